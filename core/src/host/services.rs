//! What plugins can ask of the host through [`HostApi`]: logging, stopping the run,
//! leaving the schedule, collectives, deferred work (`deferred.rs`) and checkpoint
//! commits (`commits.rs`).
//!
//! The run owns its services through an `Arc`, and so does everything that may still
//! call a plugin (and so its `HostApi`) after the run let go: the plugin host (its
//! inline plugins), each worker plugin's thread (abandoned ones included), and each
//! deferred job until it has run. The services are dropped with the last of them,
//! not leaked once per run.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use abi_stable::std_types::{RResult, RStr, RString};
use ptrain_plugin_api::{DeferredBox, HostApi, LogLevel, TensorRef, STOP_FAILURE_PREFIX};
use tch::Tensor;

use super::{commits::CommitGates, deferred::Deferred, watchdog::Watched};
use crate::{dist::Collectives, schedule::Gate};

/// A plugin's request to end the run (`HostApi::request_stop`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopRequest {
    pub plugin: String,
    pub reason: String,
    /// Asked through `HostApi::request_failure_stop`: the run ends as a failure.
    pub failure: bool,
    /// Not asked by the plugin: the host ends the run (as a failure) because this
    /// plugin, set `critical`, failed, stalled or was abandoned (`reason` says which).
    pub critical: bool,
    /// The plugin's hook, and its step, where it failed or asked (when known).
    pub at: Option<(String, u64)>,
}

impl StopRequest {
    /// Reads the failure convention ([`STOP_FAILURE_PREFIX`]) off the reason.
    pub fn new(plugin: &str, reason: &str) -> StopRequest {
        let (reason, failure) = match reason.strip_prefix(STOP_FAILURE_PREFIX) {
            Some(rest) => (rest, true),
            None => (reason, false),
        };
        StopRequest { plugin: plugin.to_string(), reason: reason.to_string(), failure, critical: false, at: None }
    }

    /// The host's stop of a failed run for critical plugin `plugin`, which failed or
    /// stalled in `hook` at `step`; `what` went wrong ("failed in step_end at step 3: ...").
    pub fn critical(plugin: &str, hook: &str, step: u64, what: String) -> StopRequest {
        StopRequest { plugin: plugin.to_string(), reason: what, failure: true, critical: true, at: Some((hook.to_string(), step)) }
    }
}

impl std::fmt::Display for StopRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.plugin.is_empty() {
            f.write_str(&self.reason)
        } else if self.critical {
            write!(f, "critical plugin `{}` {}", self.plugin, self.reason)
        } else if self.failure {
            write!(f, "plugin `{}` stopped the run as failed: {}", self.plugin, self.reason)
        } else {
            write!(f, "plugin `{}` asked to stop: {}", self.plugin, self.reason)
        }
    }
}

pub struct HostServices {
    gate: Arc<Gate>,
    stop: AtomicBool,
    /// The first request wins.
    stop_request: Mutex<Option<StopRequest>>,
    collectives: Arc<dyn Collectives>,
    /// Plugins that asked to leave the schedule, with why, not yet applied.
    detach_requests: Mutex<Vec<(String, String)>>,
    detach_pending: AtomicBool,
    /// Inline plugins' jobs run off the training thread (`HostApi::defer`).
    pub deferred: Deferred,
    /// Whether a worker plugin may still commit a checkpoint (`HostApi::commit_checkpoint`).
    pub commits: CommitGates,
    /// The plugins' calls in progress, to say where a plugin asked to stop (weak: a
    /// critical plugin's watch holds these services).
    calls: std::sync::OnceLock<Vec<std::sync::Weak<Watched>>>,
}

impl HostServices {
    /// `shutdown`: how long a plugin's `wait_deferred` may wait (`run.shutdown_timeout_s`).
    pub fn new(gate: Arc<Gate>, collectives: Arc<dyn Collectives>, shutdown: Duration) -> Arc<HostServices> {
        Arc::new(HostServices {
            gate,
            stop: AtomicBool::new(false),
            stop_request: Mutex::new(None),
            collectives,
            detach_requests: Mutex::new(Vec::new()),
            detach_pending: AtomicBool::new(false),
            deferred: Deferred::new(shutdown),
            commits: CommitGates::default(),
            calls: std::sync::OnceLock::new(),
        })
    }

    /// The plugins' watches, set once they are loaded.
    pub(super) fn watch(&self, plugins: &[Arc<Watched>]) {
        let _ = self.calls.set(plugins.iter().map(Arc::downgrade).collect());
    }

    /// The hook and step `plugin` is in now, if it is in a call.
    fn running_call(&self, plugin: &str) -> Option<(String, u64)> {
        let watched = self.calls.get()?.iter().filter_map(std::sync::Weak::upgrade).find(|w| w.name == plugin)?;
        watched.running().map(|r| (r.hook.to_string(), r.step))
    }

    pub fn request_stop(&self, request: StopRequest) {
        self.stop_request.lock().expect("stop lock").get_or_insert(request);
        self.stop.store(true, Ordering::SeqCst);
        self.gate.lower();
    }

    /// The run's gate, which these services lower.
    pub fn gate(&self) -> Arc<Gate> {
        self.gate.clone()
    }

    /// Makes the loop look at its stop conditions on the next step.
    pub fn wake(&self) {
        self.gate.lower();
    }

    pub fn stop_requested(&self) -> Option<StopRequest> {
        if self.stop.load(Ordering::SeqCst) {
            self.stop_request.lock().expect("stop lock").clone()
        } else {
            None
        }
    }

    /// The loop applies it when it next plans a step, which lowering the gate makes
    /// the next step.
    pub fn request_detach(&self, plugin: String, reason: String) {
        self.detach_requests.lock().expect("detach lock").push((plugin, reason));
        self.detach_pending.store(true, Ordering::SeqCst);
        self.gate.lower();
    }

    /// Detach requests since the last call; one atomic load when there are none.
    pub fn take_detach_requests(&self) -> Vec<(String, String)> {
        if !self.detach_pending.load(Ordering::Relaxed) || !self.detach_pending.swap(false, Ordering::SeqCst) {
            return Vec::new();
        }
        std::mem::take(&mut *self.detach_requests.lock().expect("detach lock"))
    }

    /// The function table handed to a plugin. Its context is this object, which the
    /// caller keeps alive for as long as the plugin may call it (see the module doc).
    pub fn api(self: &Arc<Self>) -> HostApi {
        HostApi {
            ctx: Arc::as_ptr(self) as *const (),
            log,
            request_stop,
            all_reduce_sum,
            broadcast,
            detach,
            defer,
            wait_deferred,
            begin_commit,
            end_commit,
        }
    }
}

fn services<'a>(ctx: *const ()) -> &'a HostServices {
    // SAFETY: ctx is the `Arc<HostServices>` that built this HostApi (`HostServices::api`),
    // alive while a plugin can call it: whoever calls a plugin holds a strong reference.
    unsafe { &*(ctx as *const HostServices) }
}

/// One more strong reference to the services behind `ctx`, for a job that outlives the call.
fn services_arc(ctx: *const ()) -> Arc<HostServices> {
    let ptr = ctx as *const HostServices;
    // SAFETY: as in `services`: `ptr` came from `Arc::as_ptr` of an `Arc` that is alive
    // during this call, so its count may be raised and a new `Arc` made from it.
    unsafe {
        Arc::increment_strong_count(ptr);
        Arc::from_raw(ptr)
    }
}

extern "C" fn log(_ctx: *const (), level: LogLevel, plugin: RStr<'_>, message: RStr<'_>) {
    match level {
        LogLevel::Error => tracing::error!(target: "ptrain::plugin", "{plugin}: {message}"),
        LogLevel::Warn => tracing::warn!(target: "ptrain::plugin", "{plugin}: {message}"),
        LogLevel::Info => tracing::info!(target: "ptrain::plugin", "{plugin}: {message}"),
        LogLevel::Debug => tracing::debug!(target: "ptrain::plugin", "{plugin}: {message}"),
    }
}

extern "C" fn request_stop(ctx: *const (), plugin: RStr<'_>, reason: RStr<'_>) {
    let services = services(ctx);
    let mut request = StopRequest::new(plugin.as_str(), reason.as_str());
    request.at = services.running_call(plugin.as_str());
    services.request_stop(request);
}

extern "C" fn detach(ctx: *const (), plugin: RStr<'_>, reason: RStr<'_>) {
    services(ctx).request_detach(plugin.to_string(), reason.to_string());
}

extern "C" fn defer(ctx: *const (), plugin: RStr<'_>, job: DeferredBox) {
    // The job may call its HostApi: it keeps the services alive until it has run.
    let host = services_arc(ctx);
    host.deferred.submit(plugin.as_str(), job, host.clone());
}

extern "C" fn begin_commit(ctx: *const (), plugin: RStr<'_>, step: u64) -> bool {
    services(ctx).commits.begin(plugin.as_str(), step)
}

extern "C" fn end_commit(ctx: *const (), plugin: RStr<'_>, _step: u64) {
    services(ctx).commits.end(plugin.as_str())
}

extern "C" fn wait_deferred(ctx: *const (), plugin: RStr<'_>) -> bool {
    services(ctx).deferred.wait_for(plugin.as_str())
}

fn with_tensor(tensor: TensorRef, f: impl FnOnce(&mut Tensor) -> Result<(), String>) -> RResult<(), RString> {
    if tensor.is_null() {
        return RResult::RErr("null tensor".into());
    }
    // SAFETY: the plugin passes a live tensor handle for the duration of the call;
    // ManuallyDrop keeps the host from freeing the plugin's tensor.
    let mut t = std::mem::ManuallyDrop::new(unsafe { Tensor::from_ptr(tensor.as_raw() as *mut _) });
    match f(&mut t) {
        Ok(()) => RResult::ROk(()),
        Err(e) => RResult::RErr(e.into()),
    }
}

extern "C" fn all_reduce_sum(ctx: *const (), tensor: TensorRef) -> RResult<(), RString> {
    let c = &services(ctx).collectives;
    with_tensor(tensor, |t| c.all_reduce_sum(t))
}

extern "C" fn broadcast(ctx: *const (), tensor: TensorRef, root: u32) -> RResult<(), RString> {
    let c = &services(ctx).collectives;
    with_tensor(tensor, |t| c.broadcast(t, root))
}
