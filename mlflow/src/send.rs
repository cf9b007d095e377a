//! Sending items to a run, with the retry policy the plugin and `ptrain sync mlflow`
//! share: 5xx and network errors are retried with exponential backoff until a
//! deadline, anything else is answered at once.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::{
    client::{Client, Error, ErrorKind, Result, RunRef},
    item::{Item, KeyValue, MetricPoint, RunStatus},
    state::RunRecord,
};

pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
pub const MAX_BACKOFF: Duration = Duration::from_secs(8);

/// Runs `attempt` until it succeeds, fails for good, or `deadline` passes;
/// `pause(d)` waits `d` between attempts and may answer false to stop early.
pub fn with_retries<T>(deadline: Instant, mut pause: impl FnMut(Duration) -> bool, mut attempt: impl FnMut() -> Result<T>) -> Result<T> {
    let mut delay = FIRST_BACKOFF;
    loop {
        match attempt() {
            Err(e) if e.is_transient() => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || !pause(delay.min(left)) {
                    return Err(e);
                }
                delay = (delay * 2).min(MAX_BACKOFF);
            }
            other => return other,
        }
    }
}

/// What reached the server.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub metrics: u64,
    pub params: u64,
    pub tags: u64,
    pub statuses: u64,
    pub artifacts: u64,
}

impl Counts {
    pub fn add(&mut self, other: Counts) {
        self.metrics += other.metrics;
        self.params += other.params;
        self.tags += other.tags;
        self.statuses += other.statuses;
        self.artifacts += other.artifacts;
    }

    pub fn is_empty(&self) -> bool {
        *self == Counts::default()
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} metric values, {} params, {} tags, {} status updates, {} artifacts",
            self.metrics, self.params, self.tags, self.statuses, self.artifacts
        )
    }
}

/// The run of `record`, created on the server when it has no id yet (`record` then
/// gets it). `reopen` sets an existing run back to RUNNING (a resumed training run).
/// Answers whether the run was created now.
pub fn open_run(client: &Client, record: &mut RunRecord, reopen: bool) -> Result<(RunRef, bool)> {
    if let Some(run_id) = record.run_id.clone() {
        if reopen {
            client.update_run(&run_id, RunStatus::Running, None)?;
        }
        let run = match (&record.experiment_id, &record.artifact_uri) {
            (Some(experiment_id), Some(artifact_uri)) => RunRef { run_id, experiment_id: experiment_id.clone(), artifact_uri: artifact_uri.clone() },
            _ => client.get_run(&run_id)?.run,
        };
        record.experiment_id = Some(run.experiment_id.clone());
        record.artifact_uri = Some(run.artifact_uri.clone());
        return Ok((run, false));
    }
    let experiment_id = client.experiment_id(&record.experiment_name)?;
    let run = client.create_run(&experiment_id, &record.run_name, record.start_time)?;
    record.run_id = Some(run.run_id.clone());
    record.experiment_id = Some(run.experiment_id.clone());
    record.artifact_uri = Some(run.artifact_uri.clone());
    Ok((run, true))
}

/// Sends `items`, which [`crate::item::request_len`] grouped into one request, to `run`.
/// Notes are things the user should hear about that did not stop the request: params
/// the run already has with another value (MLflow never changes a param; the first
/// value stays), an artifact whose file is gone.
pub fn send(client: &Client, run: &RunRef, run_dir: &Path, items: &[Item]) -> Result<(Counts, Vec<String>)> {
    let mut counts = Counts::default();
    let mut notes = Vec::new();
    let (mut metrics, mut params, mut tags) = (Vec::<MetricPoint>::new(), Vec::<KeyValue>::new(), Vec::<KeyValue>::new());
    for item in items {
        match item {
            Item::Metrics(m) => metrics.extend_from_slice(m),
            Item::Params(p) => params.extend_from_slice(p),
            Item::Tags(t) => tags.extend_from_slice(t),
            Item::Status { status, end_time } => {
                client.update_run(&run.run_id, *status, *end_time)?;
                counts.statuses += 1;
            }
            Item::Artifact { path } => {
                let file = run_dir.join(path);
                match std::fs::read(&file) {
                    Ok(data) => {
                        let name = Path::new(path).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.clone());
                        client.upload_artifact(&run.artifact_uri, &name, &data)?;
                        counts.artifacts += 1;
                    }
                    Err(e) => notes.push(format!("artifact {} not uploaded: {e}", file.display())),
                }
            }
        }
    }
    if metrics.is_empty() && params.is_empty() && tags.is_empty() {
        return Ok((counts, notes));
    }
    match client.log_batch(&run.run_id, &metrics, &params, &tags) {
        Err(e) if e.kind == ErrorKind::Rejected && !params.is_empty() && e.message.contains("Changing param values is not allowed") => {
            let existing = client.get_run(&run.run_id)?.params;
            let (new, known): (Vec<KeyValue>, Vec<KeyValue>) = params.into_iter().partition(|p| !existing.contains_key(&p.key));
            let changed: Vec<String> = known
                .iter()
                .filter(|p| existing.get(&p.key) != Some(&p.value))
                .map(|p| format!("{}: {} -> {}", p.key, existing[&p.key], p.value))
                .collect();
            if !changed.is_empty() {
                notes.push(format!(
                    "{} params differ from the values run {} already has, which MLflow keeps ({})",
                    changed.len(),
                    run.run_id,
                    changed.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
                ));
            }
            client.log_batch(&run.run_id, &metrics, &new, &tags)?;
            params = new;
        }
        other => other?,
    }
    counts.metrics += metrics.len() as u64;
    counts.params += params.len() as u64;
    counts.tags += tags.len() as u64;
    Ok((counts, notes))
}

/// A short name for why a request failed, for messages.
pub fn describe(e: &Error) -> &'static str {
    match e.kind {
        ErrorKind::Unreachable => "unreachable",
        ErrorKind::Server => "server error",
        ErrorKind::Auth => "credentials refused",
        ErrorKind::NotFound => "not found",
        ErrorKind::AlreadyExists => "already exists",
        ErrorKind::Rejected => "rejected",
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn transient() -> Error {
        Error::new(ErrorKind::Server, "HTTP 503")
    }

    #[test]
    fn transient_failures_are_retried_until_the_deadline_with_growing_pauses() {
        let pauses = std::cell::RefCell::new(Vec::new());
        let attempts = Cell::new(0);
        let out: Result<()> = with_retries(
            Instant::now() + Duration::from_secs(3600),
            |d| {
                pauses.borrow_mut().push(d);
                pauses.borrow().len() < 6
            },
            || {
                attempts.set(attempts.get() + 1);
                Err(transient())
            },
        );
        assert_eq!(out.unwrap_err().kind, ErrorKind::Server);
        assert_eq!(attempts.get(), 6, "stopped when pause said so");
        let secs: Vec<f64> = pauses.borrow().iter().map(Duration::as_secs_f64).collect();
        assert_eq!(secs, vec![0.5, 1.0, 2.0, 4.0, 8.0, 8.0]);
    }

    #[test]
    fn permanent_failures_and_successes_return_at_once() {
        let attempts = Cell::new(0);
        let out: Result<u32> = with_retries(
            Instant::now() + Duration::from_secs(3600),
            |_| panic!("no pause for a refusal"),
            || {
                attempts.set(attempts.get() + 1);
                Err(Error::new(ErrorKind::Auth, "HTTP 401"))
            },
        );
        assert_eq!((out.unwrap_err().kind, attempts.get()), (ErrorKind::Auth, 1));
        let calls = Cell::new(0);
        let out = with_retries(
            Instant::now() + Duration::from_secs(3600),
            |_| true,
            || {
                calls.set(calls.get() + 1);
                if calls.get() < 3 {
                    Err(transient())
                } else {
                    Ok(7)
                }
            },
        );
        assert_eq!(out.unwrap(), 7);
    }

    #[test]
    fn a_passed_deadline_means_one_attempt() {
        let attempts = Cell::new(0);
        let out: Result<()> = with_retries(
            Instant::now(),
            |_| panic!("no pause past the deadline"),
            || {
                attempts.set(attempts.get() + 1);
                Err(transient())
            },
        );
        assert!(out.is_err());
        assert_eq!(attempts.get(), 1);
    }
}
