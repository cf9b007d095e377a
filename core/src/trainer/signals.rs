//! SIGINT/SIGTERM: the first asks the run to stop after the current step (an
//! emergency checkpoint, flushed sinks, exit 130/143); a second one exits at once.
//! Checkpoints are atomic, so even that leaves the previous one intact. Once the
//! run is only draining its plugins (every checkpoint on disk), any signal ends
//! the drain instead, so the abandoned plugins are still reported.
//!
//! While an inline plugin's hook holds the training thread, the step cannot finish
//! until it returns: the first signal's message says which plugin and hook the run
//! waits on, and the second writes the summary of the forced exit
//! ([`ForcedRecord`]) before exiting.
//!
//! While `summary.json` is being written (a thread of its own, see `summary_write`),
//! a second signal prints what the summary says on stderr and exits at once: on a
//! hung filesystem the write never returns, and nothing else would end the process.

use std::sync::{
    atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering},
    Arc, Mutex,
};

use signal_hook::consts::{SIGINT, SIGTERM};

use super::forced::ForcedRecord;
use crate::{
    error::{Error, Result},
    host::HostServices,
};

pub struct Signals {
    received: Arc<AtomicI32>,
    /// Signals received in all.
    count: Arc<AtomicU32>,
    /// The run is draining its plugins: a signal ends that, nothing else.
    draining: Arc<AtomicBool>,
    /// While `summary.json` is being written: its essentials (one line of JSON).
    writing: Arc<Mutex<Option<String>>>,
    handle: signal_hook::iterator::Handle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Signals {
    pub fn install(services: Arc<HostServices>, record: ForcedRecord) -> Result<Signals> {
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).map_err(|e| Error::Other(format!("cannot handle signals: {e}")))?;
        let handle = signals.handle();
        let received = Arc::new(AtomicI32::new(0));
        let count = Arc::new(AtomicU32::new(0));
        let draining = Arc::new(AtomicBool::new(false));
        let writing: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        let (flag, counter, drain, summary) = (received.clone(), count.clone(), draining.clone(), writing.clone());
        let thread = std::thread::Builder::new()
            .name("ptrain-signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    counter.fetch_add(1, Ordering::SeqCst);
                    if let Some(essentials) = summary.lock().ok().and_then(|s| s.clone()) {
                        during_summary_write(sig, flag.swap(sig, Ordering::SeqCst) != 0, &essentials);
                        continue;
                    }
                    if drain.load(Ordering::SeqCst) {
                        super::eprint_line(&format!("received signal {sig}: no longer waiting for plugins to finish"));
                        let _ = flag.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
                        continue;
                    }
                    let hung = record.calls.holding_training();
                    if flag.swap(sig, Ordering::SeqCst) != 0 {
                        super::eprint_line("second signal: exiting now (the last committed checkpoint is intact)");
                        // Only a hung hook's record is written, within a bound. Nothing else
                        // touches the run directory on this way out: it may be the mount a
                        // stuck save hangs on. The lock left there names this process, dead
                        // from now on: the next run takes it over.
                        if let Some(hung) = &hung {
                            record.write(sig, 128 + sig, hung);
                        }
                        std::process::exit(128 + sig);
                    }
                    match &hung {
                        Some(h) => super::eprint_line(&format!(
                            "received signal {sig}: plugin `{}` has been in its {} hook for {} at step {}; the step finishes once it \
                             returns, then saving and exiting (again to exit at once, recording the hung hook)",
                            h.plugin,
                            h.hook,
                            crate::host::seconds(h.seconds),
                            h.step
                        )),
                        None => super::eprint_line(&format!("received signal {sig}: finishing the step, then saving and exiting (again to force)")),
                    }
                    services.wake();
                }
            })
            .map_err(|e| Error::Other(format!("cannot handle signals: {e}")))?;
        Ok(Signals { received, count, draining, writing, handle, thread: Some(thread) })
    }

    /// From now until [`Signals::summary_written`], a second signal prints
    /// `essentials` and exits at once.
    pub fn writing_summary(&self, essentials: String) {
        if let Ok(mut slot) = self.writing.lock() {
            *slot = Some(essentials);
        }
    }

    pub fn summary_written(&self) {
        if let Ok(mut slot) = self.writing.lock() {
            *slot = None;
        }
    }

    /// From now on a signal ends the final drain (see the module doc); returns a
    /// test for "a signal came since this call".
    pub fn draining(&self) -> impl Fn() -> bool + '_ {
        self.draining.store(true, Ordering::SeqCst);
        let before = self.count.load(Ordering::SeqCst);
        move || self.count.load(Ordering::SeqCst) > before
    }

    /// Signals received so far, to tell later ones apart ([`Signals::since`]).
    pub fn count(&self) -> u32 {
        self.count.load(Ordering::SeqCst)
    }

    /// Whether a signal came after `count` ([`Signals::count`]).
    pub fn since(&self, count: u32) -> bool {
        self.count.load(Ordering::SeqCst) > count
    }

    /// The signal received, if any.
    pub fn received(&self) -> Option<i32> {
        match self.received.load(Ordering::SeqCst) {
            0 => None,
            sig => Some(sig),
        }
    }
}

/// A signal while `summary.json` is being written: the second of the run exits now
/// with what the summary says, the writer left where it is (the run directory may be
/// the mount it hangs on, so nothing else touches it); a first one says so.
fn during_summary_write(sig: i32, again: bool, essentials: &str) {
    if again {
        super::eprint_line("second signal: exiting now, without summary.json (its write has not returned: is the run directory's filesystem hung?)");
        super::eprint_line(&format!("summary: {essentials}"));
        std::process::exit(128 + sig);
    }
    super::eprint_line(&format!("received signal {sig} while writing summary.json: again to exit at once, its essentials printed instead"));
}

/// How long the launcher lets a rank run after its SIGTERM before killing it:
/// `ptrain launch` says so in this variable; torchrun and the rest do not, so 10 s.
pub const GRACE_ENV: &str = "PTRAIN_LAUNCH_GRACE_S";

/// The launcher's grace after SIGTERM ([`GRACE_ENV`], else 10 s).
pub fn grace() -> std::time::Duration {
    let secs = std::env::var(GRACE_ENV).ok().and_then(|v| v.parse::<f64>().ok()).filter(|s| s.is_finite() && *s > 0.0);
    std::time::Duration::from_secs_f64(secs.unwrap_or(10.0))
}

impl Drop for Signals {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
