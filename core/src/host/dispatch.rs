//! The one path by which events reach plugins, and what happens when a plugin fails.

use std::collections::BTreeMap;

use abi_stable::std_types::RVec;
use ptrain_plugin_api::{Metric, NamedBlob, Needs};

use super::{
    event::{call, Event, Reply},
    Failure, PluginHost, Runner,
};
use crate::hooks::Owner;

/// Which plugins a scheduled event (a step hook, metrics, a checkpoint) reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Those with an attachment to the event's hook due at the planned step.
    Due,
    /// Every plugin with an attachment to the event's hook: metrics that plugins or
    /// evaluation emitted, and emergency checkpoints.
    Declared,
}

impl PluginHost {
    /// Which tensors plugin `index` gets with `event`, or `None` if it does not get it.
    fn addressed(&self, index: usize, event: &Event<'_>, reach: Reach) -> Option<Needs> {
        let instance = &self.instances[index];
        if instance.failed || matches!(instance.runner, Runner::Absent) {
            return None;
        }
        let Some(hook) = event.scheduled_hook() else { return Some(Needs::NONE) };
        if instance.detached.is_some() {
            return None;
        }
        match reach {
            Reach::Due => self.scheduler.due_needs(Owner::Plugin(index), hook),
            Reach::Declared => instance.declares(hook).then_some(Needs::NONE),
        }
    }

    /// Hands `event` to every plugin it reaches (see the module's rule): inline
    /// plugins are called now, and what they emit is appended to `emitted`; worker
    /// plugins get it through their queue. Returns the plugins' non-trivial replies
    /// by plugin index (allocating only when there are some).
    pub fn dispatch(&mut self, event: Event<'_>, reach: Reach, emitted: &mut Vec<Metric>) -> Vec<(usize, Reply)> {
        let mut replies = Vec::new();
        for index in 0..self.instances.len() {
            if let Some(needs) = self.addressed(index, &event, reach) {
                match self.deliver(index, &event, needs, emitted) {
                    Some(Reply::Done) | None => {}
                    Some(reply) => replies.push((index, reply)),
                }
            }
        }
        self.poll_workers();
        replies
    }

    /// Hands `event` to plugin `index`; a failure disables the plugin (`None`).
    fn deliver(&mut self, index: usize, event: &Event<'_>, needs: Needs, emitted: &mut Vec<Metric>) -> Option<Reply> {
        let result = match &mut self.instances[index].runner {
            Runner::Inline(plugin) => {
                let before = self.outbox.len();
                let result = call(plugin, event, needs, &mut self.outbox);
                match result {
                    Ok(_) => self.outbox.drain_into(emitted),
                    Err(_) => self.outbox.truncate(before),
                }
                result
            }
            Runner::Worker(worker) => match event.queued() {
                Some(owned) => {
                    worker.send(owned);
                    Ok(Reply::Done)
                }
                None => worker.call_now(event),
            },
            Runner::Absent => Ok(Reply::Done),
        };
        result
            .map_err(|error| {
                let name = &self.instances[index].info.name;
                tracing::error!("plugin `{name}` failed in {} and was disabled: {error}", event.name());
                self.record_failure(index, event.name(), event.step(), error);
            })
            .ok()
    }

    /// Disables a plugin: listed in the summary, never called again, and off the
    /// schedule at once.
    fn record_failure(&mut self, index: usize, hook: &str, step: u64, error: String) {
        let instance = &mut self.instances[index];
        instance.failed = true;
        self.failures.push(Failure { plugin: instance.info.name.clone(), hook: hook.into(), step, error });
        self.unschedule(index);
    }

    /// Records the failures worker threads reported (they logged them already).
    fn poll_workers(&mut self) {
        for index in 0..self.instances.len() {
            let reported = match &self.instances[index].runner {
                Runner::Worker(w) if !self.instances[index].failed => w.failure(),
                _ => None,
            };
            if let Some(f) = reported {
                self.record_failure(index, f.hook, f.step, f.error);
            }
        }
    }

    /// Run start: every plugin.
    pub fn run_start(&mut self, run: &std::sync::Arc<super::RunData>) {
        self.dispatch(Event::RunStart(run.clone()), Reach::Declared, &mut Vec::new());
    }

    /// Every live plugin's saved state, for a checkpoint at `step`.
    pub fn save_states(&mut self, step: u64) -> RVec<NamedBlob> {
        let replies = self.dispatch(Event::SaveState { step }, Reach::Declared, &mut Vec::new());
        replies
            .into_iter()
            .filter_map(|(index, reply)| match reply {
                Reply::State(data) if !data.is_empty() => {
                    Some(NamedBlob { name: self.instances[index].info.name.as_str().into(), data: data.into() })
                }
                _ => None,
            })
            .collect()
    }

    /// Hands each plugin the state it saved in the checkpoint being resumed.
    pub fn load_states(&mut self, states: &BTreeMap<String, Vec<u8>>, step: u64) {
        for index in 0..self.instances.len() {
            if let Some(state) = states.get(&self.instances[index].info.name) {
                let event = Event::LoadState { step, state };
                if self.addressed(index, &event, Reach::Declared).is_some() {
                    self.deliver(index, &event, Needs::NONE, &mut Vec::new());
                }
            }
        }
    }

    /// Ends every plugin (workers drain their queues first) and collects their
    /// summary fragments.
    pub fn run_end(&mut self, end: super::RunEndData) -> BTreeMap<String, serde_json::Value> {
        let mut fragments = self.dispatch(Event::RunEnd(std::sync::Arc::new(end)), Reach::Declared, &mut Vec::new());
        for (index, instance) in self.instances.iter_mut().enumerate() {
            if let Runner::Worker(w) = &mut instance.runner {
                w.finish();
                if let Some(summary) = w.take_summary() {
                    fragments.push((index, Reply::Summary(summary)));
                }
            }
        }
        self.poll_workers();
        fragments
            .into_iter()
            .filter_map(|(index, reply)| match reply {
                Reply::Summary(s) if !s.is_empty() => Some((self.instances[index].info.name.clone(), serde_json::from_str(&s).ok()?)),
                _ => None,
            })
            .collect()
    }
}
