//! The one path by which events reach plugins, and what happens when a plugin fails.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use abi_stable::std_types::RVec;
use ptrain_plugin_api::{Metric, NamedBlob, Needs};

use super::{
    event::{call, Event, Reply},
    worker::{Drain, Now},
    Failure, PluginHost, RunEndData, Runner, StopRequest,
};
use crate::schedule::Due;

/// Which plugins a scheduled event (a step hook, metrics, a checkpoint) reaches.
#[derive(Clone, Copy)]
pub enum Reach<'a> {
    /// Those with an attachment to the event's hook due at the step the run
    /// planned (its schedule says who: `RunSchedule::due`).
    Due(Due<'a>),
    /// Every plugin with an attachment to the event's hook: metrics that plugins or
    /// evaluation emitted, and emergency checkpoints.
    Declared,
}

impl PluginHost {
    /// Which tensors plugin `index` gets with `event`, or `None` if it does not get it.
    fn addressed(&self, index: usize, event: &Event<'_>, reach: Reach<'_>) -> Option<Needs> {
        let instance = &self.instances[index];
        if instance.failed || matches!(instance.runner, Runner::Absent) {
            return None;
        }
        let Some(hook) = event.scheduled_hook() else { return Some(Needs::NONE) };
        if instance.detached.is_some() {
            return None;
        }
        match reach {
            Reach::Due(due) => due.needs(index, hook),
            Reach::Declared => instance.declares(hook).then_some(Needs::NONE),
        }
    }

    /// Hands `event` to every plugin it reaches (see the module's rule): inline
    /// plugins are called now, and what they emit is kept for the run's next
    /// metrics batch ([`PluginHost::drain_emitted`]); worker plugins get it through
    /// their queue. Returns the plugins' non-trivial replies by plugin index
    /// (allocating only when there are some).
    pub fn dispatch(&mut self, event: Event<'_>, reach: Reach<'_>) -> Vec<(usize, Reply)> {
        let mut replies = Vec::new();
        for index in 0..self.instances.len() {
            if let Some(needs) = self.addressed(index, &event, reach) {
                match self.deliver(index, &event, needs) {
                    Some(Reply::Done) | None => {}
                    Some(reply) => replies.push((index, reply)),
                }
            }
        }
        self.poll_workers();
        replies
    }

    /// Whether inline plugins emitted metrics the run has not taken yet.
    pub fn has_emitted(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// Moves what inline plugins emitted since the last call to the end of `batch`.
    pub fn drain_emitted(&mut self, batch: &mut Vec<Metric>) {
        self.outbox.drain_into(batch);
    }

    /// Hands `event` to plugin `index`; a failure disables the plugin (`None`),
    /// and what it emitted in the failed call is dropped.
    fn deliver(&mut self, index: usize, event: &Event<'_>, needs: Needs) -> Option<Reply> {
        let instance = &mut self.instances[index];
        let result = match &mut instance.runner {
            Runner::Inline(plugin) => {
                let before = self.outbox.len();
                instance.watched.begin(event.name(), event.step());
                let result = call(plugin, event, needs, &mut self.outbox);
                instance.watched.end();
                if result.is_err() {
                    self.outbox.truncate(before);
                }
                result
            }
            Runner::Worker(worker) => match event.queued() {
                Some(owned) => {
                    worker.send(owned);
                    Ok(Reply::Done)
                }
                None => match worker.call_now(event) {
                    Now::Called(result) => result,
                    Now::Busy(last) => {
                        let reply = self.busy_at_save.note(&instance.info.name, event, last.as_ref().map(|(step, _)| *step));
                        Ok(last.filter(|_| reply).map_or(Reply::Done, |(_, bytes)| Reply::State(bytes)))
                    }
                },
            },
            Runner::Absent => Ok(Reply::Done),
        };
        result
            .map_err(|error| {
                let (name, hook, step) = (&self.instances[index].info.name, event.name(), event.step());
                tracing::error!("plugin `{name}` failed in {hook} at step {step} and was disabled: {error}");
                self.record_failure(index, event.name(), event.step(), error);
            })
            .ok()
    }

    /// Disables a plugin: listed in the summary, never called again, and off the
    /// run's schedule when it next plans a step ([`PluginHost::take_departed`]).
    pub(super) fn record_failure(&mut self, index: usize, hook: &str, step: u64, error: String) {
        let instance = &mut self.instances[index];
        instance.failed = true;
        if instance.info.critical {
            let what = format!("failed in {hook} at step {step}: {error}");
            self.services.request_stop(StopRequest::critical(&instance.info.name, hook, step, what));
        }
        self.failures.push(Failure { plugin: instance.info.name.clone(), hook: hook.into(), step, error });
        self.departed.push(index);
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
    pub fn run_start(&mut self, run: &Arc<super::RunData>) {
        self.dispatch(Event::RunStart(run.clone()), Reach::Declared);
    }

    /// Every live plugin's saved state, for a checkpoint at `step`; a worker busy in a
    /// call of its own is waited for at most `wait` (see [`Event::SaveState`]).
    pub fn save_states(&mut self, step: u64, wait: Duration) -> RVec<NamedBlob> {
        let replies = self.dispatch(Event::SaveState { step, wait }, Reach::Declared);
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
                    self.deliver(index, &event, Needs::NONE);
                }
            }
        }
    }

    /// Ends every plugin and collects their summary fragments. Workers drain
    /// their queues, all at once, each until its `finish_timeout_s` and all until
    /// `shutdown` is up, or until `interrupted` (a signal during the drain) says
    /// to stop waiting; a worker still busy then is abandoned and reported. Deferred
    /// jobs left are waited for within the same bound ([`PluginHost::drain_deferred`]).
    pub fn run_end(&mut self, end: RunEndData, shutdown: Duration, interrupted: &dyn Fn() -> bool) -> BTreeMap<String, serde_json::Value> {
        let (step, begun) = (end.step, Instant::now());
        let mut fragments = self.dispatch(Event::RunEnd(Arc::new(end)), Reach::Declared);
        let started = Instant::now();
        let mut waiting = Vec::new();
        for instance in &self.instances {
            if let Runner::Worker(w) = &instance.runner {
                w.close();
                // A disabled worker only drains its queue, calling nothing: not waited on.
                if !instance.failed {
                    waiting.push(instance.info.name.as_str());
                }
            }
        }
        if !waiting.is_empty() {
            tracing::info!("waiting for worker plugins to finish (at most {}s): {}", shutdown.as_secs_f64(), waiting.join(", "));
        }
        for (index, instance) in self.instances.iter_mut().enumerate() {
            let Runner::Worker(w) = &mut instance.runner else { continue };
            if w.is_abandoned() {
                continue; // given up already, during the run (a save stuck in I/O)
            }
            let deadline = started + instance.finish_timeout.min(shutdown);
            let drain = w.drain_until(deadline, interrupted);
            // From the queue's close to the thread's return (or to being given up on):
            // what this plugin added to the end of the run.
            let drained = w.exited_at().unwrap_or_else(Instant::now).saturating_duration_since(started);
            self.drain_s.insert(instance.info.name.clone(), drained.as_secs_f64());
            match drain {
                Drain::Done => {
                    if let Some(summary) = w.take_summary() {
                        fragments.push((index, Reply::Summary(summary)));
                    }
                }
                Drain::Abandoned(unhandled) => {
                    let why = if interrupted() {
                        "a signal ended the wait".to_string()
                    } else {
                        let (own, all) = (instance.finish_timeout.as_secs_f64(), shutdown.as_secs_f64());
                        format!("plugins.{}.finish_timeout_s = {own}, run.shutdown_timeout_s = {all}", instance.info.name)
                    };
                    tracing::warn!(
                        "plugin `{}` did not finish in time ({why}): abandoned with {unhandled} event(s) never handled",
                        instance.info.name
                    );
                    self.abandoned.insert(instance.info.name.clone(), unhandled);
                }
            }
        }
        // From before `on_run_end`, where a plugin may have waited for its jobs
        // already: deferred work holds the end at most `shutdown` in all.
        self.drain_deferred(step, begun + shutdown, interrupted);
        self.poll_workers();
        fragments
            .into_iter()
            .filter_map(|(index, reply)| match reply {
                Reply::Summary(s) if !s.is_empty() => Some((self.instances[index].info.name.clone(), serde_json::from_str(&s).ok()?)),
                _ => None,
            })
            .collect()
    }

    /// Waits for inline plugins' deferred jobs until `deadline`: those not run by
    /// then are counted under the plugin in `abandoned_plugins`; those that failed
    /// are the plugin's failures (hook `deferred`, at the run's last `step`).
    fn drain_deferred(&mut self, step: u64, deadline: Instant, interrupted: &dyn Fn() -> bool) {
        let deferred = &self.services.deferred;
        for (plugin, left) in deferred.wait(None, deadline, interrupted) {
            tracing::warn!("plugin `{plugin}`: {left} deferred job(s) did not run in time (run.shutdown_timeout_s): given up");
            *self.abandoned.entry(plugin).or_default() += left;
        }
        for (plugin, error) in deferred.take_failures() {
            if let Some(index) = self.instances.iter().position(|i| i.info.name == plugin) {
                self.record_failure(index, "deferred", step, error);
            }
        }
    }
}
