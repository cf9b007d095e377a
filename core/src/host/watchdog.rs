//! The inline-plugin watchdog. The training thread cannot be preempted while an
//! inline plugin's hook runs, but the user must be told what it is waiting on: a
//! thread looks at the call in progress every quarter of the shortest
//! `hook_warn_s`, and warns when one has run longer than its plugin's
//! `hook_warn_s`, again at most every minute while it goes on.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// How often a warning about the same call is repeated.
const REPEAT: Duration = Duration::from_secs(60);

struct Call {
    /// Index into the plugin names.
    plugin: usize,
    hook: &'static str,
    step: u64,
    started: Instant,
    warn_after: Duration,
    warned_at: Option<Instant>,
}

struct Shared {
    names: Vec<String>,
    call: Mutex<Option<Call>>,
    stop: AtomicBool,
}

pub struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the watchdog thread for the plugins `names` (by index); `shortest`
    /// is the shortest `hook_warn_s`.
    pub fn start(names: Vec<String>, shortest: Duration) -> Watchdog {
        let shared = Arc::new(Shared { names, call: Mutex::new(None), stop: AtomicBool::new(false) });
        let watched = shared.clone();
        let period = (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(15));
        let thread = std::thread::Builder::new()
            .name("ptrain-watchdog".into())
            .spawn(move || {
                while !watched.stop.load(Ordering::Relaxed) {
                    std::thread::park_timeout(period);
                    if let Some(call) = watched.call.lock().expect("watchdog lock").as_mut() {
                        warn_if_late(&watched.names[call.plugin], call);
                    }
                }
            })
            .expect("spawn watchdog");
        Watchdog { shared, thread: Some(thread) }
    }

    /// Plugin `plugin`'s call begins (the training thread is now inside it).
    /// Allocates nothing: this is on every inline call.
    pub fn begin(&self, plugin: usize, hook: &'static str, step: u64, warn_after: Duration) {
        let call = Call { plugin, hook, step, started: Instant::now(), warn_after, warned_at: None };
        *self.shared.call.lock().expect("watchdog lock") = Some(call);
    }

    pub fn end(&self) {
        *self.shared.call.lock().expect("watchdog lock") = None;
    }
}

fn warn_if_late(name: &str, call: &mut Call) {
    let now = Instant::now();
    let running = now - call.started;
    let due = match call.warned_at {
        None => running >= call.warn_after,
        Some(last) => now - last >= REPEAT,
    };
    if due {
        tracing::warn!(
            "plugin `{}` has been in {} for {:.0}s at step {}: training waits for it (plugins.{}.hook_warn_s = {})",
            name,
            call.hook,
            running.as_secs_f64(),
            call.step,
            name,
            call.warn_after.as_secs_f64()
        );
        call.warned_at = Some(now);
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
