//! AdamW and SGD on libtorch's fused kernels (`torch._fused_adamw_`,
//! `_fused_sgd_`), with state the trainer owns so checkpoints can hold it.
//!
//! Weight decay applies to matrices and embeddings only (parameters with two or more
//! dimensions), as in nanoGPT and HF Trainer. A non-finite loss skips the update on
//! the device through the kernels' `found_inf` argument: no host sync.
//!
//! With `dist.shard` the optimizer keeps state for this rank's slice of the
//! parameters only ([`shard`]); checkpoints restore into either kind through
//! [`SavedState`], which re-cuts the slices when the layout changed.

pub mod layout;
mod lr_schedule;
mod saved;
pub mod shard;

use std::collections::HashMap;

use ptrain_torch_ext::{self as ext, TensorList};
use tch::{Kind, Tensor};

pub use lr_schedule::LrSchedule;
pub use saved::{CheckpointState, SavedState};
pub use shard::{Shard, ShardSpec};

use crate::{
    config::{OptimConfig, OptimName},
    error::{Error, Result},
};

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

pub struct Optimizer {
    config: OptimConfig,
    groups: Vec<Group>,
    all_grads: TensorList,
    /// Optimizer steps taken (float, on the device, as torch keeps `state_steps`).
    step: Tensor,
    /// Every parameter's name and element count, in the trainer's order.
    params: Vec<(String, u64)>,
    /// The parameters themselves (their `.grad` is measured for memory figures).
    live: Vec<Tensor>,
    shard: Option<Shard>,
}

fn torch_err(e: ext::TorchError) -> Error {
    Error::Other(format!("optimizer: {e}"))
}

impl Optimizer {
    /// `params` must be sorted by name; every parameter gets a defined (zero)
    /// gradient here so gradient handles can be kept for the whole run.
    pub fn new(config: &OptimConfig, params: &[(String, Tensor)]) -> Result<Optimizer> {
        let device = params.first().map_or(tch::Device::Cpu, |(_, p)| p.device());
        // Defines every `.grad` (zeros); backward then accumulates into them in place.
        let touch = params.iter().map(|(_, p)| p.sum(Kind::Float) * 0.0).fold(Tensor::zeros([], (Kind::Float, device)), |a, b| a + b);
        touch.backward();
        let step = Tensor::zeros([], (Kind::Float, device));
        let mut groups = Vec::new();
        for decay in [true, false] {
            let members: Vec<&(String, Tensor)> = params.iter().filter(|(_, p)| (p.dim() >= 2) == decay).collect();
            if members.is_empty() {
                continue;
            }
            let tensors = |f: &dyn Fn(&Tensor) -> Tensor| TensorList::new(members.iter().map(|(_, p)| f(p)).collect());
            let stateful = |needed: bool| if needed { tensors(&|p| p.zeros_like().set_requires_grad(false)) } else { TensorList::new(Vec::new()) };
            groups.push(Group {
                weight_decay: if decay { config.weight_decay } else { 0.0 },
                names: members.iter().map(|(n, _)| n.clone()).collect(),
                params: tensors(&|p| p.shallow_clone()),
                grads: tensors(&|p| p.grad()),
                exp_avgs: stateful(config.name == OptimName::Adamw),
                exp_avg_sqs: stateful(config.name == OptimName::Adamw),
                momentum: stateful(config.name == OptimName::Sgd && config.momentum > 0.0),
                steps: TensorList::repeat(&step, members.len()),
            });
        }
        let all_grads = TensorList::new(groups.iter().flat_map(|g| g.grads.tensors().iter().map(Tensor::shallow_clone)).collect());
        Ok(Optimizer { config: config.clone(), groups, all_grads, step, params: names_and_sizes(params), live: live(params), shard: None })
    }

    /// An optimizer for this rank's slice only (see [`shard`]). The parameters
    /// move into one flat buffer; `params` must be sorted by name.
    pub fn sharded(config: &OptimConfig, params: &[(String, Tensor)], spec: ShardSpec) -> Result<Optimizer> {
        if params.is_empty() {
            return Err(Error::Other("the model has no trainable parameters".into()));
        }
        let step = Tensor::zeros([], (Kind::Float, params[0].1.device()));
        let (shard, groups) = Shard::build(config, params, spec, &step)?;
        let optimizer = Optimizer {
            config: config.clone(),
            groups,
            all_grads: TensorList::new(Vec::new()),
            step,
            params: names_and_sizes(params),
            live: live(params),
            shard: Some(shard),
        };
        Ok(optimizer)
    }

    /// The sharding, in a sharded run.
    pub fn shard(&self) -> Option<&Shard> {
        self.shard.as_ref()
    }

    /// Bytes of optimizer state this rank holds, measured from its tensors.
    pub fn state_bytes(&self) -> Result<u64> {
        let state = self.state();
        ext::grads::held_bytes(state.iter().map(|(_, t)| t), []).map_err(torch_err)
    }

    /// Bytes of gradient this rank holds now: the parameters' `.grad` and, when
    /// sharded, the flat gradient buffers (views of one buffer count once).
    pub fn gradient_bytes(&self) -> Result<u64> {
        let buffers = self.shard.as_ref().map(Shard::gradient_buffers).unwrap_or_default();
        ext::grads::held_bytes(&buffers, &self.live).map_err(torch_err)
    }

    /// Every parameter's gradient, in a fixed order, for the whole run (backward
    /// accumulates into these tensors in place).
    pub fn grads(&self) -> &TensorList {
        &self.all_grads
    }

    pub fn zero_grad(&mut self) -> Result<()> {
        match &mut self.shard {
            Some(shard) => shard.zero_grad(),
            None => ext::zero_all(&self.all_grads).map_err(torch_err),
        }
    }

    /// Global gradient norm (a device scalar), clipping to `grad_clip` when set.
    /// Sharded, the norm comes from the sum of squares the data-parallel layer
    /// all-reduced (see [`Shard::stats`]).
    pub fn clip_grad_norm(&self) -> Result<Tensor> {
        match &self.shard {
            Some(shard) => Ok(shard.clip(self.config.grad_clip)),
            None => ext::clip_grad_norm(&self.all_grads, self.config.grad_clip).map_err(torch_err),
        }
    }

    /// One update at `lr`. `found_inf` (a float device scalar) set to 1 skips it.
    pub fn step(&mut self, lr: f64, found_inf: Option<&Tensor>) -> Result<()> {
        if let Some(shard) = &mut self.shard {
            // Reduced into this rank's slice by now: the full-size gradient can go.
            shard.release_full_grads()?;
        }
        let c = &self.config;
        match c.name {
            OptimName::Adamw => {
                let _ = self.step.g_add_scalar_(1.0);
                for g in &self.groups {
                    let hp = ext::AdamW { lr, beta1: c.beta1, beta2: c.beta2, weight_decay: g.weight_decay, eps: c.eps };
                    ext::fused_adamw(&g.params, &g.grads, &g.exp_avgs, &g.exp_avg_sqs, &g.steps, hp, found_inf).map_err(torch_err)?;
                }
                if let Some(skipped) = found_inf {
                    let _ = self.step.g_sub_(skipped);
                }
            }
            OptimName::Sgd => {
                for g in &self.groups {
                    let hp = ext::Sgd { lr, momentum: c.momentum, weight_decay: g.weight_decay, nesterov: c.nesterov };
                    ext::fused_sgd(&g.params, &g.grads, &g.momentum, hp, found_inf).map_err(torch_err)?;
                }
            }
        }
        Ok(())
    }

    /// State tensors by name, sharing storage with the live state: `step`, then
    /// `exp_avg.<param>`, `exp_avg_sq.<param>`, `momentum.<param>`; sharded, the
    /// owned slice's flat `exp_avg`, `exp_avg_sq`, `momentum`.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![("step".to_string(), self.step.shallow_clone())];
        if let Some(shard) = &self.shard {
            out.extend(shard.state.iter().map(|(k, t)| (k.to_string(), t.shallow_clone())));
            return out;
        }
        for g in &self.groups {
            for (prefix, list) in [("exp_avg", &g.exp_avgs), ("exp_avg_sq", &g.exp_avg_sqs), ("momentum", &g.momentum)] {
                out.extend(g.names.iter().zip(list.tensors()).map(|(n, t)| (format!("{prefix}.{n}"), t.shallow_clone())));
            }
        }
        out
    }

    /// Every parameter's name and element count, in the flat order.
    pub fn param_sizes(&self) -> &[(String, u64)] {
        &self.params
    }

    /// Restores saved state, re-cutting it for this optimizer's layout: any
    /// sharded or unsharded checkpoint of the same parameters fits.
    pub fn load_state(&mut self, saved: &dyn SavedState) -> Result<()> {
        let kinds = shard::state_kinds(&self.config);
        let range = match &self.shard {
            Some(shard) => shard.layout.range(shard.spec.rank),
            None => 0..self.params.iter().map(|(_, n)| n).sum(),
        };
        let (step, values) = saved.load(kinds, range)?;
        let result: Result<()> = tch::no_grad(|| {
            if step.size() != self.step.size() {
                return Err(Error::Other(format!("optimizer state `step` has shape {:?}, expected {:?}", step.size(), self.step.size())));
            }
            self.step.copy_(&step.to_device(self.step.device()));
            if let Some(shard) = &mut self.shard {
                for ((_, live), value) in shard.state.iter_mut().zip(values) {
                    live.copy_(&value.to_device(live.device()));
                }
                return Ok(());
            }
            let mut offsets = HashMap::new();
            let mut offset = 0;
            for (name, n) in &self.params {
                offsets.insert(name.as_str(), offset);
                offset += n;
            }
            for g in &mut self.groups {
                let lists = [&g.exp_avgs, &g.exp_avg_sqs, &g.momentum];
                let by_kind = ["exp_avg", "exp_avg_sq", "momentum"];
                for (kind, value) in kinds.iter().zip(&values) {
                    let list = lists[by_kind.iter().position(|k| k == kind).expect("a known kind")];
                    for (name, live) in g.names.iter().zip(list.tensors()) {
                        let at = offsets[name.as_str()] as i64;
                        let piece = value.narrow(0, at, live.numel() as i64).view(live.size().as_slice());
                        live.shallow_clone().copy_(&piece.to_device(live.device()));
                    }
                }
            }
            Ok(())
        });
        result
    }
}

fn names_and_sizes(params: &[(String, Tensor)]) -> Vec<(String, u64)> {
    params.iter().map(|(n, p)| (n.clone(), p.numel() as u64)).collect()
}

fn live(params: &[(String, Tensor)]) -> Vec<Tensor> {
    params.iter().map(|(_, p)| p.shallow_clone()).collect()
}
