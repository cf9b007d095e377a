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
#[derive(Debug, Default)]
pub struct Gate {
    next: AtomicU64,
}

impl Gate {
    pub fn new(next: u64) -> Gate {
        Gate { next: AtomicU64::new(next) }
    }

    /// The hot-path check.
    #[inline(always)]
    pub fn is_due(&self, step: u64) -> bool {
        step >= self.next.load(Ordering::Relaxed)
    }

    pub fn set(&self, next: u64) {
        self.next.store(next, Ordering::Relaxed);
    }

    /// Makes the next step look at the scheduler.
    pub fn lower(&self) {
        self.next.store(0, Ordering::Relaxed);
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
