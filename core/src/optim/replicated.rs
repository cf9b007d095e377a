//! The optimizer every rank holds in full (and the only one of a single rank):
//! per-parameter state, the gradients all-reduced in place before the update.
//! Gradients are kept and zeroed between steps, or released ([`GradMemory`]).

use std::{cell::Cell, collections::HashMap};

use ptrain_torch_ext::{self as ext, TensorList};
use tch::{Kind, Tensor};

use super::{live, load_step, names_and_sizes, state_kinds, torch_err, update, GradMemory, Group, LearningRate, Optimizer, SavedState};
use crate::{
    checkpoint::ShardLayout,
    config::{OptimConfig, OptimName, ShardMode},
    dist::DataParallel,
    error::{Error, Result},
};

pub struct Replicated {
    config: OptimConfig,
    groups: Vec<Group>,
    /// Every parameter's gradient, in a fixed order: for the whole run (backward
    /// accumulates into these tensors in place), or bound to backward's own
    /// gradients after each step's backward ([`GradMemory::Released`]).
    all_grads: TensorList,
    /// The parameters in `all_grads`' order.
    all_params: TensorList,
    grad_memory: GradMemory,
    /// With `Released`: whether the gradient lists hold this step's gradients.
    bound: bool,
    /// With `Released`: the gradient bytes the first step's backward made (what is
    /// held from a step's backward to the next step; measured once).
    first_grad_bytes: Option<u64>,
    /// Optimizer steps taken (float, on the device, as torch keeps `state_steps`).
    step: Tensor,
    /// Every parameter's name and element count, in the trainer's order.
    params: Vec<(String, u64)>,
    /// The parameters themselves (their `.grad` is measured for memory figures).
    live: Vec<Tensor>,
    /// Whether the state tensors are still as allocated (unwritten): they are
    /// zeroed when first needed unless a checkpoint fills them first.
    state_unwritten: Cell<bool>,
}

impl Replicated {
    /// `params` must be sorted by name. With [`GradMemory::Kept`] every parameter
    /// gets a defined (zero) gradient here so gradient handles can be kept for the
    /// whole run.
    pub fn new(config: &OptimConfig, params: &[(String, Tensor)], grad_memory: GradMemory) -> Result<Replicated> {
        let device = params.first().map_or(tch::Device::Cpu, |(_, p)| p.device());
        if grad_memory == GradMemory::Kept {
            // Defines every `.grad` (zeros); backward then accumulates into them in place.
            let touch = params.iter().map(|(_, p)| p.sum(Kind::Float) * 0.0).fold(Tensor::zeros([], (Kind::Float, device)), |a, b| a + b);
            touch.backward();
        }
        let step = Tensor::zeros([], (Kind::Float, device));
        let mut groups = Vec::new();
        for decay in [true, false] {
            let members: Vec<&(String, Tensor)> = params.iter().filter(|(_, p)| (p.dim() >= 2) == decay).collect();
            if members.is_empty() {
                continue;
            }
            let tensors = |f: &dyn Fn(&Tensor) -> Tensor| TensorList::new(members.iter().map(|(_, p)| f(p)).collect());
            // Allocated, not written: zeroing the moments (twice the model's bytes, every
            // page faulted in) is the first step's work, as in PyTorch's first `step()`,
            // so the time to the first step is not spent on them, nor on zeros a resumed
            // run's checkpoint overwrites.
            let stateful = |needed: bool| if needed { tensors(&|p| p.empty_like().set_requires_grad(false)) } else { TensorList::new(Vec::new()) };
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
        let all_params = TensorList::new(groups.iter().flat_map(|g| g.params.tensors().iter().map(Tensor::shallow_clone)).collect());
        #[cfg(test)]
        tch::no_grad(|| {
            // Unwritten memory is whatever the allocator had (often zeros): tests see
            // NaN there, so a path that reads the state before it is zeroed shows.
            for (_, list) in groups.iter().flat_map(Group::state_lists) {
                for t in list.tensors() {
                    let _ = t.shallow_clone().fill_(f64::NAN);
                }
            }
        });
        let (names, live) = (names_and_sizes(params), live(params));
        Ok(Replicated {
            config: config.clone(),
            groups,
            all_grads,
            all_params,
            grad_memory,
            bound: false,
            first_grad_bytes: None,
            step,
            params: names,
            live,
            state_unwritten: Cell::new(true),
        })
    }

    /// Zeroes the state tensors if nothing has written them yet.
    fn zero_unwritten_state(&self) -> Result<()> {
        if self.state_unwritten.get() {
            for g in &self.groups {
                for (_, list) in g.state_lists() {
                    ext::zero_all(list).map_err(torch_err)?;
                }
            }
            self.state_unwritten.set(false);
        }
        Ok(())
    }

    /// With `Released`, after backward: the gradient lists take this step's
    /// gradients (in place: the kernels' handle arrays stay valid).
    fn bind_grads(&mut self) -> Result<()> {
        if self.grad_memory == GradMemory::Released && !self.bound {
            for g in &mut self.groups {
                ext::grads::bind(&g.params, &mut g.grads).map_err(torch_err)?;
            }
            ext::grads::bind(&self.all_params, &mut self.all_grads).map_err(torch_err)?;
            self.bound = true;
            if self.first_grad_bytes.is_none() {
                self.first_grad_bytes = Some(self.gradient_bytes()?);
            }
        }
        Ok(())
    }
}

impl Optimizer for Replicated {
    fn zero_grad(&mut self) -> Result<()> {
        match self.grad_memory {
            GradMemory::Kept => ext::zero_all(&self.all_grads).map_err(torch_err),
            GradMemory::Released => self.release_grads(),
        }
    }

    fn release_grads(&mut self) -> Result<()> {
        if self.grad_memory == GradMemory::Released {
            // `grad = None` on every parameter, and no list keeps the old gradient alive.
            ext::grads::detach(&self.all_params).map_err(torch_err)?;
            for g in &mut self.groups {
                ext::grads::unbind(&mut g.grads).map_err(torch_err)?;
            }
            ext::grads::unbind(&mut self.all_grads).map_err(torch_err)?;
            self.bound = false;
        }
        Ok(())
    }

    fn reduce_gradients(&mut self, dp: &mut dyn DataParallel, found_inf: &Tensor) -> Result<()> {
        self.bind_grads()?;
        if self.grad_memory == GradMemory::Released && dp.world_size() > 1 {
            // The all-reduce buckets are bound to the gradients of the first step.
            return Err(Error::Other("released gradients with more than one rank (the all-reduce needs GradMemory::Kept)".into()));
        }
        dp.all_reduce_grads(self.all_grads.tensors(), found_inf).map_err(Error::Dist)
    }

    fn clip_grad_norm(&self) -> Result<Tensor> {
        ext::clip_grad_norm(&self.all_grads, self.config.grad_clip).map_err(torch_err)
    }

    fn step(&mut self, lr: &LearningRate, found_inf: Option<&Tensor>) -> Result<()> {
        self.bind_grads()?;
        self.zero_unwritten_state()?;
        update(&self.config, &self.groups, &mut self.step, lr.on_device(), found_inf)
    }

    fn sync_params(&mut self, _dp: &mut dyn DataParallel) -> Result<()> {
        // Every rank applied the same averaged gradient to the same parameters.
        Ok(())
    }

    /// `step`, then `exp_avg.<param>`, `exp_avg_sq.<param>`, `momentum.<param>`.
    /// Before the first step the state is its zeros. Should zeroing fail, the state
    /// is left out: loading that checkpoint then names what is missing, rather than
    /// resuming from unwritten memory.
    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![("step".to_string(), self.step.shallow_clone())];
        if let Err(e) = self.zero_unwritten_state() {
            tracing::error!("{e}: the checkpoint holds no optimizer moments");
            return out;
        }
        for g in &self.groups {
            for (prefix, list) in g.state_lists() {
                out.extend(g.names.iter().zip(list.tensors()).map(|(n, t)| (format!("{prefix}.{n}"), t.shallow_clone())));
            }
        }
        out
    }

    fn load_state(&mut self, saved: &dyn SavedState) -> Result<()> {
        let kinds = state_kinds(&self.config);
        let (step, values) = saved.load(kinds, 0..self.params.iter().map(|(_, n)| n).sum())?;
        load_step(&mut self.step, &step)?;
        let mut offsets = HashMap::new();
        let mut offset = 0;
        for (name, n) in &self.params {
            offsets.insert(name.as_str(), offset);
            offset += n;
        }
        tch::no_grad(|| {
            for g in &self.groups {
                let lists = g.state_lists();
                for (kind, value) in kinds.iter().zip(&values) {
                    let (_, list) = lists.iter().find(|(k, _)| k == kind).expect("a known kind");
                    for (name, live) in g.names.iter().zip(list.tensors()) {
                        let at = offsets[name.as_str()] as i64;
                        let piece = value.narrow(0, at, live.numel() as i64).view(live.size().as_slice());
                        live.shallow_clone().copy_(&piece.to_device(live.device()));
                    }
                }
            }
        });
        self.state_unwritten.set(false);
        Ok(())
    }

    fn param_sizes(&self) -> &[(String, u64)] {
        &self.params
    }

    fn parameter_bytes(&self) -> Result<u64> {
        ext::grads::held_bytes(&self.live, []).map_err(torch_err)
    }

    /// The parameters' `.grad`.
    fn gradient_bytes(&self) -> Result<u64> {
        ext::grads::held_bytes(&[] as &[Tensor], &self.live).map_err(torch_err)
    }

    /// Released gradients: what backward made (after the run they may be gone).
    fn gradient_peak_bytes(&self) -> Option<u64> {
        self.first_grad_bytes
    }

    fn shard_mode(&self) -> ShardMode {
        ShardMode::None
    }

    fn checkpoint_layout(&self) -> Option<ShardLayout> {
        None
    }
}
