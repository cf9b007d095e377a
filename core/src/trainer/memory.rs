//! Per-rank memory figures for `summary.json`, measured from the tensors each rank
//! holds (distinct storages, so views count once) and gathered to every rank in
//! one all-reduce.

use tch::{Device, Kind, Tensor};

use super::run::Run;
use crate::error::{Error, Result};

/// One entry per rank.
#[derive(Debug, Clone, Default)]
pub(super) struct MemoryFigures {
    /// Optimizer state held.
    pub optimizer_state_bytes: Vec<u64>,
    /// Gradient held after the last step: `.grad` tensors, flat gradient
    /// buffers, the gradient shard, all-reduce buckets.
    pub gradient_bytes: Vec<u64>,
    /// Gradient held when the first step's gradient was reduced (with
    /// `gradients`, the full-size gradient from backward is still there).
    pub gradient_peak_bytes: Vec<u64>,
}

impl Run {
    /// A collective in a distributed run: every rank calls it at the same point.
    /// Without `collective` (a failed run), only this rank's row is filled.
    pub(super) fn memory_figures(&self, collective: bool) -> Result<MemoryFigures> {
        let optimizer = &self.learner.optimizer;
        let state = optimizer.state_bytes()?;
        let gradient = optimizer.gradient_bytes()? + self.dist.gradient_buffer_bytes();
        let peak = optimizer.gradient_peak_bytes().unwrap_or(gradient);
        let world = self.env.world as i64;
        let mut all = Tensor::zeros([world, 3], (Kind::Int64, self.env.device));
        all.get(self.env.rank as i64).copy_(&Tensor::from_slice(&[state as i64, gradient as i64, peak as i64]).to_device(self.env.device));
        if collective {
            self.dist.all_reduce_sum(&mut all).map_err(Error::Dist)?;
        }
        let rows = Vec::<i64>::try_from(all.to_device(Device::Cpu).flatten(0, -1)).map_err(|e| Error::Other(e.to_string()))?;
        let column = |c: usize| rows.chunks(3).map(|r| r[c] as u64).collect();
        Ok(MemoryFigures { optimizer_state_bytes: column(0), gradient_bytes: column(1), gradient_peak_bytes: column(2) })
    }
}
