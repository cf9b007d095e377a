//! Parameter sharding (`dist.shard = "parameters"`, ZeRO stage 3, FSDP-style): each
//! rank keeps only its chunk of every unit's parameters (a block's, or the rest),
//! of their gradient and of the optimizer state: one float32 buffer each for the
//! trainable parameters' chunks, and one chunk per frozen part (LoRA's base, in its
//! own dtype: gathered, never updated).
//! The units are gathered and released around the blocks by [`gather`](super::gather);
//! each block's gradient is reduce-scattered as its backward finishes, so the full
//! gradient never exists. The update runs on views of the chunks (one per parameter
//! piece, grouped by weight decay), and the next gather picks the new values up:
//! nothing is all-gathered after it.

use std::sync::{Arc, Mutex};

use ptrain_torch_ext::{self as ext, grads, TensorList};
use tch::{Device, Kind, Tensor};

use super::{
    gather::{Part, Shared, Unit, Units},
    layout::FlatLayout,
    names_and_sizes,
    offload::Offload,
    state_kinds, torch_err, update, Group, Optimizer, SavedState, ShardSpec,
};
use crate::{
    checkpoint::{Checkpoint, ParamEntry, ParamLayout, ShardLayout, UnitLayout},
    config::{OptimConfig, ShardMode},
    dist::{DataParallel, ShardCollectives},
    error::{Error, Result},
    model::decoder::BlockWrap,
};

/// What parameter sharding needs besides the agreed [`ShardSpec`].
pub struct ParamSharding {
    pub collectives: Arc<dyn ShardCollectives>,
    pub reshard_after_forward: bool,
    /// `dist.offload_optimizer`: the optimizer state and the update in host memory.
    pub offload: bool,
    /// The model's variables that are not trained (LoRA's base), sharded and
    /// gathered like the rest, without gradient or optimizer state.
    pub frozen: Vec<(String, Tensor)>,
}

/// The unit of a parameter: its block's (1 + the first number in its name), or 0.
fn unit_of(name: &str) -> usize {
    name.split('.').find_map(|part| part.parse::<usize>().ok()).map_or(0, |block| block + 1)
}

pub struct FullySharded {
    config: OptimConfig,
    spec: ShardSpec,
    /// Every trainable unit's chunk size and parameters, as checkpoints record it.
    layout: ParamLayout,
    /// This rank's chunks of every trainable unit, back to back (`held` views it).
    master: Tensor,
    units: Shared,
    groups: Vec<Group>,
    step: Tensor,
    sizes: Vec<(String, u64)>,
    /// This rank's chunks of the trainable parameters (float32 masters, views of one
    /// buffer); the frozen chunks live in their units.
    held: Vec<Tensor>,
    /// This rank's chunks of the trainable parameters' averaged gradient, back to
    /// back, and of the optimizer state by kind, likewise.
    grads: Tensor,
    state: Vec<(&'static str, Tensor)>,
    stats: Tensor,
    /// The host side of `dist.offload_optimizer` (the groups view its buffers).
    offload: Option<Offload>,
    /// Gradient bytes at a step's high point: the chunks, unit 0's whole gradient
    /// (it lives through backward) and the largest block's.
    peak_gradient_bytes: u64,
}

fn torch(e: tch::TchError) -> Error {
    Error::Other(format!("parameter sharding: {e}"))
}

impl FullySharded {
    /// Cuts `params` (trainable, sorted by name) and `with.frozen` into units, all of
    /// them whole on every rank, and keeps this rank's chunk of each; rank 0's values
    /// win. The units' memory is released before this returns.
    pub fn new(config: &OptimConfig, params: &[(String, Tensor)], spec: ShardSpec, with: ParamSharding) -> Result<FullySharded> {
        let frozen = &with.frozen[..];
        let Some((_, first)) = params.first() else { return Err(Error::Other("the model has no trainable parameters".into())) };
        let device = first.device();
        let wrong = params.iter().find(|(_, p)| p.kind() != Kind::Float).or_else(|| params.iter().chain(frozen).find(|(_, p)| p.device() != device));
        if let Some((name, p)) = wrong {
            return Err(Error::Other(format!(
                "dist.shard = \"parameters\" needs every trainable parameter in float32 and every variable on one device; `{name}` is {:?} on {:?}",
                p.kind(),
                p.device()
            )));
        }
        for (_, p) in params.iter().chain(frozen) {
            with.collectives.broadcast(p, 0).map_err(Error::Dist)?;
        }
        let (trained, kept) = (by_unit(params), by_unit(frozen));
        let count = trained.len().max(kept.len());
        let layout_of =
            |members: &[&(String, Tensor)]| FlatLayout::new(&members.iter().map(|(_, t)| t.numel() as u64).collect::<Vec<_>>(), spec.world);
        let train_layouts: Vec<FlatLayout> = (0..count).map(|u| layout_of(trained.get(u).map_or(&[][..], Vec::as_slice))).collect();
        let total: i64 = train_layouts.iter().map(|l| l.chunk as i64).sum();
        // The optimizer's state, and the buffers its update runs on, in host memory with offload.
        let offload = if with.offload { Some(Offload::new(total)?) } else { None };
        let state_device = if with.offload { Device::Cpu } else { device };
        let zeros = |device| Tensor::f_zeros([total], (Kind::Float, device)).map_err(torch);
        let (master, grads) = (zeros(device)?, zeros(device)?);
        let state: Vec<(&'static str, Tensor)> = state_kinds(config).iter().map(|&k| Ok((k, zeros(state_device)?))).collect::<Result<_>>()?;
        let step = Tensor::f_zeros([], (Kind::Float, state_device)).map_err(torch)?;
        let (updated, updated_grads) = match &offload {
            Some(o) => (o.master.shallow_clone(), o.grads.shallow_clone()),
            None => (master.shallow_clone(), grads.shallow_clone()),
        };
        // (weight decay, name, offset in the chunks, length) of each owned trainable piece.
        let mut pieces = Vec::new();
        let mut saved_units = Vec::new();
        let (mut units, mut at) = (Vec::with_capacity(count), 0i64);
        for (u, layout) in train_layouts.into_iter().enumerate() {
            let (mut parts, mut grad_shard) = (Vec::new(), None);
            let train = trained.get(u).cloned().unwrap_or_default();
            if !train.is_empty() {
                let owned = layout.range(spec.rank);
                for piece in layout.pieces(owned.clone()) {
                    let (name, p) = train[piece.param];
                    pieces.push((p.dim() >= 2, name.clone(), at + (piece.flat_offset - owned.start) as i64, piece.len as i64));
                }
                let chunk = layout.chunk as i64;
                let entries =
                    train.iter().zip(&layout.params).map(|((name, p), &(offset, _))| ParamEntry { name: name.clone(), shape: p.size(), offset });
                saved_units.push(UnitLayout { chunk: layout.chunk, params: entries.collect() });
                parts.push(part(&train, layout, master.narrow(0, at, chunk), spec.rank)?);
                grad_shard = Some(grads.narrow(0, at, chunk));
                at += chunk;
            }
            let others = kept.get(u).cloned().unwrap_or_default();
            let mut kinds: Vec<Kind> = Vec::new();
            for (_, t) in &others {
                if !kinds.contains(&t.kind()) {
                    kinds.push(t.kind());
                }
            }
            for kind in kinds {
                let members: Vec<&(String, Tensor)> = others.iter().copied().filter(|(_, t)| t.kind() == kind).collect();
                let layout = layout_of(&members);
                let shard = Tensor::f_zeros([layout.chunk as i64], (kind, device)).map_err(torch)?;
                parts.push(part(&members, layout, shard, spec.rank)?);
            }
            if parts.is_empty() {
                return Err(Error::Other(format!("dist.shard = \"parameters\": block {} has no parameters", u as i64 - 1)));
            }
            units.push(Unit::new(parts, grad_shard));
        }
        let mut groups = Vec::new();
        for decay in [true, false] {
            let mine: Vec<_> = pieces.iter().filter(|p| p.0 == decay).collect();
            if mine.is_empty() {
                continue;
            }
            let list = |t: &Tensor| TensorList::new(mine.iter().map(|p| t.narrow(0, p.2, p.3)).collect());
            let of_kind = |k: &str| state.iter().find(|(name, _)| *name == k).map_or_else(|| TensorList::new(Vec::new()), |(_, t)| list(t));
            groups.push(Group {
                weight_decay: if decay { config.weight_decay } else { 0.0 },
                names: mine.iter().map(|p| p.1.clone()).collect(),
                params: list(&updated),
                grads: list(&updated_grads),
                exp_avgs: of_kind("exp_avg"),
                exp_avg_sqs: of_kind("exp_avg_sq"),
                momentum: of_kind("momentum"),
                steps: TensorList::repeat(&step, mine.len()),
            });
        }
        let element = Kind::Float.elt_size_in_bytes() as u64;
        let whole = |u: &Unit| u.grad_shard.as_ref().map_or(0, |_| u.parts[0].layout.padded() * element);
        let largest_block = units.iter().skip(1).map(whole).max().unwrap_or(0);
        let peak_gradient_bytes = total as u64 * element + units.first().map_or(0, whole) + largest_block;
        let held: Vec<Tensor> = units.iter().filter(|u| u.grad_shard.is_some()).map(|u| u.parts[0].shard.shallow_clone()).collect();
        let mut units = Units::new(units, with.collectives, spec.rank, with.reshard_after_forward)?;
        units.release_all()?;
        if let Some(o) = &offload {
            o.pull(&master)?;
        }
        Ok(FullySharded {
            config: config.clone(),
            spec,
            layout: ParamLayout { units: saved_units },
            master,
            units: Shared(Arc::new(Mutex::new(units))),
            groups,
            step,
            sizes: names_and_sizes(params),
            held,
            grads,
            state,
            stats: Tensor::f_zeros([2], (Kind::Float, device)).map_err(torch)?,
            offload,
            peak_gradient_bytes,
        })
    }
}

/// The variables of each unit, in the order given (unit 0 first).
fn by_unit(vars: &[(String, Tensor)]) -> Vec<Vec<&(String, Tensor)>> {
    let mut units: Vec<Vec<&(String, Tensor)>> = Vec::new();
    for var in vars {
        let u = unit_of(&var.0);
        if units.len() <= u {
            units.resize(u + 1, Vec::new());
        }
        units[u].push(var);
    }
    units
}

/// Moves `members` into one flat buffer laid out as `layout` (every handle to them,
/// model, var store and trainer, views it from here on), and copies this rank's
/// chunk into `shard`.
fn part(members: &[&(String, Tensor)], layout: FlatLayout, shard: Tensor, rank: u32) -> Result<Part> {
    let (kind, device) = (members[0].1.kind(), members[0].1.device());
    let full = Tensor::f_zeros([layout.padded() as i64], (kind, device)).map_err(torch)?;
    tch::no_grad(|| {
        for ((_, p), &(offset, n)) in members.iter().zip(&layout.params) {
            let view = full.narrow(0, offset as i64, n as i64).view(p.size().as_slice());
            view.shallow_clone().copy_(p);
            p.shallow_clone().set_data(&view);
        }
    });
    let chunk = layout.chunk as i64;
    tch::no_grad(|| shard.shallow_clone().f_copy_(&full.narrow(0, rank as i64 * chunk, chunk))).map_err(torch)?;
    let params = TensorList::new(members.iter().map(|(_, p)| p.shallow_clone()).collect());
    Ok(Part { params, layout, full, shard })
}

impl Optimizer for FullySharded {
    /// Zeroes the gradient chunks and gives unit 0 a fresh flat `.grad` (the blocks
    /// get theirs when their backward starts).
    fn zero_grad(&mut self) -> Result<()> {
        let _ = self.grads.f_zero_().map_err(torch)?;
        self.units.lock().attach_grads(0)
    }

    /// Unit 0's gradient (and any block's a hook did not reach) reduce-scattered, then
    /// one all-reduce of the chunks' sum of squares and the non-finite flag.
    fn reduce_gradients(&mut self, dp: &mut dyn DataParallel, found_inf: &Tensor) -> Result<()> {
        {
            let mut units = self.units.lock();
            (0..units.units.len()).try_for_each(|u| units.reduce_grads(u))?;
        }
        tch::no_grad(|| {
            self.stats.get(0).copy_(&self.grads.dot(&self.grads));
            self.stats.get(1).copy_(found_inf);
        });
        dp.all_reduce_sum(&mut self.stats).map_err(Error::Dist)?;
        found_inf.shallow_clone().copy_(&self.stats.get(1).clamp_max(1.0));
        Ok(())
    }

    fn clip_grad_norm(&self) -> Result<Tensor> {
        let norm = self.stats.get(0).sqrt();
        let max_norm = self.config.grad_clip;
        if max_norm > 0.0 {
            let coef = (norm.g_add_scalar(1e-6).reciprocal() * max_norm).clamp_max(1.0);
            let _ = self.grads.shallow_clone().g_mul_(&coef);
        }
        Ok(norm)
    }

    /// The update on the chunks; every gathered unit goes (the next gather brings
    /// the new values).
    fn step(&mut self, lr: f64, found_inf: Option<&Tensor>) -> Result<()> {
        match &self.offload {
            None => update(&self.config, &self.groups, &mut self.step, lr, found_inf)?,
            Some(o) => o.step(&self.config, &self.groups, &mut self.step, lr, found_inf, [&self.grads, &self.master])?,
        }
        self.units.lock().release_all()
    }

    fn sync_params(&mut self, _dp: &mut dyn DataParallel) -> Result<()> {
        Ok(())
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![("step".to_string(), self.step.shallow_clone())];
        out.extend(self.state.iter().map(|(k, t)| (k.to_string(), t.shallow_clone())));
        out
    }

    /// Checkpoints of other shard modes hold whole weights, which a rank of this run
    /// never holds: they go through [`Optimizer::restore_chunks`] instead.
    fn load_state(&mut self, _saved: &dyn SavedState) -> Result<()> {
        Err(Error::Other("parameter sharding restores through restore_chunks".into()))
    }

    fn sharded_params(&self) -> Vec<(String, Tensor)> {
        vec![(crate::checkpoint::params::PARAMS.to_string(), self.master.shallow_clone())]
    }

    fn restore_chunks(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        let mut buffers = vec![(crate::checkpoint::params::PARAMS, self.master.shallow_clone())];
        buffers.extend(self.state.iter().map(|(k, t)| (*k, t.shallow_clone())));
        let step = super::chunks::restore(checkpoint, &self.layout, self.spec.rank, &buffers)?;
        if let Some(o) = &self.offload {
            o.pull(&self.master)?;
        }
        super::load_step(&mut self.step, &step)
    }

    fn param_sizes(&self) -> &[(String, u64)] {
        &self.sizes
    }

    fn parameter_bytes(&self) -> Result<u64> {
        ext::grads::held_bytes(&self.held, []).map_err(torch_err)
    }

    fn gradient_bytes(&self) -> Result<u64> {
        let units = self.units.lock();
        let buffers: Vec<Tensor> = units.grad_buffers().into_iter().chain([self.grads.shallow_clone()]).collect();
        let params: Vec<Tensor> =
            units.units.iter().flat_map(|u| u.parts.iter().flat_map(|p| p.params.tensors().iter().map(Tensor::shallow_clone))).collect();
        grads::held_bytes(&buffers, &params).map_err(torch_err)
    }

    fn gradient_peak_bytes(&self) -> Option<u64> {
        Some(self.peak_gradient_bytes)
    }

    fn shard_mode(&self) -> ShardMode {
        ShardMode::Parameters
    }

    /// The parts tile `[0, world x chunks)`: rank r's part holds `[r x chunks, (r + 1) x chunks)`.
    fn checkpoint_layout(&self) -> Option<ShardLayout> {
        let chunks = self.master.numel() as u64;
        Some(ShardLayout {
            mode: ShardMode::Parameters.name().into(),
            world_size: self.spec.world,
            numel: chunks * self.spec.world as u64,
            ranges: (0..self.spec.world as u64).map(|r| [r * chunks, (r + 1) * chunks]).collect(),
            save_id: format!("{:016x}", self.spec.save_id),
            params: Some(self.layout.clone()),
        })
    }

    fn block_wrap(&self) -> Option<(Arc<dyn BlockWrap>, usize)> {
        let blocks = self.units.lock().units.len() - 1;
        Some((Arc::new(self.units.clone()), blocks))
    }
}

#[cfg(test)]
mod tests {
    use super::unit_of;

    #[test]
    fn a_parameter_belongs_to_the_block_its_name_numbers() {
        assert_eq!(unit_of("transformer.h.3.ln_1.weight"), 4);
        assert_eq!(unit_of("model.layers.0.mlp.up_proj.weight"), 1);
        assert_eq!(unit_of("transformer.wte.weight"), 0);
        assert_eq!(unit_of("lm_head.weight"), 0);
    }
}
