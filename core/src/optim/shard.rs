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

use ptrain_torch_ext::{grads, TensorList};
use tch::{Device, Kind, Tensor};

use super::{layout::FlatLayout, torch_err, Group};
use crate::{
    checkpoint::ShardLayout,
    config::{OptimConfig, OptimName, ShardMode},
    dist::DataParallel,
    error::{Error, Result},
};

/// What a sharded run agreed on at set-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSpec {
    pub mode: ShardMode,
    pub rank: u32,
    pub world: u32,
    /// Rank 0's random number for this launch: names the staging directory of
    /// sharded checkpoints, so a crashed launch's parts are never taken for ours.
    pub save_id: u64,
    /// Rank 0's clock at set-up (names a default run directory the same on all ranks).
    pub launch_secs: u64,
}

impl ShardSpec {
    /// The sharding to use: `None` for `shard = "none"`, and, with one warning, for
    /// a run without peers. Ranks agree on rank 0's save id and clock (one
    /// broadcast).
    pub fn agree(mode: ShardMode, dist: Option<&dyn DataParallel>) -> Result<Option<ShardSpec>> {
        if mode == ShardMode::None {
            return Ok(None);
        }
        let Some(dist) = dist.filter(|d| d.world_size() > 1) else {
            tracing::warn!("dist.shard = \"{}\" needs more than one rank; training unsharded", mode.name());
            return Ok(None);
        };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let nonce = (u64::from(std::process::id()) << 32) ^ now.subsec_nanos() as u64 ^ now.as_secs().rotate_left(17);
        let mut agreed = Tensor::from_slice(&[(nonce >> 1) as i64, now.as_secs() as i64]).to_device(dist.device());
        dist.collectives().broadcast(&mut agreed, 0).map_err(Error::Dist)?;
        let v = Vec::<i64>::try_from(agreed.to_device(Device::Cpu)).map_err(|e| Error::Other(e.to_string()))?;
        Ok(Some(ShardSpec { mode, rank: dist.rank(), world: dist.world_size(), save_id: v[0] as u64, launch_secs: v[1] as u64 }))
    }
}

/// The state kinds an optimizer keeps per element.
pub(super) fn state_kinds(config: &OptimConfig) -> &'static [&'static str] {
    match config.name {
        OptimName::Adamw => &["exp_avg", "exp_avg_sq"],
        OptimName::Sgd if config.momentum > 0.0 => &["momentum"],
        OptimName::Sgd => &[],
    }
}

pub struct Shard {
    pub spec: ShardSpec,
    pub layout: FlatLayout,
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
    pub(super) state: Vec<(&'static str, Tensor)>,
    /// Sum of squares of the owned gradient and the non-finite flag, all-reduced
    /// together.
    stats: Tensor,
}

impl Shard {
    /// Moves the parameters into a flat buffer and builds the update groups over
    /// this rank's slice. `params` must be in the trainer's order.
    pub(super) fn build(config: &OptimConfig, params: &[(String, Tensor)], spec: ShardSpec, step: &Tensor) -> Result<(Shard, Vec<Group>)> {
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
        let flat_params = Tensor::zeros([layout.padded() as i64], (kind, device));
        tch::no_grad(|| {
            for ((_, p), &(offset, n)) in params.iter().zip(&layout.params) {
                let view = flat_params.narrow(0, offset as i64, n as i64).view(p.size().as_slice());
                view.shallow_clone().copy_(p);
                // The parameter (every handle to it: model, var store, trainer) now
                // lives in the flat buffer.
                p.shallow_clone().set_data(&view);
            }
        });
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
                params: list(&|at, n| piece_of(&flat_params, 0, at, n)),
                grads: list(&|at, n| piece_of(&owned_grads, owned.start, at, n)),
                exp_avgs: of_kind("exp_avg"),
                exp_avg_sqs: of_kind("exp_avg_sq"),
                momentum: of_kind("momentum"),
                steps: TensorList::repeat(step, pieces.len()),
            });
        }
        let stats = Tensor::zeros([2], (Kind::Float, device));
        Ok((Shard { spec, layout, params: live, flat_params, flat_grads, grad_shard, owned_grads, state, stats }, groups))
    }

    pub fn mode(&self) -> ShardMode {
        self.spec.mode
    }

    /// The padded flat parameter buffer; this rank's slice starts at `rank * chunk`.
    pub fn flat_params(&self) -> &Tensor {
        &self.flat_params
    }

    /// The full-size flat gradient, while it exists.
    pub fn flat_grads(&self) -> Option<&Tensor> {
        self.flat_grads.as_ref()
    }

    /// `gradients`: the buffer this rank's reduced gradient goes to (`chunk` elements).
    pub fn grad_shard(&self) -> Option<&Tensor> {
        self.grad_shard.as_ref()
    }

    /// The reduced gradient of the owned slice.
    pub fn owned_grads(&self) -> &Tensor {
        &self.owned_grads
    }

    /// `[sum of squares of the owned gradient, non-finite flag]`, all-reduced by
    /// the data-parallel layer before clipping.
    pub fn stats(&self) -> &Tensor {
        &self.stats
    }

    /// Before a step's first backward: zeroes the gradient (`optimizer`), or
    /// allocates it and makes it every parameter's `.grad` (`gradients`).
    pub(super) fn zero_grad(&mut self) -> Result<()> {
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

    /// `gradients`: drops the full-size gradient once it has been reduced.
    pub(super) fn release_full_grads(&mut self) -> Result<()> {
        if self.spec.mode == ShardMode::Gradients && self.flat_grads.take().is_some() {
            grads::detach(&self.params).map_err(torch_err)?;
        }
        Ok(())
    }

    /// The global norm from the all-reduced sum of squares, clipping the gradient
    /// this rank uses (all of it with `optimizer`, so replicas stay equal) as
    /// `clip_grad_norm_` would.
    pub(super) fn clip(&self, max_norm: f64) -> Tensor {
        let norm = self.stats.get(0).sqrt();
        if max_norm > 0.0 {
            let coef = (norm.g_add_scalar(1e-6).reciprocal() * max_norm).clamp_max(1.0);
            let target = match (&self.grad_shard, &self.flat_grads) {
                (Some(shard), _) => shard,
                (None, Some(flat)) => flat,
                (None, None) => return norm,
            };
            let _ = target.shallow_clone().g_mul_(&coef);
        }
        norm
    }

    /// What `state.json` records about the cut.
    pub fn checkpoint_layout(&self) -> ShardLayout {
        ShardLayout {
            mode: self.spec.mode.name().into(),
            world_size: self.spec.world,
            numel: self.layout.numel,
            ranges: self.layout.ranges().into_iter().map(|r| [r.start, r.end]).collect(),
            save_id: format!("{:016x}", self.spec.save_id),
        }
    }

    /// Gradient tensors this rank holds (the parameters' `.grad` count separately).
    pub(super) fn gradient_buffers(&self) -> Vec<Tensor> {
        self.flat_grads.iter().chain(&self.grad_shard).map(Tensor::shallow_clone).collect()
    }
}
