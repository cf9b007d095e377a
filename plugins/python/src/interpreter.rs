//! The training thread's side of the interpreter: one thread runs every Python call,
//! in order. Sinks' calls are queued and never waited for; the others are waited for
//! at most `timeout_s`, after which the interpreter is abandoned: its thread may never
//! return (a module that sleeps forever), so nothing ever waits on it again and the
//! process exits without it.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use crate::{
    call::{Answer, Args, Function, Job, Returned},
    python::{self, Declared},
};

/// What both threads see: the call in progress, the first exception of a sink, the
/// sink calls dropped from a full queue.
#[derive(Default)]
struct Shared {
    running: Mutex<Option<(Function, u64, Instant)>>,
    failure: Mutex<Option<String>>,
    dropped: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct Interpreter {
    jobs: SyncSender<Job>,
    replies: SyncSender<Answer>,
    answers: Receiver<Answer>,
    shared: Arc<Shared>,
    timeout: Duration,
}

impl Interpreter {
    /// Starts the interpreter's thread, which imports `module` (found on `paths`, then
    /// the interpreter's `sys.path`); returns what the module declares.
    pub fn start(module: String, paths: Vec<PathBuf>, queue: usize, timeout: Duration) -> Result<(Interpreter, Declared), String> {
        let (jobs, pending) = sync_channel::<Job>(queue);
        let (ready, loaded) = sync_channel(1);
        let shared = Arc::new(Shared::default());
        let serving = shared.clone();
        let name = module.clone();
        std::thread::Builder::new()
            .name("ptrain-python".into())
            .spawn(move || match python::load(&name, &paths) {
                Ok((loaded, declared)) => {
                    let _ = ready.send(Ok(declared));
                    serve(&loaded, pending, &serving);
                    pyo3::Python::attach(|_| drop(loaded));
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                }
            })
            .map_err(|e| format!("cannot start the interpreter's thread: {e}"))?;
        let declared = match loaded.recv_timeout(timeout) {
            Ok(declared) => declared?,
            Err(RecvTimeoutError::Timeout) => {
                return Err(format!("importing `{module}` took more than {}s (timeout_s): abandoned", timeout.as_secs_f64()))
            }
            Err(RecvTimeoutError::Disconnected) => return Err(format!("importing `{module}` ended the interpreter's thread")),
        };
        let (replies, answers) = sync_channel(1);
        Ok((Interpreter { jobs, replies, answers, shared, timeout }, declared))
    }

    /// Sink calls dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// A sink's exception, or a call running past `timeout_s`: the plugin has failed.
    fn check(&self) -> Result<(), String> {
        if let Some(failure) = lock(&self.shared.failure).clone() {
            return Err(failure);
        }
        if let Some((function, step, started)) = *lock(&self.shared.running) {
            if started.elapsed() > self.timeout {
                return Err(format!(
                    "{} has been running since step {step} for {:.1}s (timeout_s = {}): the interpreter is abandoned",
                    function.name(),
                    started.elapsed().as_secs_f64(),
                    self.timeout.as_secs_f64()
                ));
            }
        }
        Ok(())
    }

    /// Why a call waited for gave up: it did not return, or an earlier call (a sink's)
    /// still holds the interpreter.
    fn abandoned(&self, function: Function, step: u64) -> String {
        let timeout = self.timeout.as_secs_f64();
        match *lock(&self.shared.running) {
            Some((running, since, _)) if running != function || since != step => format!(
                "{} waited {timeout}s (timeout_s) at step {step} behind {}, which has been running since step {since}: the interpreter is abandoned",
                function.name(),
                running.name()
            ),
            _ => format!("{} did not return within {timeout}s (timeout_s) at step {step}: the interpreter is abandoned", function.name()),
        }
    }

    /// Queues a sink's call; the training thread goes on at once. A full queue drops
    /// the call and counts it.
    pub fn send(&self, function: Function, step: u64, args: Args) -> Result<(), String> {
        self.check()?;
        match self.jobs.try_send(Job { function, step, args, reply: None }) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(TrySendError::Disconnected(_)) => Err("the interpreter's thread has ended".into()),
        }
    }

    /// Runs `function` and waits for its answer at most `timeout_s` (queued sink calls
    /// run first).
    pub fn call(&self, function: Function, step: u64, args: Args) -> Result<Returned, String> {
        self.check()?;
        let deadline = Instant::now() + self.timeout;
        let mut job = Job { function, step, args, reply: Some(self.replies.clone()) };
        loop {
            match self.jobs.try_send(job) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    job = back;
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(TrySendError::Full(_)) => return Err(self.abandoned(function, step)),
                Err(TrySendError::Disconnected(_)) => return Err("the interpreter's thread has ended".into()),
            }
        }
        match self.answers.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(answer) => answer.map_err(|e| format!("{} raised at step {step}: {e}", function.name())),
            Err(_) => Err(self.abandoned(function, step)),
        }
    }
}

/// The interpreter's loop: every job in order until the plugin is dropped. After a
/// sink's exception no sink is called again (the plugin has failed; the training
/// thread reports it at its next call).
fn serve(loaded: &python::Loaded, jobs: Receiver<Job>, shared: &Shared) {
    while let Ok(job) = jobs.recv() {
        let sink = job.reply.is_none();
        if sink && lock(&shared.failure).is_some() {
            continue;
        }
        *lock(&shared.running) = Some((job.function, job.step, Instant::now()));
        let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| python::run(loaded, job.function, job.args)))
            .unwrap_or_else(|_| Err("the call panicked in the plugin".into()));
        *lock(&shared.running) = None;
        match job.reply {
            Some(reply) => {
                let _ = reply.try_send(answer);
            }
            None => {
                if let Err(e) = answer {
                    let mut failure = lock(&shared.failure);
                    failure.get_or_insert_with(|| format!("{} raised at step {}: {e}", job.function.name(), job.step));
                }
            }
        }
    }
}
