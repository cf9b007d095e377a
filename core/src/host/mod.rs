//! The plugin host: loads plugin libraries, applies the user's cadence overrides,
//! runs inline plugins on the training thread and worker plugins on their own
//! threads, and disables a plugin (one error line, training goes on) when it fails.

pub mod loader;
mod queue;
mod run_data;
mod services;
mod worker;

use std::{collections::BTreeMap, path::PathBuf, sync::Arc};

use abi_stable::std_types::{RResult, RSlice, RVec};
use ptrain_plugin_api::{
    Cadence, CheckpointPayload, Descriptor, Hook, Metric, MetricBatch, NamedBlob, Needs, Outbox, PluginBox, StepContext, StepTensors, TensorRef,
    Threading,
};
use serde::Serialize;

pub use loader::{available, resolve, search_dirs, PluginLibrary};
pub use queue::{BoundedQueue, QueueItem};
pub use run_data::{RunData, RunEndData};
pub use services::{Collectives, HostServices};

use self::worker::{Worker, WorkerEvent};
use crate::{
    config::{CadenceOverride, PluginSettings},
    error::{Error, Result},
    hooks::{Gate, Owner, Scheduler, SlotSpec},
};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Failure {
    pub plugin: String,
    pub hook: String,
    pub step: u64,
    pub error: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoadedInfo {
    pub name: String,
    pub version: String,
    pub path: PathBuf,
    pub threading: &'static str,
}

enum Runner {
    Inline(PluginBox),
    Worker(Worker),
    /// A rank-0 worker plugin on another rank: scheduled (so every rank agrees on
    /// emission steps) but not instantiated.
    Absent,
}

struct Instance {
    info: LoadedInfo,
    descriptor: Descriptor,
    runner: Runner,
    failed: bool,
    /// Why the plugin took itself off the schedule ([`HostApi::detach`]).
    detached: Option<String>,
    /// Event hooks the plugin declared (RunStart, Eval, RunEnd) as a bit mask.
    events: u32,
    sink: bool,
    checkpoints: bool,
}

pub struct PluginHost {
    instances: Vec<Instance>,
    outbox: Outbox,
    failures: Vec<Failure>,
    services: &'static HostServices,
    /// In a distributed run a failed plugin keeps its slots (its calls are simply
    /// skipped): every rank must keep the same schedule, since metric emission and
    /// plugin collectives are collective operations.
    keep_schedule: bool,
}

fn unschedule(keep_schedule: bool, plugin: usize, scheduler: &mut Scheduler, gate: &Gate) {
    if !keep_schedule {
        scheduler.disable_plugin(plugin, gate);
    }
}

fn apply(cadence: Cadence, o: &CadenceOverride) -> Cadence {
    Cadence {
        every_steps: o.every.unwrap_or(cadence.every_steps),
        every_secs: o.every_secs.unwrap_or(cadence.every_secs),
        first_step: o.first_step.unwrap_or(cadence.first_step),
        at_eval: o.at_eval.unwrap_or(cadence.at_eval),
        at_checkpoint: o.at_checkpoint.unwrap_or(cadence.at_checkpoint),
        at_end: o.at_end.unwrap_or(cadence.at_end),
    }
}

fn masked<'a>(ctx: &StepContext<'a>, needs: Needs) -> StepContext<'a> {
    let keep = |flag: Needs, t: TensorRef| if needs.contains(flag) { t } else { TensorRef::NULL };
    let t = &ctx.tensors;
    StepContext {
        tensors: StepTensors {
            loss: keep(Needs::LOSS, t.loss),
            logits: keep(Needs::LOGITS, t.logits),
            labels: keep(Needs::LABELS, t.labels),
            dataset_ids: keep(Needs::DATASET_IDS, t.dataset_ids),
            inputs: keep(Needs::INPUTS, t.inputs),
        },
        params: if needs.contains(Needs::PARAMS) { ctx.params } else { RSlice::EMPTY },
        grads: if needs.contains(Needs::GRADS) { ctx.grads } else { RSlice::EMPTY },
        ..*ctx
    }
}

impl Instance {
    /// Whether its scheduled calls still come: neither failed nor detached.
    fn scheduled(&self) -> bool {
        !self.failed && self.detached.is_none()
    }
}

impl PluginHost {
    /// Loads the requested plugins (names or paths) and returns their scheduled
    /// attachments. Every problem here is a usage error: nothing has trained yet.
    pub fn load(
        requests: &[String],
        tables: &BTreeMap<String, toml::Table>,
        services: &'static HostServices,
        rank: u32,
    ) -> Result<(PluginHost, Vec<SlotSpec>)> {
        let mut host = PluginHost { instances: Vec::new(), outbox: Outbox::new(), failures: Vec::new(), services, keep_schedule: false };
        let mut slots = Vec::new();
        for request in requests {
            let path = loader::resolve(request)?;
            let lib = loader::load(&path)?;
            let d = lib.descriptor;
            let name = d.name.as_str().to_string();
            if host.instances.iter().any(|i| i.info.name == name) {
                return Err(Error::Plugin { name, message: "requested twice".into() });
            }
            let empty = toml::Table::new();
            let table = tables.get(&name).or_else(|| tables.get(request.as_str())).unwrap_or(&empty);
            let names: Vec<&str> = d.attachments.iter().map(|a| a.name.as_str()).collect();
            let settings = PluginSettings::parse(&name, table, &names)?;
            let index = host.instances.len();
            let mut events = 0;
            for (k, a) in d.attachments.iter().enumerate() {
                let worker_step_hook =
                    d.threading == Threading::Worker && !matches!(a.hook, Hook::Metrics | Hook::Checkpoint | Hook::RunStart | Hook::RunEnd);
                if worker_step_hook {
                    tracing::warn!("plugin `{name}`: worker plugins cannot attach to {}; ignored", a.hook.name());
                    continue;
                }
                if !a.hook.is_scheduled() {
                    events |= a.hook.bit();
                    continue;
                }
                let mut cadence = a.cadence;
                if k == 0 {
                    cadence = apply(cadence, &settings.primary);
                }
                if let Some(o) = settings.attachments.get(a.name.as_str()) {
                    cadence = apply(cadence, o);
                }
                slots.push(SlotSpec { owner: Owner::Plugin(index), hook: a.hook, cadence, needs: a.needs });
            }
            let runs_here = rank == 0 || d.threading == Threading::Inline || d.per_rank;
            let runner = if runs_here {
                let plugin = lib.module.create()(settings.options.to_string().as_str().into(), services.api())
                    .into_result()
                    .map_err(|e| Error::Plugin { name: name.clone(), message: e.into_string() })?;
                match d.threading {
                    Threading::Inline => Runner::Inline(plugin),
                    Threading::Worker => Runner::Worker(Worker::spawn(&name, plugin, settings.queue, settings.on_full)),
                }
            } else {
                Runner::Absent
            };
            host.instances.push(Instance {
                info: LoadedInfo {
                    name,
                    version: d.version.as_str().to_string(),
                    path: path.canonicalize().unwrap_or(path),
                    threading: if d.threading == Threading::Inline { "inline" } else { "worker" },
                },
                descriptor: d,
                runner,
                failed: false,
                detached: None,
                events,
                sink: d.attachments.iter().any(|a| a.hook == Hook::Metrics),
                checkpoints: d.attachments.iter().any(|a| a.hook == Hook::Checkpoint),
            });
        }
        Ok((host, slots))
    }

    pub fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }

    /// Distributed runs keep every rank's schedule identical, failures included.
    pub fn keep_schedule_on_failure(&mut self, keep: bool) {
        self.keep_schedule = keep;
    }

    pub fn loaded(&self) -> Vec<LoadedInfo> {
        self.instances.iter().map(|i| i.info.clone()).collect()
    }

    pub fn services(&self) -> &'static HostServices {
        self.services
    }

    pub fn has_checkpointer(&self) -> bool {
        self.instances.iter().any(|i| i.checkpoints && i.scheduled() && !matches!(i.runner, Runner::Absent))
    }

    pub fn has_sinks(&self) -> bool {
        self.instances.iter().any(|i| i.sink)
    }

    fn fail(&mut self, index: usize, hook: &str, step: u64, error: String) {
        let instance = &mut self.instances[index];
        if instance.failed {
            return;
        }
        tracing::error!("plugin `{}` failed in {hook} and was disabled: {error}", instance.info.name);
        instance.failed = true;
        self.failures.push(Failure { plugin: instance.info.name.clone(), hook: hook.into(), step, error });
    }

    /// Records failures that worker threads reported, and stops scheduling them.
    pub fn poll_workers(&mut self, step: u64, scheduler: &mut Scheduler, gate: &Gate) {
        for (index, instance) in self.instances.iter_mut().enumerate() {
            if let (Runner::Worker(w), false) = (&instance.runner, instance.failed) {
                if w.shared.failed.load(std::sync::atomic::Ordering::Relaxed) {
                    let (hook, error, failed_at) =
                        w.shared.failure.lock().expect("failure lock").clone().unwrap_or((String::new(), String::new(), step));
                    instance.failed = true;
                    self.failures.push(Failure { plugin: instance.info.name.clone(), hook, step: failed_at, error });
                    unschedule(self.keep_schedule, index, scheduler, gate);
                }
            }
        }
    }

    /// Takes the plugins that asked to leave the schedule off it; called when the
    /// loop plans a step, which a request makes the next one.
    pub fn apply_detaches(&mut self, step: u64, scheduler: &mut Scheduler, gate: &Gate) {
        for (plugin, reason) in self.services.take_detach_requests() {
            let Some(index) = self.instances.iter().position(|i| i.info.name == plugin) else {
                tracing::warn!("a plugin asked to detach `{plugin}`, which is not loaded; ignored");
                continue;
            };
            if !self.instances[index].scheduled() {
                continue;
            }
            tracing::info!("plugin `{plugin}` left the schedule before step {step}: {reason}");
            self.instances[index].detached = Some(reason);
            unschedule(self.keep_schedule, index, scheduler, gate);
        }
    }

    /// Plugins that took themselves off the schedule, with why.
    pub fn detached(&self) -> BTreeMap<String, String> {
        self.instances.iter().filter_map(|i| Some((i.info.name.clone(), i.detached.clone()?))).collect()
    }

    pub fn run_start(&mut self, run: &Arc<RunData>) {
        let mut failed = Vec::new();
        for (index, instance) in self.instances.iter_mut().enumerate() {
            match &mut instance.runner {
                Runner::Inline(p) if instance.events & Hook::RunStart.bit() != 0 => {
                    if let RResult::RErr(e) = run.with_view(|info| p.on_run_start(info)) {
                        failed.push((index, e.into_string()));
                    }
                }
                Runner::Worker(w) => w.send(WorkerEvent::RunStart(run.clone())),
                _ => {}
            }
        }
        for (index, e) in failed {
            self.fail(index, "run_start", run.start_step, e);
        }
    }

    /// Calls the inline plugins due at `hook`; what they emit is appended to
    /// `emitted`. Each gets only the tensors its attachment asked for.
    pub fn step_hook(&mut self, hook: Hook, scheduler: &mut Scheduler, gate: &Gate, ctx: &StepContext<'_>, emitted: &mut Vec<Metric>) {
        let mut failed: Vec<(usize, String)> = Vec::new();
        for (_, spec) in scheduler.due() {
            let Owner::Plugin(index) = spec.owner else { continue };
            if spec.hook != hook || !self.instances[index].scheduled() {
                continue;
            }
            if let Runner::Inline(p) = &mut self.instances[index].runner {
                let call = masked(ctx, spec.needs);
                let before = self.outbox.len();
                match p.on_step(&call, &mut self.outbox) {
                    RResult::ROk(()) => self.outbox.drain_into(emitted),
                    RResult::RErr(e) => {
                        self.outbox.truncate(before);
                        failed.push((index, e.into_string()));
                    }
                }
            }
        }
        for (index, e) in failed {
            self.fail(index, hook.name(), ctx.step, e);
            unschedule(self.keep_schedule, index, scheduler, gate);
        }
    }

    /// Calls inline plugins that declared [`Hook::Eval`].
    pub fn eval(&mut self, ctx: &StepContext<'_>, scheduler: &mut Scheduler, gate: &Gate, emitted: &mut Vec<Metric>) {
        let mut failed = Vec::new();
        for (index, instance) in self.instances.iter_mut().enumerate() {
            if !instance.scheduled() || instance.events & Hook::Eval.bit() == 0 {
                continue;
            }
            if let Runner::Inline(p) = &mut instance.runner {
                match p.on_step(ctx, &mut self.outbox) {
                    RResult::ROk(()) => self.outbox.drain_into(emitted),
                    RResult::RErr(e) => failed.push((index, e.into_string())),
                }
            }
        }
        for (index, e) in failed {
            self.fail(index, "eval", ctx.step, e);
            unschedule(self.keep_schedule, index, scheduler, gate);
        }
    }

    /// Sends a metrics batch to the sinks that are due at this step, or to every
    /// sink when `to_all` (plugin metrics and eval results reach every sink).
    pub fn deliver(&mut self, batch: MetricBatch, scheduler: &mut Scheduler, gate: &Gate, to_all: bool) {
        let due: Vec<usize> = if to_all {
            Vec::new()
        } else {
            scheduler
                .due()
                .filter(|(_, s)| s.hook == Hook::Metrics)
                .filter_map(|(_, s)| match s.owner {
                    Owner::Plugin(p) => Some(p),
                    _ => None,
                })
                .collect()
        };
        let batch = Arc::new(batch);
        let mut failed = Vec::new();
        for (index, instance) in self.instances.iter_mut().enumerate() {
            if !instance.sink || !instance.scheduled() || !(to_all || due.contains(&index)) {
                continue;
            }
            match &mut instance.runner {
                Runner::Worker(w) => w.send(WorkerEvent::Metrics(batch.clone())),
                Runner::Inline(p) => {
                    if let RResult::RErr(e) = p.on_metrics(&batch) {
                        failed.push((index, e.into_string()));
                    }
                }
                Runner::Absent => {}
            }
        }
        for (index, e) in failed {
            self.fail(index, "metrics", batch.step, e);
            unschedule(self.keep_schedule, index, scheduler, gate);
        }
        self.poll_workers(batch.step, scheduler, gate);
    }

    /// Waits until every checkpoint handed to a plugin has been written.
    pub fn wait_saves(&self) {
        for instance in &self.instances {
            if let Runner::Worker(w) = &instance.runner {
                w.shared.saves.wait_idle();
            }
        }
    }

    /// Hands a payload to the checkpoint plugins (after any previous save finished).
    pub fn checkpoint(&mut self, payload: CheckpointPayload) {
        self.wait_saves();
        let targets: Vec<usize> = (0..self.instances.len()).filter(|&i| self.instances[i].checkpoints && self.instances[i].scheduled()).collect();
        let mut payload = Some(payload);
        for (k, &index) in targets.iter().enumerate() {
            // The last target takes the payload itself; others get copies.
            let owned = Box::new(if k + 1 == targets.len() { payload.take().expect("payload") } else { payload.clone().expect("payload") });
            match &mut self.instances[index].runner {
                Runner::Worker(w) => w.send(WorkerEvent::Checkpoint(owned)),
                Runner::Inline(p) => {
                    if let RResult::RErr(e) = p.on_checkpoint(&owned) {
                        let step = owned.step;
                        self.fail(index, "checkpoint", step, e.into_string());
                    }
                }
                Runner::Absent => {}
            }
        }
    }

    /// Every live plugin's saved state, for a checkpoint.
    pub fn save_states(&mut self, step: u64) -> RVec<NamedBlob> {
        let mut out = RVec::new();
        let mut failed = Vec::new();
        for (index, instance) in self.instances.iter_mut().enumerate() {
            if instance.failed {
                continue;
            }
            let result = match &mut instance.runner {
                Runner::Inline(p) => p.save_state(),
                Runner::Worker(w) => w.shared.plugin.lock().expect("plugin lock").save_state(),
                Runner::Absent => continue,
            };
            match result {
                RResult::ROk(data) if !data.is_empty() => out.push(NamedBlob { name: instance.info.name.as_str().into(), data }),
                RResult::ROk(_) => {}
                RResult::RErr(e) => failed.push((index, e.into_string())),
            }
        }
        for (index, e) in failed {
            self.fail(index, "save_state", step, e);
        }
        out
    }

    /// Hands each plugin the state it saved in the checkpoint being resumed.
    pub fn load_states(&mut self, states: &BTreeMap<String, Vec<u8>>, step: u64) {
        let mut failed = Vec::new();
        for (index, instance) in self.instances.iter_mut().enumerate() {
            let Some(state) = states.get(&instance.info.name) else { continue };
            let result = match &mut instance.runner {
                Runner::Inline(p) => p.load_state(state.as_slice().into()),
                Runner::Worker(w) => w.shared.plugin.lock().expect("plugin lock").load_state(state.as_slice().into()),
                Runner::Absent => continue,
            };
            if let RResult::RErr(e) = result {
                failed.push((index, e.into_string()));
            }
        }
        for (index, e) in failed {
            self.fail(index, "load_state", step, e);
        }
    }

    /// Ends every plugin (workers drain their queues first) and collects their
    /// summary fragments.
    pub fn run_end(&mut self, end: &RunEndData) -> BTreeMap<String, serde_json::Value> {
        let mut summaries = BTreeMap::new();
        let mut failed = Vec::new();
        for (index, instance) in self.instances.iter_mut().enumerate() {
            let summary = match &mut instance.runner {
                Runner::Inline(p) if !instance.failed => match end.with_view(|e| p.on_run_end(e)) {
                    RResult::ROk(s) => Some(s.into_string()),
                    RResult::RErr(e) => {
                        failed.push((index, e.into_string()));
                        None
                    }
                },
                Runner::Worker(w) => {
                    w.send(WorkerEvent::RunEnd(end.clone()));
                    w.finish();
                    w.shared.summary.lock().expect("summary lock").take()
                }
                _ => None,
            };
            if let Some(value) = summary.filter(|s| !s.is_empty()).and_then(|s| serde_json::from_str(&s).ok()) {
                summaries.insert(instance.info.name.clone(), value);
            }
        }
        for (index, e) in failed {
            self.fail(index, "run_end", end.step, e);
        }
        for instance in &mut self.instances {
            if let (Runner::Worker(w), false) = (&instance.runner, instance.failed) {
                if let Some((hook, error, step)) = w.shared.failure.lock().expect("failure lock").clone() {
                    instance.failed = true;
                    self.failures.push(Failure { plugin: instance.info.name.clone(), hook, step, error });
                }
            }
        }
        summaries
    }

    pub fn failures(&self) -> &[Failure] {
        &self.failures
    }

    /// Metrics dropped from each worker's full queue.
    pub fn queue_drops(&self) -> BTreeMap<String, u64> {
        self.instances
            .iter()
            .filter_map(|i| match &i.runner {
                Runner::Worker(w) => Some((i.info.name.clone(), w.queue.dropped())),
                _ => None,
            })
            .collect()
    }

    pub fn descriptors(&self) -> impl Iterator<Item = (&LoadedInfo, &Descriptor)> {
        self.instances.iter().map(|i| (&i.info, &i.descriptor))
    }
}
