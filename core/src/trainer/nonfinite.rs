//! Non-finite losses, without a host sync per step: each step sets a flag on the
//! device that the fused optimizer takes as `found_inf` (the update is skipped),
//! and the flags are read every `train.nonfinite_check_every` steps, where the
//! policy (`train.nan_policy`) decides whether to stop.

use tch::{Device, Kind, Tensor};

use super::stop::Stop;
use crate::config::{NanPolicy, TrainConfig};

pub(super) struct NonFinite {
    /// One flag per step since the last check, in a ring.
    ring: Tensor,
    slots: Vec<Tensor>,
    one: Tensor,
    last_checked: u64,
    /// Non-finite steps in a row at the last check, and in all.
    pub run: u64,
    pub total: u64,
    policy: NanPolicy,
    max_in_row: u64,
}

impl NonFinite {
    /// Counters start from a resumed checkpoint's (`run`, `total`).
    pub fn new(train: &TrainConfig, device: Device, start_step: u64, (run, total): (u64, u64)) -> NonFinite {
        let k = train.nonfinite_check_every.max(1) as i64;
        let ring = Tensor::zeros([k], (Kind::Float, device));
        NonFinite {
            slots: (0..k).map(|i| ring.select(0, i)).collect(),
            one: Tensor::ones([], (Kind::Float, device)),
            ring,
            last_checked: start_step,
            run,
            total,
            policy: train.nan_policy,
            max_in_row: train.max_nonfinite_in_row.max(1),
        }
    }

    /// Sets this step's flag to 1.0 when `loss` is NaN or infinite, in one kernel
    /// (libtorch's AMP check, which only ever sets it: the ring is zeroed when read,
    /// and each slot is used once between reads).
    pub fn flag(&mut self, step: u64, loss: &mut Tensor) -> &Tensor {
        let i = (step % self.slots.len() as u64) as usize;
        // Also multiplies the (detached) loss by one, in place.
        loss.internal_amp_non_finite_check_and_unscale(&mut self.slots[i], &self.one);
        &self.slots[i]
    }

    /// Reads the flags of the steps since the last check; a reason to stop when
    /// the policy says so.
    pub fn check(&mut self, step: u64) -> Option<Stop> {
        let k = self.slots.len() as u64;
        let flags: Vec<f32> = Vec::try_from(self.ring.to_device(Device::Cpu)).unwrap_or_default();
        let _ = self.ring.zero_();
        let mut found_now = 0;
        for s in self.last_checked + 1..=step {
            if flags.get((s % k) as usize).copied().unwrap_or(0.0) > 0.5 {
                self.run += 1;
                self.total += 1;
                found_now += 1;
            } else {
                self.run = 0;
            }
        }
        self.last_checked = step;
        if found_now > 0 {
            tracing::warn!(
                "{found_now} non-finite loss(es) by step {step}: those updates were skipped ({} in a row, {} in all)",
                self.run,
                self.total
            );
        }
        match self.policy {
            NanPolicy::Stop if found_now > 0 => Some(Stop::NonFinite(format!("non-finite loss by step {step} (nan_policy = \"stop\")"))),
            NanPolicy::Skip if self.run >= self.max_in_row => {
                Some(Stop::NonFinite(format!("{} non-finite losses in a row by step {step}", self.run)))
            }
            _ => None,
        }
    }
}
