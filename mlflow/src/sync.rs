//! `ptrain sync mlflow <run-dir>`: sends `pending.jsonl` past what earlier syncs sent,
//! recording progress after every request, so a sync that stops halfway goes on where
//! it stopped and a second sync sends nothing.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use crate::{
    auth::{check_uri, Auth},
    client::{Client, ErrorKind, RunRef},
    item::{request_len, Item},
    send::{describe, open_run, send, with_retries, Counts},
    state::StateDir,
};

pub struct SyncSettings {
    /// Send to this server instead of the one in `run.json`.
    pub uri: Option<String>,
    /// `MLFLOW_TRACKING_URI`, used when neither `uri` nor `run.json` names an http(s) server.
    pub env_uri: Option<String>,
    pub auth: Auth,
    /// Per HTTP request.
    pub timeout: Duration,
    /// How long one request is retried on 5xx and network errors.
    pub retry: Duration,
}

#[derive(Debug)]
pub struct SyncReport {
    pub uri: String,
    /// None when there was nothing to send.
    pub run: Option<RunRef>,
    pub run_url: Option<String>,
    /// The server had no run yet (the training run never reached it) and has one now.
    pub created: bool,
    pub sent: Counts,
    /// Pending items already sent by earlier syncs, and those sent now.
    pub items_before: usize,
    pub items_sent: usize,
    /// Items the server refused for good (skipped, with a note each).
    pub items_refused: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("no MLflow state in {0} (expected run.json there or in its mlflow/ directory; the run did not use the mlflow plugin?)")]
    NoState(PathBuf),
    #[error("{0}")]
    Uri(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{message} (sent {sent} before stopping; run the sync again to go on)")]
    Server { message: String, sent: Counts },
}

impl SyncError {
    /// What the user asked for was wrong (exit 2), as opposed to a server failing (exit 1).
    pub fn is_usage(&self) -> bool {
        matches!(self, SyncError::NoState(_) | SyncError::Uri(_))
    }
}

/// Sends the pending items of `state`; `note` hears about items skipped or changed.
pub fn sync(state: &StateDir, settings: &SyncSettings, mut note: impl FnMut(&str)) -> Result<SyncReport, SyncError> {
    let io = |source| SyncError::Io { path: state.dir().to_path_buf(), source };
    let mut record = state.read_record().map_err(io)?.ok_or_else(|| SyncError::NoState(state.dir().to_path_buf()))?;
    let offset = state.synced_bytes().map_err(io)?;
    let items = state.pending_from(offset).map_err(io)?;
    let items_before = if offset > 0 { state.pending_from(0).map_err(io)?.len() - items.len() } else { 0 };
    let uri = settings
        .uri
        .clone()
        .or_else(|| Some(record.tracking_uri.clone()).filter(|u| check_uri(u).is_ok()))
        .or_else(|| settings.env_uri.clone())
        .ok_or_else(|| {
            SyncError::Uri(format!("the run logged to {:?}; pass --uri http://<server> to send to a tracking server", record.tracking_uri))
        })?;
    let uri = check_uri(&uri).map_err(SyncError::Uri)?;
    let mut report = SyncReport {
        uri: uri.clone(),
        run: None,
        run_url: None,
        created: false,
        sent: Counts::default(),
        items_before,
        items_sent: 0,
        items_refused: 0,
    };
    if items.is_empty() {
        return Ok(report);
    }
    let client = Client::new(&uri, settings.auth.clone(), settings.timeout);
    let failed = |e: crate::client::Error, sent: Counts| SyncError::Server { message: format!("{} ({})", e.message, describe(&e)), sent };
    let pause = |d: Duration| {
        std::thread::sleep(d);
        true
    };
    let (run, created) =
        with_retries(Instant::now() + settings.retry, pause, || open_run(&client, &mut record, false)).map_err(|e| failed(e, Counts::default()))?;
    if created || record.tracking_uri != uri {
        record.tracking_uri = uri.clone();
        state.write_record(&record).map_err(io)?;
    }
    report.created = created;
    report.run_url = Some(client.run_url(&run));
    let run_dir = state.run_dir();
    let mut at = 0;
    while at < items.len() {
        let n = request_len(items[at..].iter().map(|(item, _)| item));
        let group: Vec<Item> = items[at..at + n].iter().map(|(item, _)| item.clone()).collect();
        match with_retries(Instant::now() + settings.retry, pause, || send(&client, &run, &run_dir, &group)) {
            Ok((counts, notes)) => {
                report.sent.add(counts);
                report.items_sent += n;
                notes.iter().for_each(|n| note(n));
            }
            Err(e) if e.kind == ErrorKind::Rejected => {
                report.items_refused += n;
                note(&format!("skipped {n} pending item(s) the server refuses: {}", e.message));
            }
            Err(e) => return Err(failed(e, report.sent)),
        }
        state.set_synced_bytes(items[at + n - 1].1).map_err(io)?;
        at += n;
    }
    report.run = Some(run);
    Ok(report)
}
