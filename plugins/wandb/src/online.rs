//! Online mode: an uploader thread that creates the run and streams history rows,
//! retrying with backoff. It is fed through a queue the plugin never waits on, so a
//! slow or dead network cannot hold up the offline file or the training loop; at
//! the end of the run it gets a bounded time to finish.

use std::{
    collections::VecDeque,
    sync::{Arc, Condvar, Mutex, MutexGuard},
    thread::JoinHandle,
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

#[derive(Default)]
struct State {
    pending: VecDeque<String>,
    summary: Option<String>,
    /// Set by `finish`: the exit code to report and when to give up.
    finish: Option<(i32, Instant)>,
    done: bool,
    run: Option<RunPath>,
    pushed: u64,
    sent: u64,
    last_error: Option<String>,
    fatal: Option<String>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

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
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Online {
    pub fn start(api: Api, meta: RunMeta) -> std::io::Result<Online> {
        let shared = Arc::new(Shared { state: Mutex::new(State::default()), changed: Condvar::new() });
        let inner = shared.clone();
        let thread = std::thread::Builder::new().name("ptrain-wandb-upload".into()).spawn(move || upload(&inner, &api, &meta))?;
        Ok(Online { shared, thread: Some(thread) })
    }

    /// Queues a history row and the summary as of that row. Never waits on the network.
    pub fn push(&self, line: String, summary: String) {
        let mut state = self.shared.lock();
        if state.done {
            return;
        }
        if state.pending.len() >= MAX_PENDING {
            state.pending.pop_front();
        }
        state.pending.push_back(line);
        state.pushed += 1;
        state.summary = Some(summary);
        self.shared.changed.notify_all();
    }

    /// Sends what is left and marks the run complete, waiting at most `timeout`.
    pub fn finish(mut self, exit_code: i32, summary: String, timeout: Duration) -> Report {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        state.summary = Some(summary);
        state.finish = Some((exit_code, deadline));
        self.shared.changed.notify_all();
        while !state.done {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            state = self.shared.changed.wait_timeout(state, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        let complete = state.done && state.fatal.is_none() && state.pending.is_empty();
        let error = if complete {
            None
        } else {
            state
                .fatal
                .clone()
                .or_else(|| state.last_error.clone().map(|e| format!("gave up after {timeout:?}: {e}")))
                .or(Some(format!("still waiting for the W&B API {timeout:?} after the run ended")))
        };
        let report = Report { complete, rows_sent: state.sent, rows_not_sent: state.pushed - state.sent, run: state.run.clone(), error };
        // An upload still blocked on the network is left behind; it holds only its own state.
        state.done = true;
        let finished = report.complete || state.fatal.is_some();
        drop(state);
        if finished {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
        report
    }
}

/// Waits out a backoff; false when the end-of-run deadline passed first. The end
/// of the run cuts a wait short: the network may be back, and time is now bounded.
fn back_off(shared: &Shared, delay: &mut Duration, error: String) -> bool {
    let mut state = shared.lock();
    state.last_error = Some(error);
    let until = Instant::now() + *delay;
    *delay = (*delay * 2).min(MAX_BACKOFF);
    let finishing = state.finish.is_some();
    loop {
        if !finishing && state.finish.is_some() {
            return true;
        }
        let now = Instant::now();
        let limit = state.finish.map_or(until, |(_, deadline)| until.min(deadline));
        if state.finish.is_some_and(|(_, deadline)| now >= deadline) {
            return false;
        }
        if now >= limit {
            return true;
        }
        state = shared.changed.wait_timeout(state, limit - now).unwrap_or_else(|p| p.into_inner()).0;
    }
}

fn give_up(shared: &Shared, fatal: Option<String>) {
    let mut state = shared.lock();
    if fatal.is_some() {
        state.fatal = fatal;
    }
    state.done = true;
    shared.changed.notify_all();
}

fn upload(shared: &Shared, api: &Api, meta: &RunMeta) {
    let mut delay = FIRST_BACKOFF;
    let (run, mut offset) = loop {
        let created = if meta.resume { api.history_line_count(meta) } else { Ok(0) }.and_then(|lines| Ok((api.upsert_run(meta)?, lines)));
        match created {
            Ok(run) => break run,
            Err(Failure::Fatal(e)) => return give_up(shared, Some(e)),
            Err(Failure::Retry(e)) => {
                if !back_off(shared, &mut delay, e) {
                    return give_up(shared, None);
                }
            }
        }
    };
    shared.lock().run = Some(run.clone());
    delay = FIRST_BACKOFF;
    let mut last_post = Instant::now();
    loop {
        let (lines, summary, exit_code) = {
            let mut state = shared.lock();
            loop {
                let due = !state.pending.is_empty() && last_post.elapsed() >= STREAM_EVERY;
                if state.finish.is_some() || due || state.done {
                    break;
                }
                let wait = if state.pending.is_empty() { STREAM_EVERY } else { STREAM_EVERY.saturating_sub(last_post.elapsed()) };
                state = shared.changed.wait_timeout(state, wait).unwrap_or_else(|p| p.into_inner()).0;
            }
            if state.done {
                return;
            }
            let n = state.pending.len().min(MAX_BATCH);
            let lines: Vec<String> = state.pending.drain(..n).collect();
            let last = state.pending.is_empty();
            (lines, state.summary.take(), state.finish.filter(|_| last).map(|(code, _)| code))
        };
        match api.file_stream(&run, offset, &lines, summary.as_deref(), exit_code) {
            Ok(()) => {
                offset += lines.len() as u64;
                delay = FIRST_BACKOFF;
                last_post = Instant::now();
                let mut state = shared.lock();
                state.sent += lines.len() as u64;
                if exit_code.is_some() {
                    state.done = true;
                    shared.changed.notify_all();
                    return;
                }
            }
            Err(failure) => {
                {
                    // Put the rows back in front, and the summary unless a newer one came.
                    let mut state = shared.lock();
                    for line in lines.into_iter().rev() {
                        state.pending.push_front(line);
                    }
                    if state.summary.is_none() {
                        state.summary = summary;
                    }
                }
                match failure {
                    Failure::Fatal(e) => return give_up(shared, Some(e)),
                    Failure::Retry(e) => {
                        if !back_off(shared, &mut delay, e) {
                            return give_up(shared, None);
                        }
                    }
                }
            }
        }
    }
}
