//! The thread that talks to the tracking server. The plugin queues items and never
//! waits on the network: the thread opens the run, sends what is queued (metrics at
//! most every `flush` seconds, each request retried for at most `retry` seconds on
//! 5xx and network errors), and when the server stays away it appends items to
//! `pending.jsonl` instead, trying the server again every `reconnect` seconds. At the
//! end of the run it gets a bounded time; whatever is left then goes to the file too.

use std::{
    collections::VecDeque,
    path::PathBuf,
    sync::{Arc, Condvar, Mutex, MutexGuard},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use ptrain_mlflow::{
    client::{Client, Error, ErrorKind, Result, RunRef},
    item::{request_len, Item, MAX_METRICS_PER_BATCH},
    send::{describe, open_run, send, with_retries, Counts},
    state::{PendingWriter, RunRecord, StateDir},
};
use ptrain_plugin_api::{HostApi, LogLevel};

/// Metric values waiting in memory beyond this go to pending.jsonl at once.
const MAX_QUEUED: usize = 100_000;

pub struct Timing {
    pub retry: Duration,
    pub flush: Duration,
    pub reconnect: Duration,
}

/// What the thread needs besides the queue.
pub struct Context {
    /// None when the URI is not a tracking server: everything goes to pending.jsonl.
    pub client: Option<Client>,
    pub record: RunRecord,
    pub state: StateDir,
    /// Set a known run back to RUNNING first (a resumed training run).
    pub reopen: bool,
    pub timing: Timing,
    pub host: HostApi,
}

struct State {
    queue: VecDeque<Item>,
    queued: usize,
    /// Items being sent; written to pending.jsonl if the end of the run cannot wait for them.
    in_flight: Vec<Item>,
    finish: Option<Instant>,
    /// The end of the run stopped waiting: the thread must not touch anything again.
    abandoned: bool,
    done: bool,
    online: bool,
    run_id: Option<String>,
    /// Wrong credentials, or pending.jsonl cannot be written: the plugin reports it and is disabled.
    fatal: Option<String>,
    sent: Counts,
    pending_items: u64,
    refused: u64,
    pending: PendingWriter,
}

impl State {
    /// Appends `items` to pending.jsonl; a file that cannot be written is fatal.
    fn spill(&mut self, items: impl IntoIterator<Item = Item>) {
        let items: Vec<Item> = items.into_iter().collect();
        if items.is_empty() || self.fatal.is_some() {
            return;
        }
        match self.pending.append(&items) {
            Ok(()) => self.pending_items += items.len() as u64,
            Err(e) => self.fatal = Some(format!("cannot write {}: {e}", self.pending.path().display())),
        }
    }

    fn spill_queue(&mut self) {
        let items: Vec<Item> = self.queue.drain(..).collect();
        self.queued = 0;
        self.spill(items);
    }
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>, limit: Option<Instant>) -> MutexGuard<'a, State> {
        match limit {
            Some(at) => self.changed.wait_timeout(state, at.saturating_duration_since(Instant::now())).unwrap_or_else(|p| p.into_inner()).0,
            None => self.changed.wait(state).unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Waits `d` between retries; false when the end of the run's deadline passed or
    /// it stopped waiting.
    fn pause(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        let mut state = self.lock();
        loop {
            let now = Instant::now();
            if state.abandoned || state.finish.is_some_and(|f| now >= f) {
                return false;
            }
            if now >= until {
                return true;
            }
            let limit = state.finish.map_or(until, |f| f.min(until));
            state = self.wait(state, Some(limit));
        }
    }
}

/// How the upload went, for the end-of-run message and summary.json.
#[derive(Debug, Clone)]
pub struct Report {
    pub run_id: Option<String>,
    pub online: bool,
    pub sent: Counts,
    /// Items appended to pending.jsonl during this run.
    pub pending_items: u64,
    pub refused: u64,
    pub fatal: Option<String>,
    /// The end of the run stopped waiting for a request still under way.
    pub gave_up: bool,
}

pub struct Uploader {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Uploader {
    pub fn start(context: Context, first: Vec<Item>) -> std::io::Result<Uploader> {
        let queued = first.iter().map(Item::entries).sum();
        let state = State {
            queue: first.into(),
            queued,
            in_flight: Vec::new(),
            finish: None,
            abandoned: false,
            done: false,
            online: false,
            run_id: context.record.run_id.clone(),
            fatal: None,
            sent: Counts::default(),
            pending_items: 0,
            refused: 0,
            pending: context.state.pending_writer(),
        };
        let shared = Arc::new(Shared { state: Mutex::new(state), changed: Condvar::new() });
        let inner = shared.clone();
        let thread = std::thread::Builder::new().name("ptrain-mlflow-upload".into()).spawn(move || Thread::new(context).run(&inner))?;
        Ok(Uploader { shared, thread: Some(thread) })
    }

    /// Queues items. Never waits on the network.
    pub fn push(&self, items: Vec<Item>) {
        let mut state = self.shared.lock();
        if state.done || state.abandoned || state.fatal.is_some() {
            return;
        }
        for item in items {
            state.queued += item.entries();
            state.queue.push_back(item);
        }
        while state.queued > MAX_QUEUED {
            let Some(oldest) = state.queue.pop_front() else { break };
            state.queued -= oldest.entries();
            state.spill([oldest]);
        }
        self.shared.changed.notify_all();
    }

    pub fn fatal(&self) -> Option<String> {
        self.shared.lock().fatal.clone()
    }

    pub fn run_id(&self) -> Option<String> {
        self.shared.lock().run_id.clone()
    }

    /// Sends what is queued, waiting at most `timeout`; what is not sent by then is
    /// in pending.jsonl when this returns.
    pub fn finish(mut self, timeout: Duration) -> Report {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        state.finish = Some(deadline);
        self.shared.changed.notify_all();
        while !state.done && Instant::now() < deadline {
            state = self.shared.wait(state, Some(deadline));
        }
        let gave_up = !state.done;
        if gave_up {
            // A request still under way may or may not arrive: write it too. Sending a
            // metric value twice stores it once (MLflow keys values by key, step,
            // timestamp and value), and the other items are idempotent.
            state.abandoned = true;
            let in_flight = std::mem::take(&mut state.in_flight);
            state.spill(in_flight);
            state.spill_queue();
            self.shared.changed.notify_all();
        }
        let report = Report {
            run_id: state.run_id.clone(),
            online: state.online && !gave_up,
            sent: state.sent,
            pending_items: state.pending_items,
            refused: state.refused,
            fatal: state.fatal.clone(),
            gave_up,
        };
        drop(state);
        if !gave_up {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
        report
    }
}

impl Drop for Uploader {
    /// Dropped without `finish` (the plugin failed): keep what is queued in the file.
    fn drop(&mut self) {
        if self.thread.is_some() {
            let mut state = self.shared.lock();
            if !state.done && !state.abandoned {
                state.abandoned = true;
                let in_flight = std::mem::take(&mut state.in_flight);
                state.spill(in_flight);
                state.spill_queue();
                self.shared.changed.notify_all();
            }
        }
    }
}

enum Link {
    /// The run is not open on the server yet.
    Connecting,
    Online(RunRef),
    /// Items go to pending.jsonl; the server is tried again at `retry_at` (never when None).
    Offline {
        retry_at: Option<Instant>,
    },
    /// 401/403, or pending.jsonl cannot be written.
    Disabled,
}

enum Action {
    Connect,
    Send(Vec<Item>),
}

struct Thread {
    context: Context,
    run_dir: PathBuf,
    link: Link,
    last_send: Option<Instant>,
    /// Whether the server was reached before (for the message when it comes back).
    was_online: bool,
    warned_refusal: bool,
    /// The end of the run tries an offline server once more.
    tried_at_finish: bool,
}

impl Thread {
    fn new(context: Context) -> Thread {
        let link = if context.client.is_some() { Link::Connecting } else { Link::Offline { retry_at: None } };
        let run_dir = context.state.run_dir();
        Thread { context, run_dir, link, last_send: None, was_online: false, warned_refusal: false, tried_at_finish: false }
    }

    fn log(&self, level: LogLevel, message: &str) {
        self.context.host.log(level, "mlflow", message);
    }

    fn run(mut self, shared: &Shared) {
        while let Some(action) = self.next(shared) {
            match action {
                Action::Connect => self.connect(shared),
                Action::Send(items) => self.send(shared, items),
            }
        }
    }

    /// Waits for something to do; None when the thread is done.
    fn next(&mut self, shared: &Shared) -> Option<Action> {
        let mut state = shared.lock();
        loop {
            if state.abandoned || state.done {
                return None;
            }
            if state.fatal.is_some() {
                self.link = Link::Disabled;
            }
            let finishing = state.finish.is_some();
            let mut limit = None;
            match &self.link {
                Link::Disabled => {
                    state.queue.clear();
                    state.queued = 0;
                    if finishing {
                        return self.done(shared, state);
                    }
                }
                Link::Connecting => return Some(Action::Connect),
                Link::Offline { retry_at } => {
                    let retry_at = *retry_at;
                    let at_finish = finishing && retry_at.is_some() && !self.tried_at_finish;
                    if retry_at.is_some_and(|t| Instant::now() >= t) || at_finish {
                        self.tried_at_finish |= finishing;
                        return Some(Action::Connect);
                    }
                    state.spill_queue();
                    if finishing {
                        return self.done(shared, state);
                    }
                    limit = retry_at;
                }
                Link::Online(_) => {
                    if state.queue.is_empty() {
                        if finishing {
                            return self.done(shared, state);
                        }
                    } else {
                        let next_flush = self.last_send.map(|t| t + self.context.timing.flush);
                        let metrics_first = matches!(state.queue.front(), Some(Item::Metrics(_)));
                        let due =
                            finishing || !metrics_first || state.queued >= MAX_METRICS_PER_BATCH || next_flush.is_none_or(|t| Instant::now() >= t);
                        if due {
                            let n = request_len(&state.queue);
                            let items: Vec<Item> = state.queue.drain(..n).collect();
                            state.queued -= items.iter().map(Item::entries).sum::<usize>();
                            state.in_flight = items.clone();
                            return Some(Action::Send(items));
                        }
                        limit = next_flush;
                    }
                }
            }
            state = shared.wait(state, limit);
        }
    }

    fn done(&self, shared: &Shared, mut state: MutexGuard<'_, State>) -> Option<Action> {
        state.done = true;
        shared.changed.notify_all();
        None
    }

    /// The deadline for one request's retries.
    fn deadline(&self, shared: &Shared) -> Instant {
        let end = Instant::now() + self.context.timing.retry;
        shared.lock().finish.map_or(end, |f| f.min(end))
    }

    fn connect(&mut self, shared: &Shared) {
        let offline = matches!(self.link, Link::Offline { .. });
        // Retries only on the first attempt: later ones are the periodic reconnects.
        let deadline = if offline { Instant::now() } else { self.deadline(shared) };
        let Some(client) = &self.context.client else { return };
        let (record, reopen) = (&mut self.context.record, self.context.reopen);
        let opened = with_retries(deadline, |d| shared.pause(d), || open(client, record, reopen));
        let mut state = shared.lock();
        if state.abandoned {
            return;
        }
        match opened {
            Ok(run) => {
                self.context.reopen = false;
                if let Err(e) = self.context.state.write_record(&self.context.record) {
                    self.log(LogLevel::Warn, &format!("cannot write {}/run.json: {e}", self.context.state.dir().display()));
                }
                state.run_id = Some(run.run_id.clone());
                state.online = true;
                if offline && self.was_online {
                    self.log(
                        LogLevel::Info,
                        &format!("{} answers again; earlier items stay in {} for `ptrain sync mlflow`", client.uri(), state.pending.path().display()),
                    );
                }
                self.was_online = true;
                self.link = Link::Online(run);
            }
            Err(e) if e.kind == ErrorKind::NotFound && self.context.record.run_id.is_some() => {
                let id = self.context.record.run_id.take().unwrap_or_default();
                self.context.reopen = false;
                self.log(LogLevel::Warn, &format!("run {id} is not on {} (deleted?): starting a new MLflow run", client.uri()));
                state.run_id = None;
            }
            Err(e) => {
                let what = format!("cannot open the MLflow run on {}", client.uri());
                drop(state);
                self.fail(shared, e, &what, Vec::new());
            }
        }
    }

    fn send(&mut self, shared: &Shared, items: Vec<Item>) {
        let Link::Online(run) = &self.link else { return };
        let Some(client) = &self.context.client else { return };
        let deadline = self.deadline(shared);
        let result = with_retries(deadline, |d| shared.pause(d), || send(client, run, &self.run_dir, &items));
        let mut state = shared.lock();
        if state.abandoned {
            return;
        }
        state.in_flight.clear();
        self.last_send = Some(Instant::now());
        match result {
            Ok((counts, notes)) => {
                state.sent.add(counts);
                drop(state);
                // Params a resumed run changed (MLflow keeps the first value), a missing file.
                for note in notes {
                    self.log(LogLevel::Info, &note);
                }
            }
            Err(e) if e.kind == ErrorKind::Rejected => {
                state.refused += items.iter().map(Item::entries).sum::<usize>() as u64;
                if !self.warned_refusal {
                    self.warned_refusal = true;
                    drop(state);
                    self.log(
                        LogLevel::Warn,
                        &format!("skipped items the server refuses (later ones are only counted as `refused` in summary.json): {}", e.message),
                    );
                }
            }
            Err(e) => {
                drop(state);
                let what = format!("cannot send to {}", client.uri());
                self.fail(shared, e, &what, items);
            }
        }
    }

    /// After a request failed for good: credentials refused disable the plugin; a
    /// server that is away sends everything to pending.jsonl until it answers again.
    fn fail(&mut self, shared: &Shared, e: Error, what: &str, items: Vec<Item>) {
        let mut state = shared.lock();
        state.online = false;
        if e.kind == ErrorKind::Auth {
            // Reported once, by the host, when the plugin answers its next call with it.
            state.fatal = Some(e.message);
            self.link = Link::Disabled;
            shared.changed.notify_all();
            return;
        }
        state.spill(items);
        state.spill_queue();
        let retry_at = e.is_transient().then(|| Instant::now() + self.context.timing.reconnect);
        let pending = state.pending.path().display().to_string();
        drop(state);
        if !matches!(self.link, Link::Offline { .. }) {
            let then = match retry_at {
                Some(_) => format!("trying again every {:.0} s", self.context.timing.reconnect.as_secs_f64()),
                None => "not trying again in this run".to_string(),
            };
            self.log(
                LogLevel::Warn,
                &format!(
                    "{what} ({}: {}); logging to {pending}, {then}; `ptrain sync mlflow {}` sends what is left",
                    describe(&e),
                    e.message,
                    self.run_dir.display()
                ),
            );
        }
        self.link = Link::Offline { retry_at };
    }
}

/// Opens the run of `record`: a known run is looked up (or set back to RUNNING when
/// `reopen`), an unknown one created.
fn open(client: &Client, record: &mut RunRecord, reopen: bool) -> Result<RunRef> {
    if let (Some(id), false) = (record.run_id.clone(), reopen) {
        let run = client.get_run(&id)?.run;
        record.experiment_id = Some(run.experiment_id.clone());
        record.artifact_uri = Some(run.artifact_uri.clone());
        return Ok(run);
    }
    open_run(client, record, reopen).map(|(run, _)| run)
}
