//! AdamW and SGD on libtorch's fused kernels (`torch._fused_adamw_`,
//! `_fused_sgd_`), with state the trainer owns so checkpoints can hold it.
//!
//! Weight decay applies to matrices and embeddings only (parameters with two or more
//! dimensions), as in nanoGPT and HF Trainer. A non-finite loss skips the update on
//! the device through the kernels' `found_inf` argument: no host sync.
//!
//! One interface, [`Optimizer`], two ways to hold the state across ranks (as
//! ZeRO and burn-train's multi-device strategies do): [`Replicated`], every rank
//! keeps all of it and gradients are all-reduced; [`Sharded`] (`dist.shard`),
//! each rank keeps its slice of the parameters only ([`shard`]). Each drives its
//! own collectives through [`DataParallel`], which on one rank are the identity.
//! Checkpoints restore into either through [`SavedState`], which re-cuts the
//! slices when the layout changed.

mod chunks;
mod cut;
mod from_whole;
mod fully_sharded;
mod gather;
pub mod layout;
mod learning_rate;
mod lr_schedule;
mod mixed;
mod offload;
mod replicated;
mod saved;
pub mod shard;
mod shard_spec;
mod stream_cut;

use std::sync::Arc;

use ptrain_torch_ext::{self as ext, TensorList};
use tch::Tensor;

pub use cut::{cut_whole, CutModel, OwnedPiece};
pub use fully_sharded::{FullySharded, ParamSharding};
pub use learning_rate::LearningRate;
pub use lr_schedule::LrSchedule;
pub use replicated::Replicated;
pub use saved::{CheckpointState, SavedState};
pub use shard::Sharded;
pub use shard_spec::ShardSpec;
pub use stream_cut::{Planned, StreamingCut};

use crate::{
    checkpoint::{Checkpoint, ShardLayout},
    config::{OptimConfig, OptimName, ShardMode},
    dist::DataParallel,
    error::{Error, Result},
    model::decoder::BlockWrap,
};

/// What the trainer asks of an optimizer, one step after another: `zero_grad`,
/// backward, `reduce_gradients`, `clip_grad_norm`, `step`, `sync_params`.
pub trait Optimizer: Send {
    /// Before a step's first backward.
    fn zero_grad(&mut self) -> Result<()>;
    /// Frees the gradients now if this optimizer releases them between steps
    /// (before an evaluation, which has no use for them); otherwise nothing.
    fn release_grads(&mut self) -> Result<()> {
        Ok(())
    }
    /// After the step's last backward, before anything reads the gradients:
    /// averages the gradients this optimizer uses over the ranks, and makes
    /// `found_inf` (a float device scalar) 1 on every rank if it was on any.
    fn reduce_gradients(&mut self, dp: &mut dyn DataParallel, found_inf: &Tensor) -> Result<()>;
    /// Global gradient norm (a device scalar), clipping to `grad_clip` when set.
    fn clip_grad_norm(&self) -> Result<Tensor>;
    /// One update at `lr` (read on the device). `found_inf` (a float device scalar)
    /// set to 1 skips it.
    fn step(&mut self, lr: &LearningRate, found_inf: Option<&Tensor>) -> Result<()>;
    /// After the update: makes every rank's parameters equal again.
    fn sync_params(&mut self, dp: &mut dyn DataParallel) -> Result<()>;
    /// State tensors by name, sharing storage with the live state: `step`, then
    /// the state of each kind (`exp_avg`, `exp_avg_sq`, `momentum`).
    fn state(&self) -> Vec<(String, Tensor)>;
    /// Restores saved state, re-cutting it for this optimizer's layout: any
    /// sharded or unsharded checkpoint of the same parameters fits.
    fn load_state(&mut self, saved: &dyn SavedState) -> Result<()>;
    /// Every parameter's name and element count, in the flat order.
    fn param_sizes(&self) -> &[(String, u64)];
    /// Bytes of optimizer state this rank holds, measured from its tensors.
    fn state_bytes(&self) -> Result<u64> {
        ext::grads::held_bytes(self.state().iter().map(|(_, t)| t), []).map_err(torch_err)
    }
    /// Bytes of trainable parameters this rank holds between steps (with
    /// `parameters`: its float32 chunks; gathered blocks come and go within a step).
    fn parameter_bytes(&self) -> Result<u64>;
    /// Bytes of gradient this rank holds now (views of one buffer count once).
    fn gradient_bytes(&self) -> Result<u64>;
    /// Gradient bytes held at the reduction, the high point of a step (measured
    /// at the first step); `None` when the gradients live for the whole run, so
    /// what is held now is the high point.
    fn gradient_peak_bytes(&self) -> Option<u64>;
    /// With `parameters`: the bytes the largest block takes while gathered (in its
    /// gathered dtype); 0 where parameters are never gathered.
    fn gathered_block_bytes(&self) -> u64 {
        0
    }
    /// `dist.shard` as trained.
    fn shard_mode(&self) -> ShardMode;
    /// How the state is cut across ranks, as `state.json` records it (`None`
    /// when every rank holds all of it).
    fn checkpoint_layout(&self) -> Option<ShardLayout>;
    /// With `parameters`: what the model's blocks must run through (their gathers and
    /// gradient hooks), and how many blocks the parameters' names number.
    fn block_wrap(&self) -> Option<(Arc<dyn BlockWrap>, usize)> {
        None
    }
    /// With `parameters`: what a checkpoint part holds besides [`Optimizer::state`]
    /// (this rank's parameter chunks; no rank holds whole weights to save).
    fn sharded_params(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    /// With `parameters`: this rank's chunks of the weights and of the state, read from
    /// a checkpoint of any shard mode and world size (only those slices of its files).
    fn restore_chunks(&mut self, _checkpoint: &Checkpoint) -> Result<()> {
        Err(Error::Other("only parameter sharding restores chunks".into()))
    }
}

/// How the replicated optimizer holds `.grad` between steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradMemory {
    /// Zeroed in place and kept for the whole run: data parallelism's all-reduce
    /// buckets are bound to these tensors.
    Kept,
    /// Released before each step's first backward (PyTorch's `zero_grad(set_to_none=True)`):
    /// backward's own gradient tensors are taken as they come, so the forward pass and
    /// the start of backward run without a model-sized gradient beside the
    /// activations, and backward adds nothing into zeros. One rank only.
    Released,
}

/// The optimizer for these parameters (sorted by name): sharded when the ranks
/// agreed on a [`ShardSpec`] (`parameters` needs `with`, the group's collectives);
/// replicated otherwise, holding its gradients as `grads` says.
pub fn build(
    config: &OptimConfig,
    params: &[(String, Tensor)],
    shard: Option<ShardSpec>,
    with: Option<ParamSharding>,
    grads: GradMemory,
) -> Result<Box<dyn Optimizer>> {
    Ok(match (shard, with) {
        (Some(spec), Some(with)) if spec.mode == ShardMode::Parameters => Box::new(FullySharded::new(config, params, spec, with)?),
        (Some(spec), None) if spec.mode == ShardMode::Parameters => {
            return Err(Error::Other("dist.shard = \"parameters\" needs a process group's collectives".into()))
        }
        (Some(spec), _) => Box::new(Sharded::new(config, params, spec)?),
        (None, _) => Box::new(Replicated::new(config, params, grads)?),
    })
}

/// Parameters updated with one weight decay, and their state, as the fused
/// kernels take them.
struct Group {
    weight_decay: f64,
    names: Vec<String>,
    params: TensorList,
    grads: TensorList,
    exp_avgs: TensorList,
    exp_avg_sqs: TensorList,
    momentum: TensorList,
    /// The shared step counter, once per parameter (the kernels take a list).
    steps: TensorList,
}

impl Group {
    /// Each kind of per-parameter state by its name in checkpoints (a kind the
    /// optimizer does not keep is an empty list).
    fn state_lists(&self) -> [(&'static str, &TensorList); 3] {
        [("exp_avg", &self.exp_avgs), ("exp_avg_sq", &self.exp_avg_sqs), ("momentum", &self.momentum)]
    }
}

fn torch_err(e: ext::TorchError) -> Error {
    Error::Other(format!("optimizer: {e}"))
}

/// One update of every group at `lr`; `step` counts the updates taken.
fn update(config: &OptimConfig, groups: &[Group], step: &mut Tensor, lr: ext::Lr, found_inf: Option<&Tensor>) -> Result<()> {
    let c = config;
    match c.name {
        OptimName::Adamw => {
            let _ = step.g_add_scalar_(1.0);
            for g in groups {
                let hp = ext::AdamW { lr, beta1: c.beta1, beta2: c.beta2, weight_decay: g.weight_decay, eps: c.eps };
                ext::fused_adamw(&g.params, &g.grads, &g.exp_avgs, &g.exp_avg_sqs, &g.steps, hp, found_inf).map_err(torch_err)?;
            }
            if let Some(skipped) = found_inf {
                let _ = step.g_sub_(skipped);
            }
        }
        OptimName::Sgd => {
            for g in groups {
                let hp = ext::Sgd { lr, momentum: c.momentum, weight_decay: g.weight_decay, nesterov: c.nesterov };
                ext::fused_sgd(&g.params, &g.grads, &g.momentum, hp, found_inf).map_err(torch_err)?;
            }
        }
    }
    Ok(())
}

/// The state kinds an optimizer keeps per element.
fn state_kinds(config: &OptimConfig) -> &'static [&'static str] {
    match config.name {
        OptimName::Adamw => &["exp_avg", "exp_avg_sq"],
        OptimName::Sgd if config.momentum > 0.0 => &["momentum"],
        OptimName::Sgd => &[],
    }
}

/// Copies a saved step counter into the live one.
fn load_step(live: &mut Tensor, saved: &Tensor) -> Result<()> {
    if saved.size() != live.size() {
        return Err(Error::Other(format!("optimizer state `step` has shape {:?}, expected {:?}", saved.size(), live.size())));
    }
    tch::no_grad(|| live.copy_(&saved.to_device(live.device())));
    Ok(())
}

fn names_and_sizes(params: &[(String, Tensor)]) -> Vec<(String, u64)> {
    params.iter().map(|(n, p)| (n.clone(), p.numel() as u64)).collect()
}

fn live(params: &[(String, Tensor)]) -> Vec<Tensor> {
    params.iter().map(|(_, p)| p.shallow_clone()).collect()
}

#[cfg(test)]
mod tests;
