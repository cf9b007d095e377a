//! Parameter-sharded checkpoints (`dist.shard = "parameters"`): no rank ever holds
//! the whole model, so each rank's part holds its chunks of the trainable
//! parameters (`params`, float32) beside its optimizer state, and `model.safetensors`
//! is empty. [`ParamLayout`] (in the manifest's `shards` and in `state.json`) names
//! every parameter, its shape and where it lies, so a reader re-assembles any
//! parameter from the parts without the training code.
//!
//! Within one part every flat tensor (`params`, `exp_avg`, ...) is the rank's chunk
//! of each unit back to back, in unit order. Unit `u` is its parameters flattened
//! and concatenated (each at its `offset`), padded to `world_size` chunks of
//! `chunk` elements; rank r holds chunk r.

use std::{collections::BTreeMap, ops::Range, path::Path};

use serde::{Deserialize, Serialize};

use crate::{read::tensors, Error, Result, ShardSet, Tensor};

/// The parameter chunks' name inside each part.
pub const PARAMS: &str = "params";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamLayout {
    /// The units that have trainable parameters, in the order their chunks lie in a part.
    pub units: Vec<UnitLayout>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitLayout {
    /// Elements of each rank's chunk of this unit.
    pub chunk: u64,
    pub params: Vec<ParamEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamEntry {
    pub name: String,
    pub shape: Vec<i64>,
    /// Where the flattened parameter starts in its unit.
    pub offset: u64,
}

impl ParamEntry {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product::<i64>() as u64
    }
}

impl UnitLayout {
    /// Elements of the unit without its padding.
    pub fn numel(&self) -> u64 {
        self.params.iter().map(|p| p.offset + p.numel()).max().unwrap_or(0)
    }

    /// The unit's elements rank `rank` holds (empty past the end).
    pub fn range(&self, rank: u32) -> Range<u64> {
        let n = self.numel();
        let start = (rank as u64 * self.chunk).min(n);
        start..(start + self.chunk).min(n)
    }
}

impl ParamLayout {
    /// Where each unit's chunk starts in a part's flat tensors, and their length.
    pub fn bases(&self) -> (Vec<u64>, u64) {
        let mut at = 0;
        let bases = self
            .units
            .iter()
            .map(|u| {
                at += u.chunk;
                at - u.chunk
            })
            .collect();
        (bases, at)
    }
}

/// Copies the elements `overlap` of unit `u` from a part (rank `from`, its flat
/// tensor `src` starting the unit at `src_base`) into `dst` (starting the same unit's
/// elements `dst_start..` at `dst_base`); `size` bytes an element.
#[allow(clippy::too_many_arguments)]
pub fn copy_overlap(src: &[u8], src_base: u64, src_start: u64, dst: &mut [u8], dst_base: u64, dst_start: u64, overlap: Range<u64>, size: usize) {
    if overlap.start >= overlap.end {
        return;
    }
    let from = (src_base + overlap.start - src_start) as usize * size;
    let to = (dst_base + overlap.start - dst_start) as usize * size;
    let len = (overlap.end - overlap.start) as usize * size;
    dst[to..to + len].copy_from_slice(&src[from..from + len]);
}

fn intersect(a: &Range<u64>, b: &Range<u64>) -> Range<u64> {
    a.start.max(b.start)..a.end.min(b.end)
}

/// Whole tensors re-assembled from the parts, one part read at a time: each
/// parameter under its name (from `params`), and with `optimizer` each state kind
/// as `<kind>.<name>` (as an unsharded `optimizer.safetensors` has it) and `step`.
pub(crate) fn consolidate(dir: &Path, set: &ShardSet, layout: &ParamLayout, optimizer: bool) -> Result<BTreeMap<String, Tensor>> {
    let (bases, total) = layout.bases();
    let mut out: BTreeMap<String, Tensor> = BTreeMap::new();
    for part in &set.parts {
        let path = dir.join(&part.path);
        let saved = tensors(&path)?;
        for (kind, flat) in &saved {
            if kind == "step" {
                if optimizer {
                    out.entry(kind.clone()).or_insert_with(|| flat.clone());
                }
                continue;
            }
            if kind != PARAMS && !optimizer {
                continue;
            }
            if flat.shape != [total as i64] {
                return Err(Error::invalid(&path, format!("`{kind}` has shape {:?}, the layout says [{total}]", flat.shape)));
            }
            let size = flat.dtype.size();
            for (unit, &base) in layout.units.iter().zip(&bases) {
                let held = unit.range(part.rank);
                for param in &unit.params {
                    let name = if kind == PARAMS { param.name.clone() } else { format!("{kind}.{}", param.name) };
                    let whole = out.entry(name).or_insert_with(|| Tensor {
                        dtype: flat.dtype,
                        shape: param.shape.clone(),
                        data: vec![0; param.numel() as usize * size],
                    });
                    let span = param.offset..param.offset + param.numel();
                    copy_overlap(&flat.data, base, held.start, &mut whole.data, 0, param.offset, intersect(&held, &span), size);
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_lie_back_to_back_and_ranks_hold_their_chunk() {
        let entry = |name: &str, shape: Vec<i64>, offset| ParamEntry { name: name.into(), shape, offset };
        let layout = ParamLayout {
            units: vec![
                UnitLayout { chunk: 4, params: vec![entry("a", vec![2, 2], 0), entry("b", vec![3], 4)] },
                UnitLayout { chunk: 1, params: vec![entry("c", vec![1], 0)] },
            ],
        };
        assert_eq!(layout.bases(), (vec![0, 4], 5));
        assert_eq!(layout.units[0].numel(), 7);
        assert_eq!((layout.units[0].range(0), layout.units[0].range(1)), (0..4, 4..7));
        assert_eq!(layout.units[1].range(1), 1..1, "past the end: empty");
    }
}
