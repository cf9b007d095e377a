//! Gradient buckets: the gradients are copied into a few flat buffers of about
//! `dist.bucket_mb` each (allocated once), all buckets are all-reduced at once,
//! and the sums are copied back scaled by 1/world. Few large messages instead of
//! one per parameter is what makes the all-reduce cheap.

use std::ops::Range;

use tch::{Kind, Tensor};

use crate::{
    ffi::{self, check, raw, Handles},
    group::{wait_all, Group, Work},
};

struct Bucket {
    flat: Tensor,
    grads: Handles,
    /// Views of `flat` shaped like `grads`.
    views: Handles,
}

pub(crate) struct Buckets {
    buckets: Vec<Bucket>,
    /// One extra element of the last bucket that carries the non-finite flag, so
    /// agreeing on it costs no collective of its own.
    flag: Tensor,
    scale: f64,
    works: Vec<Work>,
}

/// Consecutive runs of `grads` with one dtype and device, each at most `cap_bytes`
/// (a larger tensor gets a bucket to itself). `cap_bytes` 0: one tensor a bucket.
pub fn plan(grads: &[(Kind, tch::Device, usize)], cap_bytes: usize) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    let mut bytes = 0;
    for (i, &(kind, device, n)) in grads.iter().enumerate() {
        let size = n * kind.elt_size_in_bytes();
        let joins = out.last().is_some_and(|r| {
            let (k, d, _) = grads[r.start];
            k == kind && d == device && bytes + size <= cap_bytes
        });
        if joins {
            out.last_mut().expect("a bucket").end = i + 1;
            bytes += size;
        } else {
            out.push(i..i + 1);
            bytes = size;
        }
    }
    out
}

impl Buckets {
    pub fn new(grads: &[Tensor], cap_bytes: usize, world_size: u32) -> Result<Buckets, String> {
        let shapes: Vec<(Kind, tch::Device, usize)> = grads.iter().map(|g| (g.kind(), g.device(), g.numel())).collect();
        let ranges = plan(&shapes, cap_bytes);
        let mut buckets = Vec::with_capacity(ranges.len());
        let mut flag = None;
        for (k, range) in ranges.iter().enumerate() {
            let members = &grads[range.clone()];
            let (kind, device, _) = shapes[range.start];
            let numel: usize = members.iter().map(Tensor::numel).sum();
            let last = k + 1 == ranges.len();
            let flat = Tensor::zeros([(numel + usize::from(last)) as i64], (kind, device));
            let mut offset = 0;
            let mut views = Vec::with_capacity(members.len());
            for g in members {
                views.push(flat.narrow(0, offset as i64, g.numel() as i64).view(g.size().as_slice()));
                offset += g.numel();
            }
            if last {
                flag = Some(flat.narrow(0, numel as i64, 1).view([0i64; 0].as_slice()));
            }
            let grads = Handles::new(members.iter().map(Tensor::shallow_clone).collect());
            buckets.push(Bucket { flat, grads, views: Handles::new(views) });
        }
        let flag = flag.ok_or("no gradients to all-reduce")?;
        Ok(Buckets { works: Vec::with_capacity(buckets.len()), buckets, flag, scale: 1.0 / world_size as f64 })
    }

    /// Each bucket goes out as soon as it is filled, so filling the next one
    /// overlaps with its transfer.
    fn launch(&mut self, group: &Group) -> Result<(), String> {
        for b in &self.buckets {
            // SAFETY: both arrays hold `len` live handles.
            check(unsafe { ffi::pd_copy(b.views.ptr(), b.grads.ptr(), b.grads.len() as i64) })?;
            self.works.push(group.start_all_reduce(&b.flat)?);
        }
        Ok(())
    }

    pub(crate) fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Bytes of the bucket buffers (gradient copies kept for the whole run).
    pub(crate) fn bytes(&self) -> u64 {
        self.buckets.iter().map(|b| (b.flat.numel() * b.flat.kind().elt_size_in_bytes()) as u64).sum()
    }

    /// Averages the gradients across ranks in place; `found_inf` becomes 1 on every
    /// rank when it was 1 on any.
    pub fn all_reduce(&mut self, group: &Group, found_inf: &Tensor) -> Result<(), String> {
        self.flag.copy_(found_inf);
        let launched = self.launch(group);
        // Whatever was launched is waited for, also after a failed launch.
        let waited = wait_all(self.works.drain(..));
        launched.and(waited)?;
        for b in &self.buckets {
            // SAFETY: both arrays hold `len` live handles.
            check(unsafe { ffi::pd_scale_copy(raw(&b.flat), self.scale, b.grads.ptr(), b.views.ptr(), b.grads.len() as i64) })?;
        }
        // The flag now holds (ranks that saw inf) / world: 0, or in (0, 1].
        let mut out = found_inf.shallow_clone();
        out.copy_(&self.flag);
        let _ = out.ceil_();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind};

    use super::plan;

    const F: Kind = Kind::Float;
    const CPU: Device = Device::Cpu;

    #[test]
    fn buckets_fill_up_to_the_cap_in_order() {
        // 4-byte floats: 10 + 10 elements fit 80 bytes, the third starts a new bucket.
        let grads = [(F, CPU, 10), (F, CPU, 10), (F, CPU, 10), (F, CPU, 5)];
        assert_eq!(plan(&grads, 80), vec![0..2, 2..4]);
    }

    #[test]
    fn a_tensor_larger_than_the_cap_gets_its_own_bucket() {
        let grads = [(F, CPU, 4), (F, CPU, 1000), (F, CPU, 4)];
        assert_eq!(plan(&grads, 64), vec![0..1, 1..2, 2..3]);
    }

    #[test]
    fn dtypes_never_share_a_bucket() {
        let grads = [(F, CPU, 4), (Kind::BFloat16, CPU, 4), (F, CPU, 4)];
        assert_eq!(plan(&grads, 1 << 20), vec![0..1, 1..2, 2..3]);
    }

    #[test]
    fn zero_cap_means_one_tensor_per_bucket() {
        let grads = [(F, CPU, 4), (F, CPU, 4)];
        assert_eq!(plan(&grads, 0), vec![0..1, 1..2]);
    }
}
