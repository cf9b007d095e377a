//! Services the host offers plugins: logging, stopping the run, leaving the
//! schedule, collectives and deferred work. Every `impl HostApi` is in this file.

use abi_stable::{
    std_types::{RResult, RStr, RString},
    StableAbi,
};

use crate::{
    context::TensorRef,
    deferred::{DeferredBox, RunOnce},
    PluginResult,
};

/// How a stop request says it comes from a failure: its reason starts with this.
/// A convention rather than a new `HostApi` function, so that the function table
/// (whose layout the host checks when loading a plugin) stays as it was; a host
/// that predates it shows the prefixed reason and ends the run as it always did.
pub const STOP_FAILURE_PREFIX: &str = "failure: ";

#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
}

/// Function table into the host, handed to every plugin when it is created.
///
/// Collectives (`all_reduce_sum`, `broadcast`) act in place on a host-device tensor
/// and must be called by every rank at the same point; in a single-process run they
/// return at once. Call them only from inline plugins, on the training thread.
///
/// Deferred work (`defer`, `wait_deferred`, added in 0.3.0): an inline plugin hands
/// the host a job to run off the training thread ([`HostApi::defer`]) and may wait
/// for its jobs at the end ([`HostApi::wait_deferred`]).
///
/// Valid for as long as the plugin instance it was given to lives (the host keeps
/// its side alive until then, and for each deferred job until it has run): keep it
/// in the plugin, never in a global that outlives the instance.
#[repr(C)]
#[derive(StableAbi, Clone, Copy)]
pub struct HostApi {
    pub ctx: *const (),
    pub log: extern "C" fn(ctx: *const (), level: LogLevel, plugin: RStr<'_>, message: RStr<'_>),
    pub request_stop: extern "C" fn(ctx: *const (), plugin: RStr<'_>, reason: RStr<'_>),
    pub all_reduce_sum: extern "C" fn(ctx: *const (), tensor: TensorRef) -> RResult<(), RString>,
    pub broadcast: extern "C" fn(ctx: *const (), tensor: TensorRef, root: u32) -> RResult<(), RString>,
    pub detach: extern "C" fn(ctx: *const (), plugin: RStr<'_>, reason: RStr<'_>),
    pub defer: extern "C" fn(ctx: *const (), plugin: RStr<'_>, job: DeferredBox),
    pub wait_deferred: extern "C" fn(ctx: *const (), plugin: RStr<'_>) -> bool,
}

// SAFETY: the host's context is a thread-safe object the host keeps alive for as long
// as the plugin instance it was given to can call it (from any of its threads).
unsafe impl Send for HostApi {}
// SAFETY: as above; the function pointers are plain `extern "C" fn`s.
unsafe impl Sync for HostApi {}

impl HostApi {
    pub fn log(&self, level: LogLevel, plugin: &str, message: &str) {
        (self.log)(self.ctx, level, plugin.into(), message.into())
    }

    /// Asks the host to end the run after the current step, as a normal end: the
    /// final checkpoint is saved (when a checkpoint plugin is loaded), summary.json
    /// names the plugin (`stopped_by`) and the reason, and ptrain exits 0. For a
    /// plugin that decides training is done (early stopping). In a distributed run
    /// the ranks agree and stop at the same step.
    pub fn request_stop(&self, plugin: &str, reason: &str) {
        (self.request_stop)(self.ctx, plugin.into(), reason.into())
    }

    /// Asks the host to end the run after the current step because something
    /// failed (a checkpoint could not be written): as [`HostApi::request_stop`],
    /// but the run ends as a failure, with an emergency checkpoint and exit 1.
    pub fn request_failure_stop(&self, plugin: &str, reason: &str) {
        let reason = format!("{STOP_FAILURE_PREFIX}{reason}");
        (self.request_stop)(self.ctx, plugin.into(), reason.as_str().into())
    }

    /// Takes this plugin off the schedule for the rest of the run, from the next step
    /// on: no more step, eval or checkpoint calls and no more metrics, so the loop
    /// pays nothing for it. For a plugin that finds it has nothing to do in this run
    /// (per-dataset metrics on data without datasets). Its state is still saved in
    /// checkpoints, and `on_run_end` still comes. Not a failure: logged at info and
    /// listed under `detached_plugins` in summary.json. Callable from any thread; in
    /// a distributed run every rank must decide alike, as for collectives.
    pub fn detach(&self, plugin: &str, reason: &str) {
        (self.detach)(self.ctx, plugin.into(), reason.into())
    }

    pub fn all_reduce_sum(&self, tensor: TensorRef) -> Result<(), String> {
        (self.all_reduce_sum)(self.ctx, tensor).into_result().map_err(RString::into_string)
    }

    pub fn broadcast(&self, tensor: TensorRef, root: u32) -> Result<(), String> {
        (self.broadcast)(self.ctx, tensor, root).into_result().map_err(RString::into_string)
    }

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
        let job = DeferredBox::from_value(RunOnce(Some(job)), abi_stable::sabi_trait::TD_Opaque);
        (self.defer)(self.ctx, plugin.into(), job)
    }

    /// Waits until every job `plugin` handed over ([`HostApi::defer`]) has run, at
    /// most `run.shutdown_timeout_s`; `false` if some had not by then. For
    /// `on_run_end`, to report what the jobs did. Blocks the calling thread: never
    /// call it from a step hook.
    pub fn wait_deferred(&self, plugin: &str) -> bool {
        (self.wait_deferred)(self.ctx, plugin.into())
    }

    /// A host that only logs to stderr: for tests of plugins outside ptrain. It runs
    /// deferred jobs at once, on the calling thread.
    pub fn standalone() -> HostApi {
        extern "C" fn log(_: *const (), level: LogLevel, plugin: RStr<'_>, message: RStr<'_>) {
            eprintln!("[{level:?}] {plugin}: {message}");
        }
        extern "C" fn request_stop(_: *const (), plugin: RStr<'_>, reason: RStr<'_>) {
            eprintln!("{plugin} asked to stop: {reason}");
        }
        extern "C" fn no_reduce(_: *const (), _: TensorRef) -> RResult<(), RString> {
            RResult::ROk(())
        }
        extern "C" fn no_broadcast(_: *const (), _: TensorRef, _: u32) -> RResult<(), RString> {
            RResult::ROk(())
        }
        extern "C" fn detach(_: *const (), plugin: RStr<'_>, reason: RStr<'_>) {
            eprintln!("{plugin} detached: {reason}");
        }
        extern "C" fn defer(_: *const (), plugin: RStr<'_>, mut job: DeferredBox) {
            if let RResult::RErr(e) = job.run() {
                eprintln!("{plugin}: a deferred job failed: {e}");
            }
        }
        extern "C" fn wait_deferred(_: *const (), _: RStr<'_>) -> bool {
            true
        }
        HostApi { ctx: std::ptr::null(), log, request_stop, all_reduce_sum: no_reduce, broadcast: no_broadcast, detach, defer, wait_deferred }
    }
}
