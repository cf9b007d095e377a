//! A created plugin's runner: on the training thread, or on its worker thread with
//! its queue.

use std::{sync::Arc, time::Duration};

use ptrain_plugin_api::{PluginBox, Threading};

use super::{queue::BoundedQueue, watchdog::Watched, worker, worker::Worker, HostServices};
use crate::config::PluginSettings;

pub(super) enum Runner {
    Inline(PluginBox),
    Worker(Worker),
    /// A rank-0 worker plugin on another rank: scheduled (so every rank agrees on
    /// emission steps) but not instantiated.
    Absent,
}

/// A created plugin's runner (on the training thread, or its worker thread with its
/// queue) and what the watchdog watches of it. A critical plugin's stall fails the run
/// (it may never return).
pub(super) fn start(
    name: &str,
    plugin: PluginBox,
    threading: Threading,
    settings: &PluginSettings,
    services: &Arc<HostServices>,
) -> std::result::Result<(Runner, Arc<Watched>), abi_stable::std_types::RString> {
    let hook_warn = Duration::from_secs_f64(settings.hook_warn_s);
    let critical = settings.critical.then(|| services.clone());
    let timer = worker::timer(&plugin, threading)?;
    Ok(match threading {
        Threading::Inline => (Runner::Inline(plugin), Watched::new(name, hook_warn, None, critical)),
        Threading::Worker => {
            let queue = Arc::new(BoundedQueue::new(settings.queue, settings.on_full));
            let waiting = queue.clone();
            let watched = Watched::new(name, hook_warn, Some(Box::new(move || waiting.len())), critical);
            (Runner::Worker(Worker::spawn(name, plugin, queue, timer, watched.clone(), services.clone())), watched)
        }
    })
}
