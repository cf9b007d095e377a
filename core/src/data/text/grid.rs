//! A micro-batch's `[B, T]` int64 grids, filled on the host a token row at a time
//! (instruction rows, preference pairs), then made the batch: the one place text
//! data builds its batches.

use tch::Tensor;

use crate::{
    data::{Batch, Payload, Segments},
    error::Result,
    objective::IGNORE_INDEX,
};

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

/// Where a row of tokens goes in its sequence: its first position and its row id.
#[derive(Clone, Copy)]
pub(crate) struct Place {
    pub position: i64,
    pub row: i64,
}

impl Grid {
    pub fn new(b: usize, t: usize) -> Grid {
        let n = b * t;
        Grid { t, shape: [b as i64, t as i64], inputs: vec![0; n], targets: vec![IGNORE_INDEX; n], positions: vec![0; n], rows: vec![0; n] }
    }

    /// A row of `len` tokens (`id(p)`) from cell `at`: each but the last is an input,
    /// whose target is the next token where `trained(p + 1)`; positions count from
    /// `place.position`. Returns the cell after it and the targets trained.
    pub fn write_row(&mut self, at: usize, len: usize, id: impl Fn(usize) -> u32, trained: impl Fn(usize) -> bool, place: Place) -> (usize, i64) {
        let mut count = 0;
        for p in 0..len.saturating_sub(1) {
            let q = at + p;
            self.inputs[q] = id(p) as i64;
            if trained(p + 1) {
                self.targets[q] = id(p + 1) as i64;
                count += 1;
            }
            (self.positions[q], self.rows[q]) = (place.position + p as i64, place.row);
        }
        (at + len.saturating_sub(1), count)
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

    /// The batch of `samples` samples the grids hold: with `segments` for packed
    /// sequences, per-token `dataset_ids` for named sources, and the objective's `payload`.
    pub fn batch(&self, samples: usize, segments: Option<Segments>, dataset_ids: Option<&[i64]>, payload: Payload) -> Result<Batch> {
        Ok(Batch {
            inputs: self.tensor(&self.inputs)?,
            targets: self.tensor(&self.targets)?,
            dataset_ids: dataset_ids.map(|ids| self.tensor(ids)).transpose()?,
            segments,
            payload,
            samples: samples as i64,
            tokens: self.shape[0] * self.shape[1],
        })
    }
}
