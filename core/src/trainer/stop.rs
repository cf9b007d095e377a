//! Why a run stops before its last step, and how ranks agree to stop together.

use tch::{Device, Tensor};

use crate::{
    dist::DataParallel,
    error::{Error, Result},
    host::HostServices,
    signals::Signals,
};

/// A reason to stop early.
pub(super) enum Stop {
    /// SIGINT or SIGTERM.
    Signal(i32),
    /// A plugin asked (`HostApi::request_stop`), or another rank stopped.
    Requested(String),
    /// Non-finite losses, by `train.nan_policy`.
    NonFinite(String),
}

/// Stop requests from other threads (signals, plugins), and the agreement of a
/// distributed run's ranks on them.
pub(super) struct StopControl {
    pub signals: Option<Signals>,
    pub services: &'static HostServices,
    /// A stop request seen by this rank, not yet agreed with the others.
    pending: Option<Stop>,
}

impl StopControl {
    pub fn new(signals: Option<Signals>, services: &'static HostServices) -> StopControl {
        StopControl { signals, services, pending: None }
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
    pub fn before_step(&mut self, world: u32) -> Option<Stop> {
        let reason = self.requested()?;
        if world == 1 {
            return Some(reason);
        }
        self.pending.get_or_insert(reason);
        None
    }

    /// Distributed runs: one all-reduce of "does any rank want to stop", at a step
    /// every rank checks (the non-finite check is step-based, so ranks agree on it).
    pub fn agree(&mut self, dist: &dyn DataParallel, device: Device) -> Result<Option<Stop>> {
        let mut flag = Tensor::from(if self.pending.is_some() { 1.0f64 } else { 0.0 }).to_device(device);
        dist.collectives().all_reduce_sum(&mut flag).map_err(Error::Dist)?;
        if flag.double_value(&[]) < 0.5 {
            return Ok(None);
        }
        Ok(Some(self.pending.take().unwrap_or_else(|| Stop::Requested("another rank asked to stop".into()))))
    }
}
