//! Parameter sharding's units and the block wrap that gathers them (ZeRO-3, FSDP).
//!
//! A unit is the variables of one decoder block (unit `i + 1` for block `i`), or,
//! unit 0, the rest (embeddings, final norm, head). Each is one flat buffer per part
//! (its trainable parameters; its frozen ones by dtype), padded to `world` equal
//! chunks, which the model's variables view; its memory exists only while the unit
//! is gathered (the storage is resized to nothing and back, so what autograd saved
//! keeps pointing at it). Between steps a rank holds only its chunk of each part.
//!
//! - Forward: a block's unit is gathered before it runs (the next block's gather is
//!   issued before this one computes: one block of prefetch), and released after,
//!   unless `dist.reshard_after_forward = false` (training only).
//! - Backward: a hook on the block's output gathers it again (and issues the previous
//!   block's gather) and gives its parameters a fresh flat `.grad`; a hook on its
//!   input, which fires once the block's backward is done, reduce-scatters that
//!   gradient into this rank's gradient chunk and releases both.
//! - A checkpointed block: its checkpoint's forward gathers and releases it; the
//!   recompute in backward gathers it again and the hook on the input releases it.
//! - Unit 0 is gathered at the start of every forward and released after the update;
//!   its gradient is left to autograd on its parameters (the chunked loss's head
//!   gradient becomes the embedding's `.grad` without a copy) and copied into a flat
//!   buffer only for its reduce-scatter, after backward.

use std::sync::{Arc, Mutex, MutexGuard};

use ptrain_torch_ext::{grads, sharding, TensorList, TorchError};
use tch::{Kind, Tensor};

use super::{layout::FlatLayout, mixed::Vectors};
use crate::{
    dist::{Pending, ShardCollectives},
    error::{Error, Result},
    model::decoder::BlockWrap,
};

enum Held {
    Released,
    Gathering(Vec<Box<dyn Pending>>),
    Gathered,
}

/// One flat buffer of a unit: its trainable parameters, or its frozen ones of one dtype.
pub(super) struct Part {
    /// The model's parameters in this part, views of `full`.
    pub params: TensorList,
    pub layout: FlatLayout,
    /// The part, padded to `world` chunks; memory only while gathered.
    pub full: Tensor,
    /// This rank's chunk (a view of a master buffer).
    pub shard: Tensor,
    /// Gathered in bf16: its float32 vectors, gathered beside `full` ([`mixed`](super::mixed)).
    pub vectors: Option<Vectors>,
}

impl Part {
    fn bytes(&self) -> u64 {
        self.layout.padded() * self.full.kind().elt_size_in_bytes() as u64
    }

    /// What the part takes gathered: its flat buffer and, in bf16, its float32 vectors.
    pub fn gathered_bytes(&self) -> u64 {
        self.bytes() + self.vectors.as_ref().map_or(0, Vectors::bytes)
    }
}

pub(super) struct Unit {
    /// The trainable part first, when there is one; then the frozen ones.
    pub parts: Vec<Part>,
    /// This rank's chunk of the trainable part's averaged gradient (a view of the
    /// optimizer's buffer); `None` for a unit without trainable parameters.
    pub grad_shard: Option<Tensor>,
    /// The trainable part's gradient from backward until it is reduce-scattered.
    grad_full: Option<Tensor>,
    held: Held,
}

impl Unit {
    pub fn new(parts: Vec<Part>, grad_shard: Option<Tensor>) -> Unit {
        Unit { parts, grad_shard, grad_full: None, held: Held::Gathered }
    }
}

pub(super) struct Units {
    pub units: Vec<Unit>,
    comm: Arc<dyn ShardCollectives>,
    rank: i64,
    reshard_after_forward: bool,
    /// Every unit gathered and kept (`BlockWrap::hold_whole`).
    held_whole: bool,
}

fn torch(e: TorchError) -> Error {
    Error::Other(format!("parameter sharding: {e}"))
}

fn tch_err(e: tch::TchError) -> Error {
    Error::Other(format!("parameter sharding: {}", crate::error::torch_message(&e)))
}

impl Units {
    pub fn new(units: Vec<Unit>, comm: Arc<dyn ShardCollectives>, rank: u32, reshard_after_forward: bool) -> Result<Units> {
        Ok(Units { units, comm, rank: rank as i64, reshard_after_forward, held_whole: false })
    }

    /// Issues unit `u`'s all-gathers unless it is gathered or on its way.
    pub fn start_gather(&mut self, u: usize) -> Result<()> {
        let unit = &mut self.units[u];
        if !matches!(unit.held, Held::Released) {
            return Ok(());
        }
        let mut works = Vec::with_capacity(unit.parts.len());
        for part in &unit.parts {
            sharding::resize_storage(&part.full, part.bytes()).map_err(torch)?;
            let chunk = part.layout.chunk as i64;
            tch::no_grad(|| part.full.narrow(0, self.rank * chunk, chunk).f_copy_(&part.shard)).map_err(tch_err)?;
            works.push(self.comm.start_all_gather(&part.full).map_err(Error::Dist)?);
            if let Some(vectors) = &part.vectors {
                works.push(vectors.start_gather(&part.shard, self.comm.as_ref())?);
            }
        }
        unit.held = Held::Gathering(works);
        Ok(())
    }

    /// Unit `u`, gathered.
    pub fn gathered(&mut self, u: usize) -> Result<()> {
        self.start_gather(u)?;
        let unit = &mut self.units[u];
        if let Held::Gathering(works) = std::mem::replace(&mut unit.held, Held::Gathered) {
            works.into_iter().try_for_each(|w| w.wait()).map_err(Error::Dist)?;
            unit.parts.iter().filter_map(|p| p.vectors.as_ref()).try_for_each(Vectors::unpack)?;
        }
        Ok(())
    }

    /// Gives unit `u`'s gathered memory back (after its gathers, if in flight).
    pub fn release(&mut self, u: usize) -> Result<()> {
        let unit = &mut self.units[u];
        match std::mem::replace(&mut unit.held, Held::Released) {
            Held::Released => return Ok(()),
            Held::Gathering(works) => works.into_iter().try_for_each(|w| w.wait()).map_err(Error::Dist)?,
            Held::Gathered => {}
        }
        unit.parts.iter().try_for_each(|p| sharding::resize_storage(&p.full, 0)).map_err(torch)
    }

    pub fn release_all(&mut self) -> Result<()> {
        (0..self.units.len()).try_for_each(|u| self.release(u))
    }

    /// A zeroed flat `.grad` for unit `u`'s trainable parameters, unless they have one.
    pub fn attach_grads(&mut self, u: usize) -> Result<()> {
        let unit = &mut self.units[u];
        if unit.grad_full.is_none() && unit.grad_shard.is_some() {
            let part = &unit.parts[0];
            let flat = Tensor::f_zeros([part.layout.padded() as i64], (part.full.kind(), part.full.device())).map_err(tch_err)?;
            match &part.vectors {
                Some(vectors) => vectors.attach_grads(&flat)?,
                None => grads::attach_flat(&part.params, &flat).map_err(torch)?,
            }
            unit.grad_full = Some(flat);
        }
        Ok(())
    }

    /// Reduce-scatters unit `u`'s gradient (if it has one) and adds this rank's
    /// chunk of the average to its gradient chunk; the full gradient goes.
    pub fn reduce_grads(&mut self, u: usize) -> Result<()> {
        let unit = &mut self.units[u];
        let (Some(flat), Some(shard)) = (unit.grad_full.take(), &unit.grad_shard) else { return Ok(()) };
        let part = &unit.parts[0];
        // Gathered in bf16: reduced in float32 (FSDP2's `reduce_dtype`), the vectors'
        // float32 gradients copied in.
        let flat = if flat.kind() == Kind::Float {
            flat
        } else {
            let wide = flat.f_to_kind(Kind::Float).map_err(tch_err)?;
            if let Some(vectors) = &part.vectors {
                vectors.copy_grads(&part.params, &part.layout, &wide)?;
            }
            wide
        };
        grads::detach(&part.params).map_err(torch)?;
        // In place, into this rank's chunk of the flat gradient itself: no buffer of
        // the largest chunk held for it (260 MiB at Qwen2-0.5B's shape on 2 ranks).
        let chunk = part.layout.chunk as i64;
        let own = flat.f_narrow(0, self.rank * chunk, chunk).map_err(tch_err)?;
        self.comm.reduce_scatter(&flat, &own).map_err(Error::Dist)?;
        let _ = tch::no_grad(|| shard.shallow_clone().f_add_(&own)).map_err(tch_err)?;
        Ok(())
    }

    /// Reduces unit `u`'s gradient as backward left it on its parameters, with no flat
    /// `.grad` attached before (unit 0: see `FullySharded::zero_grad`): copied into
    /// one flat buffer (zero where backward did not reach), then as [`Self::reduce_grads`].
    /// Every rank reduces, whatever its backward reached, so the collectives pair up.
    /// Called once backward is done: the unit's gathered weights go first (nothing
    /// reads them before the update, after which they would go anyway; the next
    /// forward gathers the updated ones), so the flat buffer takes their memory.
    pub fn reduce_loose_grads(&mut self, u: usize) -> Result<()> {
        if self.units[u].grad_full.is_some() || self.units[u].grad_shard.is_none() {
            return self.reduce_grads(u);
        }
        self.release(u)?;
        let unit = &mut self.units[u];
        let part = &unit.parts[0];
        // Float32 whatever the gathered dtype: the sum is reduced in float32.
        let flat = Tensor::f_zeros([part.layout.padded() as i64], (Kind::Float, part.full.device())).map_err(tch_err)?;
        for (param, &(offset, numel)) in part.params.tensors().iter().zip(&part.layout.params) {
            let grad = param.grad();
            if grad.defined() {
                // add_, not copy_: the tied embedding's lookup gradient may have come alone,
                // sparse (dense + sparse is defined, a dense copy of a sparse one is not).
                let into = flat.f_narrow(0, offset as i64, numel as i64).and_then(|t| t.f_view_as(&grad)).map_err(tch_err)?;
                let _ = tch::no_grad(|| into.shallow_clone().f_add_(&grad)).map_err(tch_err)?;
            }
            // Released as soon as copied: one whole gradient beside the flat one at a time.
            grads::detach(&TensorList::new(vec![param.shallow_clone()])).map_err(torch)?;
        }
        unit.grad_full = Some(flat);
        self.reduce_grads(u)
    }

    /// Gradient tensors held now besides the chunks.
    pub fn grad_buffers(&self) -> Vec<Tensor> {
        self.units.iter().filter_map(|u| u.grad_full.as_ref().map(Tensor::shallow_clone)).collect()
    }
}

/// The units, shared by the optimizer and the block wrap (whose hooks run on the
/// thread running backward).
#[derive(Clone)]
pub(super) struct Shared(pub Arc<Mutex<Units>>);

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, Units> {
        // A poisoned lock means a hook panicked; its error already failed the run.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Block unit `u`'s backward is about to run.
    fn before_backward(&self, u: usize) -> Result<()> {
        let mut units = self.lock();
        units.gathered(u)?;
        units.attach_grads(u)?;
        if u > 1 {
            units.start_gather(u - 1)?;
        }
        Ok(())
    }

    /// Block unit `u`'s backward is done.
    fn after_backward(&self, u: usize) -> Result<()> {
        let mut units = self.lock();
        units.reduce_grads(u)?;
        units.release(u)
    }

    fn hook(&self, t: &Tensor, u: usize, after: bool) -> Result<()> {
        let shared = self.clone();
        let call = move || {
            let done = if after { shared.after_backward(u) } else { shared.before_backward(u) };
            done.map_err(|e| e.to_string())
        };
        sharding::on_grad(t, Arc::new(call)).map_err(torch)
    }
}

impl BlockWrap for Shared {
    fn enter(&self) -> Result<()> {
        self.lock().gathered(0)
    }

    fn around(&self, index: usize, input: &Tensor, checkpointed: bool, forward: &mut dyn FnMut() -> Result<Tensor>) -> Result<Tensor> {
        let u = index + 1;
        // Backward recomputing a checkpointed block: its gradient is reduced by the
        // hook its checkpoint's forward set on the outer input.
        let recompute = checkpointed && sharding::grad_enabled();
        {
            let mut units = self.lock();
            units.gathered(u)?;
            if recompute {
                units.attach_grads(u)?;
                if u > 1 {
                    units.start_gather(u - 1)?;
                }
            } else if u + 1 < units.units.len() {
                units.start_gather(u + 1)?;
            }
        }
        let output = forward()?;
        if recompute {
            return Ok(output);
        }
        // Whether a backward will come through this block.
        let training = output.requires_grad() || (checkpointed && input.requires_grad());
        if training {
            if !checkpointed {
                self.hook(&output, u, false)?;
            }
            if input.requires_grad() {
                self.hook(input, u, true)?;
            }
        }
        let mut units = self.lock();
        if (!training || units.reshard_after_forward) && !units.held_whole {
            units.release(u)?;
        }
        Ok(output)
    }

    /// Gathers every unit (all their all-gathers issued first) and keeps them, or
    /// releases them all: the gathered model costs its whole size on each rank while
    /// held (4 bytes a parameter, 2 for the blocks' matrices under bf16).
    fn hold_whole(&self, hold: bool) -> Result<()> {
        let mut units = self.lock();
        units.held_whole = hold;
        let n = units.units.len();
        match hold {
            true => (0..n).try_for_each(|u| units.start_gather(u)).and_then(|()| (0..n).try_for_each(|u| units.gathered(u))),
            false => units.release_all(),
        }
    }
}
