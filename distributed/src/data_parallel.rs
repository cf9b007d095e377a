//! The trainer's [`DataParallel`] on a c10d process group.

use std::sync::Arc;

use ptrain_core::{
    dist::{Collectives, DataParallel},
    optim::Optimizer,
};
use tch::{Device, Tensor};

use crate::{
    buckets::Buckets,
    group::{wait_all, Backend, Group},
    shard::ShardSync,
};

pub struct C10dDataParallel {
    group: Arc<Group>,
    bucket_bytes: usize,
    /// Built at the first step, from the optimizer's gradient tensors (which live
    /// for the whole run).
    buckets: Option<Buckets>,
    /// Sharded runs: built at the first step from the optimizer's flat buffers.
    shard: Option<ShardSync>,
    /// Gradient bytes held at the first reduction.
    peak_gradient_bytes: u64,
}

impl C10dDataParallel {
    pub fn new(group: Group, bucket_mb: f64) -> C10dDataParallel {
        let bucket_bytes = (bucket_mb.max(0.0) * 1024.0 * 1024.0) as usize;
        C10dDataParallel { group: Arc::new(group), bucket_bytes, buckets: None, shard: None, peak_gradient_bytes: 0 }
    }

    pub fn group(&self) -> &Group {
        &self.group
    }

    /// The same as [`DataParallel::all_reduce_grads`], on any gradient list.
    pub fn all_reduce(&mut self, grads: &[Tensor], found_inf: &Tensor) -> Result<(), String> {
        let group = &*self.group;
        let buckets = match &mut self.buckets {
            Some(b) => b,
            None => {
                let b = Buckets::new(grads, self.bucket_bytes, group.spec().world_size)?;
                tracing::debug!("all-reducing {} gradients in {} bucket(s)", grads.len(), b.len());
                self.buckets.insert(b)
            }
        };
        group.timed(|| buckets.all_reduce(group, found_inf)).map_err(|e| group.explain("gradient all-reduce", e))
    }

    /// Sharded: the gradient reduction of [`ShardSync::reduce`]. `reduce_scatter`
    /// overrides the backend's choice (tests drive NCCL's path on Gloo).
    pub fn reduce_sharded(&mut self, optimizer: &Optimizer, found_inf: &Tensor, reduce_scatter: Option<bool>) -> Result<(), String> {
        let group = &*self.group;
        let shard = optimizer.shard().ok_or("the optimizer is not sharded")?;
        let sync = match &mut self.shard {
            Some(s) => s,
            None => {
                let reduce_scatter = reduce_scatter.unwrap_or(group.spec().backend == Backend::Nccl);
                let s = ShardSync::new(shard, self.bucket_bytes, reduce_scatter);
                tracing::debug!("sharded ({}): gradients reduced in {} bucket(s)", shard.mode().name(), s.buckets());
                self.shard.insert(s)
            }
        };
        let first = self.peak_gradient_bytes == 0;
        if first {
            self.peak_gradient_bytes = optimizer.gradient_bytes().map_err(|e| e.to_string())?;
        }
        group.timed(|| sync.reduce(group, shard, found_inf)).map_err(|e| group.explain("sharded gradient reduction", e))
    }
}

impl DataParallel for C10dDataParallel {
    fn rank(&self) -> u32 {
        self.group.spec().rank
    }

    fn world_size(&self) -> u32 {
        self.group.spec().world_size
    }

    fn device(&self) -> Device {
        self.group.spec().device
    }

    fn collectives(&self) -> Arc<dyn Collectives> {
        self.group.clone()
    }

    fn broadcast_params(&self, params: &[Tensor]) -> Result<(), String> {
        let group = &*self.group;
        group
            .timed(|| {
                let works = params.iter().map(|p| group.start_broadcast(p, 0)).collect::<Result<Vec<_>, _>>()?;
                wait_all(works)
            })
            .map_err(|e| group.explain("parameter broadcast", e))
    }

    fn all_reduce_grads(&mut self, optimizer: &Optimizer, found_inf: &Tensor) -> Result<(), String> {
        if optimizer.shard().is_some() {
            return self.reduce_sharded(optimizer, found_inf, None);
        }
        self.all_reduce(optimizer.grads().tensors(), found_inf)?;
        if self.peak_gradient_bytes == 0 {
            self.peak_gradient_bytes = optimizer.gradient_bytes().map_err(|e| e.to_string())? + self.gradient_buffer_bytes();
        }
        Ok(())
    }

    fn after_update(&mut self, optimizer: &Optimizer) -> Result<(), String> {
        let (Some(shard), Some(sync)) = (optimizer.shard(), &self.shard) else {
            return Ok(());
        };
        let group = &*self.group;
        group.timed(|| sync.all_gather(group, shard)).map_err(|e| group.explain("parameter all-gather", e))
    }

    fn gradient_buffer_bytes(&self) -> u64 {
        self.buckets.as_ref().map_or(0, Buckets::bytes)
    }

    fn gradient_peak_bytes(&self) -> u64 {
        self.peak_gradient_bytes
    }

    fn collective_secs(&self) -> f64 {
        self.group.busy_secs()
    }
}
