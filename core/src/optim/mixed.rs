//! Parameter sharding in mixed precision (`train.precision = "bf16"`, FSDP2's
//! `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`): a block's trainable
//! part is all-gathered in bfloat16, half the traffic and half the gathered memory
//! of float32, while this rank's chunk (the optimizer's master) stays float32.
//!
//! Only the matrices are gathered in bf16: they are what autocast casts to bf16
//! anyway, so the gathered value is autocast's cast of the same float32 value. The
//! vectors (norm weights, biases), which autocast runs in float32 (and the CPU's
//! layer norm refuses in bf16 beside a float32 input), stay float32: this rank's
//! elements of them are all-gathered in a small float32 buffer of their own, then
//! laid out back to back in `values`, which those parameters view. Both buffers are
//! made once; the gathered bf16 buffer follows the part's gather and release.
//!
//! Backward: the matrices take bf16 `.grad`s, views of one flat bf16 buffer (zero
//! where the vectors are), the vectors float32 ones of their own; before the
//! reduce-scatter the flat gradient is cast to float32 and the vectors' gradients
//! are copied into it, so the reduction and the update run in float32.

use ptrain_torch_ext::{grads, sharding, TensorList};
use tch::{Kind, Tensor};

use super::{cut::torch, gather::Part, layout::FlatLayout};
use crate::{
    dist::{Pending, ShardCollectives},
    error::{Error, Result},
};

/// A bf16-gathered part's vectors and how this rank's elements of them travel.
pub(super) struct Vectors {
    /// Each vector: its index among the part's parameters, its offset in `values`.
    members: Vec<(usize, i64)>,
    /// The vectors back to back in float32; the vector parameters view it.
    values: Tensor,
    /// Each rank's elements of the vectors, `slot` elements a rank: all-gathered.
    slots: Tensor,
    /// This rank's elements: (offset in its chunk, offset in `slots`, length).
    pack: Vec<(i64, i64, i64)>,
    /// Every rank's, after the gather: (offset in `slots`, offset in `values`, length).
    unpack: Vec<(i64, i64, i64)>,
    /// Each matrix alone with its offset and length in the flat gradient.
    matrices: Vec<(TensorList, i64, i64)>,
}

/// Re-points the trainable `part` of a block at a flat buffer of `kind` when that
/// is not float32 (its matrices; its vectors at [`Vectors`]' float32 values).
pub(super) fn gather_in(part: &mut Part, kind: Kind, rank: u32) -> Result<()> {
    if part.full.kind() == kind {
        return Ok(());
    }
    let (layout, device) = (&part.layout, part.full.device());
    let is_vector: Vec<bool> = part.params.tensors().iter().map(|p| p.dim() < 2).collect();
    let (mut members, mut at) = (Vec::new(), 0i64);
    for (i, &(_, n)) in layout.params.iter().enumerate().filter(|(i, _)| is_vector[*i]) {
        members.push((i, at));
        at += n as i64;
    }
    let value_of = |param: usize| members.iter().find(|m| m.0 == param).map(|m| m.1);
    let (mut pack, mut unpack, mut slot) = (Vec::new(), Vec::new(), 0i64);
    let mut per_rank = Vec::with_capacity(layout.world as usize);
    for r in 0..layout.world {
        let range = layout.range(r);
        let mine: Vec<_> = layout.pieces(range.clone()).into_iter().filter(|p| is_vector[p.param]).collect();
        slot = slot.max(mine.iter().map(|p| p.len as i64).sum());
        per_rank.push((r, range.start, mine));
    }
    for (r, start, mine) in per_rank {
        let mut s = r as i64 * slot;
        for p in mine {
            let value = value_of(p.param).expect("a vector's offset") + p.param_offset as i64;
            unpack.push((s, value, p.len as i64));
            if r == rank {
                pack.push(((p.flat_offset - start) as i64, s, p.len as i64));
            }
            s += p.len as i64;
        }
    }
    let zeros = |n: i64| Tensor::f_zeros([n], (Kind::Float, device)).map_err(torch);
    let (values, slots) = (zeros(at)?, zeros(slot * layout.world as i64)?);
    let full = tch::no_grad(|| -> std::result::Result<Tensor, tch::TchError> {
        let full = Tensor::f_empty([layout.padded() as i64], (kind, device))?;
        for (i, (p, &(offset, n))) in part.params.tensors().iter().zip(&layout.params).enumerate() {
            let (from, offset) = match value_of(i) {
                Some(at) => (&values, at),
                None => (&full, offset as i64),
            };
            p.shallow_clone().f_set_data(&from.f_narrow(0, offset, n as i64)?.f_view(p.size().as_slice())?)?;
        }
        Ok(full)
    })
    .map_err(torch)?;
    sharding::resize_storage(&full, 0).map_err(|e| Error::Other(format!("parameter sharding: {e}")))?;
    let matrices = (part.params.tensors().iter().zip(&layout.params).enumerate().filter(|(i, _)| !is_vector[*i]))
        .map(|(_, (p, &(offset, n)))| (TensorList::new(vec![p.shallow_clone()]), offset as i64, n as i64))
        .collect();
    part.full = full;
    part.vectors = (!members.is_empty()).then_some(Vectors { members, values, slots, pack, unpack, matrices });
    Ok(())
}

/// Copies each run `(offset in src, offset in dst, length)` of `src` into `dst`.
fn copy_runs(dst: &Tensor, src: &Tensor, runs: &[(i64, i64, i64)]) -> Result<()> {
    tch::no_grad(|| -> std::result::Result<(), tch::TchError> {
        for &(from, to, n) in runs {
            dst.f_narrow(0, to, n)?.f_copy_(&src.f_narrow(0, from, n)?)?;
        }
        Ok(())
    })
    .map_err(torch)
}

impl Vectors {
    /// The float32 buffers: the vectors' values and their gather's slots.
    pub fn bytes(&self) -> u64 {
        (self.values.numel() + self.slots.numel()) as u64 * Kind::Float.elt_size_in_bytes() as u64
    }

    /// Copies this rank's elements of the vectors from its float32 chunk (`shard`)
    /// into its slot and starts gathering every rank's.
    pub fn start_gather(&self, shard: &Tensor, comm: &dyn ShardCollectives) -> Result<Box<dyn Pending>> {
        copy_runs(&self.slots, shard, &self.pack)?;
        comm.start_all_gather(&self.slots).map_err(Error::Dist)
    }

    /// The gathered elements into the vectors' values (after the gather's wait).
    pub fn unpack(&self) -> Result<()> {
        copy_runs(&self.values, &self.slots, &self.unpack)
    }

    /// Gives each matrix its view of the flat bf16 gradient `flat` as its `.grad`
    /// (the vectors get float32 ones from autograd).
    pub fn attach_grads(&self, flat: &Tensor) -> Result<()> {
        for (matrix, offset, n) in &self.matrices {
            let view = flat.f_narrow(0, *offset, *n).map_err(torch)?;
            grads::attach_flat(matrix, &view).map_err(|e| Error::Other(format!("parameter sharding: {e}")))?;
        }
        Ok(())
    }

    /// Copies the vectors' gradients (of the part's `params`, laid out as `layout`)
    /// into the float32 flat gradient `flat`, before their `.grad`s go.
    pub fn copy_grads(&self, params: &TensorList, layout: &FlatLayout, flat: &Tensor) -> Result<()> {
        tch::no_grad(|| -> std::result::Result<(), tch::TchError> {
            for &(i, _) in &self.members {
                let grad = params.tensors()[i].grad();
                if grad.defined() {
                    let (offset, n) = layout.params[i];
                    flat.f_narrow(0, offset as i64, n as i64)?.f_copy_(&grad.f_reshape([-1])?)?;
                }
            }
            Ok(())
        })
        .map_err(torch)
    }
}
