//! The plugin watchdog. A plugin's call cannot be preempted, but the user must be
//! told what the run waits on: one thread looks at every plugin's call in progress
//! (inline plugins' on the training thread, worker plugins' on their own) every
//! quarter of the shortest `hook_warn_s`, and warns when one has run longer than its
//! plugin's `hook_warn_s`, again at most every minute while it goes on. An inline
//! call holds training; a worker's holds its queue (training goes on, metrics may be
//! dropped, and the end of the run waits for it at most `finish_timeout_s`).
//!
//! Each call that ran longer than `hook_warn_s` is a stall, kept per plugin (the
//! longest, and how many) for `summary.json`'s `plugin_stalls`.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use serde::Serialize;

use super::{HostServices, StopRequest};

/// How often a warning about the same call is repeated, and how often a plugin's
/// stalled calls are warned about at most (those between are counted in the next).
const REPEAT: Duration = Duration::from_secs(60);

/// Seconds as the summary holds them, to the precision a stall under a second needs.
pub fn seconds(s: f64) -> String {
    match s {
        s if s < 1.0 => format!("{s:.3}s"),
        s if s < 10.0 => format!("{s:.2}s"),
        s => format!("{s:.1}s"),
    }
}

/// When a plugin's stalls were last warned about, and how many came since unsaid.
#[derive(Default)]
struct Warned {
    last: Option<Instant>,
    unsaid: u64,
}

/// A call in progress.
struct Call {
    hook: &'static str,
    step: u64,
    started: Instant,
    warned_at: Option<Instant>,
}

/// A plugin's calls that ran longer than its `hook_warn_s`: the longest, and how many.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Stall {
    pub hook: &'static str,
    pub step: u64,
    pub seconds: f64,
    pub count: u64,
}

/// A call in progress, as the signal handler and the summary of a forced exit tell it.
#[derive(Debug, Clone, PartialEq)]
pub struct Running {
    pub plugin: String,
    pub hook: &'static str,
    pub step: u64,
    pub seconds: f64,
}

/// One plugin, watched: its call in progress and its stalls. The thread that calls
/// the plugin marks each call (`begin`, `end`): a lock and a clock read, no allocation.
pub struct Watched {
    pub name: String,
    /// `hook_warn_s`.
    warn_after: Duration,
    /// A worker's queue length, for the warning (`None`: an inline plugin, whose
    /// calls hold training).
    queued: Option<Box<dyn Fn() -> usize + Send + Sync>>,
    /// A critical plugin's: where its first stall ends the run (as a failure).
    critical: Option<Arc<HostServices>>,
    call: Mutex<Option<Call>>,
    stall: Mutex<Option<Stall>>,
    warned: Mutex<Warned>,
}

impl Watched {
    pub fn new(
        name: &str,
        warn_after: Duration,
        queued: Option<Box<dyn Fn() -> usize + Send + Sync>>,
        critical: Option<Arc<HostServices>>,
    ) -> Arc<Watched> {
        Arc::new(Watched {
            name: name.to_string(),
            warn_after,
            queued,
            critical,
            call: Mutex::new(None),
            stall: Mutex::new(None),
            warned: Mutex::default(),
        })
    }

    pub fn begin(&self, hook: &'static str, step: u64) {
        *self.call.lock().expect("watchdog lock") = Some(Call { hook, step, started: Instant::now(), warned_at: None });
    }

    pub fn end(&self) {
        let Some(call) = self.call.lock().expect("watchdog lock").take() else { return };
        let ran = call.started.elapsed();
        if ran >= self.warn_after {
            let mut stall = self.stall.lock().expect("watchdog lock");
            let count = stall.as_ref().map_or(0, |s| s.count) + 1;
            let longest = stall.as_ref().filter(|s| s.seconds >= ran.as_secs_f64()).cloned();
            *stall = Some(match longest {
                Some(s) => Stall { count, ..s },
                None => Stall { hook: call.hook, step: call.step, seconds: ran.as_secs_f64(), count },
            });
        }
    }

    /// The call in progress, if any.
    pub fn running(&self) -> Option<Running> {
        let call = self.call.lock().expect("watchdog lock");
        call.as_ref().map(|c| Running { plugin: self.name.clone(), hook: c.hook, step: c.step, seconds: c.started.elapsed().as_secs_f64() })
    }

    /// Its stalls, the call in progress counted if it has run past `hook_warn_s`.
    pub fn stall(&self) -> Option<Stall> {
        let mut stall = self.stall.lock().expect("watchdog lock").clone();
        if let Some(now) = self.running().filter(|r| r.seconds >= self.warn_after.as_secs_f64()) {
            let count = stall.as_ref().map_or(0, |s| s.count) + 1;
            stall = Some(match stall.filter(|s| s.seconds >= now.seconds) {
                Some(s) => Stall { count, ..s },
                None => Stall { hook: now.hook, step: now.step, seconds: now.seconds, count },
            });
        }
        stall
    }

    fn warn_if_late(&self) {
        let mut guard = self.call.lock().expect("watchdog lock");
        let Some(call) = guard.as_mut() else { return };
        let now = Instant::now();
        let running = now - call.started;
        let due = match call.warned_at {
            None => running >= self.warn_after,
            Some(last) => now - last >= REPEAT,
        };
        if !due {
            return;
        }
        let first = call.warned_at.is_none();
        call.warned_at = Some(now);
        let (name, hook, step, secs) = (&self.name, call.hook, call.step, seconds(running.as_secs_f64()));
        let setting = format!("plugins.{name}.hook_warn_s = {}", self.warn_after.as_secs_f64());
        if let Some(services) = self.critical.as_ref().filter(|_| first) {
            // Training stops at its next step: at once for a worker; for an inline
            // plugin once its hook returns (the training thread is inside it).
            tracing::error!("critical plugin `{name}` stalled in {hook} at step {step} ({setting}): the run stops as failed");
            services.request_stop(StopRequest::critical(
                name,
                hook,
                step,
                format!("stalled in {hook} at step {step} for more than {}s", self.warn_after.as_secs_f64()),
            ));
        }
        // One warning per plugin per REPEAT: a sink slow at every batch would otherwise
        // warn at every batch. The calls left unsaid are counted in the next.
        let mut warned = self.warned.lock().expect("watchdog lock");
        if first && warned.last.is_some_and(|last| now - last < REPEAT) {
            warned.unsaid += 1;
            return;
        }
        let more = match std::mem::take(&mut warned.unsaid) {
            0 => String::new(),
            n => format!("; {n} more call(s) ran past plugins.{name}.hook_warn_s since the last warning"),
        };
        warned.last = Some(now);
        match &self.queued {
            None => tracing::warn!("plugin `{name}` has been in {hook} for {secs} at step {step}: training waits for it ({setting}){more}"),
            Some(queued) => tracing::warn!(
                "plugin `{name}` has been in {hook} for {secs} at step {step}, {} event(s) waiting in its queue: training goes on \
                 without it, the end of the run waits for it at most plugins.{name}.finish_timeout_s ({setting}){more}",
                queued()
            ),
        }
    }
}

/// Every plugin's calls, as another thread (the signal handler's) reads them.
#[derive(Clone, Default)]
pub struct Calls {
    /// Each plugin here, and whether it runs inline (on the training thread).
    plugins: Vec<(Arc<Watched>, bool)>,
}

impl Calls {
    pub(super) fn new(plugins: Vec<(Arc<Watched>, bool)>) -> Calls {
        Calls { plugins }
    }

    /// The inline plugin's call holding the training thread now, if any.
    pub fn holding_training(&self) -> Option<Running> {
        self.plugins.iter().filter(|(_, inline)| *inline).find_map(|(w, _)| w.running())
    }

    /// Each plugin's stalls (see [`Watched::stall`]).
    pub fn stalls(&self) -> std::collections::BTreeMap<String, Stall> {
        self.plugins.iter().filter_map(|(w, _)| Some((w.name.clone(), w.stall()?))).collect()
    }
}

struct Shared {
    plugins: Vec<Arc<Watched>>,
    stop: AtomicBool,
}

pub struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the watchdog thread for `plugins` (none: no thread).
    pub fn start(plugins: Vec<Arc<Watched>>) -> Option<Watchdog> {
        let shortest = plugins.iter().map(|p| p.warn_after).min()?;
        let shared = Arc::new(Shared { plugins, stop: AtomicBool::new(false) });
        let watched = shared.clone();
        let period = (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(15));
        let thread = std::thread::Builder::new()
            .name("ptrain-watchdog".into())
            .spawn(move || {
                while !watched.stop.load(Ordering::Relaxed) {
                    std::thread::park_timeout(period);
                    for plugin in &watched.plugins {
                        plugin.warn_if_late();
                    }
                }
            })
            .expect("spawn watchdog");
        Some(Watchdog { shared, thread: Some(thread) })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}
