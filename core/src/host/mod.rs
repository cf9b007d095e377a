//! The plugin host: loads plugin libraries, applies the user's cadence overrides
//! (the attachments it returns become slots of the run's schedule, which the run
//! owns: `schedule::RunSchedule`), and calls plugins through one path
//! ([`PluginHost::dispatch`]): inline plugins on the training thread, worker
//! plugins on their own threads. A plugin that fails is disabled (one error line,
//! training goes on) and reported to the run's schedule as leaving it
//! ([`PluginHost::take_departed`]), like one that asked to leave.
//!
//! Who receives an event is one rule, the same for inline and worker plugins:
//! - run start, run end and the state events reach every plugin that has not failed
//!   (detached ones included), whatever it declares; an attachment to `RunStart` or
//!   `RunEnd` is ignored;
//! - a step hook, `Eval`, `Metrics` or `Checkpoint` event reaches the plugins with an
//!   attachment to that hook due at this step ([`Reach::Due`], with the run's
//!   plan; an `Eval` attachment is due at every step that evaluates), or, for metrics that plugins or evaluation
//!   emitted and for emergency checkpoints, every plugin with an attachment to that
//!   hook ([`Reach::Declared`]). Worker plugins attach to `Metrics` and `Checkpoint`
//!   only.

mod attach;
mod busy;
mod commits;
mod deferred;
mod dispatch;
mod event;
pub mod loader;
mod queue;
mod reward;
mod run_data;
mod runner;
mod saves;
mod services;
mod watchdog;
mod worker;

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use ptrain_plugin_api::{Hook, Outbox, Threading};
use serde::Serialize;

pub use busy::BusyAtSave;
pub use dispatch::Reach;
pub use event::{Event, Reply};
pub use loader::{available, resolve, search_dirs, PluginLibrary};
pub use queue::{BoundedQueue, QueueItem};
pub use reward::{RewardClient, RewardRequest, Scores};
pub use run_data::{RunData, RunEndData};
pub use services::{HostServices, StopRequest};

pub use watchdog::{seconds, Calls, Running, Stall};

use self::{
    runner::{start, Runner},
    watchdog::{Watchdog, Watched},
};
use crate::{
    config::{explain_option_error, KeyOrigins, PluginSettings},
    error::{Error, Result},
    schedule::SlotSpec,
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
    /// Its failure, stall or abandonment fails the run (`critical`, from its table or
    /// its descriptor).
    pub critical: bool,
    /// Scores GRPO's completions (`Descriptor::reward`): runs on every rank.
    #[serde(skip)]
    pub reward: bool,
}

struct Instance {
    info: LoadedInfo,
    runner: Runner,
    failed: bool,
    /// Why the plugin took itself off the schedule ([`HostServices::request_detach`]).
    detached: Option<String>,
    /// Hooks the plugin has attachments to, as a bit mask.
    declared: u32,
    /// `finish_timeout_s`: how long a worker may drain at the end, or take to write
    /// a save the run waits for.
    finish_timeout: Duration,
    /// `hook_warn_s`: when a wait on it is worth a warning.
    hook_warn: Duration,
    /// Its calls in progress and its stalls (`hook_warn_s`), for the watchdog.
    watched: Arc<Watched>,
}

impl Instance {
    fn declares(&self, hook: Hook) -> bool {
        self.declared & hook.bit() != 0
    }
}

pub struct PluginHost {
    instances: Vec<Instance>,
    /// What inline plugins emitted since the run last took it
    /// ([`PluginHost::drain_emitted`]), for the next metrics batch.
    outbox: Outbox,
    failures: Vec<Failure>,
    /// Plugins that failed or detached since the run's schedule last asked.
    departed: Vec<usize>,
    /// Workers given up on at the end, with how many events they never handled,
    /// and plugins whose deferred jobs had not all run by then, with how many.
    abandoned: BTreeMap<String, u64>,
    /// Each worker's end-of-run drain, in seconds.
    drain_s: BTreeMap<String, f64>,
    /// Saves that found a worker busy: its state reused or left out.
    busy_at_save: busy::BusySaves,
    /// Warns while a plugin's call runs too long; only with plugins that run here.
    watchdog: Option<Watchdog>,
    /// Last: dropped after the plugins, which may call it until they are.
    services: Arc<HostServices>,
}

impl PluginHost {
    /// Loads the requested plugins (names or paths) and returns their scheduled
    /// attachments. Every problem here is a usage error: nothing has trained yet.
    /// `origins` (the configuration's) lets option errors name the file that set the key.
    pub fn load(
        requests: &[String],
        tables: &BTreeMap<String, toml::Table>,
        origins: &KeyOrigins,
        services: Arc<HostServices>,
        rank: u32,
    ) -> Result<(PluginHost, Vec<SlotSpec>)> {
        let mut host = PluginHost {
            instances: Vec::new(),
            outbox: Outbox::new(),
            failures: Vec::new(),
            departed: Vec::new(),
            abandoned: BTreeMap::new(),
            busy_at_save: busy::BusySaves::default(),
            drain_s: BTreeMap::new(),
            watchdog: None,
            services: services.clone(),
        };
        let mut slots = Vec::new();
        // Every library is checked, and every table claimed, before any plugin is created.
        let libraries = requests.iter().map(|request| loader::resolve(request).and_then(|path| Ok((request, loader::load(&path)?, path))));
        let libraries = libraries.collect::<Result<Vec<_>>>()?;
        loader::claim_tables(&libraries, tables)?;
        for (request, lib, path) in libraries {
            let d = &lib.descriptor;
            let name = d.name.as_str().to_string();
            if host.instances.iter().any(|i| i.info.name == name) {
                return Err(Error::Plugin { name, message: "requested twice".into() });
            }
            let empty = toml::Table::new();
            let table = tables.get(&name).or_else(|| tables.get(request.as_str())).unwrap_or(&empty);
            let names: Vec<&str> = d.attachments.iter().map(|a| a.name.as_str()).collect();
            // A plugin whose first attachment has no cadence (run start) takes the
            // cadence keys of its table as its own options (the trace's `every`).
            let scheduled = attach::primary(d).is_some();
            let worker = d.threading == Threading::Worker;
            let mut settings = PluginSettings::parse(&name, table, &names, scheduled, worker).map_err(|e| origins.locate(e))?;
            // The plugin's own default (`Descriptor::critical`), unless its table says.
            if !table.contains_key("critical") {
                settings.critical = d.critical;
            }
            let refused = |e: abi_stable::std_types::RString| Error::Plugin {
                name: name.clone(),
                message: explain_option_error(&name, e.as_str(), &names, scheduled, worker, origins),
            };
            let index = host.instances.len();
            let hook_warn = Duration::from_secs_f64(settings.hook_warn_s);
            let runs_here = rank == 0 || d.threading == Threading::Inline || d.per_rank || d.reward;
            let ((runner, watched), declared) = match runs_here {
                true => {
                    let plugin = lib.module.create()(settings.options.to_string().as_str().into(), services.api()).into_result().map_err(refused)?;
                    let windows = plugin.step_windows().into_result().map_err(refused)?;
                    let (plugin_slots, declared) = attach::slots(&attach::described(&lib, d, &name)?, index, &name, &settings);
                    slots.extend(plugin_slots);
                    if !windows.is_none() {
                        attach::set_windows(&mut slots, index, windows);
                    }
                    (start(&name, plugin, d.threading, &settings, &services).map_err(refused)?, declared)
                }
                false => {
                    let (plugin_slots, declared) = attach::slots(d, index, &name, &settings);
                    slots.extend(plugin_slots);
                    ((Runner::Absent, Watched::new(&name, hook_warn, None, settings.critical.then(|| services.clone()))), declared)
                }
            };
            let threading = if d.threading == Threading::Inline { "inline" } else { "worker" };
            host.instances.push(Instance {
                info: LoadedInfo {
                    name,
                    version: d.version.as_str().to_string(),
                    path: path.canonicalize().unwrap_or(path),
                    threading,
                    critical: settings.critical,
                    reward: d.reward,
                },
                runner,
                failed: false,
                detached: None,
                declared,
                finish_timeout: Duration::from_secs_f64(settings.finish_timeout_s),
                hook_warn,
                watched,
            });
        }
        let here: Vec<_> = host.instances.iter().filter(|i| !matches!(i.runner, Runner::Absent)).map(|i| i.watched.clone()).collect();
        host.services.watch(&here);
        if !host.instances.is_empty() {
            let each = host.instances.iter().map(|i| {
                let critical = if i.info.critical { ", critical: its failure fails the run" } else { "" };
                format!("{} {} ({}{critical})", i.info.name, i.info.version, i.info.threading)
            });
            tracing::info!("plugins: {}", each.collect::<Vec<_>>().join(", "));
        }
        host.watchdog = Watchdog::start(here);
        Ok((host, slots))
    }

    pub fn loaded(&self) -> Vec<LoadedInfo> {
        self.instances.iter().map(|i| i.info.clone()).collect()
    }

    pub fn failures(&self) -> &[Failure] {
        &self.failures
    }

    /// Whether a checkpoint handed over now would reach a plugin that writes it.
    pub fn has_checkpointer(&self) -> bool {
        self.instances.iter().any(|i| i.declares(Hook::Checkpoint) && !i.failed && i.detached.is_none() && !matches!(i.runner, Runner::Absent))
    }

    /// Each plugin's calls that ran longer than its `hook_warn_s` (those still running
    /// included): the longest, and how many.
    pub fn stalls(&self) -> BTreeMap<String, Stall> {
        self.calls().stalls()
    }

    /// The plugins' calls, for other threads (a signal during a hung hook).
    pub fn calls(&self) -> Calls {
        let here = self.instances.iter().filter(|i| !matches!(i.runner, Runner::Absent));
        Calls::new(here.map(|i| (i.watched.clone(), matches!(i.runner, Runner::Inline(_)))).collect())
    }

    /// Whether a critical plugin failed or was abandoned at the end: the run fails
    /// (one that stopped already stopped as failed, `StopRequest::failure`).
    pub fn critical_lost(&self) -> bool {
        self.instances.iter().any(|i| i.info.critical && (i.failed || self.abandoned.contains_key(&i.info.name)))
    }

    /// Workers abandoned at the end, with how many events each never handled, and
    /// deferred jobs given up on, by plugin.
    pub fn abandoned(&self) -> &BTreeMap<String, u64> {
        &self.abandoned
    }

    /// Saves that found a worker plugin busy, by plugin ([`BusyAtSave`]).
    pub fn busy_at_save(&self) -> BTreeMap<String, BusyAtSave> {
        self.busy_at_save.by_plugin()
    }

    /// Plugins that took themselves off the schedule, with why.
    pub fn detached(&self) -> BTreeMap<String, String> {
        self.instances.iter().filter_map(|i| Some((i.info.name.clone(), i.detached.clone()?))).collect()
    }

    /// How long each worker took to drain its queue at the end of the run (from
    /// closing it to its thread's return, or to being given up on).
    pub fn drain_s(&self) -> &BTreeMap<String, f64> {
        &self.drain_s
    }

    /// How long the training thread waited for room in each worker's full queue
    /// (`on_full = "block"`), in seconds.
    pub fn queue_blocked_s(&self) -> BTreeMap<String, f64> {
        let workers = self.instances.iter().filter_map(|i| match &i.runner {
            Runner::Worker(w) => Some((i.info.name.clone(), w.queue.blocked().as_secs_f64())),
            _ => None,
        });
        workers.collect()
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

    /// The plugins that left the schedule since the last call, by index: those
    /// that failed, and those that asked to leave (`HostApi::detach`), which are
    /// marked detached here. The run's schedule calls it when it plans `step`,
    /// which a detach request makes the next step.
    pub fn take_departed(&mut self, step: u64) -> Vec<usize> {
        for (plugin, reason) in self.services.take_detach_requests() {
            let Some(index) = self.instances.iter().position(|i| i.info.name == plugin) else {
                tracing::warn!("a plugin asked to detach `{plugin}`, which is not loaded; ignored");
                continue;
            };
            let instance = &mut self.instances[index];
            if instance.failed || instance.detached.is_some() {
                continue;
            }
            tracing::info!("plugin `{plugin}` left the schedule before step {step}: {reason}");
            instance.detached = Some(reason);
            self.departed.push(index);
        }
        std::mem::take(&mut self.departed)
    }
}
