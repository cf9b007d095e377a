//! One normalisation over the step: a micro-batch's sum becomes its share of the
//! step's loss, divided by what the whole step counts (every micro-batch on every
//! rank). The gradient all-reduce then averages over the ranks, so each rank's
//! share is multiplied by the number of ranks.
//!
//! Floating point makes the order matter: a step of micro-batch means divides each
//! mean by the micro-batches ((sum/N)/accum is not sum/(N*accum) bit for bit), a
//! step counted in units multiplies by the reciprocal of their number.

use tch::{Device, Kind, Tensor};

use super::Count;
use crate::{
    dist::DataParallel,
    error::{Error, Result},
};

/// What a step divides its micro-batches' sums (losses and metrics) by.
#[derive(Debug)]
pub enum StepScale {
    /// Micro-batch means ([`Count::MicroBatch`]): divided by their number,
    /// `optim.accum_steps`, the same on every rank.
    MicroBatches(u64),
    /// Units on one rank: times 1 / their number in the step, known on the host.
    Host(f64),
    /// Units on several ranks: times ranks / (their number in the step on every
    /// rank), all-reduced on the device and never read on the host.
    Device(Tensor),
}

impl StepScale {
    /// The scale of a step of `accum` micro-batches that each count `count`, for
    /// a step of micro-batch means, or of `units` in all on this rank: with
    /// several ranks, those of every rank are summed on `device` in one
    /// collective, and that sum is returned too (it is never read here).
    pub fn of_step(count: Count, accum: u64, dist: &dyn DataParallel, device: Device) -> Result<(StepScale, Option<Tensor>)> {
        let units = match count {
            Count::MicroBatch => return Ok((StepScale::MicroBatches(accum), None)),
            Count::Units(units) => units,
        };
        let world = dist.world_size();
        if world == 1 {
            // This rank's count alone, known on the host: no device scalar.
            return Ok((StepScale::Host(1.0 / units.max(1) as f64), None));
        }
        let mut all = Tensor::from(units as f64).f_to_device(device)?;
        dist.all_reduce_sum(&mut all).map_err(Error::Dist)?;
        let factor = all.f_clamp_min(1.0)?.f_reciprocal()?.f_mul_scalar(world as f64)?.f_to_kind(Kind::Float)?;
        Ok((StepScale::Device(factor), Some(all)))
    }

    /// A micro-batch's share of the step: `sum` scaled.
    pub fn apply(&self, sum: Tensor) -> Result<Tensor> {
        Ok(match self {
            StepScale::MicroBatches(n) if *n > 1 => sum.f_div_scalar(*n as f64)?,
            StepScale::MicroBatches(_) => sum,
            StepScale::Host(factor) => sum.f_mul_scalar(*factor)?,
            StepScale::Device(factor) => sum.f_mul(factor)?,
        })
    }
}
