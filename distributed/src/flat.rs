//! The collectives of sharded training (ZeRO stage 1 and 2) on a flat tensor of
//! `world` equal chunks (the sharded optimizer's flat gradient or parameters,
//! `ptrain_core::optim::shard`): nothing is copied into buckets, buckets are views
//! of the flat tensor.
//!
//! - Every chunk wanted (`optimizer`): the flat gradient is all-reduced in place in
//!   contiguous buckets of about `dist.bucket_mb`, then averaged; every rank keeps
//!   all of it.
//! - Only this rank's chunk wanted (`gradients`): NCCL reduce-scatters, one bucket
//!   covering the same local range of every rank's chunk. Gloo in torch 2.11
//!   implements reduce-scatter as a clone of the input, an all-reduce and a copy
//!   of the rank's chunk; ptrain does the same without the clone: all-reduce the
//!   flat gradient in place (in buckets), copy the own chunk out.
//! - After the update: one in-place all-gather of the flat parameters.

use std::ops::Range;

use tch::Tensor;

use crate::{
    ffi::Handles,
    group::{wait_all, Group, Work},
};

pub(crate) struct FlatSync {
    /// Bucket ranges over the flat tensor (all-reduce paths).
    flat_buckets: Vec<Range<i64>>,
    /// Bucket ranges inside a chunk (reduce-scatter path): bucket k reduces
    /// `rows[k]`, the same range of every rank's chunk, into this rank's chunk.
    slice_buckets: Vec<Range<i64>>,
    rows: Vec<Handles>,
    /// Whether an own-chunk-only reduction uses the backend's reduce-scatter.
    reduce_scatter: bool,
    rank: i64,
    world: i64,
    chunk: i64,
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

impl FlatSync {
    /// For flat tensors like `flat` (`world` chunks) on this group. `reduce_scatter`:
    /// whether an own-chunk-only reduction uses the backend's reduce-scatter (NCCL)
    /// or the all-reduce-then-slice equivalent (Gloo).
    pub fn new(flat: &Tensor, rank: u32, world: u32, bucket_bytes: usize, reduce_scatter: bool) -> FlatSync {
        let element = flat.kind().elt_size_in_bytes().max(1);
        let (padded, world) = (flat.numel() as i64, world.max(1) as i64);
        let chunk = padded / world;
        let cap = (bucket_bytes / element) as i64;
        FlatSync {
            flat_buckets: split(padded, cap),
            slice_buckets: split(chunk, cap / world),
            rows: Vec::new(),
            reduce_scatter,
            rank: rank as i64,
            world,
            chunk,
            scale: 1.0 / world as f64,
            works: Vec::new(),
        }
    }

    /// Buckets of a reduction (`own`: of this rank's chunk only).
    pub fn buckets(&self, own: bool) -> usize {
        if own && self.reduce_scatter {
            self.slice_buckets.len()
        } else {
            self.flat_buckets.len()
        }
    }

    /// Averages `flat` over the ranks in place, or, with `own`, only this rank's
    /// chunk of it into `own`.
    pub fn reduce(&mut self, group: &Group, flat: &Tensor, own: Option<&Tensor>) -> Result<(), String> {
        if flat.numel() as i64 != self.chunk * self.world {
            return Err(format!("a flat tensor of {} elements, not the {} the buckets were cut for", flat.numel(), self.chunk * self.world));
        }
        let launched = self.launch(group, flat, own);
        let waited = wait_all(self.works.drain(..));
        launched.and(waited)?;
        tch::no_grad(|| match own {
            Some(out) if !self.reduce_scatter => {
                out.shallow_clone().copy_(&flat.narrow(0, self.rank * self.chunk, self.chunk));
                let _ = out.shallow_clone().g_mul_scalar_(self.scale);
            }
            Some(out) => {
                let _ = out.shallow_clone().g_mul_scalar_(self.scale);
            }
            None => {
                let _ = flat.shallow_clone().g_mul_scalar_(self.scale);
            }
        });
        Ok(())
    }

    fn launch(&mut self, group: &Group, flat: &Tensor, own: Option<&Tensor>) -> Result<(), String> {
        let Some(out) = own.filter(|_| self.reduce_scatter) else {
            for b in &self.flat_buckets {
                self.works.push(group.start_all_reduce(&flat.narrow(0, b.start, b.end - b.start))?);
            }
            return Ok(());
        };
        if self.slice_buckets.len() == 1 {
            self.works.push(group.start_reduce_scatter_flat(out, flat)?);
            return Ok(());
        }
        // The flat gradient is new every step with `gradients`, so are its row
        // views (handles, not memory); they live until the next launch.
        let (chunk, world) = (self.chunk, self.world);
        self.rows.clear();
        for b in &self.slice_buckets {
            self.rows.push(Handles::new((0..world).map(|r| flat.narrow(0, r * chunk + b.start, b.end - b.start)).collect()));
        }
        for (b, rows) in self.slice_buckets.iter().zip(&self.rows) {
            self.works.push(group.start_reduce_scatter(&out.narrow(0, b.start, b.end - b.start), rows)?);
        }
        Ok(())
    }

    /// Every rank's chunk of `flat` to every rank, in place.
    pub fn all_gather(&self, group: &Group, flat: &Tensor) -> Result<(), String> {
        let own = flat.narrow(0, self.rank * self.chunk, self.chunk);
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
