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
    /// [`HostApi::commit_checkpoint`]'s two halves (added in 0.6.0).
    pub begin_commit: extern "C" fn(ctx: *const (), plugin: RStr<'_>, step: u64) -> bool,
    pub end_commit: extern "C" fn(ctx: *const (), plugin: RStr<'_>, step: u64),
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

    /// Runs `commit`, the act that makes the checkpoint of `step` exist (the rename of
    /// its staged directory, and the `latest` pointer), unless the host has given this
    /// plugin's saves up (a save not finished within `finish_timeout_s`): then it
    /// returns `None` without running it, and the writer removes what it staged. The
    /// host, giving a save up, waits a moment for a commit in progress, so a given-up
    /// writer never commits after the run's summary is written: a checkpoint is on
    /// disk before the host gave up (and the summary names it), or never. Added in
    /// 0.6.0; for a plugin that writes checkpoints on its worker thread.
    pub fn commit_checkpoint<R>(&self, plugin: &str, step: u64, commit: impl FnOnce() -> R) -> Option<R> {
        if !(self.begin_commit)(self.ctx, plugin.into(), step) {
            return None;
        }
        /// Ends the commit however `commit` returns (a panic included).
        struct End<'a>(&'a HostApi, &'a str, u64);
        impl Drop for End<'_> {
            fn drop(&mut self) {
                (self.0.end_commit)(self.0.ctx, self.1.into(), self.2)
            }
        }
        let _end = End(self, plugin, step);
        Some(commit())
    }

    /// A host that only logs to stderr: for trying a plugin outside ptrain. It runs
    /// deferred jobs at once, on the calling thread. To assert what the plugin asked
    /// of the host, use [`RecordingHost`] (`testing::RecordingHost`) instead.
    pub fn standalone() -> HostApi {
        extern "C" fn log(_: *const (), level: LogLevel, plugin: RStr<'_>, message: RStr<'_>) {
            eprintln!("[{level:?}] {plugin}: {message}");
        }
        extern "C" fn request_stop(_: *const (), plugin: RStr<'_>, reason: RStr<'_>) {
            eprintln!("{plugin} asked to stop: {reason}");
        }
        extern "C" fn detach(_: *const (), plugin: RStr<'_>, reason: RStr<'_>) {
            eprintln!("{plugin} detached: {reason}");
        }
        extern "C" fn defer(_: *const (), plugin: RStr<'_>, mut job: DeferredBox) {
            if let RResult::RErr(e) = job.run() {
                eprintln!("{plugin}: a deferred job failed: {e}");
            }
        }
        HostApi {
            ctx: std::ptr::null(),
            log,
            request_stop,
            all_reduce_sum: no_reduce,
            broadcast: no_broadcast,
            detach,
            defer,
            wait_deferred: all_done,
            begin_commit: may_commit,
            end_commit: commit_ended,
        }
    }
}

/// What a plugin asked of a [`RecordingHost`], in order.
#[derive(Debug, Clone, PartialEq)]
pub enum HostCall {
    Log {
        level: LogLevel,
        plugin: String,
        message: String,
    },
    /// `request_stop` (`failure: false`) or `request_failure_stop` (`true`; the
    /// reason without the [`STOP_FAILURE_PREFIX`]).
    Stop {
        plugin: String,
        reason: String,
        failure: bool,
    },
    Detach {
        plugin: String,
        reason: String,
    },
    /// A deferred job, run at once on the calling thread: `Err` with its error (or
    /// panic message) if it failed.
    Deferred {
        plugin: String,
        result: Result<(), String>,
    },
}

/// A host for unit tests that records what the plugin asked of it (logs, stop and
/// failure-stop requests, detaches, deferred jobs), for the test to assert on; no
/// `abi_stable` needed. Collectives return at once (one process); deferred jobs run
/// at once, on the calling thread. What a plugin emits goes to the `Outbox` the test
/// hands it: read it with [`crate::testing::scalars`].
///
/// ```
/// use ptrain_plugin_api::testing::RecordingHost;
/// let host = RecordingHost::new();
/// let api = host.api(); // hand this to `Plugin::new`
/// api.request_failure_stop("budget", "token budget spent");
/// assert_eq!(host.failure_stops(), vec!["token budget spent".to_string()]);
/// assert!(host.stops().is_empty());
/// ```
#[derive(Clone, Default)]
pub struct RecordingHost {
    calls: std::sync::Arc<std::sync::Mutex<Vec<HostCall>>>,
}

impl RecordingHost {
    pub fn new() -> RecordingHost {
        RecordingHost::default()
    }

    /// The function table to hand to the plugin. It keeps the record alive for the
    /// rest of the process (a `HostApi` is `Copy` and may outlive this object: a few
    /// bytes per test), so it is never left dangling.
    pub fn api(&self) -> HostApi {
        let ctx = std::sync::Arc::into_raw(self.calls.clone()) as *const ();
        HostApi {
            ctx,
            log: rec_log,
            request_stop: rec_stop,
            all_reduce_sum: no_reduce,
            broadcast: no_broadcast,
            detach: rec_detach,
            defer: rec_defer,
            wait_deferred: all_done,
            begin_commit: may_commit,
            end_commit: commit_ended,
        }
    }

    /// Every call, in order.
    pub fn calls(&self) -> Vec<HostCall> {
        self.calls.lock().expect("recording host lock").clone()
    }

    /// The messages logged, with their level.
    pub fn logs(&self) -> Vec<(LogLevel, String)> {
        self.select(|c| match c {
            HostCall::Log { level, message, .. } => Some((*level, message.clone())),
            _ => None,
        })
    }

    /// The reasons of `request_stop` calls (a normal end: early stopping).
    pub fn stops(&self) -> Vec<String> {
        self.select(|c| match c {
            HostCall::Stop { reason, failure: false, .. } => Some(reason.clone()),
            _ => None,
        })
    }

    /// The reasons of `request_failure_stop` calls (the run ends as failed).
    pub fn failure_stops(&self) -> Vec<String> {
        self.select(|c| match c {
            HostCall::Stop { reason, failure: true, .. } => Some(reason.clone()),
            _ => None,
        })
    }

    /// The reasons of `detach` calls.
    pub fn detaches(&self) -> Vec<String> {
        self.select(|c| match c {
            HostCall::Detach { reason, .. } => Some(reason.clone()),
            _ => None,
        })
    }

    /// The results of the deferred jobs, in the order they were handed over (each has run).
    pub fn deferred(&self) -> Vec<Result<(), String>> {
        self.select(|c| match c {
            HostCall::Deferred { result, .. } => Some(result.clone()),
            _ => None,
        })
    }

    fn select<T>(&self, f: impl Fn(&HostCall) -> Option<T>) -> Vec<T> {
        self.calls().iter().filter_map(f).collect()
    }
}

fn record(ctx: *const (), call: HostCall) {
    // SAFETY: ctx came from `Arc::into_raw` in `RecordingHost::api`, whose count is
    // never given back: the record outlives every HostApi made from it.
    let calls = unsafe { &*(ctx as *const std::sync::Mutex<Vec<HostCall>>) };
    calls.lock().expect("recording host lock").push(call);
}

extern "C" fn rec_log(ctx: *const (), level: LogLevel, plugin: RStr<'_>, message: RStr<'_>) {
    record(ctx, HostCall::Log { level, plugin: plugin.to_string(), message: message.to_string() });
}

extern "C" fn rec_stop(ctx: *const (), plugin: RStr<'_>, reason: RStr<'_>) {
    let (reason, failure) = match reason.as_str().strip_prefix(STOP_FAILURE_PREFIX) {
        Some(rest) => (rest, true),
        None => (reason.as_str(), false),
    };
    record(ctx, HostCall::Stop { plugin: plugin.to_string(), reason: reason.to_string(), failure });
}

extern "C" fn rec_detach(ctx: *const (), plugin: RStr<'_>, reason: RStr<'_>) {
    record(ctx, HostCall::Detach { plugin: plugin.to_string(), reason: reason.to_string() });
}

extern "C" fn rec_defer(ctx: *const (), plugin: RStr<'_>, mut job: DeferredBox) {
    let result = job.run().into_result().map_err(RString::into_string);
    record(ctx, HostCall::Deferred { plugin: plugin.to_string(), result });
}

extern "C" fn no_reduce(_: *const (), _: TensorRef) -> RResult<(), RString> {
    RResult::ROk(())
}

extern "C" fn no_broadcast(_: *const (), _: TensorRef, _: u32) -> RResult<(), RString> {
    RResult::ROk(())
}

/// A host that never gives a save up: every commit may go ahead.
extern "C" fn may_commit(_: *const (), _: RStr<'_>, _: u64) -> bool {
    true
}

extern "C" fn commit_ended(_: *const (), _: RStr<'_>, _: u64) {}

extern "C" fn all_done(_: *const (), _: RStr<'_>) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recording_host_records_each_request_in_order() {
        let host = RecordingHost::new();
        let api = host.api();
        api.log(LogLevel::Info, "p", "hello");
        api.request_stop("p", "done");
        api.request_failure_stop("p", "broken");
        api.detach("p", "nothing to do");
        api.defer("p", || Ok(()));
        api.defer("p", || Err("no disk".into()));
        assert!(api.wait_deferred("p"));
        assert_eq!(host.logs(), vec![(LogLevel::Info, "hello".to_string())]);
        assert_eq!((host.stops(), host.failure_stops()), (vec!["done".to_string()], vec!["broken".to_string()]));
        assert_eq!(host.detaches(), vec!["nothing to do".to_string()]);
        assert_eq!(host.deferred(), vec![Ok(()), Err("no disk".to_string())]);
        assert_eq!(host.calls().len(), 6);
        drop(host);
        // The HostApi outlives the RecordingHost it came from.
        api.log(LogLevel::Debug, "p", "still fine");
    }
}
