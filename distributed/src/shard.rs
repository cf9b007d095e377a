//! The collectives of sharded training (ZeRO stage 1 and 2) on the optimizer's
//! flat buffers (`ptrain_core::optim::shard`): nothing is copied into buckets,
//! buckets are views of the flat gradient.
//!
//! - `optimizer`: the flat gradient is all-reduced in place in contiguous buckets
//!   of about `dist.bucket_mb`, then averaged; every rank keeps all of it.
//! - `gradients`: each rank needs only the reduced gradient of its slice. NCCL
//!   reduce-scatters, one bucket covering the same local range of every rank's
//!   slice. Gloo in torch 2.11 implements reduce-scatter as a clone of the input,
//!   an all-reduce and a copy of the rank's chunk; ptrain does the same without
//!   the clone: all-reduce the flat gradient in place (in buckets), copy the own
//!   slice into the gradient shard. Then the full-size gradient is released.
//! - Then one all-reduce of `[sum of squares of the own slice, non-finite flag]`
//!   gives every rank the exact global norm and the agreed flag.
//! - After the update: one in-place all-gather of the flat parameters.

use std::ops::Range;

use ptrain_core::{config::ShardMode, optim::Shard};
use tch::{Kind, Tensor};

use crate::{
    ffi::Handles,
    group::{wait_all, Group, Work},
};

pub(crate) struct ShardSync {
    /// Bucket ranges over the padded flat gradient (all-reduce paths).
    flat_buckets: Vec<Range<i64>>,
    /// Bucket ranges inside a rank's slice (reduce-scatter path): bucket k reduces
    /// `rows[k]`, the same range of every rank's slice, into the gradient shard.
    slice_buckets: Vec<Range<i64>>,
    rows: Vec<Handles>,
    reduce_scatter: bool,
    scale: f64,
    works: Vec<Work>,
}

/// `0..total` in consecutive ranges of at most `cap` elements (one range when
/// `cap` is 0).
fn split(total: i64, cap: i64) -> Vec<Range<i64>> {
    if cap <= 0 || total <= cap {
        return std::iter::once(0..total).collect();
    }
    (0..total).step_by(cap as usize).map(|s| s..(s + cap).min(total)).collect()
}

impl ShardSync {
    /// `reduce_scatter`: whether `gradients` uses the backend's reduce-scatter
    /// (NCCL) or the all-reduce-then-slice equivalent (Gloo).
    pub fn new(shard: &Shard, bucket_bytes: usize, reduce_scatter: bool) -> ShardSync {
        let flat = shard.flat_params();
        let element = flat.kind().elt_size_in_bytes().max(1);
        let (padded, chunk, world) = (shard.layout.padded() as i64, shard.layout.chunk as i64, shard.spec.world as i64);
        let cap = (bucket_bytes / element) as i64;
        let flat_buckets = split(padded, cap);
        let slice_buckets = split(chunk, cap / world);
        ShardSync {
            flat_buckets,
            slice_buckets,
            rows: Vec::new(),
            reduce_scatter: reduce_scatter && shard.mode() == ShardMode::Gradients,
            scale: 1.0 / world as f64,
            works: Vec::new(),
        }
    }

    pub fn buckets(&self) -> usize {
        if self.reduce_scatter {
            self.slice_buckets.len()
        } else {
            self.flat_buckets.len()
        }
    }

    /// Reduces the step's gradient into what this rank keeps, then agrees on the
    /// global sum of squares and the non-finite flag.
    pub fn reduce(&mut self, group: &Group, shard: &Shard, found_inf: &Tensor) -> Result<(), String> {
        let flat = shard.flat_grads().ok_or("no gradient to reduce (zero_grad was not called this step)")?;
        let launched = self.launch(group, shard, flat);
        let waited = wait_all(self.works.drain(..));
        launched.and(waited)?;
        tch::no_grad(|| {
            match (shard.mode(), shard.grad_shard()) {
                (ShardMode::Gradients, Some(out)) if !self.reduce_scatter => {
                    let own = flat.narrow(0, shard.spec.rank as i64 * shard.layout.chunk as i64, shard.layout.chunk as i64);
                    out.shallow_clone().copy_(&own);
                    let _ = out.shallow_clone().g_mul_scalar_(self.scale);
                }
                (ShardMode::Gradients, Some(out)) => {
                    let _ = out.shallow_clone().g_mul_scalar_(self.scale);
                }
                _ => {
                    let _ = flat.shallow_clone().g_mul_scalar_(self.scale);
                }
            }
            let owned = shard.owned_grads();
            let stats = shard.stats();
            stats.get(0).copy_(&owned.dot(owned).to_kind(Kind::Float));
            stats.get(1).copy_(found_inf);
        });
        group.start_all_reduce(shard.stats())?.wait()?;
        // The flag is now the number of ranks that saw a non-finite loss.
        found_inf.shallow_clone().copy_(&shard.stats().get(1).clamp_max(1.0));
        Ok(())
    }

    fn launch(&mut self, group: &Group, shard: &Shard, flat: &Tensor) -> Result<(), String> {
        if !self.reduce_scatter {
            for b in &self.flat_buckets {
                self.works.push(group.start_all_reduce(&flat.narrow(0, b.start, b.end - b.start))?);
            }
            return Ok(());
        }
        let out = shard.grad_shard().ok_or("no gradient shard")?;
        if self.slice_buckets.len() == 1 {
            self.works.push(group.start_reduce_scatter_flat(out, flat)?);
            return Ok(());
        }
        // The flat gradient is new every step with `gradients`, so are its row
        // views (handles, not memory); they live until the next launch.
        let (chunk, world) = (shard.layout.chunk as i64, shard.spec.world as i64);
        self.rows.clear();
        for b in &self.slice_buckets {
            self.rows.push(Handles::new((0..world).map(|r| flat.narrow(0, r * chunk + b.start, b.end - b.start)).collect()));
        }
        for (b, rows) in self.slice_buckets.iter().zip(&self.rows) {
            self.works.push(group.start_reduce_scatter(&out.narrow(0, b.start, b.end - b.start), rows)?);
        }
        Ok(())
    }

    /// Every rank's updated slice to every rank, in place.
    pub fn all_gather(&self, group: &Group, shard: &Shard) -> Result<(), String> {
        let flat = shard.flat_params();
        let chunk = shard.layout.chunk as i64;
        let own = flat.narrow(0, shard.spec.rank as i64 * chunk, chunk);
        group.start_all_gather_flat(flat, &own)?.wait()
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn buckets_split_a_range_into_capped_pieces() {
        assert_eq!(split(10, 4), vec![0..4, 4..8, 8..10]);
        assert_eq!(split(10, 0), vec![0..10]);
        assert_eq!(split(3, 10), vec![0..3]);
    }
}
