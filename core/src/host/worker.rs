//! A worker plugin's thread: it owns the plugin, takes queued events from a
//! bounded queue and calls the plugin with them, and reports a failure once,
//! after which it drains events without calling.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Condvar, Mutex,
    },
    thread::JoinHandle,
};

use ptrain_plugin_api::{Needs, Outbox, PluginBox};

use super::{
    event::{call, Event, Queued, Reply},
    queue::{BoundedQueue, QueueItem},
};
use crate::config::OnFull;

impl QueueItem for Queued {
    fn droppable(&self) -> bool {
        self.0.droppable()
    }
}

/// Saves handed to the worker and not yet finished; the host waits on it before
/// starting the next save, so saves never overlap and none is dropped.
#[derive(Default)]
pub struct SaveTracker {
    in_flight: Mutex<u64>,
    done: Condvar,
}

impl SaveTracker {
    fn begin(&self) {
        *self.in_flight.lock().expect("tracker lock") += 1;
    }

    fn end(&self) {
        *self.in_flight.lock().expect("tracker lock") -= 1;
        self.done.notify_all();
    }

    pub fn wait_idle(&self) {
        let mut n = self.in_flight.lock().expect("tracker lock");
        while *n > 0 {
            n = self.done.wait(n).expect("tracker lock");
        }
    }
}

/// Where, when and why a plugin failed.
#[derive(Debug, Clone)]
pub struct WorkerFailure {
    pub hook: &'static str,
    pub step: u64,
    pub error: String,
}

/// State shared between the host and the worker thread.
pub struct Shared {
    plugin: Mutex<PluginBox>,
    failed: AtomicBool,
    failure: Mutex<Option<WorkerFailure>>,
    summary: Mutex<Option<String>>,
    pub saves: SaveTracker,
}

impl Shared {
    fn record(&self, hook: &'static str, step: u64, error: String) {
        *self.failure.lock().expect("failure lock") = Some(WorkerFailure { hook, step, error });
        self.failed.store(true, Ordering::Relaxed);
    }
}

pub struct Worker {
    pub queue: Arc<BoundedQueue<Queued>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    pub fn spawn(name: &str, plugin: PluginBox, capacity: usize, on_full: OnFull) -> Worker {
        let queue = Arc::new(BoundedQueue::new(capacity, on_full));
        let shared = Arc::new(Shared {
            plugin: Mutex::new(plugin),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            summary: Mutex::new(None),
            saves: SaveTracker::default(),
        });
        let (q, s, plugin_name) = (queue.clone(), shared.clone(), name.to_string());
        let thread =
            std::thread::Builder::new().name(format!("ptrain-plugin-{name}")).spawn(move || run(&plugin_name, &q, &s)).expect("spawn plugin worker");
        Worker { queue, shared, thread: Some(thread) }
    }

    /// Queues an event for the worker thread.
    pub fn send(&self, event: Queued) {
        if let Event::Checkpoint(_) = event.0 {
            self.shared.saves.begin();
        }
        if !self.queue.push(event) {
            tracing::debug!("plugin queue closed; event discarded");
        }
    }

    /// Calls the plugin on this thread, between two of the worker's own calls
    /// (for the state events, whose answer the caller needs now).
    pub fn call_now(&self, event: &Event<'_>) -> Result<Reply, String> {
        call(&mut self.shared.plugin.lock().expect("plugin lock"), event, Needs::NONE, &mut Outbox::new())
    }

    /// The failure the worker thread reported, if any.
    pub fn failure(&self) -> Option<WorkerFailure> {
        if !self.shared.failed.load(Ordering::Relaxed) {
            return None;
        }
        self.shared.failure.lock().expect("failure lock").clone()
    }

    /// `on_run_end`'s summary fragment, once the worker has handled the run's end.
    pub fn take_summary(&self) -> Option<String> {
        self.shared.summary.lock().expect("summary lock").take()
    }

    pub fn wait_saves(&self) {
        self.shared.saves.wait_idle();
    }

    /// Closes the queue and waits for the worker to finish what is queued.
    pub fn finish(&mut self) {
        self.queue.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.finish();
    }
}

fn run(name: &str, queue: &BoundedQueue<Queued>, shared: &Shared) {
    // Workers never see step hooks, so nothing is ever emitted here.
    let mut unused = Outbox::new();
    while let Some(Queued(event)) = queue.pop() {
        if !shared.failed.load(Ordering::Relaxed) {
            let result = call(&mut shared.plugin.lock().expect("plugin lock"), &event, Needs::NONE, &mut unused);
            match result {
                Ok(Reply::Summary(summary)) => *shared.summary.lock().expect("summary lock") = Some(summary),
                Ok(_) => {}
                Err(error) => {
                    tracing::error!("plugin `{name}` failed in {} and was disabled: {error}", event.name());
                    shared.record(event.name(), event.step(), error);
                }
            }
        }
        if let Event::Checkpoint(_) = event {
            shared.saves.end();
        }
    }
}
