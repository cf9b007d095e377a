//! Resuming parameter sharding from a parameter-sharded checkpoint of any world
//! size (others: [`from_whole`](super::from_whole)): the saved parts are read one
//! at a time (only those holding some of this rank's elements, and one for the step
//! counter), and the overlap of each saved chunk with this rank's chunk of the same
//! unit is copied. Whole weights never exist on a rank.

use std::ops::Range;

use ptrain_plugin_api::DType;
use tch::{Kind, Tensor};

use crate::{
    checkpoint::{params::copy_overlap, Checkpoint, ParamLayout},
    error::{Error, Result},
};

pub(super) fn intersect(a: &Range<u64>, b: &Range<u64>) -> Range<u64> {
    a.start.max(b.start)..a.end.min(b.end)
}

/// Fills `buffers` (each this rank's chunks of every unit back to back, float32:
/// the parameters, then each state kind, by their names in the parts) and returns
/// the saved step counter. A checkpoint saved without parameter sharding (whole
/// weights) is read by [`from_whole`](super::from_whole), in the flat `order` of its
/// optimizer's parts.
pub(super) fn restore(checkpoint: &Checkpoint, mine: &ParamLayout, rank: u32, buffers: &[(&str, Tensor)], order: &[(String, u64)]) -> Result<Tensor> {
    let bad = |message: String| Error::Checkpoint { path: checkpoint.path.clone(), message };
    let (Some(set), Some(saved)) = (&checkpoint.shards, checkpoint.param_layout()) else {
        return super::from_whole::restore(checkpoint, mine, rank, buffers, order);
    };
    if saved.units.len() != mine.units.len() {
        return Err(bad(format!("it has {} units of trainable parameters, this model {}", saved.units.len(), mine.units.len())));
    }
    for (s, m) in saved.units.iter().zip(&mine.units) {
        if let Some((a, b)) = s.params.iter().zip(&m.params).find(|(a, b)| (&a.name, &a.shape, a.offset) != (&b.name, &b.shape, b.offset)) {
            return Err(bad(format!("it holds `{}` of shape {:?} where this model has `{}` of shape {:?}", a.name, a.shape, b.name, b.shape)));
        }
        if s.params.len() != m.params.len() {
            return Err(bad(format!("its unit of `{}` has {} parameters, this model's {}", s.params[0].name, s.params.len(), m.params.len())));
        }
    }
    let ((saved_bases, saved_total), (my_bases, total)) = (saved.bases(), mine.bases());
    let size = Kind::Float.elt_size_in_bytes();
    let mut host: Vec<Vec<u8>> = buffers.iter().map(|_| vec![0u8; total as usize * size]).collect();
    let mut step = None;
    for part in &set.parts {
        let overlaps = saved.units.iter().zip(&mine.units).any(|(s, m)| !intersect(&s.range(part.rank), &m.range(rank)).is_empty());
        if !overlaps && step.is_some() {
            continue;
        }
        let tensors = checkpoint.read_part(part).map_err(|e| bad(e.to_string()))?;
        let counter = tensors.get("step").ok_or_else(|| bad(format!("{}: no `step`", part.path)))?;
        step.get_or_insert(Tensor::f_from_data_size(&counter.data, &counter.shape, counter.dtype.kind())?);
        for ((name, _), out) in buffers.iter().zip(&mut host) {
            let flat = tensors.get(*name).ok_or_else(|| bad(format!("`{name}` missing from {}", part.path)))?;
            if flat.dtype != DType::F32 || flat.shape != [saved_total as i64] {
                return Err(bad(format!("`{name}` of {} is {:?} {:?}, expected F32 [{saved_total}]", part.path, flat.dtype, flat.shape)));
            }
            for (u, (s, m)) in saved.units.iter().zip(&mine.units).enumerate() {
                let (held, want) = (s.range(part.rank), m.range(rank));
                copy_overlap(&flat.data, saved_bases[u], held.start, out, my_bases[u], want.start, intersect(&held, &want), size);
            }
        }
    }
    for ((_, live), bytes) in buffers.iter().zip(host) {
        let value = Tensor::f_from_data_size(&bytes, &[total as i64], Kind::Float)?.f_to_device(live.device())?;
        tch::no_grad(|| live.shallow_clone().f_copy_(&value))?;
    }
    step.ok_or_else(|| bad("no optimizer parts".into()))
}
