//! What talks to the tracking server. It has no thread of its own: the plugin's
//! timer (called on the plugin's worker thread) makes at most one request per tick
//! when one is due, so the training loop never waits on the network; a slow server
//! holds up only this plugin's queue, whose policy the host applies. It opens the
//! run, sends what is queued (metrics at most every `flush` seconds), retries a
//! request that fails with a 5xx or a network error for at most `retry` seconds
//! (backing off between ticks, never sleeping in one), and when the server stays
//! away it appends items to `pending.jsonl` instead, trying the server again every
//! `reconnect` seconds. At the end of the run it gets a bounded time, every request
//! cut off at that deadline; whatever is left then goes to the file too.

use std::{
    collections::VecDeque,
    path::PathBuf,
    time::{Duration, Instant},
};

use ptrain_mlflow::{
    client::{Client, Error, ErrorKind, Result, RunRef},
    item::{request_len, Item, MAX_METRICS_PER_BATCH},
    send::{describe, open_run, send, Counts, FIRST_BACKOFF, MAX_BACKOFF},
    state::{PendingWriter, RunRecord, StateDir},
};
use ptrain_plugin_api::{HostApi, LogLevel};

/// Metric values waiting in memory beyond this go to pending.jsonl at once.
const MAX_QUEUED: usize = 100_000;
/// The finest tick asked for, whatever `flush` says.
const MIN_TICK: Duration = Duration::from_millis(50);

pub struct Timing {
    pub retry: Duration,
    pub flush: Duration,
    pub reconnect: Duration,
}

/// The timer interval the plugin asks for: the finest wait the uploader has (the
/// first retry backoff, or the flush period when shorter).
pub fn tick_interval(flush: Duration) -> Duration {
    flush.min(FIRST_BACKOFF).max(MIN_TICK)
}

/// What the uploader needs besides the queue.
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
    /// The end of the run stopped waiting with items still queued.
    pub gave_up: bool,
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

/// What is due now.
enum Next {
    Connect,
    /// The first `n` queued items, as one request.
    Send(usize),
    /// Nothing before this (None: until something is queued).
    Wait(Option<Instant>),
    /// The end of the run has nothing left to do.
    Done,
}

/// A request failing with transient errors: it is tried again at `next` until `until`.
struct Retrying {
    until: Instant,
    next: Instant,
    delay: Duration,
}

pub struct Uploader {
    context: Context,
    run_dir: PathBuf,
    link: Link,
    queue: VecDeque<Item>,
    /// Metric values (and other items, one each) in `queue`.
    queued: usize,
    retrying: Option<Retrying>,
    last_send: Option<Instant>,
    /// The end of the run: nothing is sent after it.
    deadline: Option<Instant>,
    run_id: Option<String>,
    /// Wrong credentials, or pending.jsonl cannot be written: the plugin reports it and is disabled.
    fatal: Option<String>,
    sent: Counts,
    pending_items: u64,
    refused: u64,
    pending: PendingWriter,
    /// Whether the server was reached before (for the message when it comes back).
    was_online: bool,
    warned_refusal: bool,
    /// The end of the run tries an offline server once more.
    tried_at_finish: bool,
}

impl Uploader {
    pub fn start(context: Context, first: Vec<Item>) -> Uploader {
        let link = if context.client.is_some() { Link::Connecting } else { Link::Offline { retry_at: None } };
        Uploader {
            run_dir: context.state.run_dir(),
            run_id: context.record.run_id.clone(),
            pending: context.state.pending_writer(),
            context,
            link,
            queued: first.iter().map(Item::entries).sum(),
            queue: first.into(),
            retrying: None,
            last_send: None,
            deadline: None,
            fatal: None,
            sent: Counts::default(),
            pending_items: 0,
            refused: 0,
            was_online: false,
            warned_refusal: false,
            tried_at_finish: false,
        }
    }

    fn log(&self, level: LogLevel, message: &str) {
        self.context.host.log(level, "mlflow", message);
    }

    /// Queues items. Never waits on the network.
    pub fn push(&mut self, items: Vec<Item>) {
        if self.fatal.is_some() {
            return;
        }
        for item in items {
            self.queued += item.entries();
            self.queue.push_back(item);
        }
        while self.queued > MAX_QUEUED {
            let Some(oldest) = self.queue.pop_front() else { break };
            self.queued -= oldest.entries();
            self.spill([oldest]);
        }
    }

    pub fn fatal(&self) -> Option<&str> {
        self.fatal.as_deref()
    }

    pub fn run_id(&self) -> Option<String> {
        self.run_id.clone()
    }

    /// A timer tick: opens the run, sends a request or tries an offline server
    /// again, when one is due; at most one request.
    pub fn tick(&mut self) {
        match self.next(false) {
            Next::Connect => self.connect(),
            Next::Send(n) => self.send(n),
            Next::Wait(_) | Next::Done => {}
        }
    }

    /// Sends what is queued, taking at most `timeout` (each request is cut off at the
    /// deadline too); what is not sent by then is in pending.jsonl when this returns.
    pub fn finish(mut self, timeout: Duration) -> Report {
        let deadline = Instant::now() + timeout;
        self.deadline = Some(deadline);
        if let Some(client) = &mut self.context.client {
            client.set_deadline(Some(deadline));
        }
        // The end of the run cuts a backoff short: the server may be back.
        if let Some(r) = &mut self.retrying {
            r.next = Instant::now();
        }
        let mut done = false;
        while Instant::now() < deadline {
            match self.next(true) {
                Next::Connect => self.connect(),
                Next::Send(n) => self.send(n),
                Next::Wait(Some(until)) => std::thread::sleep(until.min(deadline).saturating_duration_since(Instant::now())),
                Next::Wait(None) => break,
                Next::Done => {
                    done = true;
                    break;
                }
            }
        }
        // A request cut off at the deadline may or may not have arrived: its items are
        // still queued and go to the file too. Sending a metric value twice stores it
        // once (MLflow keys values by key, step, timestamp and value), and the other
        // items are idempotent.
        let gave_up = !done && !self.queue.is_empty();
        self.spill_queue();
        Report {
            run_id: self.run_id.clone(),
            online: matches!(self.link, Link::Online(_)) && !gave_up,
            sent: self.sent,
            pending_items: self.pending_items,
            refused: self.refused,
            fatal: self.fatal.take(),
            gave_up,
        }
    }

    /// What is due now; `finishing`: the end of the run, which sends at once what
    /// is queued and tries an offline server once more.
    fn next(&mut self, finishing: bool) -> Next {
        if self.fatal.is_some() {
            self.link = Link::Disabled;
        }
        let now = Instant::now();
        if let Some(r) = self.retrying.as_ref().filter(|r| now < r.next) {
            return Next::Wait(Some(r.next));
        }
        let waiting = if finishing { Next::Done } else { Next::Wait(None) };
        match &self.link {
            Link::Disabled => {
                self.queue.clear();
                self.queued = 0;
                waiting
            }
            Link::Connecting => Next::Connect,
            Link::Offline { retry_at } => {
                let retry_at = *retry_at;
                let at_finish = finishing && retry_at.is_some() && !self.tried_at_finish;
                if retry_at.is_some_and(|t| now >= t) || at_finish {
                    self.tried_at_finish |= finishing;
                    return Next::Connect;
                }
                self.spill_queue();
                if finishing {
                    Next::Done
                } else {
                    Next::Wait(retry_at)
                }
            }
            Link::Online(_) if self.queue.is_empty() => waiting,
            Link::Online(_) => {
                let next_flush = self.last_send.map(|t| t + self.context.timing.flush);
                let metrics_first = matches!(self.queue.front(), Some(Item::Metrics(_)));
                let due = finishing || !metrics_first || self.queued >= MAX_METRICS_PER_BATCH || next_flush.is_none_or(|t| now >= t);
                if due {
                    Next::Send(request_len(&self.queue))
                } else {
                    Next::Wait(next_flush)
                }
            }
        }
    }

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

    fn take(&mut self, n: usize) -> Vec<Item> {
        let items: Vec<Item> = self.queue.drain(..n).collect();
        self.queued -= items.iter().map(Item::entries).sum::<usize>();
        items
    }

    /// After a failed attempt: true when the request is given up (not transient, or
    /// retried for `retry`), false when it waits for a later tick. `retry`: whether
    /// this request retries at all (the periodic reconnects do not).
    fn gives_up(&mut self, e: &Error, retry: bool) -> bool {
        let now = Instant::now();
        let budget = if retry { self.context.timing.retry } else { Duration::ZERO };
        let r = self.retrying.get_or_insert(Retrying { until: now + budget, next: now, delay: FIRST_BACKOFF });
        let until = self.deadline.map_or(r.until, |d| d.min(r.until));
        if !e.is_transient() || now >= until {
            self.retrying = None;
            return true;
        }
        r.next = now + r.delay.min(until - now);
        r.delay = (r.delay * 2).min(MAX_BACKOFF);
        false
    }

    /// The end of the run's deadline has passed: what failed stays queued, for the file.
    fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    fn connect(&mut self) {
        let offline = matches!(self.link, Link::Offline { .. });
        let Some(client) = &self.context.client else { return };
        let opened = open(client, &mut self.context.record, self.context.reopen);
        match opened {
            Ok(run) => {
                self.retrying = None;
                self.context.reopen = false;
                if let Err(e) = self.context.state.write_record(&self.context.record) {
                    self.log(LogLevel::Warn, &format!("cannot write {}/run.json: {e}", self.context.state.dir().display()));
                }
                self.run_id = Some(run.run_id.clone());
                if offline && self.was_online {
                    let message =
                        format!("{} answers again; earlier items stay in {} for `ptrain sync mlflow`", client.uri(), self.pending.path().display());
                    self.log(LogLevel::Info, &message);
                }
                self.was_online = true;
                self.link = Link::Online(run);
            }
            Err(e) if e.kind == ErrorKind::NotFound && self.context.record.run_id.is_some() => {
                self.retrying = None;
                let id = self.context.record.run_id.take().unwrap_or_default();
                self.context.reopen = false;
                self.log(LogLevel::Warn, &format!("run {id} is not on {} (deleted?): starting a new MLflow run", client.uri()));
                self.run_id = None;
            }
            Err(e) => {
                let what = format!("cannot open the MLflow run on {}", client.uri());
                if self.past_deadline() || !self.gives_up(&e, !offline) {
                    return;
                }
                self.fail(e, &what, Vec::new());
            }
        }
    }

    /// Sends the first `n` queued items; they leave the queue once the server took or
    /// refused them, or the request is given up.
    fn send(&mut self, n: usize) {
        let Link::Online(run) = &self.link else { return };
        let Some(client) = &self.context.client else { return };
        let result = send(client, run, &self.run_dir, &self.queue.make_contiguous()[..n]);
        self.last_send = Some(Instant::now());
        match result {
            Ok((counts, notes)) => {
                self.retrying = None;
                self.take(n);
                self.sent.add(counts);
                // Params a resumed run changed (MLflow keeps the first value), a missing file.
                for note in notes {
                    self.log(LogLevel::Info, &note);
                }
            }
            Err(e) if e.kind == ErrorKind::Rejected => {
                self.retrying = None;
                let items = self.take(n);
                self.refused += items.iter().map(Item::entries).sum::<usize>() as u64;
                if !self.warned_refusal {
                    self.warned_refusal = true;
                    let message =
                        format!("skipped items the server refuses (later ones are only counted as `refused` in summary.json): {}", e.message);
                    self.log(LogLevel::Warn, &message);
                }
            }
            Err(e) => {
                let what = format!("cannot send to {}", client.uri());
                if self.past_deadline() || !self.gives_up(&e, true) {
                    return;
                }
                let items = self.take(n);
                self.fail(e, &what, items);
            }
        }
    }

    /// After a request failed for good: credentials refused disable the plugin; a
    /// server that is away sends everything to pending.jsonl until it answers again.
    fn fail(&mut self, e: Error, what: &str, items: Vec<Item>) {
        if e.kind == ErrorKind::Auth {
            // Reported once, by the host, when the plugin answers its next call with it.
            self.fatal = Some(e.message);
            self.link = Link::Disabled;
            return;
        }
        self.spill(items);
        self.spill_queue();
        let retry_at = e.is_transient().then(|| Instant::now() + self.context.timing.reconnect);
        if !matches!(self.link, Link::Offline { .. }) {
            let then = match retry_at {
                Some(_) => format!("trying again every {:.0} s", self.context.timing.reconnect.as_secs_f64()),
                None => "not trying again in this run".to_string(),
            };
            let message = format!(
                "{what} ({}: {}); logging to {}, {then}; `ptrain sync mlflow {}` sends what is left",
                describe(&e),
                e.message,
                self.pending.path().display(),
                self.run_dir.display()
            );
            self.log(LogLevel::Warn, &message);
        }
        self.link = Link::Offline { retry_at };
    }
}

impl Drop for Uploader {
    /// Dropped without `finish` (the plugin failed): keep what is queued in the file.
    fn drop(&mut self) {
        if !matches!(self.link, Link::Disabled) {
            self.spill_queue();
        }
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
