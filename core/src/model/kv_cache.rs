//! The key/value cache of incremental decoding (`ptrain generate`, the GRPO sampler):
//! each layer's keys and values of the positions seen so far, in buffers allocated
//! once for the whole generation, so a new token costs its own projections and one
//! attention row, not a recomputation (or a re-copy) of the prefix.
//!
//! Rows of different prompt lengths share one cache **left-padded** ([`KvCache::pad_left`]):
//! each row's prompt ends at the same column, so every row's next token goes to the same
//! column and the cache stays one rectangle (right padding would write each row's tokens
//! at a column of its own). A row's pads are keys no query attends to, and its tokens'
//! positions count from its first real token, as transformers' `generate` computes them
//! from the attention mask (`cumsum - 1`, pads at 1).

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};

/// Keys and values per layer, `[B, kv_heads, capacity, head_dim]`, valid up to `len`.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    capacity: i64,
    len: i64,
    padding: Option<Padding>,
    masks: ForwardMasks,
}

/// The masks of the forward in progress (`n` new positions after `start`), by window:
/// made by its first layer, shared by the others.
#[derive(Debug, Default)]
struct ForwardMasks {
    start: i64,
    n: i64,
    by_window: Vec<(Option<i64>, Option<Tensor>)>,
}

/// Where a left-padded cache's rows start.
#[derive(Debug)]
struct Padding {
    /// `[B, capacity]` boolean: the columns holding a row's tokens (false: its pads).
    keys: Tensor,
    /// `[B, 1]` int64: each row's pads, what its positions are shifted by.
    pads: Tensor,
    /// The most pads of a row: the columns after it are never a pad (known on the host,
    /// so that decoding reads nothing back).
    widest: i64,
}

/// One layer's view of the cache during a forward: what to attend over, and how.
pub struct Attend {
    pub keys: Tensor,
    pub values: Tensor,
    /// Causal within the new positions: only when the cache held nothing before.
    pub causal: bool,
    /// A boolean mask `[n, len + n]` (`[B, 1, n, len + n]` when left-padded) for several
    /// new positions after a prefix, a window, or pads.
    pub mask: Option<Tensor>,
}

impl KvCache {
    /// A cache for `layers` layers and at most `capacity` positions.
    pub fn new(layers: usize, capacity: i64) -> KvCache {
        KvCache { layers: (0..layers).map(|_| None).collect(), capacity, len: 0, padding: None, masks: ForwardMasks::default() }
    }

    /// Its rows left-padded: row `r` starts with `pads[r]` pads (a prompt `pads[r]`
    /// shorter than the longest), which no query attends to. Before the first forward.
    pub fn pad_left(&mut self, pads: &[i64], device: Device) -> Result<()> {
        if self.len > 0 {
            return Err(Error::Other("a key/value cache is padded before it holds anything".into()));
        }
        let widest = pads.iter().copied().max().unwrap_or(0);
        let pads = Tensor::f_from_slice(pads)?.f_to_device(device)?.f_unsqueeze(1)?;
        let columns = Tensor::f_arange(self.capacity, (Kind::Int64, device))?.f_unsqueeze(0)?;
        self.padding = Some(Padding { keys: columns.f_ge_tensor(&pads)?, pads, widest });
        Ok(())
    }

    /// The positions `[B, n]` of the next `n` tokens of a left-padded cache (each row's
    /// from its first token; its pads at 1, as transformers'); `None` when not padded:
    /// they are `len..len + n` for every row.
    pub fn positions(&self, n: i64) -> Result<Option<Tensor>> {
        let Some(padding) = &self.padding else { return Ok(None) };
        let columns = Tensor::f_arange_start(self.len, self.len + n, (Kind::Int64, padding.pads.device()))?;
        let positions = columns.f_unsqueeze(0)?.f_sub(&padding.pads)?;
        Ok(Some(match self.len >= padding.widest {
            true => positions,
            false => positions.f_masked_fill(&positions.f_lt(0)?, 1)?,
        }))
    }

    /// Each row repeated `times` times in place (row `r` becomes rows `r * times ..
    /// (r + 1) * times`): a prompt prefilled once continues as several completions.
    pub fn repeat_rows(&mut self, times: i64) -> Result<()> {
        let repeat = |t: &Tensor| t.f_repeat_interleave_self_int(times, 0, None);
        for (keys, values) in self.layers.iter_mut().flatten() {
            (*keys, *values) = (repeat(keys)?, repeat(values)?);
        }
        if let Some(p) = &mut self.padding {
            (p.keys, p.pads) = (repeat(&p.keys)?, repeat(&p.pads)?);
        }
        self.masks = ForwardMasks::default();
        Ok(())
    }

    /// Positions held.
    pub fn len(&self) -> i64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> i64 {
        self.capacity
    }

    /// Checks that `new` more positions fit, before a forward writes any layer.
    pub fn reserve(&self, new: i64) -> Result<()> {
        if self.len + new > self.capacity {
            return Err(Error::Other(format!(
                "{} positions do not fit the model's context of {} (model.block_size): ask for fewer new tokens or a shorter prompt",
                self.len + new,
                self.capacity
            )));
        }
        Ok(())
    }

    /// Writes layer `layer`'s new keys and values `[B, kv_heads, n, head_dim]` after
    /// the cached positions and returns what the new queries attend over: every
    /// position before them, or those within the layer's sliding `window`; never a pad.
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor, window: Option<i64>) -> Result<Attend> {
        let (b, heads, n, d) = k.size4()?;
        let start = self.len;
        if self.layers[layer].is_none() {
            let buffer = || Tensor::f_zeros([b, heads, self.capacity, d], (k.kind(), k.device()));
            self.layers[layer] = Some((buffer()?, buffer()?));
        }
        let (keys, values) = self.layers[layer].as_ref().expect("allocated above");
        keys.f_narrow(2, start, n)?.f_copy_(k)?;
        values.f_narrow(2, start, n)?.f_copy_(v)?;
        let (keys, values) = (keys.f_narrow(2, 0, start + n)?, values.f_narrow(2, 0, start + n)?);
        // A window narrower than what the queries could see hides the oldest keys.
        let window = window.filter(|&w| w < start + n);
        let mask = self.mask(start, n, window, k.device())?;
        let causal = mask.is_none() && n > 1;
        Ok(Attend { keys, values, causal, mask })
    }

    /// The mask of `n` queries after `start` held positions within `window`, made once
    /// per forward and window: `None` where plain (causal) attention is it.
    fn mask(&mut self, start: i64, n: i64, window: Option<i64>, device: Device) -> Result<Option<Tensor>> {
        if (self.masks.start, self.masks.n) != (start, n) {
            self.masks = ForwardMasks { start, n, by_window: Vec::new() };
        }
        if let Some((_, mask)) = self.masks.by_window.iter().find(|(w, _)| *w == window) {
            return Ok(mask.as_ref().map(Tensor::shallow_clone));
        }
        let order = (start > 0 && n > 1) || window.is_some();
        let order = order.then(|| super::attention::causal_after(start, n, window, device)).transpose()?;
        let mask = match &self.padding {
            None => order,
            Some(padding) => Some(padded(padding, start, n, order)?),
        };
        self.masks.by_window.push((window, mask.as_ref().map(Tensor::shallow_clone)));
        Ok(mask)
    }

    /// Marks the `n` positions every layer just appended as held.
    pub fn advance(&mut self, n: i64) {
        self.len += n;
    }
}

/// `[B, 1, n, start + n]`: `order` (causal, windowed; `None`: all) without the pads'
/// keys. A pad's query sees the pads before it and itself, so no row of the softmax is
/// empty (an empty one would make a pad's values NaN, and 0 * NaN reaches real rows).
fn padded(padding: &Padding, start: i64, n: i64, order: Option<Tensor>) -> Result<Tensor> {
    let real = padding.keys.f_narrow(1, 0, start + n)?;
    let seen = match n {
        // One new token after the prompt (decoding): it is never a pad.
        1 if start >= padding.widest => real.f_unsqueeze(1)?.f_unsqueeze(1)?,
        _ => {
            let pad_query = padding.keys.f_narrow(1, start, n)?.f_logical_not()?;
            real.f_unsqueeze(1)?.f_logical_or(&pad_query.f_unsqueeze(2)?)?.f_unsqueeze(1)?
        }
    };
    match order {
        Some(order) => Ok(seen.f_logical_and(&order)?),
        None if n > 1 => Ok(seen.f_logical_and(&super::attention::causal_after(start, n, None, padding.keys.device())?)?),
        None => Ok(seen),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(t: &Tensor) -> Vec<Vec<i64>> {
        Vec::<Vec<i64>>::try_from(t).unwrap()
    }

    fn bools(t: &Tensor) -> Vec<Vec<bool>> {
        Vec::<Vec<bool>>::try_from(t).unwrap()
    }

    #[test]
    fn left_padded_rows_count_positions_from_their_first_token_and_hide_their_pads() {
        // Prompts of 3, 1 and 2 tokens padded to 3; transformers' position ids of the
        // attention mask [[1,1,1],[0,0,1],[0,1,1]]: cumsum - 1, pads at 1.
        let mut cache = KvCache::new(1, 5);
        cache.pad_left(&[0, 2, 1], Device::Cpu).unwrap();
        assert_eq!(ints(&cache.positions(3).unwrap().unwrap()), [[0, 1, 2], [1, 1, 0], [1, 0, 1]]);
        let kv = Tensor::zeros([3, 1, 3, 2], (Kind::Float, Device::Cpu));
        let seen = cache.append(0, &kv, &kv, None).unwrap();
        let mask = seen.mask.unwrap();
        assert!(!seen.causal);
        let row = |r: i64| bools(&mask.get(r).get(0));
        assert_eq!(row(0), [[true, false, false], [true, true, false], [true, true, true]], "unpadded: causal");
        assert_eq!(row(1), [[true, false, false], [true, true, false], [false, false, true]], "pads see pads; the token only itself");
        assert_eq!(row(2), [[true, false, false], [false, true, false], [false, true, true]]);
        cache.advance(3);
        assert_eq!(ints(&cache.positions(1).unwrap().unwrap()), [[3], [1], [2]]);
        let kv = Tensor::zeros([3, 1, 1, 2], (Kind::Float, Device::Cpu));
        let mask = cache.append(0, &kv, &kv, Some(2)).unwrap().mask.unwrap();
        assert_eq!(bools(&mask.view([3, 4])), [[false, false, true, true], [false, false, true, true], [false, false, true, true]], "a window of 2");
        let mask = cache.append(0, &kv, &kv, None).unwrap().mask.unwrap();
        assert_eq!(bools(&mask.view([3, 4])), [[true, true, true, true], [false, false, true, true], [false, true, true, true]], "decoding: no pad");
        assert!(KvCache::new(1, 5).positions(3).unwrap().is_none(), "not padded: the positions of the cache's columns");
    }
}
