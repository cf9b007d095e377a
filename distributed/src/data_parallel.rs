//! The trainer's [`DataParallel`] on a c10d process group.

use std::{sync::Arc, time::Duration};

use ptrain_core::{
    config::Config,
    dist::{Collectives, DataParallel, ShardCollectives},
};
use tch::{Device, Tensor};

use crate::{
    buckets::Buckets,
    flat::FlatSync,
    group::{wait_all, Backend, Group},
    shard_group::ShardGroup,
};

pub struct C10dDataParallel {
    group: Arc<Group>,
    bucket_bytes: usize,
    /// Built at the first step, from the optimizer's gradient tensors (which live
    /// for the whole run).
    buckets: Option<Buckets>,
    /// Sharded runs: built at the first step from the first flat tensor.
    flat: Option<FlatSync>,
    /// Whether reducing only this rank's chunk of a flat tensor uses the backend's
    /// reduce-scatter; `None`: NCCL does, Gloo does not.
    reduce_scatter: Option<bool>,
}

impl C10dDataParallel {
    pub fn new(group: Group, bucket_mb: f64) -> C10dDataParallel {
        let bucket_bytes = (bucket_mb.max(0.0) * 1024.0 * 1024.0) as usize;
        C10dDataParallel { group: Arc::new(group), bucket_bytes, buckets: None, flat: None, reduce_scatter: None }
    }

    pub fn group(&self) -> &Group {
        &self.group
    }

    /// Overrides the backend's choice of reduce-scatter for own-chunk reductions
    /// (tests drive NCCL's path on Gloo). Takes effect before the first one.
    pub fn set_reduce_scatter(&mut self, on: bool) {
        self.reduce_scatter = Some(on);
    }
}

/// The flat collectives, built for the first flat tensor they see.
fn flat_sync<'a>(
    built: &'a mut Option<FlatSync>,
    group: &Group,
    flat: &Tensor,
    bucket_bytes: usize,
    reduce_scatter: Option<bool>,
) -> &'a mut FlatSync {
    built.get_or_insert_with(|| {
        let spec = group.spec();
        let reduce_scatter = reduce_scatter.unwrap_or(spec.backend == Backend::Nccl);
        let sync = FlatSync::new(flat, spec.rank, spec.world_size, bucket_bytes, reduce_scatter);
        tracing::debug!("sharded: gradients reduced in {} bucket(s) ({} for this rank's chunk only)", sync.buckets(false), sync.buckets(true));
        sync
    })
}

impl DataParallel for C10dDataParallel {
    fn rank(&self) -> u32 {
        self.group.spec().rank
    }

    fn world_size(&self) -> u32 {
        self.group.spec().world_size
    }

    /// The group's, chosen when it formed (`from_env`).
    fn device(&self, _config: &Config) -> ptrain_core::Result<Device> {
        Ok(self.group.spec().device)
    }

    fn collectives(&self) -> Arc<dyn Collectives> {
        self.group.clone()
    }

    fn all_reduce_sum(&self, tensor: &mut Tensor) -> Result<(), String> {
        self.group.all_reduce_sum(tensor)
    }

    fn sum_host(&self, values: &mut [f64]) -> Result<(), String> {
        let mut t = Tensor::f_from_slice(&*values)
            .and_then(|t| t.f_to_device(self.group.spec().device))
            .map_err(|e| ptrain_core::error::torch_message(&e))?;
        self.group.all_reduce_sum(&mut t)?;
        let sums = Vec::<f64>::try_from(t.to_device(Device::Cpu)).map_err(|e| ptrain_core::error::torch_message(&e))?;
        values.copy_from_slice(&sums);
        Ok(())
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

    fn all_reduce_grads(&mut self, grads: &[Tensor], found_inf: &Tensor) -> Result<(), String> {
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

    fn reduce_flat(&mut self, flat: &Tensor, own: Option<&Tensor>) -> Result<(), String> {
        let group = &*self.group;
        let sync = flat_sync(&mut self.flat, group, flat, self.bucket_bytes, self.reduce_scatter);
        group.timed(|| sync.reduce(group, flat, own)).map_err(|e| group.explain("sharded gradient reduction", e))
    }

    fn all_gather_flat(&mut self, flat: &Tensor) -> Result<(), String> {
        let group = &*self.group;
        let sync = flat_sync(&mut self.flat, group, flat, self.bucket_bytes, self.reduce_scatter);
        group.timed(|| sync.all_gather(group, flat)).map_err(|e| group.explain("parameter all-gather", e))
    }

    fn shard_collectives(&self) -> Option<Arc<dyn ShardCollectives>> {
        Some(Arc::new(ShardGroup::new(self.group.clone(), self.reduce_scatter)))
    }

    fn gradient_buffer_bytes(&self) -> u64 {
        self.buckets.as_ref().map_or(0, Buckets::bytes)
    }

    fn collective_secs(&self) -> f64 {
        self.group.busy_secs()
    }

    fn end_arrive(&self, timeout: Duration, cancelled: &dyn Fn() -> bool) -> Result<(), String> {
        crate::end::arrive(&self.group, timeout, cancelled)
    }

    fn end_release(&self, timeout: Duration, cancelled: &dyn Fn() -> bool) -> Result<(), String> {
        crate::end::release(&self.group, timeout, cancelled)
    }
}
