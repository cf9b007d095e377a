//! Sharded optimizer state (ZeRO stage 1 and 2): the parameters live in one flat
//! buffer, and this rank updates only its slice of it.
//!
//! Set-up moves every parameter into `flat_params` (the live parameters become
//! views of it), so the updated slices can be all-gathered in place. The fused
//! kernels take lists of tensors of any shape, so the update runs on views of the
//! slice: one per parameter piece, grouped by weight decay. Optimizer state exists
//! only for the slice, as one flat buffer per kind.
//!
//! Gradients: with `optimizer` every `.grad` is a view of one persistent flat
//! buffer (all-reduced in place, no bucket copies). With `gradients` the flat
//! gradient buffer is allocated when a step starts, backward accumulates into it,
//! and once it is reduced into this rank's `grad_shard` it is released: between
//! steps a rank holds only the reduced gradient of its own slice.
//!
//! The collectives see flat tensors of `world` equal chunks only: the gradient
//! reduction ([`DataParallel::reduce_flat`]), one all-reduce of the owned
//! gradient's sum of squares with the non-finite flag (the exact global norm and
//! an agreed flag), and after the update [`DataParallel::all_gather_flat`].

use ptrain_torch_ext::{self as ext, grads, TensorList};
use tch::{Kind, Tensor};

use super::{layout::FlatLayout, load_step, names_and_sizes, state_kinds, torch_err, update, Group, LearningRate, Optimizer, SavedState, ShardSpec};
use crate::{
    checkpoint::ShardLayout,
    config::{OptimConfig, ShardMode},
    dist::DataParallel,
    error::{Error, Result},
};

pub struct Sharded {
    config: OptimConfig,
    spec: ShardSpec,
    layout: FlatLayout,
    /// Update groups over views of this rank's slice.
    groups: Vec<Group>,
    /// Optimizer steps taken (float, on the device, as torch keeps `state_steps`).
    step: Tensor,
    /// Every parameter's name and element count, in the trainer's order.
    sizes: Vec<(String, u64)>,
    /// The live parameters, in the trainer's order.
    params: TensorList,
    flat_params: Tensor,
    /// The full-size gradient: persistent with `optimizer`; with `gradients` only
    /// from the start of a step until its update.
    flat_grads: Option<Tensor>,
    /// `gradients`: this rank's reduced gradient, `chunk` elements.
    grad_shard: Option<Tensor>,
    /// The reduced gradient of the owned slice (a view).
    owned_grads: Tensor,
    /// Flat state buffers of the owned slice, by kind.
    state: Vec<(&'static str, Tensor)>,
    /// Sum of squares of the owned gradient and the non-finite flag, all-reduced
    /// together.
    stats: Tensor,
    /// Gradient bytes held at the first reduction (0 before it).
    peak_gradient_bytes: u64,
}

/// One flat buffer laid out as `layout` holding every parameter: each parameter (every
/// handle to it: model, var store, trainer) now lives in it.
fn flatten(params: &[(String, Tensor)], layout: &FlatLayout, kind: Kind, device: tch::Device) -> Tensor {
    let flat_params = Tensor::zeros([layout.padded() as i64], (kind, device));
    tch::no_grad(|| {
        for ((_, p), &(offset, n)) in params.iter().zip(&layout.params) {
            let view = flat_params.narrow(0, offset as i64, n as i64).view(p.size().as_slice());
            view.shallow_clone().copy_(p);
            p.shallow_clone().set_data(&view);
        }
    });
    flat_params
}

/// The fused optimizer's groups over this rank's pieces of the flat buffers (with
/// weight decay, without): views into the flat parameters (from offset 0), the owned
/// gradients and the state (from `owned.start`).
fn groups(
    config: &OptimConfig,
    params: &[(String, Tensor)],
    layout: &FlatLayout,
    owned: &std::ops::Range<u64>,
    [flat_params, owned_grads]: [&Tensor; 2],
    state: &[(&'static str, Tensor)],
    step: &Tensor,
) -> Vec<Group> {
    // A view of `t` where a piece starting at flat offset `at` lies, `t` starting at `base`.
    let piece_of = |t: &Tensor, base: u64, at: u64, n: u64| t.narrow(0, (at - base) as i64, n as i64);
    let mut groups = Vec::new();
    for decay in [true, false] {
        let pieces: Vec<_> = layout.pieces(owned.clone()).into_iter().filter(|p| (params[p.param].1.dim() >= 2) == decay).collect();
        if pieces.is_empty() {
            continue;
        }
        let list = |f: &dyn Fn(u64, u64) -> Tensor| TensorList::new(pieces.iter().map(|p| f(p.flat_offset, p.len)).collect());
        let of_kind = |k: &str| match state.iter().find(|(name, _)| *name == k) {
            Some((_, t)) => list(&|at, n| piece_of(t, owned.start, at, n)),
            None => TensorList::new(Vec::new()),
        };
        groups.push(Group {
            weight_decay: if decay { config.weight_decay } else { 0.0 },
            names: pieces.iter().map(|p| params[p.param].0.clone()).collect(),
            params: list(&|at, n| piece_of(flat_params, 0, at, n)),
            grads: list(&|at, n| piece_of(owned_grads, owned.start, at, n)),
            exp_avgs: of_kind("exp_avg"),
            exp_avg_sqs: of_kind("exp_avg_sq"),
            momentum: of_kind("momentum"),
            steps: TensorList::repeat(step, pieces.len()),
        });
    }
    groups
}

impl Sharded {
    /// An optimizer for this rank's slice only. The parameters move into one flat
    /// buffer; `params` must be sorted by name.
    pub fn new(config: &OptimConfig, params: &[(String, Tensor)], spec: ShardSpec) -> Result<Sharded> {
        if params.is_empty() {
            return Err(Error::Other("the model has no trainable parameters".into()));
        }
        let step = Tensor::zeros([], (Kind::Float, params[0].1.device()));
        let (kind, device) = (params[0].1.kind(), params[0].1.device());
        if let Some((name, p)) = params.iter().find(|(_, p)| p.kind() != kind || p.device() != device) {
            return Err(Error::Other(format!(
                "dist.shard needs every parameter in one dtype and on one device; `{name}` is {:?} on {:?}",
                p.kind(),
                p.device()
            )));
        }
        let numels: Vec<u64> = params.iter().map(|(_, p)| p.numel() as u64).collect();
        let layout = FlatLayout::new(&numels, spec.world);
        let flat_params = flatten(params, &layout, kind, device);
        let live = TensorList::new(params.iter().map(|(_, p)| p.shallow_clone()).collect());
        let owned = layout.range(spec.rank);
        let len = (owned.end - owned.start) as i64;
        let (flat_grads, grad_shard) = match spec.mode {
            ShardMode::Gradients => (None, Some(Tensor::zeros([layout.chunk as i64], (kind, device)))),
            _ => {
                let flat = Tensor::zeros([layout.padded() as i64], (kind, device));
                grads::attach_flat(&live, &flat).map_err(torch_err)?;
                (Some(flat), None)
            }
        };
        let owned_grads = match (&grad_shard, &flat_grads) {
            (Some(shard), _) => shard.narrow(0, 0, len),
            (None, Some(flat)) => flat.narrow(0, owned.start as i64, len),
            (None, None) => unreachable!("one gradient buffer exists"),
        };
        let state: Vec<(&'static str, Tensor)> = state_kinds(config).iter().map(|&k| (k, Tensor::zeros([len], (kind, device)))).collect();
        let groups = groups(config, params, &layout, &owned, [&flat_params, &owned_grads], &state, &step);
        let stats = Tensor::zeros([2], (Kind::Float, device));
        Ok(Sharded {
            config: config.clone(),
            spec,
            layout,
            groups,
            step,
            sizes: names_and_sizes(params),
            params: live,
            flat_params,
            flat_grads,
            grad_shard,
            owned_grads,
            state,
            stats,
            peak_gradient_bytes: 0,
        })
    }

    /// The padded flat parameter buffer; this rank's slice starts at `rank * chunk`.
    pub fn flat_params(&self) -> &Tensor {
        &self.flat_params
    }

    /// The reduced gradient of the owned slice.
    pub fn owned_grads(&self) -> &Tensor {
        &self.owned_grads
    }

    /// Gradient tensors this rank holds (the parameters' `.grad` count separately).
    fn gradient_buffers(&self) -> Vec<Tensor> {
        self.flat_grads.iter().chain(&self.grad_shard).map(Tensor::shallow_clone).collect()
    }
}

impl Optimizer for Sharded {
    /// Zeroes the gradient (`optimizer`), or allocates it and makes it every
    /// parameter's `.grad` (`gradients`).
    fn zero_grad(&mut self) -> Result<()> {
        match (&self.flat_grads, self.spec.mode) {
            (Some(flat), ShardMode::Optimizer) => {
                let _ = flat.shallow_clone().zero_();
            }
            (_, _) => {
                let flat = Tensor::zeros([self.layout.padded() as i64], (self.flat_params.kind(), self.flat_params.device()));
                grads::attach_flat(&self.params, &flat).map_err(torch_err)?;
                self.flat_grads = Some(flat);
            }
        }
        Ok(())
    }

    /// Reduces the step's gradient into what this rank keeps, then agrees on the
    /// global sum of squares and the non-finite flag in one all-reduce.
    fn reduce_gradients(&mut self, dp: &mut dyn DataParallel, found_inf: &Tensor) -> Result<()> {
        let flat = self.flat_grads.as_ref().ok_or_else(|| Error::Dist("no gradient to reduce (zero_grad was not called this step)".into()))?;
        if self.peak_gradient_bytes == 0 {
            self.peak_gradient_bytes = self.gradient_bytes()?;
        }
        dp.reduce_flat(flat, self.grad_shard.as_ref()).map_err(Error::Dist)?;
        tch::no_grad(|| {
            let owned = &self.owned_grads;
            self.stats.get(0).copy_(&owned.dot(owned).to_kind(Kind::Float));
            self.stats.get(1).copy_(found_inf);
        });
        dp.all_reduce_sum(&mut self.stats).map_err(Error::Dist)?;
        // The flag is now the number of ranks that saw a non-finite loss.
        found_inf.shallow_clone().copy_(&self.stats.get(1).clamp_max(1.0));
        Ok(())
    }

    /// The global norm from the all-reduced sum of squares, clipping the gradient
    /// this rank uses (all of it with `optimizer`, so replicas stay equal) as
    /// `clip_grad_norm_` would.
    fn clip_grad_norm(&self) -> Result<Tensor> {
        let max_norm = self.config.grad_clip;
        let norm = self.stats.get(0).sqrt();
        if max_norm > 0.0 {
            let coef = (norm.g_add_scalar(1e-6).reciprocal() * max_norm).clamp_max(1.0);
            let target = match (&self.grad_shard, &self.flat_grads) {
                (Some(shard), _) => shard,
                (None, Some(flat)) => flat,
                (None, None) => return Ok(norm),
            };
            let _ = target.shallow_clone().g_mul_(&coef);
        }
        Ok(norm)
    }

    fn step(&mut self, lr: &LearningRate, found_inf: Option<&Tensor>) -> Result<()> {
        // `gradients`: reduced into this rank's slice by now, the full-size gradient can go.
        if self.spec.mode == ShardMode::Gradients && self.flat_grads.take().is_some() {
            grads::detach(&self.params).map_err(torch_err)?;
        }
        update(&self.config, &self.groups, &mut self.step, lr.on_device(), found_inf)
    }

    /// Every rank's updated slice to every rank, in place.
    fn sync_params(&mut self, dp: &mut dyn DataParallel) -> Result<()> {
        dp.all_gather_flat(&self.flat_params).map_err(Error::Dist)
    }

    /// `step`, then the owned slice's flat `exp_avg`, `exp_avg_sq`, `momentum`.
    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![("step".to_string(), self.step.shallow_clone())];
        out.extend(self.state.iter().map(|(k, t)| (k.to_string(), t.shallow_clone())));
        out
    }

    fn load_state(&mut self, saved: &dyn SavedState) -> Result<()> {
        let (step, values) = saved.load(state_kinds(&self.config), self.layout.range(self.spec.rank))?;
        load_step(&mut self.step, &step)?;
        tch::no_grad(|| {
            for ((_, live), value) in self.state.iter_mut().zip(values) {
                live.copy_(&value.to_device(live.device()));
            }
        });
        Ok(())
    }

    fn param_sizes(&self) -> &[(String, u64)] {
        &self.sizes
    }

    fn parameter_bytes(&self) -> Result<u64> {
        ext::grads::held_bytes([&self.flat_params], []).map_err(torch_err)
    }

    /// The parameters' `.grad` and the flat gradient buffers.
    fn gradient_bytes(&self) -> Result<u64> {
        ext::grads::held_bytes(&self.gradient_buffers(), self.params.tensors()).map_err(torch_err)
    }

    fn gradient_peak_bytes(&self) -> Option<u64> {
        Some(self.peak_gradient_bytes)
    }

    fn shard_mode(&self) -> ShardMode {
        self.spec.mode
    }

    fn checkpoint_layout(&self) -> Option<ShardLayout> {
        Some(ShardLayout {
            mode: self.spec.mode.name().into(),
            world_size: self.spec.world,
            numel: self.layout.numel,
            ranges: self.layout.ranges().into_iter().map(|r| [r.start, r.end]).collect(),
            save_id: format!("{:016x}", self.spec.save_id),
            params: None,
        })
    }
}
