//! Online mode: creates the run and streams history rows, retrying with backoff.
//! It has no thread of its own: the plugin's timer (called on the plugin's worker
//! thread) makes at most one request per tick when one is due, so the training
//! loop never waits on the network; a slow network holds up only this plugin's
//! queue, whose policy the host applies. At the end of the run it gets a bounded
//! time to finish.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use crate::{
    api::{Api, Failure, RunPath},
    meta::RunMeta,
};

/// Rows waiting beyond this are dropped (counted): the offline file has them all.
const MAX_PENDING: usize = 100_000;
/// Rows per request, and how often rows go out during the run.
const MAX_BATCH: usize = 1_000;
const STREAM_EVERY: Duration = Duration::from_secs(5);
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The timer interval the plugin asks for: the finest wait above (the first backoff).
pub const TICK: Duration = FIRST_BACKOFF;

/// How the upload went, for the end-of-run message and the summary.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub complete: bool,
    pub rows_sent: u64,
    /// Rows queued but not uploaded (dropped from a full queue, or left at the end).
    pub rows_not_sent: u64,
    pub run: Option<RunPath>,
    pub error: Option<String>,
}

pub struct Online {
    api: Api,
    meta: RunMeta,
    /// The run on the server and how many history lines it has.
    run: Option<(RunPath, u64)>,
    pending: VecDeque<String>,
    summary: Option<String>,
    /// No request before this: the stream's pace, or a backoff after a failure.
    next_try: Instant,
    delay: Duration,
    pushed: u64,
    sent: u64,
    last_error: Option<String>,
    fatal: Option<String>,
}

impl Online {
    pub fn start(api: Api, meta: RunMeta) -> Online {
        Online {
            api,
            meta,
            run: None,
            pending: VecDeque::new(),
            summary: None,
            next_try: Instant::now(),
            delay: FIRST_BACKOFF,
            pushed: 0,
            sent: 0,
            last_error: None,
            fatal: None,
        }
    }

    /// Queues a history row and the summary as of that row. Never waits on the network.
    pub fn push(&mut self, line: String, summary: String) {
        if self.fatal.is_some() {
            return;
        }
        if self.pending.len() >= MAX_PENDING {
            self.pending.pop_front();
        }
        self.pending.push_back(line);
        self.pushed += 1;
        self.summary = Some(summary);
    }

    /// A timer tick: creates the run or sends the rows waiting, when due.
    pub fn tick(&mut self) {
        if self.fatal.is_some() || Instant::now() < self.next_try {
            return;
        }
        if self.run.is_none() {
            self.connect();
        } else if !self.pending.is_empty() {
            self.send(None);
        }
    }

    /// One attempt at creating the run (or finding where a resumed one stopped).
    fn connect(&mut self) -> bool {
        let created = if self.meta.resume { self.api.history_line_count(&self.meta) } else { Ok(0) }
            .and_then(|lines| Ok((self.api.upsert_run(&self.meta)?, lines)));
        match created {
            Ok(run) => {
                self.run = Some(run);
                self.delay = FIRST_BACKOFF;
                // The first rows go out a stream period after the run is created.
                self.next_try = Instant::now() + STREAM_EVERY;
                true
            }
            Err(failure) => self.failed(failure),
        }
    }

    /// Sends up to a batch of rows; `exit_code` marks the run complete when these
    /// are the last. True when sent.
    fn send(&mut self, exit_code: Option<i32>) -> bool {
        let Some((run, offset)) = &self.run else { return false };
        let n = self.pending.len().min(MAX_BATCH);
        let lines: Vec<String> = self.pending.range(..n).cloned().collect();
        let exit_code = exit_code.filter(|_| n == self.pending.len());
        match self.api.file_stream(run, *offset, &lines, self.summary.as_deref(), exit_code) {
            Ok(()) => {
                self.pending.drain(..n);
                self.run = Some((run.clone(), offset + n as u64));
                self.sent += n as u64;
                self.summary = None;
                self.delay = FIRST_BACKOFF;
                self.next_try = Instant::now() + STREAM_EVERY;
                true
            }
            Err(failure) => self.failed(failure),
        }
    }

    /// Records a failed request: fatal ones end the upload, others back off. False.
    fn failed(&mut self, failure: Failure) -> bool {
        match failure {
            Failure::Fatal(e) => self.fatal = Some(e),
            Failure::Retry(e) => {
                self.last_error = Some(e);
                self.next_try = Instant::now() + self.delay;
                self.delay = (self.delay * 2).min(MAX_BACKOFF);
            }
        }
        false
    }

    /// Sends what is left and marks the run complete, taking at most `timeout`
    /// (each request is cut off at the deadline too).
    pub fn finish(mut self, exit_code: i32, summary: String, timeout: Duration) -> Report {
        let deadline = Instant::now() + timeout;
        self.api.set_deadline(Some(deadline));
        self.summary = Some(summary);
        // The end of the run cuts a backoff short: the network may be back.
        self.next_try = Instant::now();
        let mut complete = false;
        while self.fatal.is_none() && !complete {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if now < self.next_try {
                std::thread::sleep(self.next_try.min(deadline) - now);
                continue;
            }
            // Within the end's time bound, what is left goes out at once: only a
            // failure's backoff waits.
            let done = if self.run.is_none() {
                self.connect()
            } else {
                // The exit code goes with the last rows: then the run is complete.
                let last = self.pending.len() <= MAX_BATCH;
                let sent = self.send(Some(exit_code));
                complete = sent && last;
                sent
            };
            if done {
                self.next_try = Instant::now();
            }
        }
        let error = if complete {
            None
        } else {
            self.fatal
                .clone()
                .or_else(|| self.last_error.clone().map(|e| format!("gave up after {timeout:?}: {e}")))
                .or(Some(format!("still waiting for the W&B API {timeout:?} after the run ended")))
        };
        Report { complete, rows_sent: self.sent, rows_not_sent: self.pushed - self.sent, run: self.run.map(|(run, _)| run), error }
    }
}
