//! Saved optimizer state, seen as flat ranges: whatever cut a checkpoint was saved
//! with (unsharded per-parameter tensors, or one slice per rank of any world
//! size), an optimizer asks for the range it owns and gets it re-cut.

use std::ops::Range;

use ptrain_plugin_api::DType;
use tch::Tensor;

use super::layout::FlatLayout;
use crate::{
    checkpoint::{Checkpoint, ShardEntry, Tensor as Saved},
    error::{Error, Result},
};

pub trait SavedState {
    /// The step counter, and for each of `kinds` (`exp_avg`, ...) the saved state
    /// over `range` of the flat index space, as 1-D host tensors.
    fn load(&self, kinds: &[&str], range: Range<u64>) -> Result<(Tensor, Vec<Tensor>)>;
}

/// A checkpoint's optimizer state, for parameters of these names and sizes in
/// the trainer's order.
pub struct CheckpointState<'a> {
    checkpoint: &'a Checkpoint,
    layout: FlatLayout,
    names: Vec<&'a str>,
}

impl<'a> CheckpointState<'a> {
    pub fn new(checkpoint: &'a Checkpoint, params: &'a [(String, u64)]) -> CheckpointState<'a> {
        let numels: Vec<u64> = params.iter().map(|(_, n)| *n).collect();
        CheckpointState { checkpoint, layout: FlatLayout::new(&numels, 1), names: params.iter().map(|(n, _)| n.as_str()).collect() }
    }

    fn bad(&self, message: String) -> Error {
        Error::Checkpoint { path: self.checkpoint.path.clone(), message }
    }

    fn tensor(&self, dtype: Option<DType>, bytes: Vec<u8>, len: u64) -> Result<Tensor> {
        let kind = dtype.unwrap_or(DType::F32).kind();
        Ok(Tensor::f_from_data_size(&bytes, &[len as i64], kind)?)
    }

    /// Unsharded: the per-parameter tensors cut to `range`.
    fn cut_params(&self, kinds: &[&str], range: Range<u64>) -> Result<(Tensor, Vec<Tensor>)> {
        let step = self.checkpoint.optimizer.get("step").ok_or_else(|| self.bad("optimizer state `step` missing from checkpoint".into()))?;
        let mut out = Vec::new();
        for kind in kinds {
            let (mut bytes, mut dtype) = (Vec::new(), None);
            for piece in self.layout.pieces(range.clone()) {
                let name = format!("{kind}.{}", self.names[piece.param]);
                let saved =
                    self.checkpoint.optimizer.get(&name).ok_or_else(|| self.bad(format!("optimizer state `{name}` missing from checkpoint")))?;
                let numel: i64 = saved.shape.iter().product();
                if numel as u64 != self.layout.params[piece.param].1 {
                    return Err(
                        self.bad(format!("optimizer state `{name}` has {numel} elements, the parameter {}", self.layout.params[piece.param].1))
                    );
                }
                let size = saved.dtype.size();
                bytes.extend_from_slice(&saved.data[piece.param_offset as usize * size..(piece.param_offset + piece.len) as usize * size]);
                dtype = Some(saved.dtype);
            }
            out.push(self.tensor(dtype, bytes, range.end - range.start)?);
        }
        Ok((scalar(step)?, out))
    }

    /// Sharded: the overlapping parts of each rank, each read once.
    fn cut_parts(&self, parts: &[ShardEntry], kinds: &[&str], range: Range<u64>) -> Result<(Tensor, Vec<Tensor>)> {
        let mut bytes = vec![Vec::new(); kinds.len()];
        let mut dtypes = vec![None; kinds.len()];
        let mut step = None;
        let overlapping: Vec<&ShardEntry> = parts.iter().filter(|p| p.start < range.end && range.start < p.end).collect();
        let first = [&parts[0]];
        for part in if overlapping.is_empty() { &first[..] } else { &overlapping[..] } {
            let tensors = self.checkpoint.read_part(part).map_err(|e| self.bad(e.to_string()))?;
            if step.is_none() {
                step = Some(scalar(tensors.get("step").ok_or_else(|| self.bad(format!("{}: no `step`", part.path)))?)?);
            }
            let (start, end) = (range.start.max(part.start), range.end.min(part.end));
            for (k, kind) in kinds.iter().enumerate() {
                if start >= end {
                    continue;
                }
                let saved = tensors.get(*kind).ok_or_else(|| self.bad(format!("optimizer state `{kind}` missing from {}", part.path)))?;
                let size = saved.dtype.size();
                let from = (start - part.start) as usize * size;
                bytes[k].extend_from_slice(&saved.data[from..from + (end - start) as usize * size]);
                dtypes[k] = Some(saved.dtype);
            }
        }
        let tensors = bytes.into_iter().zip(dtypes).map(|(b, d)| self.tensor(d, b, range.end - range.start)).collect::<Result<Vec<_>>>()?;
        Ok((step.expect("one part was read"), tensors))
    }
}

fn scalar(saved: &Saved) -> Result<Tensor> {
    Ok(Tensor::f_from_data_size(&saved.data, &saved.shape, saved.dtype.kind())?)
}

impl SavedState for CheckpointState<'_> {
    fn load(&self, kinds: &[&str], range: Range<u64>) -> Result<(Tensor, Vec<Tensor>)> {
        match &self.checkpoint.shards {
            None => self.cut_params(kinds, range),
            Some(shards) if shards.numel != self.layout.numel => {
                Err(self.bad(format!("its optimizer state covers {} parameter elements, this model has {}", shards.numel, self.layout.numel)))
            }
            Some(shards) => self.cut_parts(&shards.parts, kinds, range),
        }
    }
}
