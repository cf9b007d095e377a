//! Parameter sharding's collectives (`dist.shard = "parameters"`) on the run's
//! group: issued from forward and backward (any thread), each on one flat tensor of
//! `world` equal chunks. The reduce-scatter is NCCL's own, in place (its output is
//! the rank's chunk of its input, checked on every backend), and on Gloo the
//! equivalent the ZeRO-2 path uses (`flat.rs`): all-reduce in place, which leaves the
//! average in the own chunk.

use std::sync::Arc;

use ptrain_core::dist::{Pending, ShardCollectives};
use tch::Tensor;

use crate::group::{Backend, Group, Work};

pub(crate) struct ShardGroup {
    group: Arc<Group>,
    reduce_scatter: bool,
}

impl ShardGroup {
    pub fn new(group: Arc<Group>, reduce_scatter: Option<bool>) -> ShardGroup {
        let reduce_scatter = reduce_scatter.unwrap_or(group.spec().backend == Backend::Nccl);
        ShardGroup { group, reduce_scatter }
    }

    /// NCCL's in-place reduce-scatter takes its output at the rank's chunk of its input
    /// (recvbuff = sendbuff + rank x count): anywhere else in `flat` the two overlap and
    /// NCCL's result is undefined, while Gloo's paths would still give the right values.
    /// Checked on every backend (pointer arithmetic, no copy) so that the CPU tests hold
    /// the caller's offset to NCCL's contract.
    fn check_in_place(&self, flat: &Tensor, own: &Tensor) -> Result<(), String> {
        let (start, len) = self.chunk_range(flat);
        let want = flat.data_ptr() as usize + start as usize * flat.kind().elt_size_in_bytes();
        if own.data_ptr() as usize == want && own.numel() as i64 == len && own.kind() == flat.kind() && own.is_contiguous() {
            return Ok(());
        }
        Err(format!(
            "sharded gradient reduce-scatter: the output must be rank {}'s chunk of the flat gradient ({len} elements at offset {start}), not {} elements at byte offset {}",
            self.group.spec().rank,
            own.numel(),
            own.data_ptr() as isize - flat.data_ptr() as isize
        ))
    }

    /// Where this rank's chunk of `flat` starts, and its length, in elements.
    fn chunk_range(&self, flat: &Tensor) -> (i64, i64) {
        let spec = self.group.spec();
        let chunk = flat.numel() as i64 / spec.world_size.max(1) as i64;
        (spec.rank as i64 * chunk, chunk)
    }

    /// This rank's chunk of `flat`.
    fn own_chunk(&self, flat: &Tensor) -> Tensor {
        let (start, len) = self.chunk_range(flat);
        flat.narrow(0, start, len)
    }
}

struct Gathering {
    work: Work,
    group: Arc<Group>,
}

impl Pending for Gathering {
    fn wait(self: Box<Self>) -> Result<(), String> {
        let Gathering { work, group } = *self;
        group.timed(|| work.wait()).map_err(|e| group.explain("parameter all-gather", e))
    }
}

impl ShardCollectives for ShardGroup {
    fn start_all_gather(&self, flat: &Tensor) -> Result<Box<dyn Pending>, String> {
        let g = &self.group;
        let work = g.timed(|| g.start_all_gather_flat(flat, &self.own_chunk(flat))).map_err(|e| g.explain("parameter all-gather", e))?;
        Ok(Box::new(Gathering { work, group: g.clone() }))
    }

    fn reduce_scatter(&self, flat: &Tensor, own: &Tensor) -> Result<(), String> {
        let g = &self.group;
        self.check_in_place(flat, own)?;
        let scale = 1.0 / g.spec().world_size.max(1) as f64;
        g.timed(|| {
            if self.reduce_scatter {
                g.start_reduce_scatter_flat(own, flat)?.wait()?;
            } else {
                // `own` is this rank's chunk of `flat` (checked above): the average is in it.
                g.start_all_reduce(flat)?.wait()?;
            }
            tch::no_grad(|| own.shallow_clone().f_mul_scalar_(scale)).map(drop).map_err(|e| e.to_string())
        })
        .map_err(|e| g.explain("sharded gradient reduce-scatter", e))
    }

    fn broadcast(&self, tensor: &Tensor, root: u32) -> Result<(), String> {
        let g = &self.group;
        g.timed(|| g.start_broadcast(tensor, root)?.wait()).map_err(|e| g.explain("parameter broadcast", e))
    }
}
