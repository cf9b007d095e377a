//! Deferred work: jobs inline plugins hand over (`HostApi::defer`) to run off the
//! training thread, so that no plugin starts a thread of its own. One host thread
//! (`ptrain-deferred`), started at the first job, runs them in the order they came.
//!
//! Jobs of a plugin that failed, or whose calls were given up on, still run: each
//! job was complete when handed over (a trace window already recorded), the
//! plugin's library is never unloaded, and dropping the job would lose the data.
//! At the end the host waits for what is left at most `run.shutdown_timeout_s`
//! (`PluginHost::run_end`); jobs still queued then are reported and dropped with the
//! process, and a job still running is left to it: nothing joins the thread.

use std::{
    any::Any,
    collections::{BTreeMap, HashMap},
    panic::{catch_unwind, AssertUnwindSafe},
    sync::{mpsc, Arc, Condvar, Mutex, OnceLock},
    time::{Duration, Instant},
};

use abi_stable::std_types::RResult;
use ptrain_plugin_api::DeferredBox;

/// How often a wait looks at whether a signal ended it.
const SLICE: Duration = Duration::from_millis(100);

struct Job {
    plugin: String,
    job: DeferredBox,
    /// What the job may call back into (the host's services), kept alive until it has
    /// run; dropped last.
    keep_alive: Arc<dyn Any + Send + Sync>,
}

#[derive(Default)]
struct State {
    /// Per plugin: jobs handed over, jobs run.
    counts: HashMap<String, (u64, u64)>,
    /// Jobs that returned an error or panicked: plugin, error.
    failures: Vec<(String, String)>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    ran: Condvar,
}

pub struct Deferred {
    /// Started at the first job; `None` if the thread could not be started.
    queue: OnceLock<Option<mpsc::Sender<Job>>>,
    shared: Arc<Shared>,
    /// How long a plugin's wait may last: `run.shutdown_timeout_s`.
    bound: Duration,
}

impl Deferred {
    /// `bound`: how long `HostApi::wait_deferred` may wait (`run.shutdown_timeout_s`).
    pub fn new(bound: Duration) -> Deferred {
        Deferred { queue: OnceLock::new(), shared: Arc::default(), bound }
    }

    /// Queues `job` (called on the training thread: a channel send, no wait);
    /// `keep_alive` lives until the job has run.
    pub fn submit(&self, plugin: &str, job: DeferredBox, keep_alive: Arc<dyn Any + Send + Sync>) {
        {
            let mut state = self.shared.state.lock().expect("deferred lock");
            match state.counts.get_mut(plugin) {
                Some(c) => c.0 += 1,
                None => drop(state.counts.insert(plugin.to_string(), (1, 0))),
            }
        }
        let queue = self.queue.get_or_init(|| self.start());
        let job = Job { plugin: plugin.to_string(), job, keep_alive };
        let unsent = match queue {
            Some(queue) => queue.send(job).err().map(|e| e.0),
            None => Some(job),
        };
        // No thread (it could not be started): the job runs here rather than never.
        if let Some(job) = unsent {
            run(&self.shared, job);
        }
    }

    fn start(&self) -> Option<mpsc::Sender<Job>> {
        let (send, jobs) = mpsc::channel::<Job>();
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new().name("ptrain-deferred".into()).spawn(move || {
            for job in jobs {
                run(&shared, job);
            }
        });
        match spawned {
            Ok(_) => Some(send),
            Err(e) => {
                tracing::warn!("could not start the deferred-work thread ({e}): plugins' deferred jobs run on the training thread");
                None
            }
        }
    }

    /// Waits until every job of `plugin` (every plugin's: `None`) has run, until
    /// `deadline` or until `interrupted`; returns how many were left, by plugin.
    pub fn wait(&self, plugin: Option<&str>, deadline: Instant, interrupted: &dyn Fn() -> bool) -> BTreeMap<String, u64> {
        let left = |state: &State| -> BTreeMap<String, u64> {
            let counts = state.counts.iter().filter(|(name, _)| plugin.is_none_or(|p| p == name.as_str()));
            counts.filter(|(_, (queued, ran))| queued > ran).map(|(name, (queued, ran))| (name.clone(), queued - ran)).collect()
        };
        let mut state = self.shared.state.lock().expect("deferred lock");
        loop {
            let unrun = left(&state);
            let now = Instant::now();
            if unrun.is_empty() || now >= deadline || interrupted() {
                return unrun;
            }
            state = self.shared.ran.wait_timeout(state, (deadline - now).min(SLICE)).expect("deferred lock").0;
        }
    }

    /// `HostApi::wait_deferred`: whether all of `plugin`'s jobs ran within the bound.
    pub fn wait_for(&self, plugin: &str) -> bool {
        self.wait(Some(plugin), Instant::now() + self.bound, &|| false).is_empty()
    }

    /// Jobs that failed since the last call: plugin, error.
    pub fn take_failures(&self) -> Vec<(String, String)> {
        std::mem::take(&mut self.shared.state.lock().expect("deferred lock").failures)
    }
}

/// Runs one job; an error or a panic is logged and kept for the summary.
fn run(shared: &Shared, mut job: Job) {
    // The plugin side guards its jobs (`HostApi::defer`); this catches what
    // escapes a job built another way, so the thread goes on with the next.
    let error = match catch_unwind(AssertUnwindSafe(|| job.job.run())) {
        Ok(RResult::ROk(())) => None,
        Ok(RResult::RErr(e)) => Some(e.into_string()),
        Err(_) => Some("a deferred job panicked".to_string()),
    };
    if let Some(e) = &error {
        tracing::error!("plugin `{}`: a deferred job failed: {e}", job.plugin);
    }
    drop(job.job);
    let mut state = shared.state.lock().expect("deferred lock");
    if let Some(c) = state.counts.get_mut(&job.plugin) {
        c.1 += 1;
    }
    if let Some(e) = error {
        state.failures.push((job.plugin, e));
    }
    shared.ran.notify_all();
    drop(state);
    // Last: this may drop the services, and with them this thread's queue.
    drop(job.keep_alive);
}

#[cfg(test)]
#[path = "deferred_tests.rs"]
mod tests;
