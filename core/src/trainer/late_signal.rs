//! A signal during the end of the run (the launcher's SIGTERM after another rank
//! died inside the final save): the launcher kills the process after its grace
//! ([`signals::grace`]), so the summary is written first, and what is left (the
//! plugins' end, the other ranks) is waited for within that grace, not within
//! `finish_timeout_s`.

use std::time::{Duration, Instant};

use super::{
    ending::Ending,
    run::RunEnv,
    signals::{self, Signals},
    summary::{OnDisk, Summary},
};

/// Signals counted when the end began.
pub(super) struct EndSignals {
    mark: Option<u32>,
    /// When the first signal of the end was seen, and so when the grace runs out.
    until: Option<Instant>,
}

impl EndSignals {
    pub fn mark(signals: Option<&Signals>) -> EndSignals {
        EndSignals { mark: signals.map(Signals::count), until: None }
    }

    /// Whether a signal came since the end began.
    pub fn arrived(&self, signals: Option<&Signals>) -> bool {
        signals.zip(self.mark).is_some_and(|(s, mark)| s.since(mark))
    }

    /// After the end's own work: whether a signal came; if so the run that had
    /// completed is interrupted by it, and the grace starts now.
    pub fn take(&mut self, signals: Option<&Signals>, ending: &mut Ending) -> bool {
        if !self.arrived(signals) {
            return false;
        }
        self.until = Some(Instant::now() + signals::grace());
        let sig = signals.and_then(Signals::received).unwrap_or(15);
        if ending.exit_code == 0 {
            (ending.status, ending.exit_code) = ("interrupted", 128 + sig);
            ending.stop_reason = Some(format!("signal {sig} during the end of the run"));
        }
        tracing::warn!(
            "signal {sig} during the end of the run: writing the summary first, then waiting at most {:.1}s (the launcher's grace, {})",
            signals::grace().as_secs_f64(),
            signals::GRACE_ENV
        );
        true
    }

    /// `shutdown`, or what is left of the grace less a second for the summary.
    pub fn bound(&self, shutdown: Duration) -> Duration {
        match self.until {
            Some(until) => shutdown.min(until.saturating_duration_since(Instant::now()).saturating_sub(Duration::from_secs(1))),
            None => shutdown,
        }
    }

    pub fn late(&self) -> bool {
        self.until.is_some()
    }
}

/// Rank 0 writes the summary as it stands, before waiting for anything more; the
/// final one replaces it (its `parts` keep this part once).
pub(super) fn write_first(env: &RunEnv, summary: Summary) {
    if env.rank != 0 {
        return;
    }
    let path = env.run_dir.join("summary.json");
    if let Err(e) = summary.with_parts(&path, env.unix_start).write(&path) {
        tracing::error!("writing {} before the plugins' end: {e}", path.display());
    }
}

/// The newest complete checkpoint on disk now (rank 0, which writes the summary).
pub(super) fn newest_checkpoint(env: &RunEnv) -> Option<OnDisk> {
    let dir = super::run_dir::checkpoints_of(&env.config, &env.run_dir);
    let (step, path) = (env.rank == 0).then(|| crate::checkpoint::newest_complete(&dir)).flatten()?;
    Some(OnDisk { step, path })
}
