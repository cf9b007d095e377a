//! The step gate and the ticker that lowers it for time-based cadences.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

/// The next step at which anything may be due. Lowered (to 0) by other threads to
/// force a look at the next step.
///
/// A lowering must never be lost to the loop raising the gate again after a plan:
/// `lower` marks a pending request before it lowers, the loop clears the mark when
/// it opens the gate (before it looks at stop requests), and `set` lowers again
/// when a request came in meanwhile. So a request made during step `s` is looked
/// at by step `s + 1`, not at the next step something happens to be due.
#[derive(Debug, Default)]
pub struct Gate {
    next: AtomicU64,
    pending: AtomicBool,
}

impl Gate {
    pub fn new(next: u64) -> Gate {
        Gate { next: AtomicU64::new(next), pending: AtomicBool::new(false) }
    }

    /// The hot-path check.
    #[inline(always)]
    pub fn is_due(&self, step: u64) -> bool {
        step >= self.next.load(Ordering::Relaxed)
    }

    /// Called by the loop when the gate is open, before it looks at what other
    /// threads asked for: requests made from now on keep the gate lowered.
    pub fn open(&self) {
        self.pending.store(false, Ordering::SeqCst);
    }

    /// Raises (or lowers) the gate to `next`, unless a request came in since the
    /// gate was opened. Sequentially consistent: either this load sees the
    /// request's mark, or the request's own store of 0 comes after this store.
    pub fn set(&self, next: u64) {
        self.next.store(next, Ordering::SeqCst);
        if self.pending.load(Ordering::SeqCst) {
            self.next.store(0, Ordering::SeqCst);
        }
    }

    /// Makes the next step look at the scheduler.
    pub fn lower(&self) {
        self.pending.store(true, Ordering::SeqCst);
        self.next.store(0, Ordering::SeqCst);
    }
}

/// Lowers the gate every `period` so time cadences are checked about that often.
pub struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    pub fn start(gate: Arc<Gate>, period: Duration) -> Ticker {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ptrain-ticker".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::park_timeout(period);
                    gate.lower();
                }
            })
            .expect("spawn ticker");
        Ticker { stop, thread: Some(thread) }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    /// Another thread lowers the gate as fast as it can while the loop raises it
    /// far ahead after each plan: every request is served by the step after the
    /// one during which it was made, never left waiting for the raised gate.
    #[test]
    fn no_lowering_is_lost_to_a_raise() {
        const REQUESTS: u64 = 2000;
        const FAR: u64 = 1_000_000;
        let gate = Arc::new(Gate::new(u64::MAX));
        // The step the loop is in; the last request made; the last one served, and
        // at which step; requests served later than the next step.
        let step_now = Arc::new(AtomicU64::new(0));
        let asked = Arc::new(AtomicU64::new(0));
        let served = Arc::new(AtomicU64::new(0));
        let served_at = Arc::new(AtomicU64::new(0));
        let late = Arc::new(AtomicU64::new(0));
        let requester = {
            let (gate, step_now, asked, served, served_at, late) =
                (gate.clone(), step_now.clone(), asked.clone(), served.clone(), served_at.clone(), late.clone());
            std::thread::spawn(move || {
                for id in 1..=REQUESTS {
                    asked.store(id, Ordering::SeqCst);
                    gate.lower();
                    // The request is made by now, during step `made` or earlier.
                    let made = step_now.load(Ordering::SeqCst);
                    while served.load(Ordering::SeqCst) < id {
                        std::hint::spin_loop();
                    }
                    if served_at.load(Ordering::SeqCst) > made + 1 {
                        late.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        };
        let mut step = 0u64;
        while served.load(Ordering::SeqCst) < REQUESTS {
            step += 1;
            step_now.store(step, Ordering::SeqCst);
            if gate.is_due(step) {
                gate.open();
                let id = asked.load(Ordering::SeqCst);
                if id > served.load(Ordering::SeqCst) {
                    served_at.store(step, Ordering::SeqCst);
                    served.store(id, Ordering::SeqCst);
                }
                // The plan: nothing due for a long time.
                gate.set(step + FAR);
            }
        }
        requester.join().unwrap();
        assert_eq!(late.load(Ordering::SeqCst), 0, "requests waited for the raised gate instead of the next step");
    }
}
