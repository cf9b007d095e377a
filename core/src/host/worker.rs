//! A worker plugin's thread: it owns the plugin, takes events from a bounded queue,
//! and reports a failure once, after which it drains events without calling.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Condvar, Mutex,
    },
    thread::JoinHandle,
};

use abi_stable::std_types::RResult;
use ptrain_plugin_api::{CheckpointPayload, MetricBatch, PluginBox};

use super::{
    queue::{BoundedQueue, QueueItem},
    run_data::{RunData, RunEndData},
};
use crate::config::OnFull;

pub enum WorkerEvent {
    RunStart(Arc<RunData>),
    Metrics(Arc<MetricBatch>),
    Checkpoint(Box<CheckpointPayload>),
    RunEnd(RunEndData),
}

impl WorkerEvent {
    /// The step the event belongs to, so a failure is reported at the step that failed.
    fn step(&self) -> u64 {
        match self {
            WorkerEvent::RunStart(run) => run.start_step,
            WorkerEvent::Metrics(batch) => batch.step,
            WorkerEvent::Checkpoint(payload) => payload.step,
            WorkerEvent::RunEnd(end) => end.step,
        }
    }

    fn hook(&self) -> &'static str {
        match self {
            WorkerEvent::RunStart(_) => "run_start",
            WorkerEvent::Metrics(_) => "metrics",
            WorkerEvent::Checkpoint(_) => "checkpoint",
            WorkerEvent::RunEnd(_) => "run_end",
        }
    }
}

impl QueueItem for WorkerEvent {
    fn droppable(&self) -> bool {
        matches!(self, WorkerEvent::Metrics(_))
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

/// State shared between the host and the worker thread.
pub struct Shared {
    pub plugin: Mutex<PluginBox>,
    pub failed: AtomicBool,
    /// Hook, error and step of the failure.
    pub failure: Mutex<Option<(String, String, u64)>>,
    pub summary: Mutex<Option<String>>,
    pub saves: SaveTracker,
}

pub struct Worker {
    pub queue: Arc<BoundedQueue<WorkerEvent>>,
    pub shared: Arc<Shared>,
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

    pub fn send(&self, event: WorkerEvent) {
        if let WorkerEvent::Checkpoint(_) = event {
            self.shared.saves.begin();
        }
        if !self.queue.push(event) {
            tracing::debug!("plugin queue closed; event discarded");
        }
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

fn run(name: &str, queue: &BoundedQueue<WorkerEvent>, shared: &Shared) {
    while let Some(event) = queue.pop() {
        let is_checkpoint = matches!(event, WorkerEvent::Checkpoint(_));
        if !shared.failed.load(Ordering::Relaxed) {
            let hook = event.hook();
            let mut plugin = shared.plugin.lock().expect("plugin lock");
            let result = match &event {
                WorkerEvent::RunStart(run) => run.with_view(|info| plugin.on_run_start(info)),
                WorkerEvent::Metrics(batch) => plugin.on_metrics(batch),
                WorkerEvent::Checkpoint(payload) => plugin.on_checkpoint(payload),
                WorkerEvent::RunEnd(end) => end.with_view(|end| match plugin.on_run_end(end) {
                    RResult::ROk(summary) => {
                        *shared.summary.lock().expect("summary lock") = Some(summary.into_string());
                        RResult::ROk(())
                    }
                    RResult::RErr(e) => RResult::RErr(e),
                }),
            };
            if let RResult::RErr(message) = result {
                tracing::error!("plugin `{name}` failed in {hook} and was disabled: {message}");
                *shared.failure.lock().expect("failure lock") = Some((hook.to_string(), message.into_string(), event.step()));
                shared.failed.store(true, Ordering::Relaxed);
            }
        }
        if is_checkpoint {
            shared.saves.end();
        }
    }
}
