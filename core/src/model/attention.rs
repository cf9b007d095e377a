//! Who attends to whom, decided once per forward and applied by every block: causal
//! over one plain sequence, a boolean mask over packed rows and shared-prefix pairs
//! (built here from [`Segments`], the one place masks are made), or the keys and
//! values a [`KvCache`] holds.

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
        let ids = &self.ids;
        let t = ids.size().last().copied().unwrap_or(0);
        let keys = ids.f_unsqueeze(1)?;
        let mut visible = ids.f_unsqueeze(2)?.f_eq_tensor(&keys)?;
        if let Some(prefix) = &self.prefix {
            visible = visible.f_logical_or(&prefix.f_unsqueeze(2)?.f_eq_tensor(&keys)?)?;
        }
        Ok(visible.f_logical_and(&causal(t, ids.device())?)?.f_unsqueeze(1)?)
    }
}

/// `[t, t]` boolean: row i sees columns 0..=i.
fn causal(t: i64, device: Device) -> Result<Tensor> {
    Ok(Tensor::f_ones([t, t], (Kind::Bool, device))?.f_tril(0)?)
}

/// `[n, start + n]` boolean: `n` new positions after `start` held ones, row i (position
/// `start + i`) seeing positions 0..=start + i.
pub(super) fn causal_after(start: i64, n: i64, device: Device) -> Result<Tensor> {
    let rows = Tensor::f_arange(n, (Kind::Int64, device))?.f_unsqueeze(1)?.f_add_scalar(start)?;
    let cols = Tensor::f_arange(start + n, (Kind::Int64, device))?.f_unsqueeze(0)?;
    Ok(cols.f_le_tensor(&rows)?)
}

/// How the queries of one block's forward attend.
pub enum Attend<'a> {
    /// Each position sees itself and the earlier ones.
    Causal,
    /// Where a mask from [`Segments::mask`] allows.
    Masked(&'a Tensor),
    /// After the positions `cache` holds; the block is layer `.1` of it.
    Cached(&'a mut KvCache, usize),
}

impl Attend<'_> {
    /// Scaled dot-product attention of `q` `[B, heads, n, head_dim]` over `k`, `v`
    /// `[B, kv_heads, n, head_dim]` (`gqa`: fewer key/value heads than query heads),
    /// with attention dropout `dropout` (already 0 outside training). With a cache, the
    /// new keys and values join it first and the queries attend over all it holds.
    pub fn sdpa(&mut self, q: &Tensor, k: &Tensor, v: &Tensor, dropout: f64, gqa: bool) -> Result<Tensor> {
        Ok(match self {
            Attend::Causal => Tensor::f_scaled_dot_product_attention::<Tensor>(q, k, v, None, dropout, true, None, gqa)?,
            Attend::Masked(mask) => Tensor::f_scaled_dot_product_attention(q, k, v, Some(*mask), dropout, false, None, gqa)?,
            Attend::Cached(cache, layer) => {
                let seen = cache.append(*layer, k, v)?;
                Tensor::f_scaled_dot_product_attention(q, &seen.keys, &seen.values, seen.mask.as_ref(), 0.0, seen.causal, None, gqa)?
            }
        })
    }
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
        let m: Vec<Vec<bool>> = (0..2).map(|i| Vec::<bool>::try_from(causal_after(3, 2, Device::Cpu).unwrap().get(i)).unwrap()).collect();
        assert_eq!(m, [vec![true, true, true, true, false], vec![true, true, true, true, true]]);
    }
}
