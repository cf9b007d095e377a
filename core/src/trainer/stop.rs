//! Why a run stops before its last step, and how ranks agree to stop together.

use std::sync::Arc;

use super::{failure::RunError, signals::Signals};
use crate::{
    dist::DataParallel,
    error::{Error, Result},
    host::{HostServices, StopRequest},
};

/// A reason to stop early.
pub(super) enum Stop {
    /// SIGINT or SIGTERM.
    Signal(i32),
    /// A plugin asked (`HostApi::request_stop`), or another rank stopped.
    Requested(StopRequest),
    /// Non-finite losses, by `train.nan_policy`.
    NonFinite(String),
    /// An error or a panic in training.
    Failed(RunError),
}

/// Stop requests from other threads (signals, plugins), and the agreement of a
/// distributed run's ranks on them.
pub(super) struct StopControl {
    pub signals: Option<Signals>,
    pub services: Arc<HostServices>,
    /// A stop request seen by this rank, not yet agreed with the others.
    pending: Option<Stop>,
    /// Distributed runs agree on stopping at these steps (the non-finite check's
    /// cadence, and the last step).
    agree_every: u64,
    last_step: u64,
}

impl StopControl {
    pub fn new(signals: Option<Signals>, services: Arc<HostServices>, agree_every: u64, last_step: u64) -> StopControl {
        StopControl { signals, services, pending: None, agree_every: agree_every.max(1), last_step }
    }

    /// A stop asked for since the run started, if any. Requests lower the gate,
    /// so the loop asks only on steps where the gate is open.
    pub fn requested(&self) -> Option<Stop> {
        if let Some(sig) = self.signals.as_ref().and_then(Signals::received) {
            return Some(Stop::Signal(sig));
        }
        self.services.stop_requested().map(Stop::Requested)
    }

    /// Whether to stop before `step`. A distributed rank only notes the request:
    /// ranks stop at the same step, agreed at the next check ([`StopControl::agree`]).
    /// The rank that saw the request says at which step every rank will stop.
    pub fn before_step(&mut self, world: u32, step: u64) -> Option<Stop> {
        let reason = self.requested()?;
        if world == 1 {
            return Some(reason);
        }
        if self.pending.is_none() {
            let at = step.div_ceil(self.agree_every).saturating_mul(self.agree_every).min(self.last_step);
            super::eprint_line(&format!(
                "every rank stops after step {at}, the next step the ranks agree on stopping at (train.nonfinite_check_every = {})",
                self.agree_every
            ));
        }
        self.pending.get_or_insert(reason);
        None
    }

    /// Distributed runs: one all-reduce of "does any rank want to stop, and does
    /// any stop for a failure", at a step every rank checks (the non-finite check
    /// is step-based, so ranks agree on it). Every rank then ends alike: a plugin's
    /// normal stop (early stopping) exits 0 everywhere, a failure 1 everywhere.
    /// A single rank has nothing pending ([`StopControl::before_step`] stops it at
    /// once): no stop, and no collective.
    pub fn agree(&mut self, dist: &dyn DataParallel) -> Result<Option<Stop>> {
        let failure = |stop: &Stop| !matches!(stop, Stop::Requested(r) if !r.failure);
        let mut flags = match &self.pending {
            None => [0.0f64, 0.0],
            Some(stop) => [1.0, if failure(stop) { 1.0 } else { 0.0 }],
        };
        dist.sum_host(&mut flags).map_err(Error::Dist)?;
        if flags[0] < 0.5 {
            return Ok(None);
        }
        let any_failure = flags[1] > 0.5;
        Ok(Some(match self.pending.take() {
            Some(Stop::Requested(mut r)) => {
                r.failure |= any_failure;
                Stop::Requested(r)
            }
            Some(other) => other,
            None => Stop::Requested(StopRequest {
                plugin: String::new(),
                reason: "another rank asked to stop".into(),
                failure: any_failure,
                critical: false,
                at: None,
            }),
        }))
    }
}
