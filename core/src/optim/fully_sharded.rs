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
    cut::{CutModel, CutUnit},
    gather::{Shared, Unit, Units},
    mixed::gather_in,
    names_and_sizes,
    offload::Offload,
    state_kinds, torch_err, update, Group, LearningRate, Optimizer, SavedState, ShardSpec,
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
    /// The model cut into units ([`cut`](super::cut)): set before the optimizer is built.
    pub cut: Option<CutModel>,
    /// The dtype the blocks' trainable parameters are gathered in: bfloat16 under
    /// `train.precision = "bf16"` (FSDP2's `param_dtype`), float32 otherwise. Unit 0
    /// (embeddings, final norm, head: float32 ops under autocast) stays float32.
    pub gather_kind: Kind,
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
    /// (it lives through backward) and the larger of the largest block's (in
    /// backward) and unit 0's flat copy (while it is made, for the reduction).
    peak_gradient_bytes: u64,
    /// The largest block's gathered bytes (`summary.json`'s `gathered_block_bytes`).
    gathered_block_bytes: u64,
}

fn torch(e: tch::TchError) -> Error {
    Error::Other(format!("parameter sharding: {}", crate::error::torch_message(&e)))
}

impl FullySharded {
    /// Over the model `with.cut` holds (`params`: its trainable parameters, sorted by
    /// name): the gradient chunks, the optimizer state and the gathers of its units.
    pub fn new(config: &OptimConfig, params: &[(String, Tensor)], spec: ShardSpec, mut with: ParamSharding) -> Result<FullySharded> {
        let Some(CutModel { master, units: cut, .. }) = with.cut.take() else {
            return Err(Error::Other("parameter sharding: the model was not cut into units".into()));
        };
        let device = master.device();
        let total = master.numel() as i64;
        // The optimizer's state, and the buffers its update runs on, in host memory with offload.
        let offload = if with.offload { Some(Offload::new(total)?) } else { None };
        let state_device = if with.offload { Device::Cpu } else { device };
        let zeros = |device| Tensor::f_zeros([total], (Kind::Float, device)).map_err(torch);
        let grads = zeros(device)?;
        let state: Vec<(&'static str, Tensor)> = state_kinds(config).iter().map(|&k| Ok((k, zeros(state_device)?))).collect::<Result<_>>()?;
        let step = Tensor::f_zeros([], (Kind::Float, state_device)).map_err(torch)?;
        let (updated, updated_grads) = match &offload {
            Some(o) => (o.master.shallow_clone(), o.grads.shallow_clone()),
            None => (master.shallow_clone(), grads.shallow_clone()),
        };
        let (units, pieces, saved_units) = units_of(cut, &grads, with.gather_kind, spec.rank, total)?;
        let groups = groups(config, &pieces, &state, (&updated, &updated_grads), &step);
        let (peak_gradient_bytes, gathered_block_bytes) = gradient_figures(&units, total);
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
            gathered_block_bytes,
        })
    }
}

/// An owned trainable piece of the chunks: (weight decay, name, offset, length).
type Piece = (bool, String, i64, i64);

/// The units of the cut model, each gathering its parts (unit 0's whole, the blocks'
/// gathered when they run) with its slice of the gradient chunks; the owned trainable
/// pieces; and the units' layouts as checkpoints record them.
fn units_of(cut: Vec<CutUnit>, grads: &Tensor, gather_kind: Kind, rank: u32, total: i64) -> Result<(Vec<Unit>, Vec<Piece>, Vec<UnitLayout>)> {
    let mut pieces = Vec::new();
    let mut saved_units = Vec::new();
    let (mut units, mut at) = (Vec::with_capacity(cut.len()), 0i64);
    for (u, CutUnit { trained, frozen }) in cut.into_iter().enumerate() {
        let (mut parts, mut grad_shard) = (Vec::new(), None);
        if let Some((members, mut part)) = trained {
            if u > 0 {
                gather_in(&mut part, gather_kind, rank)?;
            }
            let layout = &part.layout;
            let owned = layout.range(rank);
            for piece in layout.pieces(owned.clone()) {
                let (name, shape) = &members[piece.param];
                pieces.push((shape.len() >= 2, name.clone(), at + (piece.flat_offset - owned.start) as i64, piece.len as i64));
            }
            let chunk = layout.chunk as i64;
            let entries = members.iter().zip(&layout.params).map(|((name, shape), &(offset, _))| ParamEntry {
                name: name.clone(),
                shape: shape.clone(),
                offset,
            });
            saved_units.push(UnitLayout { chunk: layout.chunk, params: entries.collect() });
            grad_shard = Some(grads.narrow(0, at, chunk));
            parts.push(part);
            at += chunk;
        }
        parts.extend(frozen.into_iter().map(|(_, part)| part));
        if parts.is_empty() {
            return Err(Error::Other(format!("dist.shard = \"parameters\": block {} has no parameters", u as i64 - 1)));
        }
        units.push(Unit::new(parts, grad_shard));
    }
    if at != total {
        return Err(Error::Other(format!("parameter sharding: the units' chunks hold {at} elements, the master chunks {total}")));
    }
    Ok((units, pieces, saved_units))
}

/// The fused optimizer's groups over the owned pieces (with weight decay, without):
/// views into the updated chunks (`updated`: parameters, gradients) and the state.
fn groups(
    config: &OptimConfig,
    pieces: &[Piece],
    state: &[(&'static str, Tensor)],
    (updated, updated_grads): (&Tensor, &Tensor),
    step: &Tensor,
) -> Vec<Group> {
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
            params: list(updated),
            grads: list(updated_grads),
            exp_avgs: of_kind("exp_avg"),
            exp_avg_sqs: of_kind("exp_avg_sq"),
            momentum: of_kind("momentum"),
            steps: TensorList::repeat(step, mine.len()),
        });
    }
    groups
}

/// Gradient bytes at a step's high point, and the largest block's gathered bytes.
fn gradient_figures(units: &[Unit], total: i64) -> (u64, u64) {
    let element = Kind::Float.elt_size_in_bytes() as u64;
    // A unit's whole gradient: in its gathered dtype, and beside it the float32
    // copy its reduction takes when that dtype is another.
    let whole = |u: &Unit| {
        let kind = u.parts[0].full.kind();
        let bytes = kind.elt_size_in_bytes() as u64 + if kind == Kind::Float { 0 } else { element };
        u.grad_shard.as_ref().map_or(0, |_| u.parts[0].layout.padded() * bytes)
    };
    let largest_block = units.iter().skip(1).map(whole).max().unwrap_or(0);
    let unit0 = units.first().map_or(0, whole);
    let peak = total as u64 * element + unit0 + largest_block.max(unit0);
    let gathered = units.iter().skip(1).map(|u| u.parts.iter().map(|p| p.gathered_bytes()).sum()).max().unwrap_or(0);
    (peak, gathered)
}

impl Optimizer for FullySharded {
    /// Zeroes the gradient chunks. Unit 0 gets no `.grad` before forward (the blocks
    /// get theirs when their backward starts): the chunked loss hands backward its
    /// head's whole `[V, D]` gradient, made in forward, and autograd makes that buffer
    /// the tied embedding's `.grad` when it has none, where a `.grad` attached now
    /// would be a second one beside it from the loss on (519 MiB at Qwen2's shape).
    /// [`reduce_gradients`](Self::reduce_gradients) gathers it into the flat layout.
    fn zero_grad(&mut self) -> Result<()> {
        let _ = self.grads.f_zero_().map_err(torch)?;
        Ok(())
    }

    /// Unit 0's gradient (and any block's a hook did not reach) reduce-scattered, then
    /// one all-reduce of the chunks' sum of squares and the non-finite flag.
    fn reduce_gradients(&mut self, dp: &mut dyn DataParallel, found_inf: &Tensor) -> Result<()> {
        {
            let mut units = self.units.lock();
            units.reduce_loose_grads(0)?;
            (1..units.units.len()).try_for_each(|u| units.reduce_grads(u))?;
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
    fn step(&mut self, lr: &LearningRate, found_inf: Option<&Tensor>) -> Result<()> {
        match &self.offload {
            None => update(&self.config, &self.groups, &mut self.step, lr.on_device(), found_inf)?,
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

    /// A rank of this run never holds whole weights or whole state: every checkpoint,
    /// of any shard mode, goes through [`Optimizer::restore_chunks`] instead.
    fn load_state(&mut self, _saved: &dyn SavedState) -> Result<()> {
        Err(Error::Other("parameter sharding restores through restore_chunks".into()))
    }

    fn sharded_params(&self) -> Vec<(String, Tensor)> {
        vec![(crate::checkpoint::params::PARAMS.to_string(), self.master.shallow_clone())]
    }

    fn restore_chunks(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        let mut buffers = vec![(crate::checkpoint::params::PARAMS, self.master.shallow_clone())];
        buffers.extend(self.state.iter().map(|(k, t)| (*k, t.shallow_clone())));
        let step = super::chunks::restore(checkpoint, &self.layout, self.spec.rank, &buffers, &self.sizes)?;
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

    fn gathered_block_bytes(&self) -> u64 {
        self.gathered_block_bytes
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
