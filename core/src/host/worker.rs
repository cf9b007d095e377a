//! A worker plugin's thread: it owns the plugin, takes queued events from a
//! bounded queue and calls the plugin with them, and reports a failure once,
//! after which it drains events without calling. Between events it calls the
//! plugin's timer, when it asked for one (a flush, an upload), so no plugin
//! needs a thread of its own for periodic work. At the end the host gives it a
//! bounded time to drain; past it the thread is abandoned (left to the process's
//! exit), so a sink that hangs never holds the process.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Condvar, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use abi_stable::std_types::RString;
use ptrain_plugin_api::{Needs, Outbox, PluginBox, Threading};

use super::{
    event::{call, Event, Queued, Reply},
    queue::{BoundedQueue, Popped, QueueItem},
    saves::SaveTracker,
    watchdog::Watched,
    HostServices,
};

impl QueueItem for Queued {
    fn droppable(&self) -> bool {
        self.0.droppable()
    }
}

/// The plugin's timer interval (`None`: no timer), asked once at load. Only a worker
/// plugin can have one: its thread makes the calls, and an inline plugin has none.
pub fn timer(plugin: &PluginBox, threading: Threading) -> Result<Option<Duration>, RString> {
    let secs = plugin.timer_secs().into_result()?;
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(format!("invalid timer interval: {secs} s (a plugin's timer_interval must be a finite duration)").into());
    }
    match (secs > 0.0, threading) {
        (false, _) => Ok(None),
        (true, Threading::Worker) => Ok(Some(Duration::from_secs_f64(secs))),
        (true, Threading::Inline) => Err("asks for a timer (timer_interval) but runs inline: only worker plugins get timer calls".into()),
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
    pub(super) failure: Mutex<Option<WorkerFailure>>,
    summary: Mutex<Option<String>>,
    pub saves: SaveTracker,
    /// Inside a call of the plugin (counts as an unhandled item if abandoned).
    busy: AtomicBool,
    /// The host gave up waiting: handle nothing more.
    abandoned: AtomicBool,
    /// When the thread returned (`None`: it has not); signalled through `exit`.
    exited: Mutex<Option<Instant>>,
    exit: Condvar,
}

/// How a worker's final drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    Done,
    /// Given up on, with this many events never handled.
    Abandoned(u64),
}

/// How long handing a resumed state to a worker busy in a call of its own (its
/// run start: set-up, not training) waits before the plugin goes without it.
const LOAD_WAIT: Duration = Duration::from_secs(5);

/// How long a plugin's first save waits for a worker busy in a call of its own when
/// it has given no state yet (a sink mid-upload at the first save would otherwise
/// resume without its state: MLflow's run id). Once, per plugin: a later save takes
/// the state it gave last, a hung sink costs this once, and the wait is counted in
/// `checkpoint_wait_s`.
const FIRST_SAVE_WAIT: Duration = Duration::from_secs(1);

/// What a worker answered a state call made on the training thread.
pub enum Now {
    Called(Result<Reply, String>),
    /// Busy in a call of its own: a save does not wait for a sink. With the state it
    /// gave at an earlier save (its step), if any.
    Busy(Option<(u64, Vec<u8>)>),
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
    /// The state it last gave for a checkpoint, and that save's step.
    last_state: Option<(u64, Vec<u8>)>,
    /// A save has waited [`FIRST_SAVE_WAIT`] for it already.
    waited_at_save: bool,
}

impl Worker {
    /// Starts the thread on `queue`; `timer`: how often it calls the plugin's
    /// `on_timer` (see [`timer`]); `watched`: where it marks each call, for the
    /// watchdog. The thread keeps `services` alive while it may call the plugin (and
    /// so the plugin its `HostApi`), even once abandoned.
    pub fn spawn(
        name: &str,
        plugin: PluginBox,
        queue: Arc<BoundedQueue<Queued>>,
        timer: Option<Duration>,
        watched: Arc<Watched>,
        services: Arc<HostServices>,
    ) -> Worker {
        let shared = Arc::new(Shared {
            plugin: Mutex::new(plugin),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            summary: Mutex::new(None),
            saves: SaveTracker::default(),
            busy: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            exited: Mutex::new(None),
            exit: Condvar::new(),
        });
        let (q, s, plugin_name) = (queue.clone(), shared.clone(), name.to_string());
        let w = watched;
        let thread = std::thread::Builder::new()
            .name(format!("ptrain-plugin-{name}"))
            .spawn(move || {
                run(&plugin_name, &q, &s, &w, timer);
                *s.exited.lock().expect("exit lock") = Some(Instant::now());
                s.exit.notify_all();
                // The plugin (in `s`, unless the host still holds it) before the
                // services it may call while it is dropped.
                drop((s, q));
                drop(services);
            })
            .expect("spawn plugin worker");
        Worker { queue, shared, thread: Some(thread), last_state: None, waited_at_save: false }
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
    /// (for the state events, whose answer the caller needs now). A save's state
    /// call never waits for a worker busy in a call of its own (a slow or hung
    /// sink must not stall the training thread): it gets [`Now::Busy`] with the state
    /// the plugin gave last, except that a plugin's first save, when it has given no
    /// state yet, waits at most [`FIRST_SAVE_WAIT`], once. Handing over a resumed state
    /// waits at most [`LOAD_WAIT`].
    pub fn call_now(&mut self, event: &Event<'_>) -> Now {
        let started = Instant::now();
        let wait = match event {
            Event::LoadState { .. } => LOAD_WAIT,
            Event::SaveState { wait, .. } if self.last_state.is_none() && !self.waited_at_save => FIRST_SAVE_WAIT.max(*wait),
            Event::SaveState { wait, .. } => *wait,
            _ => Duration::ZERO,
        };
        let result = loop {
            match self.shared.plugin.try_lock() {
                Ok(mut plugin) => break call(&mut plugin, event, Needs::NONE, &mut Outbox::new()),
                Err(std::sync::TryLockError::Poisoned(e)) => break call(&mut e.into_inner(), event, Needs::NONE, &mut Outbox::new()),
                Err(std::sync::TryLockError::WouldBlock) if started.elapsed() < wait => std::thread::sleep(Duration::from_millis(2)),
                Err(std::sync::TryLockError::WouldBlock) => {
                    self.waited_at_save |= matches!(event, Event::SaveState { .. });
                    return Now::Busy(self.last_state.clone());
                }
            }
        };
        if let (Ok(Reply::State(bytes)), Event::SaveState { step, .. }) = (&result, event) {
            self.last_state = Some((*step, bytes.clone()));
        }
        Now::Called(result)
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

    /// Waits for the saves handed over to be written, until `deadline`; returns
    /// whether they were.
    pub fn wait_saves_until(&self, deadline: Instant, interrupted: &dyn Fn() -> bool) -> bool {
        self.shared.saves.wait_idle_until(deadline, interrupted)
    }

    /// When its thread returned, if it has.
    pub fn exited_at(&self) -> Option<Instant> {
        *self.shared.exited.lock().expect("exit lock")
    }

    /// Whether the host gave up on it ([`Worker::abandon`]).
    pub fn is_abandoned(&self) -> bool {
        self.shared.abandoned.load(Ordering::SeqCst)
    }

    /// Gives up on the worker while it is inside a call (a save stuck in I/O): it
    /// handles nothing more, and the process's exit ends its thread. Returns the
    /// events it never handled, the one in progress included.
    pub fn abandon(&mut self) -> u64 {
        self.shared.abandoned.store(true, Ordering::SeqCst);
        self.queue.close();
        self.thread = None;
        self.queue.len() as u64 + u64::from(self.shared.busy.load(Ordering::SeqCst))
    }

    /// No more events: the worker drains what is queued, then returns.
    pub fn close(&self) {
        self.queue.close();
    }

    /// Waits for the worker to drain (after [`Worker::close`]) until `deadline`,
    /// or until `interrupted` says to stop waiting; then abandons it.
    pub fn drain_until(&mut self, deadline: Instant, interrupted: &dyn Fn() -> bool) -> Drain {
        let mut exited = self.shared.exited.lock().expect("exit lock");
        while exited.is_none() {
            let now = Instant::now();
            if now >= deadline || interrupted() {
                drop(exited);
                self.shared.abandoned.store(true, Ordering::SeqCst);
                // Detached: the thread may still be inside the plugin; the process's
                // exit ends it.
                self.thread = None;
                return Drain::Abandoned(self.queue.len() as u64 + u64::from(self.shared.busy.load(Ordering::SeqCst)));
            }
            // Short waits, so a signal is noticed at once.
            let wait = (deadline - now).min(Duration::from_millis(50));
            exited = self.shared.exit.wait_timeout(exited, wait).expect("exit lock").0;
        }
        drop(exited);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        Drain::Done
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.queue.close();
        // Joined only if it has returned (or is about to): never wait on a plugin.
        if self.shared.exited.lock().expect("exit lock").is_some() {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

fn run(name: &str, queue: &BoundedQueue<Queued>, shared: &Shared, watched: &Watched, timer: Option<Duration>) {
    // Workers never see step hooks, so nothing is ever emitted here.
    let mut unused = Outbox::new();
    // When the next tick is due: from the end of `on_run_start` to `on_run_end`.
    let mut next_tick: Option<Instant> = None;
    let mut step = 0;
    loop {
        // The timer is checked before every event, so a busy queue delays a tick by
        // one event at most.
        let popped = match next_tick {
            Some(due) if Instant::now() >= due => Popped::TimedOut,
            Some(due) => queue.pop_until(due),
            None => queue.pop().map_or(Popped::Closed, Popped::Item),
        };
        let event = match popped {
            Popped::Item(Queued(event)) => event,
            Popped::Closed => break,
            Popped::TimedOut => {
                if shared.abandoned.load(Ordering::SeqCst) {
                    break;
                }
                next_tick = handle(name, shared, watched, &Event::Timer { step }, &mut unused).then(|| Instant::now() + timer.unwrap_or_default());
                continue;
            }
        };
        if shared.abandoned.load(Ordering::SeqCst) {
            break;
        }
        step = event.step();
        let ok = handle(name, shared, watched, &event, &mut unused);
        match event {
            Event::RunStart(_) => next_tick = timer.filter(|_| ok).map(|every| Instant::now() + every),
            Event::RunEnd(_) => next_tick = None,
            Event::Checkpoint(_) => shared.saves.end(),
            _ => {}
        }
    }
}

/// Calls the plugin with `event` unless it has failed; false once it has.
fn handle(name: &str, shared: &Shared, watched: &Watched, event: &Event<'_>, unused: &mut Outbox) -> bool {
    if shared.failed.load(Ordering::Relaxed) {
        super::reward::answer_disabled(event, &shared.failure);
        return false;
    }
    shared.busy.store(true, Ordering::SeqCst);
    watched.begin(event.name(), event.step());
    let result = call(&mut shared.plugin.lock().expect("plugin lock"), event, Needs::NONE, unused);
    watched.end();
    shared.busy.store(false, Ordering::SeqCst);
    super::reward::answer(event, &result);
    match result {
        Ok(Reply::Summary(summary)) => *shared.summary.lock().expect("summary lock") = Some(summary),
        Ok(_) => {}
        Err(error) => {
            tracing::error!("plugin `{name}` failed in {} at step {} and was disabled: {error}", event.name(), event.step());
            shared.record(event.name(), event.step(), error);
            return false;
        }
    }
    true
}
