//! Online mode: creates the run, uploads its logged files (tables) and streams
//! history rows, retrying with backoff.
//! It has no thread of its own: the plugin's timer (called on the plugin's worker
//! thread) makes at most one request per tick when one is due, so the training
//! loop never waits on the network; a slow network holds up only this plugin's
//! queue, whose policy the host applies. At the end of the run it gets a bounded
//! time to finish.
//!
//! A logged file goes up as the official client uploads it: `CreateRunFiles` for
//! its upload URL, then a PUT of its bytes, read from the local copy (which is only
//! ever read), each a request of its own; the next `file_stream` names it among the
//! files `uploaded`. Files go before rows, so a row's table is usually there when the
//! row arrives. A file the server refuses (HTTP 4xx) is given up and counted; the
//! rows go on.

use std::{
    collections::VecDeque,
    path::PathBuf,
    time::{Duration, Instant},
};

use crate::{
    api::{Api, Failure, RunPath, UploadUrl},
    meta::RunMeta,
};

/// Rows waiting beyond this are dropped (counted): the offline file has them all.
const MAX_PENDING: usize = 100_000;
/// Files waiting beyond this are dropped (counted): the local copy has them all.
const MAX_PENDING_FILES: usize = 1_000;
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
    pub files_sent: u64,
    /// Files queued but not uploaded (refused, dropped from a full queue, or left).
    pub files_not_sent: u64,
    pub run: Option<RunPath>,
    pub error: Option<String>,
}

/// A file of the run waiting for its upload.
struct PendingFile {
    /// Its path under the run's files, which is its name on the server.
    name: String,
    /// The local copy's file.
    local: PathBuf,
    /// Where to PUT it, once `CreateRunFiles` said.
    upload: Option<UploadUrl>,
}

pub struct Online {
    api: Api,
    meta: RunMeta,
    /// The run on the server and how many history lines it has.
    run: Option<(RunPath, u64)>,
    pending: VecDeque<String>,
    files: VecDeque<PendingFile>,
    /// Files uploaded that no `file_stream` has named yet.
    uploaded: Vec<String>,
    summary: Option<String>,
    /// No request before this: the stream's pace, or a backoff after a failure.
    next_try: Instant,
    delay: Duration,
    pushed: u64,
    sent: u64,
    files_pushed: u64,
    files_sent: u64,
    /// Why the last file given up was.
    file_error: Option<String>,
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
            files: VecDeque::new(),
            uploaded: Vec::new(),
            summary: None,
            next_try: Instant::now(),
            delay: FIRST_BACKOFF,
            pushed: 0,
            sent: 0,
            files_pushed: 0,
            files_sent: 0,
            file_error: None,
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

    /// Queues the upload of the run's file `name` (its path under the run's files),
    /// whose bytes are in `local`. Never waits on the network.
    pub fn push_file(&mut self, name: String, local: PathBuf) {
        if self.fatal.is_some() {
            return;
        }
        if self.files.len() >= MAX_PENDING_FILES {
            self.files.pop_front();
        }
        self.files.push_back(PendingFile { name, local, upload: None });
        self.files_pushed += 1;
    }

    /// A timer tick: creates the run, or takes the next step of a file's upload, or
    /// sends the rows waiting, when due.
    pub fn tick(&mut self) {
        if self.fatal.is_some() || Instant::now() < self.next_try {
            return;
        }
        if self.run.is_none() {
            self.connect();
        } else if !self.files.is_empty() {
            self.upload_file();
        } else if !self.pending.is_empty() || !self.uploaded.is_empty() {
            self.send(None);
        }
    }

    /// One request of the first file's upload: its URL, or the PUT of its bytes.
    /// True when the next request is due at once (this one went through, or the file
    /// was given up); false after a failure worth retrying, which backs off.
    fn upload_file(&mut self) -> bool {
        let (Some((run, _)), Some(file)) = (&self.run, self.files.front_mut()) else { return false };
        let result = match &file.upload {
            None => self.api.create_run_file(run, &file.name).map(Some),
            Some(url) => std::fs::read(&file.local)
                .map_err(|e| Failure::Fatal(format!("cannot read {}: {e}", file.local.display())))
                .and_then(|bytes| self.api.put_file(url, &bytes))
                .map(|()| None),
        };
        match result {
            Ok(Some(url)) => file.upload = Some(url),
            Ok(None) => {
                let done = self.files.pop_front().expect("the file just sent");
                self.uploaded.push(done.name);
                self.files_sent += 1;
            }
            Err(Failure::Fatal(e)) => {
                // This file is refused (or gone); the rows and the other files go on.
                let given_up = self.files.pop_front().expect("the file tried");
                self.file_error = Some(format!("{}: {e}", given_up.name));
            }
            Err(retry) => {
                // A fresh URL on the next try: a signed one may have expired.
                file.upload = None;
                return self.failed(retry);
            }
        }
        self.delay = FIRST_BACKOFF;
        self.next_try = Instant::now();
        true
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
        match self.api.file_stream(run, *offset, &lines, self.summary.as_deref(), &self.uploaded, exit_code) {
            Ok(()) => {
                self.pending.drain(..n);
                self.uploaded.clear();
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
            } else if !self.files.is_empty() {
                self.upload_file()
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
        let files_not_sent = self.files_pushed - self.files_sent;
        let error = if complete {
            self.file_error.clone().or_else(|| (files_not_sent > 0).then(|| format!("{files_not_sent} files dropped from a full queue")))
        } else {
            self.fatal
                .clone()
                .or_else(|| self.last_error.clone().map(|e| format!("gave up after {timeout:?}: {e}")))
                .or(Some(format!("still waiting for the W&B API {timeout:?} after the run ended")))
        };
        Report {
            complete: complete && files_not_sent == 0,
            rows_sent: self.sent,
            rows_not_sent: self.pushed - self.sent,
            files_sent: self.files_sent,
            files_not_sent,
            run: self.run.map(|(run, _)| run),
            error,
        }
    }
}
