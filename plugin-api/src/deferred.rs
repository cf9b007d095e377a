// sabi_trait expands to impls inside consts.
#![allow(non_local_definitions)]

//! Deferred work: a job an inline plugin hands the host to run off the training
//! thread ([`HostApi::defer`]), so that no plugin starts a thread of its own.
//! Added in 0.3.0.

use abi_stable::{
    sabi_trait,
    std_types::{RBox, RResult, RString},
};

use crate::{host::HostApi, plugin::guard, PluginResult};

/// A job as it crosses the boundary: the host calls `run` once, on its deferred-work
/// thread. Plugins build one through [`HostApi::defer`], which guards it (an error
/// or a panic comes back as an error string, never as an unwind).
#[sabi_trait]
pub trait FfiDeferred: Send {
    fn run(&mut self) -> RResult<(), RString>;
}

pub type DeferredBox = FfiDeferred_TO<'static, RBox<()>>;

/// A closure run at most once.
struct Once<F>(Option<F>);

impl<F: FnOnce() -> PluginResult + Send> FfiDeferred for Once<F> {
    fn run(&mut self) -> RResult<(), RString> {
        match self.0.take() {
            Some(job) => guard(job),
            None => RResult::ROk(()),
        }
    }
}

impl HostApi {
    /// Hands `job` to the host, which runs it on its one deferred-work thread
    /// (`ptrain-deferred`), after the jobs handed over before it: for slow work an
    /// inline plugin must not do on the training thread (writing a file it recorded
    /// there). Returns at once: a channel send, nothing waits for the job. A job
    /// that returns `Err` or panics is logged at once and listed under
    /// `plugin_failures` (hook `deferred`, at the run's last step); it does not
    /// disable the plugin, whose later calls and jobs go on. Jobs of a plugin that failed still
    /// run: they were complete when handed over. At the end of the run the host waits
    /// for what is left at most `run.shutdown_timeout_s`, then gives the rest up
    /// (listed under `abandoned_plugins`); a job never holds the process.
    pub fn defer(&self, plugin: &str, job: impl FnOnce() -> PluginResult + Send + 'static) {
        let job = DeferredBox::from_value(Once(Some(job)), abi_stable::sabi_trait::TD_Opaque);
        (self.defer)(self.ctx, plugin.into(), job)
    }

    /// Waits until every job `plugin` handed over ([`HostApi::defer`]) has run, at
    /// most `run.shutdown_timeout_s`; `false` if some had not by then. For
    /// `on_run_end`, to report what the jobs did. Blocks the calling thread: never
    /// call it from a step hook.
    pub fn wait_deferred(&self, plugin: &str) -> bool {
        (self.wait_deferred)(self.ctx, plugin.into())
    }
}
