//! The trainer's [`DataParallel`] on a c10d process group.

use std::sync::Arc;

use ptrain_core::{
    dist::{Collectives, DataParallel},
    optim::Optimizer,
};
use tch::{Device, Tensor};

use crate::{
    buckets::Buckets,
    group::{wait_all, Group},
};

pub struct C10dDataParallel {
    group: Arc<Group>,
    bucket_bytes: usize,
    /// Built at the first step, from the optimizer's gradient tensors (which live
    /// for the whole run).
    buckets: Option<Buckets>,
}

impl C10dDataParallel {
    pub fn new(group: Group, bucket_mb: f64) -> C10dDataParallel {
        let bucket_bytes = (bucket_mb.max(0.0) * 1024.0 * 1024.0) as usize;
        C10dDataParallel { group: Arc::new(group), bucket_bytes, buckets: None }
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
        self.all_reduce(optimizer.grads().tensors(), found_inf)
    }

    fn collective_secs(&self) -> f64 {
        self.group.busy_secs()
    }
}
