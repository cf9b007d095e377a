//! The key/value cache of incremental decoding (`ptrain generate`): each layer's keys
//! and values of the positions seen so far, in buffers allocated once for the whole
//! generation, so a new token costs its own projections and one attention row, not a
//! recomputation (or a re-copy) of the prefix.

use tch::Tensor;

use crate::error::{Error, Result};

/// Keys and values per layer, `[B, kv_heads, capacity, head_dim]`, valid up to `len`.
#[derive(Debug)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    capacity: i64,
    len: i64,
}

/// One layer's view of the cache during a forward: what to attend over, and how.
pub struct Attend {
    pub keys: Tensor,
    pub values: Tensor,
    /// Causal within the new positions: only when the cache held nothing before.
    pub causal: bool,
    /// A boolean mask `[n, len + n]` for several new positions after a prefix.
    pub mask: Option<Tensor>,
}

impl KvCache {
    /// A cache for `layers` layers and at most `capacity` positions.
    pub fn new(layers: usize, capacity: i64) -> KvCache {
        KvCache { layers: (0..layers).map(|_| None).collect(), capacity, len: 0 }
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
    /// position before them, or those within the layer's sliding `window`.
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
        // A window narrower than what the queries could see hides the oldest keys.
        let window = window.filter(|&w| w < start + n);
        let masked = (start > 0 && n > 1) || window.is_some();
        let mask = masked.then(|| super::attention::causal_after(start, n, window, k.device())).transpose()?;
        Ok(Attend { keys: keys.f_narrow(2, 0, start + n)?, values: values.f_narrow(2, 0, start + n)?, causal: !masked && n > 1, mask })
    }

    /// Marks the `n` positions every layer just appended as held.
    pub fn advance(&mut self, n: i64) {
        self.len += n;
    }
}
