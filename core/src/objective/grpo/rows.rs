//! GRPO's per-token values as one row per completion, which its loss is written for:
//! a batch's own rows, or (`data.packing`, [`crate::data::rollouts::PackedRows`]) read
//! out of the groups' sequences, and a gradient over those rows put back where the
//! chunked loss needs it.

use tch::{Kind, Tensor};

use crate::{
    data::{rollouts::PackedRows, Batch},
    error::Result,
    objective::IGNORE_INDEX,
};

pub(super) struct Rows<'a> {
    packed: Option<&'a PackedRows>,
    /// `[B, L]` float: each completion's trained tokens.
    pub mask: Tensor,
}

impl<'a> Rows<'a> {
    pub fn of(batch: &'a Batch, packed: Option<&'a PackedRows>) -> Result<Rows<'a>> {
        let targets = packed.map_or(&batch.targets, |p| &p.targets);
        Ok(Rows { packed, mask: targets.f_ne(IGNORE_INDEX)?.f_to_kind(Kind::Float)? })
    }

    /// `values` of the batch's positions as rows (0 where nothing is trained), with
    /// their graph.
    pub fn gather(&self, values: &Tensor) -> Result<Tensor> {
        let Some(p) = self.packed else { return Ok(values.shallow_clone()) };
        let picked = values.f_reshape([-1])?.f_index_select(0, &p.index.f_reshape([-1])?)?;
        Ok(picked.f_view_as(&p.index)?.f_mul(&self.mask)?)
    }

    /// The inverse of [`Rows::gather`] for a gradient: `grad` `[B, L]` at the batch's
    /// positions, shaped as `like`.
    pub fn scatter(&self, grad: &Tensor, like: &Tensor) -> Result<Tensor> {
        let Some(p) = self.packed else { return Ok(grad.shallow_clone()) };
        let flat = Tensor::f_zeros([like.numel() as i64], (grad.kind(), grad.device()))?;
        let masked = grad.f_mul(&self.mask)?.f_reshape([-1])?;
        Ok(flat.f_index_add(0, &p.index.f_reshape([-1])?, &masked)?.f_view_as(like)?)
    }
}
