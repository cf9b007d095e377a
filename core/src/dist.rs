//! Data parallelism as the trainer sees it: a [`DataParallel`] is how this process
//! takes part in training, always present. [`SingleRank`] is the one-process run
//! (every collective is the identity); the `ptrain-dist` crate implements it on
//! libtorch's c10d process groups (Gloo on CPU, NCCL on CUDA).
//!
//! The optimizer ([`crate::optim::Optimizer`], replicated or sharded) drives the
//! gradient and parameter collectives through this interface; it hands over
//! tensors, never its own buffers' layout, so the data-parallel layer knows
//! nothing of how an optimizer keeps its state.

use std::{sync::Arc, time::Duration};

use tch::{Device, Tensor};

use crate::{
    config::Config,
    device,
    error::{torch_message, Result},
};

/// In-place collectives over the run's process group.
pub trait Collectives: Send + Sync {
    fn all_reduce_sum(&self, tensor: &mut Tensor) -> Result<(), String>;
    fn broadcast(&self, tensor: &mut Tensor, root: u32) -> Result<(), String>;
}

/// A collective in flight.
pub trait Pending: Send {
    fn wait(self: Box<Self>) -> Result<(), String>;
}

/// The collectives parameter sharding (`dist.shard = "parameters"`) issues from
/// inside forward and backward, on whatever thread runs them, on flat tensors of
/// `world` equal chunks.
pub trait ShardCollectives: Send + Sync {
    /// Starts gathering every rank's chunk of `flat` into it, in place (this rank's
    /// chunk is already there).
    fn start_all_gather(&self, flat: &Tensor) -> Result<Box<dyn Pending>, String>;
    /// Averages `flat` across ranks, writing this rank's chunk of the average to
    /// `own`; `flat` may be left partly reduced. `own` may be this rank's chunk of
    /// `flat` itself (NCCL's in-place reduce-scatter; Gloo's all-reduce leaves the
    /// average there already).
    fn reduce_scatter(&self, flat: &Tensor, own: &Tensor) -> Result<(), String>;
    /// Copies rank `root`'s `tensor` to every rank, in place.
    fn broadcast(&self, tensor: &Tensor, root: u32) -> Result<(), String>;
}

pub trait DataParallel: Send {
    fn rank(&self) -> u32;
    fn world_size(&self) -> u32;
    /// The device this rank trains on: a process group chose it when it formed
    /// (the backend depends on it); a single rank takes `run.device`.
    fn device(&self, config: &Config) -> Result<Device>;
    /// The collectives, for plugins (see [`crate::host`]).
    fn collectives(&self) -> Arc<dyn Collectives>;
    /// Sums `tensor` over the ranks, in place.
    fn all_reduce_sum(&self, tensor: &mut Tensor) -> Result<(), String>;
    /// Sums host values over the ranks, in place (a round trip through the
    /// device on a group; nothing on one rank).
    fn sum_host(&self, values: &mut [f64]) -> Result<(), String>;
    /// Makes every rank start from rank 0's parameters.
    fn broadcast_params(&self, params: &[Tensor]) -> Result<(), String>;
    /// Averages gradients across ranks, in place, before the optimizer step.
    /// `found_inf` (a float device scalar, 1 when this rank's loss was not finite)
    /// becomes 1 on every rank if it was on any: otherwise the ranks that saw a
    /// finite loss would apply the NaN gradients the others skip, and diverge.
    /// The tensors live for the whole run (buffers may be built from them once).
    fn all_reduce_grads(&mut self, grads: &[Tensor], found_inf: &Tensor) -> Result<(), String>;
    /// Averages `flat`, a 1-D tensor of `world_size` equal chunks, across ranks.
    /// With `own` (one chunk's elements), only this rank's chunk of the average is
    /// needed: it is written to `own`, and `flat` may be left partly reduced.
    fn reduce_flat(&mut self, flat: &Tensor, own: Option<&Tensor>) -> Result<(), String>;
    /// Every rank's chunk of `flat` (as in [`DataParallel::reduce_flat`]) to every
    /// rank, in place.
    fn all_gather_flat(&mut self, flat: &Tensor) -> Result<(), String>;
    /// The collectives of parameter sharding; `None` where there are no peers.
    fn shard_collectives(&self) -> Option<Arc<dyn ShardCollectives>> {
        None
    }
    /// Bytes of gradient copies this layer keeps between steps (buckets).
    fn gradient_buffer_bytes(&self) -> u64 {
        0
    }
    /// Seconds spent waiting in collectives so far.
    fn collective_secs(&self) -> f64;
    /// The end of the run, first stage: returns once every rank has finished its
    /// end (its saves waited for, its plugins ended), waiting at most `timeout`
    /// (`dist.end_timeout_s`, not a collective's `dist.timeout_s`: rank 0's final
    /// save may take longer), or until `cancelled` (a signal) says to stop waiting.
    /// Nothing to wait for on one rank.
    fn end_arrive(&self, _timeout: Duration, _cancelled: &dyn Fn() -> bool) -> Result<(), String> {
        Ok(())
    }
    /// The end's second stage, after rank 0 wrote the summary: rank 0 lets the other
    /// ranks go (a launcher tears the job down when one rank exits non-zero, so none
    /// leaves before the record is written) and waits until they have.
    fn end_release(&self, _timeout: Duration, _cancelled: &dyn Fn() -> bool) -> Result<(), String> {
        Ok(())
    }
}

/// Every rank's `bytes` on every rank, in rank order (this is rank `rank` of `world`):
/// an all-gather of variable-length host data (GRPO's completions record) built on
/// the sum every backend has. The lengths first (a `world`-long count, each rank's in
/// its own place, summed), then the bytes, each rank's in its own row of a zeroed
/// `world x longest` uint8 tensor summed over the ranks (each byte is written by one
/// rank only, so the sum is a copy). Two collectives on `device` (the group's: NCCL
/// reduces CUDA tensors) and two host copies: for the steps that need it, never a
/// hot loop. A rank that never arrives fails it after the group's timeout.
pub fn all_gather_bytes(collectives: &dyn Collectives, rank: u32, world: u32, bytes: &[u8], device: Device) -> Result<Vec<Vec<u8>>, String> {
    let (rank, world) = (rank as usize, world as usize);
    if rank >= world {
        return Err(format!("gathering bytes on rank {rank}, but the world has {world} ranks"));
    }
    let on_device = |host: Tensor| host.f_to_device(device).map_err(|e| torch_message(&e));
    let mut lengths = vec![0i64; world];
    lengths[rank] = bytes.len() as i64;
    let mut counted = on_device(Tensor::from_slice(&lengths))?;
    collectives.all_reduce_sum(&mut counted)?;
    let lengths: Vec<i64> = Vec::try_from(counted.to_device(Device::Cpu)).map_err(|e| torch_message(&e))?;
    let lengths: Vec<usize> = lengths.into_iter().map(|n| n.max(0) as usize).collect();
    let longest = lengths.iter().copied().max().unwrap_or(0);
    if longest == 0 {
        // Every rank sees the same lengths: none goes on to the second collective.
        return Ok(vec![Vec::new(); world]);
    }
    let mut padded = vec![0u8; world * longest];
    padded[rank * longest..][..bytes.len()].copy_from_slice(bytes);
    let mut rows = on_device(Tensor::from_slice(&padded))?;
    collectives.all_reduce_sum(&mut rows)?;
    let gathered: Vec<u8> = Vec::try_from(rows.to_device(Device::Cpu)).map_err(|e| torch_message(&e))?;
    Ok(lengths.iter().enumerate().map(|(r, &n)| gathered[r * longest..][..n].to_vec()).collect())
}

/// The one-process run: rank 0 of 1, where every collective leaves its tensors
/// as they are (a sum or mean over one rank is the value itself).
#[derive(Debug, Default, Clone, Copy)]
pub struct SingleRank;

impl Collectives for SingleRank {
    fn all_reduce_sum(&self, _tensor: &mut Tensor) -> Result<(), String> {
        Ok(())
    }

    fn broadcast(&self, _tensor: &mut Tensor, _root: u32) -> Result<(), String> {
        Ok(())
    }
}

impl DataParallel for SingleRank {
    fn rank(&self) -> u32 {
        0
    }

    fn world_size(&self) -> u32 {
        1
    }

    fn device(&self, config: &Config) -> Result<Device> {
        device::select(config.run.device, 0)
    }

    fn collectives(&self) -> Arc<dyn Collectives> {
        Arc::new(SingleRank)
    }

    fn all_reduce_sum(&self, _tensor: &mut Tensor) -> Result<(), String> {
        Ok(())
    }

    fn sum_host(&self, _values: &mut [f64]) -> Result<(), String> {
        Ok(())
    }

    fn broadcast_params(&self, _params: &[Tensor]) -> Result<(), String> {
        Ok(())
    }

    fn all_reduce_grads(&mut self, _grads: &[Tensor], _found_inf: &Tensor) -> Result<(), String> {
        Ok(())
    }

    fn reduce_flat(&mut self, flat: &Tensor, own: Option<&Tensor>) -> Result<(), String> {
        // One chunk, this rank's: the average over one rank is the gradient itself.
        if let Some(own) = own {
            own.shallow_clone().f_copy_(flat).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn all_gather_flat(&mut self, _flat: &Tensor) -> Result<(), String> {
        Ok(())
    }

    fn collective_secs(&self) -> f64 {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rank_gathers_its_own_bytes() {
        let gathered = all_gather_bytes(&SingleRank, 0, 1, b"a\0b", Device::Cpu).unwrap();
        assert_eq!(gathered, [b"a\0b".to_vec()]);
        assert_eq!(all_gather_bytes(&SingleRank, 0, 1, b"", Device::Cpu).unwrap(), [Vec::<u8>::new()]);
        assert!(all_gather_bytes(&SingleRank, 1, 1, b"x", Device::Cpu).unwrap_err().contains("world has 1 ranks"));
    }
}
