//! Who attends to whom, decided once per forward and applied by every block: causal
//! over one plain sequence, a boolean mask over packed rows and shared-prefix pairs
//! (built here from [`Segments`], the one place masks are made), or the keys and
//! values a [`KvCache`] holds; each within a sliding window where a block's layer has
//! one. And how a block scores its queries ([`Scores`]): scaled dot-product attention,
//! computed explicitly where the scores are soft-capped.

use tch::{Device, Kind, Tensor};

use super::KvCache;
use crate::error::Result;

/// Where the rows of packed sequences lie, and what each row also sees.
///
/// Packing (`data.packing`): positions restart at 0 at each row and a token attends
/// only to the earlier tokens of its own row. Shared-prefix pairs (DPO's prompt +
/// chosen + rejected in one sequence) add `prefix`: the chosen and the rejected rows
/// both continue the prompt's row, so each of their tokens also sees the prompt's,
/// but not the other answer's; their positions both continue from the prompt's end.
#[derive(Debug)]
pub struct Segments {
    /// `[B, T]` int64 position of each token (RoPE's or the learned embedding's).
    pub positions: Tensor,
    /// `[B, T]` int64 row of each token within its sequence, from 1; 0 is padding.
    pub ids: Tensor,
    /// `[B, T]` int64 row whose tokens a token also sees (the prompt an answer
    /// continues), or its own row where there is none. `None`: no row has a prefix.
    pub prefix: Option<Tensor>,
}

impl Segments {
    /// Each tensor through `f` (pinning, a device move).
    pub(crate) fn map(self, f: impl Fn(Tensor) -> Tensor) -> Segments {
        Segments { positions: f(self.positions), ids: f(self.ids), prefix: self.prefix.map(f) }
    }

    /// The attention mask, `[B, 1, T, T]` boolean: a query attends to a key at or
    /// before it in its own row or in its row's prefix. Padding is a row of its own,
    /// so no query attends to nothing.
    pub fn mask(&self) -> Result<Tensor> {
        self.mask_within(None)
    }

    /// [`Segments::mask`], within a sliding `window` if any: a query also sees only the
    /// keys fewer than `window` positions before it. By position, so an answer of a
    /// shared-prefix pair sees the prompt's end as it would alone.
    pub fn mask_within(&self, window: Option<i64>) -> Result<Tensor> {
        let ids = &self.ids;
        let t = ids.size().last().copied().unwrap_or(0);
        let keys = ids.f_unsqueeze(1)?;
        let mut visible = ids.f_unsqueeze(2)?.f_eq_tensor(&keys)?;
        if let Some(prefix) = &self.prefix {
            visible = visible.f_logical_or(&prefix.f_unsqueeze(2)?.f_eq_tensor(&keys)?)?;
        }
        let visible = visible.f_logical_and(&causal(t, ids.device())?)?;
        let visible = match window {
            Some(w) => visible.f_logical_and(&near(&self.positions.f_unsqueeze(2)?, &self.positions.f_unsqueeze(1)?, w)?)?,
            None => visible,
        };
        Ok(visible.f_unsqueeze(1)?)
    }
}

/// A query at `queries` sees a key at `keys` fewer than `window` positions back:
/// transformers' `sliding_window_overlay` (`kv_idx > q_idx - sliding_window`).
fn near(queries: &Tensor, keys: &Tensor, window: i64) -> Result<Tensor> {
    Ok(queries.f_sub(keys)?.f_lt(window)?)
}

/// The mask of `t` positions of one plain sequence within `window`, `[t, t]` boolean;
/// `None` where causal attention is all it is (no window, or one as wide as `t`).
pub(super) fn causal_within(t: i64, window: Option<i64>, device: Device) -> Result<Option<Tensor>> {
    match window {
        Some(w) if w < t => Ok(Some(causal(t, device)?.f_triu(1 - w)?)),
        _ => Ok(None),
    }
}

/// `[t, t]` boolean: row i sees columns 0..=i.
fn causal(t: i64, device: Device) -> Result<Tensor> {
    Ok(Tensor::f_ones([t, t], (Kind::Bool, device))?.f_tril(0)?)
}

/// `[n, start + n]` boolean: `n` new positions after `start` held ones, row i (position
/// `start + i`) seeing positions 0..=start + i, within `window` of it if any.
pub(super) fn causal_after(start: i64, n: i64, window: Option<i64>, device: Device) -> Result<Tensor> {
    let rows = Tensor::f_arange(n, (Kind::Int64, device))?.f_unsqueeze(1)?.f_add_scalar(start)?;
    let cols = Tensor::f_arange(start + n, (Kind::Int64, device))?.f_unsqueeze(0)?;
    let seen = cols.f_le_tensor(&rows)?;
    match window {
        Some(w) => Ok(seen.f_logical_and(&near(&rows, &cols, w)?)?),
        None => Ok(seen),
    }
}

/// How a block scores its queries against its keys.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Scores {
    /// Attention dropout (already 0 outside training).
    pub dropout: f64,
    /// Fewer key/value heads than query heads (grouped-query attention).
    pub gqa: bool,
    /// What the scores `q . k` are multiplied by; `None`: `1 / sqrt(head_dim)`
    /// (Gemma's is `query_pre_attn_scalar ** -0.5`).
    pub scale: Option<f64>,
    /// Scores soft-capped to `cap * tanh(scores / cap)` before the mask and the softmax
    /// (Gemma 2's `attn_logit_softcapping`). Scaled dot-product attention cannot, so
    /// such attention is computed explicitly, as `transformers`' eager attention.
    pub softcap: Option<f64>,
}

/// How the queries of one block's forward attend.
pub enum Attend<'a> {
    /// Each position sees itself and the earlier ones.
    Causal,
    /// Where a mask from [`Segments::mask`] allows.
    Masked(&'a Tensor),
    /// After the positions `cache` holds; the block is layer `.1` of it, attending
    /// within the sliding window `.2` if any.
    Cached(&'a mut KvCache, usize, Option<i64>),
}

impl Attend<'_> {
    /// Scaled dot-product attention of `q` `[B, heads, n, head_dim]` over `k`, `v`
    /// `[B, kv_heads, n, head_dim]` (`gqa`: fewer key/value heads than query heads),
    /// with attention dropout `dropout` (already 0 outside training).
    pub fn sdpa(&mut self, q: &Tensor, k: &Tensor, v: &Tensor, dropout: f64, gqa: bool) -> Result<Tensor> {
        self.attention(q, k, v, &Scores { dropout, gqa, ..Scores::default() })
    }

    /// Attention of `q` `[B, heads, n, head_dim]` over `k`, `v` `[B, kv_heads, n,
    /// head_dim]`, scored as `scores` says. With a cache, the new keys and values join
    /// it first and the queries attend over all it holds (without dropout).
    pub fn attention(&mut self, q: &Tensor, k: &Tensor, v: &Tensor, scores: &Scores) -> Result<Tensor> {
        let (keys, values, mask, causal, dropout) = match self {
            Attend::Causal => (k.shallow_clone(), v.shallow_clone(), None, true, scores.dropout),
            Attend::Masked(mask) => (k.shallow_clone(), v.shallow_clone(), Some(mask.shallow_clone()), false, scores.dropout),
            Attend::Cached(cache, layer, window) => {
                let seen = cache.append(*layer, k, v, *window)?;
                (seen.keys, seen.values, seen.mask, seen.causal, 0.0)
            }
        };
        match scores.softcap {
            None => Ok(Tensor::f_scaled_dot_product_attention(q, &keys, &values, mask.as_ref(), dropout, causal, scores.scale, scores.gqa)?),
            Some(cap) => capped(q, &keys, &values, mask.as_ref(), causal, dropout, scores.scale, cap),
        }
    }
}

/// Soft-capped attention as `transformers`' `eager_attention_forward` computes it: the
/// keys and values repeated per query head, the scores `q k^T * scale`, capped, the
/// hidden ones at -inf (`mask`, or causal), the softmax in float32 cast back to the
/// queries' type, dropout, then the values.
#[allow(clippy::too_many_arguments)]
fn capped(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, causal: bool, dropout: f64, scale: Option<f64>, cap: f64) -> Result<Tensor> {
    let (heads, n, head_dim) = (q.size()[1], q.size()[2], q.size()[3]);
    let groups = heads / k.size()[1].max(1);
    let (k, v) = match groups > 1 {
        true => (k.f_repeat_interleave_self_int(groups, 1, None)?, v.f_repeat_interleave_self_int(groups, 1, None)?),
        false => (k.shallow_clone(), v.shallow_clone()),
    };
    let scale = scale.unwrap_or(1.0 / (head_dim as f64).sqrt());
    let scores = q.f_matmul(&k.f_transpose(2, 3)?)?.f_mul_scalar(scale)?;
    let scores = scores.f_div_scalar(cap)?.f_tanh()?.f_mul_scalar(cap)?;
    let seen = match (mask, causal) {
        (Some(m), _) => Some(m.shallow_clone()),
        (None, true) => Some(causal_after(k.size()[2] - n, n, None, q.device())?),
        (None, false) => None,
    };
    let scores = match seen {
        Some(seen) => scores.f_masked_fill(&seen.f_logical_not()?, f64::NEG_INFINITY)?,
        None => scores,
    };
    let weights = scores.f_softmax(-1, Kind::Float)?.f_to_kind(q.kind())?.f_dropout(dropout, dropout > 0.0)?;
    Ok(weights.f_matmul(&v)?)
}

/// A per-head norm applied to queries or keys before RoPE (Qwen3's and Gemma 3's
/// `q_norm`/`k_norm`).
pub trait HeadNorm {
    fn norm(&self, x: &Tensor) -> Result<Tensor>;
}

/// `[B, T, heads * head_dim]` projections as `[B, heads, T, head_dim]`, each head
/// normed first where the family norms them.
pub fn split_heads(x: Tensor, heads: i64, head_dim: i64, norm: Option<&dyn HeadNorm>) -> Result<Tensor> {
    let (b, t, _) = x.size3()?;
    let x = x.f_view([b, t, heads, head_dim])?;
    let x = match norm {
        Some(n) => n.norm(&x)?,
        None => x,
    };
    Ok(x.f_transpose(1, 2)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(v: &[i64]) -> Tensor {
        Tensor::from_slice(v).view([1, -1])
    }

    fn allowed(mask: &Tensor) -> Vec<Vec<bool>> {
        let t = mask.size()[2];
        (0..t).map(|i| Vec::<bool>::try_from(mask.get(0).get(0).get(i)).unwrap()).collect()
    }

    #[test]
    fn packed_rows_see_only_their_own_earlier_tokens() {
        let s = Segments { positions: rows(&[0, 1, 0, 1, 2, 0]), ids: rows(&[1, 1, 2, 2, 2, 0]), prefix: None };
        let m = allowed(&s.mask().unwrap());
        assert_eq!(m[1], [true, true, false, false, false, false]);
        assert_eq!(m[4], [false, false, true, true, true, false]);
        assert_eq!(m[5], [false, false, false, false, false, true], "padding sees itself");
    }

    #[test]
    fn a_shared_prefix_pair_sees_the_prompt_and_not_the_other_answer() {
        // prompt (row 1) of 2 tokens, chosen (row 2) of 2, rejected (row 3) of 2; both
        // answers continue the prompt: their positions start at 2.
        let s = Segments { positions: rows(&[0, 1, 2, 3, 2, 3]), ids: rows(&[1, 1, 2, 2, 3, 3]), prefix: Some(rows(&[1, 1, 1, 1, 1, 1])) };
        let m = allowed(&s.mask().unwrap());
        assert_eq!(m[1], [true, true, false, false, false, false], "the prompt is causal");
        assert_eq!(m[3], [true, true, true, true, false, false], "chosen: prompt and itself");
        assert_eq!(m[4], [true, true, false, false, true, false], "rejected: prompt, not chosen");
        assert_eq!(m[5], [true, true, false, false, true, true]);
    }

    #[test]
    fn new_positions_after_a_prefix_see_it_and_their_past() {
        let m: Vec<Vec<bool>> = (0..2).map(|i| Vec::<bool>::try_from(causal_after(3, 2, None, Device::Cpu).unwrap().get(i)).unwrap()).collect();
        assert_eq!(m, [vec![true, true, true, true, false], vec![true, true, true, true, true]]);
        let m: Vec<Vec<bool>> = (0..2).map(|i| Vec::<bool>::try_from(causal_after(3, 2, Some(2), Device::Cpu).unwrap().get(i)).unwrap()).collect();
        assert_eq!(m, [vec![false, false, true, true, false], vec![false, false, false, true, true]], "a window of 2: itself and one before");
    }

    #[test]
    fn a_window_keeps_a_query_to_itself_and_the_positions_just_before_it() {
        let band = causal_within(5, Some(3), Device::Cpu).unwrap().unwrap();
        let row = |i: i64| Vec::<bool>::try_from(band.get(i)).unwrap();
        assert_eq!(row(4), [false, false, true, true, true]);
        assert_eq!(row(1), [true, true, false, false, false]);
        assert!(causal_within(5, Some(5), Device::Cpu).unwrap().is_none(), "a window as wide as the sequence is causal attention");
        // Packed rows: by position within each row; a shared-prefix answer by its positions.
        let s = Segments { positions: rows(&[0, 1, 2, 3, 2, 3]), ids: rows(&[1, 1, 2, 2, 3, 3]), prefix: Some(rows(&[1, 1, 1, 1, 1, 1])) };
        let m = allowed(&s.mask_within(Some(2)).unwrap());
        assert_eq!(m[3], [false, false, true, true, false, false], "chosen's second token: itself and the one before");
        assert_eq!(m[4], [false, true, false, false, true, false], "rejected's first token (position 2): the prompt's last, position 1");
    }

    /// Attention computed the long way in float64: softmax(cap tanh(q k^T scale / cap) + mask) v.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, scale: f64, cap: Option<f64>) -> Tensor {
        let (q, k, v) = (q.to_kind(Kind::Double), k.to_kind(Kind::Double), v.to_kind(Kind::Double));
        let mut s = q.matmul(&k.transpose(2, 3)) * scale;
        if let Some(c) = cap {
            s = (s / c).tanh() * c;
        }
        s.masked_fill(&mask.logical_not(), f64::NEG_INFINITY).softmax(-1, Kind::Double).matmul(&v)
    }

    #[test]
    fn scores_are_scaled_capped_and_windowed_as_asked() {
        tch::manual_seed(1);
        let (b, heads, kv, t, d) = (2, 4, 2, 6, 8);
        let q = Tensor::randn([b, heads, t, d], (Kind::Float, Device::Cpu)) * 3.0;
        let (k, v) = (Tensor::randn([b, kv, t, d], (Kind::Float, Device::Cpu)) * 3.0, Tensor::randn([b, kv, t, d], (Kind::Float, Device::Cpu)));
        let (kr, vr) = (k.repeat_interleave_self_int(2, 1, None), v.repeat_interleave_self_int(2, 1, None));
        let band = causal_within(t, Some(3), Device::Cpu).unwrap().unwrap();
        let full = causal(t, Device::Cpu).unwrap();
        for (cap, mask) in [(None, &band), (Some(2.0), &band), (Some(2.0), &full), (None, &full)] {
            let scores = Scores { dropout: 0.0, gqa: true, scale: Some(0.125), softcap: cap };
            let got = match mask.equal(&full) {
                true => Attend::Causal.attention(&q, &k, &v, &scores).unwrap(),
                false => Attend::Masked(mask).attention(&q, &k, &v, &scores).unwrap(),
            };
            let want = reference(&q, &kr, &vr, mask, 0.125, cap);
            let off = (got.to_kind(Kind::Double) - &want).abs().max().double_value(&[]);
            assert!(off < 1e-5, "cap {cap:?}: off by {off}");
            // Each setting changes the result: none is ignored.
            let plain = reference(&q, &kr, &vr, &full, 1.0 / (d as f64).sqrt(), None);
            assert!((got.to_kind(Kind::Double) - plain).abs().max().double_value(&[]) > 1e-2, "cap {cap:?}");
        }
    }
}
