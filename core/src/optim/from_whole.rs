//! Resuming parameter sharding from a checkpoint saved without it (`dist.shard` =
//! `none`, `optimizer` or `gradients`, any world size): whole weights in
//! `model.safetensors`, and the optimizer state either whole per parameter
//! (`optimizer.safetensors`) or flat over every parameter in name order, one slice
//! per rank. Each rank reads the byte ranges of its own elements only
//! ([`TensorFile`]): neither the whole model nor the whole state is ever held.

use std::{collections::HashMap, ops::Range};

use tch::Tensor;

use super::chunks::intersect;
use crate::{
    checkpoint::{self as ckpt, Checkpoint, ParamLayout, ShardEntry, Tensor as Saved, TensorFile},
    error::{Error, Result},
};

/// Where a checkpoint of whole weights keeps the optimizer state.
enum State {
    /// `optimizer.safetensors`: each kind of each parameter whole, as `<kind>.<name>`.
    Whole(TensorFile),
    /// One part per rank: each kind flat over every parameter in name order, each
    /// part its slice; `offsets`: where each parameter starts in that flat order.
    Parts { parts: Vec<(ShardEntry, TensorFile)>, offsets: HashMap<String, u64> },
}

impl State {
    /// Elements `range` of the state `kind` of parameter `name`, in pieces: each with
    /// where it starts inside `range`.
    fn read(&self, kind: &str, name: &str, range: Range<u64>) -> ckpt::Result<Vec<(u64, Saved)>> {
        match self {
            State::Whole(file) => Ok(vec![(0, file.read(&format!("{kind}.{name}"), range)?)]),
            State::Parts { parts, offsets } => {
                let Some(&at) = offsets.get(name) else {
                    return Err(ckpt::Error::invalid(parts[0].1.path(), format!("no optimizer state of `{name}` in the flat order")));
                };
                let wanted = at + range.start..at + range.end;
                let mut pieces = Vec::new();
                for (part, file) in parts {
                    let held = intersect(&wanted, &(part.start..part.end));
                    if !held.is_empty() {
                        pieces.push((held.start - wanted.start, file.read(kind, held.start - part.start..held.end - part.start)?));
                    }
                }
                Ok(pieces)
            }
        }
    }

    /// The saved step counter, in its shape.
    fn step(&self) -> ckpt::Result<Saved> {
        let file = match self {
            State::Whole(file) => file,
            State::Parts { parts, .. } => &parts[0].1,
        };
        let entry = file.entry("step").ok_or_else(|| ckpt::Error::invalid(file.path(), "no optimizer state `step`"))?;
        let shape = entry.shape.clone();
        Ok(Saved { shape, ..file.read("step", 0..entry.numel())? })
    }
}

fn tensor(saved: &Saved) -> Result<Tensor> {
    Ok(Tensor::f_from_data_size(&saved.data, &saved.shape, saved.dtype.kind())?)
}

/// Fills `buffers` (this rank's chunks of every unit back to back: the parameters,
/// then each state kind, by name) from a checkpoint of whole weights and returns
/// its step counter. `order`: every trainable parameter and its size, in the flat
/// order of a sharded optimizer's parts.
pub(super) fn restore(checkpoint: &Checkpoint, mine: &ParamLayout, rank: u32, buffers: &[(&str, Tensor)], order: &[(String, u64)]) -> Result<Tensor> {
    let bad = |message: String| Error::Checkpoint { path: checkpoint.path.clone(), message };
    let open = |file: &str| TensorFile::open(&checkpoint.path.join(file)).map_err(|e| bad(e.to_string()));
    let model = open(ckpt::MODEL_FILE)?;
    let state = match &checkpoint.shards {
        None => State::Whole(open(ckpt::OPTIMIZER_FILE)?),
        Some(set) => {
            let numel: u64 = order.iter().map(|(_, n)| n).sum();
            if set.numel != numel {
                return Err(bad(format!("its optimizer state covers {} parameter elements, this model has {numel}", set.numel)));
            }
            let (mut offsets, mut at) = (HashMap::new(), 0);
            for (name, n) in order {
                offsets.insert(name.clone(), at);
                at += n;
            }
            State::Parts { parts: set.parts.iter().map(|p| Ok((p.clone(), open(&p.path)?))).collect::<Result<_>>()?, offsets }
        }
    };
    // Every rank checks every parameter, so all refuse a checkpoint of another model alike.
    let params: Vec<_> = mine.units.iter().flat_map(|u| &u.params).collect();
    for p in &params {
        match model.entry(&p.name) {
            None => return Err(bad(format!("no weights for `{}`", p.name))),
            Some(e) if e.shape != p.shape => {
                return Err(bad(format!("it holds `{}` of shape {:?} where this model has shape {:?}", p.name, e.shape, p.shape)))
            }
            Some(_) => {}
        }
    }
    if let Some(extra) = model.names().find(|n| !params.iter().any(|p| p.name == *n)) {
        return Err(bad(format!("it holds `{extra}`, which is no trainable parameter of this model")));
    }
    let (bases, _) = mine.bases();
    tch::no_grad(|| -> Result<()> {
        for (unit, base) in mine.units.iter().zip(bases) {
            let want = unit.range(rank);
            for p in &unit.params {
                let overlap = intersect(&want, &(p.offset..p.offset + p.numel()));
                if overlap.is_empty() {
                    continue;
                }
                let (elements, dest) = (overlap.start - p.offset..overlap.end - p.offset, base + overlap.start - want.start);
                for (kind, live) in buffers {
                    let pieces = match *kind {
                        ckpt::params::PARAMS => model.read(&p.name, elements.clone()).map(|t| vec![(0, t)]),
                        kind => state.read(kind, &p.name, elements.clone()),
                    };
                    for (offset, saved) in pieces.map_err(|e| bad(e.to_string()))? {
                        let value = tensor(&saved)?;
                        live.f_narrow(0, (dest + offset) as i64, value.numel() as i64)?.f_copy_(&value)?;
                    }
                }
            }
        }
        Ok(())
    })?;
    tensor(&state.step().map_err(|e| bad(e.to_string()))?)
}
