//! SIGINT/SIGTERM: the first asks the run to stop after the current step (an
//! emergency checkpoint, flushed sinks, exit 130/143); a second one exits at once.
//! Checkpoints are atomic, so even that leaves the previous one intact.

use std::sync::{
    atomic::{AtomicI32, Ordering},
    Arc,
};

use signal_hook::consts::{SIGINT, SIGTERM};

use crate::{
    error::{Error, Result},
    host::HostServices,
};

pub struct Signals {
    received: Arc<AtomicI32>,
    handle: signal_hook::iterator::Handle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Signals {
    pub fn install(services: &'static HostServices) -> Result<Signals> {
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).map_err(|e| Error::Other(format!("cannot handle signals: {e}")))?;
        let handle = signals.handle();
        let received = Arc::new(AtomicI32::new(0));
        let flag = received.clone();
        let thread = std::thread::Builder::new()
            .name("ptrain-signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    if flag.swap(sig, Ordering::SeqCst) != 0 {
                        eprintln!("second signal: exiting now (the last committed checkpoint is intact)");
                        std::process::exit(128 + sig);
                    }
                    eprintln!("received signal {sig}: finishing the step, then saving and exiting (again to force)");
                    services.wake();
                }
            })
            .map_err(|e| Error::Other(format!("cannot handle signals: {e}")))?;
        Ok(Signals { received, handle, thread: Some(thread) })
    }

    /// The signal received, if any.
    pub fn received(&self) -> Option<i32> {
        match self.received.load(Ordering::SeqCst) {
            0 => None,
            sig => Some(sig),
        }
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
