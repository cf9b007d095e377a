//! The experts' products, grouped: the `(token, slot)` pairs of a block are sorted by
//! expert, and each stacked weight is applied as one grouped matrix product
//! (`torch._grouped_mm`: expert `e`'s weight over rows `[offs[e-1], offs[e])`), as
//! transformers' `grouped_mm` experts implementation and torchtitan do. Every shape is
//! fixed by the batch (`N * top_k` rows), and the groups' ends are computed on the
//! device (`searchsorted` over the sorted expert ids), so routing reads nothing back
//! to the host: no per-expert (or per-block) synchronisation, and no product over
//! the experts a token was not routed to.
//!
//! Gathering and combining go through permutations (`index_select` by the sort's
//! permutation and its inverse) and a sum over the `top_k` slots, never a scatter-add
//! of several rows into one: so the backward has no atomic adds either, and a step is
//! bitwise repeatable on CUDA as on the CPU.

use tch::{Kind, Tensor};

use super::super::lora::experts::ExpertAdapter;
use crate::error::{Error, Result};

/// A block's experts, stacked as transformers 5 holds them.
#[derive(Debug)]
pub(super) struct Experts {
    /// `[experts, 2 * width, D]`: each expert's gate projection, then its up projection.
    pub(super) gate_up: Tensor,
    /// `[experts, D, width]`.
    pub(super) down: Tensor,
    /// LoRA's adapters of `gate_up` and `down`, when `[lora]` targets them.
    pub(super) adapters: [Option<ExpertAdapter>; 2],
}

/// [`grouped`] through `weights` and, when it has one, its LoRA `adapter`: `x W_e^T +
/// scaling (x A_e^T) B_e^T`, two more grouped products of the adapter's rank instead of
/// one over `W_e + scaling B_e A_e` (peft's), which would copy the whole stack per forward.
fn adapted(x: &Tensor, weights: &Tensor, adapter: Option<&ExpertAdapter>, offs: &Tensor) -> Result<Tensor> {
    let y = grouped(x, weights, offs)?;
    let Some((a, b, scaling)) = adapter.map(ExpertAdapter::factors).transpose()?.flatten() else { return Ok(y) };
    let low = grouped(&grouped(x, &a, offs)?, &b, offs)?;
    Ok(y.f_add(&low.f_mul_scalar(scaling)?)?)
}

/// `x` `[S, in]` times `weights` `[E, out, in]` transposed, rows `[offs[e-1], offs[e])`
/// by expert `e`'s.
fn grouped(x: &Tensor, weights: &Tensor, offs: &Tensor) -> Result<Tensor> {
    let w = weights.f_transpose(-2, -1)?;
    let w = if w.kind() == x.kind() { w } else { w.f_to_kind(x.kind())? };
    // libtorch's kernel takes rows of whole 16-byte lines: widths that are not (never a
    // released model's, often a test's) are padded with zeros, which add nothing.
    let (inp, out) = (w.size()[1], w.size()[2]);
    let line = 16 / x.kind().elt_size_in_bytes() as i64;
    let up = |n: i64| (n + line - 1) / line * line;
    let product = |x: &Tensor, w: &Tensor| {
        x.f_internal_grouped_mm::<&Tensor>(w, Some(offs), None, None).map_err(|e| Error::Other(format!("grouped expert product: {e}")))
    };
    if inp % line == 0 && out % line == 0 {
        return product(x, &w);
    }
    let x = x.f_constant_pad_nd([0, up(inp) - inp])?;
    let w = w.f_constant_pad_nd([0, up(out) - out, 0, up(inp) - inp])?;
    Ok(product(&x, &w)?.f_narrow(1, 0, out)?)
}

impl Experts {
    /// The experts' output for `x` `[N, D]`: the sum over each token's `chosen` experts
    /// (`[N, top_k]`) of their SwiGLU outputs times `weights` (`[N, top_k]`).
    pub(super) fn forward(&self, x: &Tensor, chosen: &Tensor, weights: &Tensor) -> Result<Tensor> {
        let (n, d) = x.size2()?;
        let (top_k, experts) = (chosen.size()[1], self.gate_up.size()[0]);
        let ids = chosen.f_reshape([-1])?;
        // Stable: pairs routed to one expert stay in token order, so a step repeats bit for bit.
        let (sorted, order) = ids.f_sort_stable(true, 0, false)?;
        // Each expert's rows end where the first larger id starts.
        let bounds = Tensor::f_arange(experts, (Kind::Int64, x.device()))?;
        let offs = bounds.f_searchsorted(&sorted, true, true, "right", None::<Tensor>)?;
        // Every (token, slot) pair's row, in expert order: a copy of x per slot, permuted.
        let pairs = x.f_unsqueeze(1)?.f_expand([n, top_k, d], false)?.f_reshape([n * top_k, d])?;
        let rows = pairs.f_index_select(0, &order)?;
        let gate_up = adapted(&rows, &self.gate_up, self.adapters[0].as_ref(), &offs)?;
        let [gate, up]: [Tensor; 2] = gate_up.f_chunk(2, -1)?.try_into().map_err(|_| Error::Other("gate_up_proj splits in two".into()))?;
        let out = adapted(&super::super::llama::swiglu(&gate, &up)?, &self.down, self.adapters[1].as_ref(), &offs)?;
        // Back to (token, slot) order: the inverse permutation.
        let positions = Tensor::f_arange(n * top_k, (Kind::Int64, x.device()))?;
        let inverse = order.f_zeros_like()?.f_scatter(0, &order, &positions)?;
        let out = out.f_index_select(0, &inverse)?.f_reshape([n, top_k, d])?;
        Ok(out.f_mul(&weights.f_unsqueeze(-1)?)?.f_sum_dim_intlist(1, false, x.kind())?)
    }
}
