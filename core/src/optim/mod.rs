//! AdamW and SGD on libtorch's fused kernels (`torch._fused_adamw_`,
//! `_fused_sgd_`), with state the trainer owns so checkpoints can hold it.
//!
//! Weight decay applies to matrices and embeddings only (parameters with two or more
//! dimensions), as in nanoGPT and HF Trainer. A non-finite loss skips the update on
//! the device through the kernels' `found_inf` argument: no host sync.

mod schedule;

use ptrain_torch_ext::{self as ext, TensorList};
use tch::{Kind, Tensor};

pub use schedule::LrSchedule;

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
        Ok(Optimizer { config: config.clone(), groups, all_grads, step })
    }

    /// Every parameter's gradient, in a fixed order, for the whole run (backward
    /// accumulates into these tensors in place).
    pub fn grads(&self) -> &TensorList {
        &self.all_grads
    }

    pub fn zero_grad(&self) -> Result<()> {
        ext::zero_all(&self.all_grads).map_err(torch_err)
    }

    /// Global gradient norm (a device scalar), clipping to `grad_clip` when set.
    pub fn clip_grad_norm(&self) -> Result<Tensor> {
        ext::clip_grad_norm(&self.all_grads, self.config.grad_clip).map_err(torch_err)
    }

    /// One update at `lr`. `found_inf` (a float device scalar) set to 1 skips it.
    pub fn step(&mut self, lr: f64, found_inf: Option<&Tensor>) -> Result<()> {
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

    /// State tensors by name (`exp_avg.<param>`, `exp_avg_sq.<param>`,
    /// `momentum.<param>`, `step`), sharing storage with the live state.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![("step".to_string(), self.step.shallow_clone())];
        for g in &self.groups {
            for (prefix, list) in [("exp_avg", &g.exp_avgs), ("exp_avg_sq", &g.exp_avg_sqs), ("momentum", &g.momentum)] {
                out.extend(g.names.iter().zip(list.tensors()).map(|(n, t)| (format!("{prefix}.{n}"), t.shallow_clone())));
            }
        }
        out
    }

    /// Restores state saved by [`Optimizer::state`]; every tensor must be present.
    pub fn load_state(&mut self, mut saved: impl FnMut(&str) -> Option<Tensor>) -> Result<()> {
        tch::no_grad(|| {
            for (name, mut live) in self.state() {
                let value = saved(&name).ok_or_else(|| Error::Other(format!("optimizer state `{name}` missing from checkpoint")))?;
                if value.size() != live.size() {
                    return Err(Error::Other(format!("optimizer state `{name}` has shape {:?}, expected {:?}", value.size(), live.size())));
                }
                live.copy_(&value);
            }
            Ok(())
        })
    }
}
