//! Writing `summary.json` from a thread of its own. On a hung filesystem (a frozen
//! mount, an NFS server gone) the write may never return; the main thread waits
//! for it, and a second signal meanwhile prints what the summary says and exits at
//! once ([`Signals::writing_summary`]), leaving the writer blocked in the kernel.

use std::{path::Path, sync::mpsc};

use super::{failure::RunError, signals::Signals, summary::Summary};
use crate::error::Error;

/// Fills the summary's `parts` (from the summary at `path` when the run resumed)
/// and, when `writes` (rank 0), writes it; returns it with the write's error, if any.
pub(super) fn write(summary: Summary, path: &Path, started_at: f64, writes: bool, signals: Option<&Signals>) -> (Summary, Option<String>) {
    if let Some(signals) = signals {
        signals.writing_summary(summary.essentials().to_string());
    }
    // Kept here: a writer that could not start, or that panicked, still leaves a summary to return.
    let fallback = summary.clone();
    let owned = path.to_owned();
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new().name("ptrain-summary".into()).spawn(move || {
        let _ = tx.send(parts_and_write(summary, &owned, started_at, writes));
    });
    let written = match spawned {
        Ok(_) => rx.recv().unwrap_or_else(|_| (fallback, Some(format!("{}: the summary's writer panicked", path.display())))),
        Err(_) => parts_and_write(fallback, path, started_at, writes),
    };
    if let Some(signals) = signals {
        signals.summary_written();
    }
    written
}

fn parts_and_write(summary: Summary, path: &Path, started_at: f64, writes: bool) -> (Summary, Option<String>) {
    let summary = summary.with_parts(path, started_at);
    let error = if writes { summary.write(path).map_err(|e| Error::writing(path)(e).to_string()).err() } else { None };
    (summary, error)
}

/// A rank that did not leave the end of the run once rank 0 had written the summary
/// (killed after the agreement): the launcher fails the job, so the summary, written
/// again, fails too, saying what rank 0 knows; a signal's run stays interrupted.
pub(super) fn rank_lost_after(mut summary: Summary, why: &str, path: &Path, started_at: f64, signals: Option<&Signals>) -> Summary {
    if summary.status != "interrupted" {
        summary.status = "failed".into();
    }
    summary.exit_code = summary.exit_code.max(1);
    let message = format!("every rank finished its end, but after rank 0 wrote the summary {why} (killed or failed since)");
    summary.error.get_or_insert(RunError { kind: "another_rank".into(), message, location: None, step: summary.last_step });
    let (summary, error) = write(summary, path, started_at, true, signals);
    if let Some(error) = error {
        tracing::error!("writing the summary again: {error}");
    }
    summary
}
