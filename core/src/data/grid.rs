//! A micro-batch's `[B, T]` int64 grids, filled on the host a sequence at a time
//! (instruction rows, preference pairs), then made tensors.

use tch::Tensor;

use super::{Segments, IGNORE_INDEX};
use crate::error::Result;

pub(crate) struct Grid {
    /// Positions per sequence.
    pub t: usize,
    shape: [i64; 2],
    pub inputs: Vec<i64>,
    /// [`IGNORE_INDEX`] until set.
    pub targets: Vec<i64>,
    /// Packed sequences: each token's position and row (from 1; 0 is padding).
    pub positions: Vec<i64>,
    pub rows: Vec<i64>,
}

impl Grid {
    pub fn new(b: usize, t: usize) -> Grid {
        let n = b * t;
        Grid { t, shape: [b as i64, t as i64], inputs: vec![0; n], targets: vec![IGNORE_INDEX; n], positions: vec![0; n], rows: vec![0; n] }
    }

    /// Sequence `i` ends at `at`: the padding after it continues the positions
    /// from 0, in a segment of its own (row 0).
    pub fn pad(&mut self, i: usize, at: usize) {
        for (p, q) in (at..(i + 1) * self.t).enumerate() {
            self.positions[q] = p as i64;
        }
    }

    /// `values` (one of the grids, or another of their shape) as a `[B, T]` tensor.
    pub fn tensor(&self, values: &[i64]) -> Result<Tensor> {
        Ok(Tensor::f_from_slice(values)?.f_view(self.shape)?)
    }

    /// The packed rows, with `prefix` (each token's row it also sees) if any.
    pub fn segments(&self, prefix: Option<&[i64]>) -> Result<Segments> {
        Ok(Segments { positions: self.tensor(&self.positions)?, ids: self.tensor(&self.rows)?, prefix: prefix.map(|p| self.tensor(p)).transpose()? })
    }
}
