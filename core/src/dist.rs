//! Data parallelism as the trainer sees it. The `ptrain-dist` crate implements it
//! on libtorch's c10d process groups (Gloo on CPU, NCCL on CUDA).

use std::sync::Arc;

use tch::{Device, Tensor};

use crate::optim::Optimizer;

/// In-place collectives over the run's process group.
pub trait Collectives: Send + Sync {
    fn all_reduce_sum(&self, tensor: &mut Tensor) -> Result<(), String>;
    fn broadcast(&self, tensor: &mut Tensor, root: u32) -> Result<(), String>;
}

pub trait DataParallel: Send {
    fn rank(&self) -> u32;
    fn world_size(&self) -> u32;
    /// The device this rank trains on (chosen when the group was formed: the
    /// backend depends on it).
    fn device(&self) -> Device;
    fn collectives(&self) -> Arc<dyn Collectives>;
    /// Makes every rank start from rank 0's parameters.
    fn broadcast_params(&self, params: &[Tensor]) -> Result<(), String>;
    /// Averages gradients across ranks, in place, before the optimizer step.
    /// `found_inf` (a float device scalar, 1 when this rank's loss was not finite)
    /// becomes 1 on every rank if it was on any: otherwise the ranks that saw a
    /// finite loss would apply the NaN gradients the others skip, and diverge.
    ///
    /// Sharded ([`Optimizer::shard`]), each rank ends with the averaged gradient of
    /// its own slice, and the global sum of squares and the flag are agreed in one
    /// all-reduce of [`Shard::stats`](crate::optim::Shard::stats).
    fn all_reduce_grads(&mut self, optimizer: &Optimizer, found_inf: &Tensor) -> Result<(), String>;
    /// After the optimizer step: a sharded run all-gathers the updated slices.
    fn after_update(&mut self, _optimizer: &Optimizer) -> Result<(), String> {
        Ok(())
    }
    /// Bytes of gradient copies this layer keeps between steps (buckets).
    fn gradient_buffer_bytes(&self) -> u64 {
        0
    }
    /// Gradient bytes held at the reduction, the high point of a step (measured
    /// at the first step).
    fn gradient_peak_bytes(&self) -> u64 {
        0
    }
    /// Seconds spent waiting in collectives so far.
    fn collective_secs(&self) -> f64;
}
