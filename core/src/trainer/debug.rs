//! `[debug]` tools for testing plugins against a reference: a gradient spike
//! injected at given steps, and the tensors of given steps written out; and for
//! testing how a run fails: a libtorch error, an allocation too large, a data
//! worker's panic. Each costs an untaken branch on other steps; the dump's I/O
//! happens only at the steps it names.

use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use super::run::Run;
use crate::{
    config::DebugConfig,
    data::{Batch, BatchKey, Dataset, Split},
    error::{Error, Result},
};

/// `[debug] fail_at_step` and `alloc_at_step`: failures injected into the loop.
pub(super) struct Faults {
    fail_at: u64,
    alloc_at: u64,
    alloc_bytes: u64,
    device: Device,
}

impl Faults {
    pub fn new(debug: &DebugConfig, device: Device) -> Faults {
        Faults { fail_at: debug.fail_at_step, alloc_at: debug.alloc_at_step, alloc_bytes: debug.alloc_bytes, device }
    }

    /// Whether a failure is injected at `step` (0 = never; steps start at 1).
    #[inline(always)]
    pub fn at(&self, step: u64) -> bool {
        step == self.fail_at || step == self.alloc_at
    }

    /// Fails as libtorch fails: through tch's `f_` functions, as an error.
    pub fn inject(&self, step: u64) -> Result<()> {
        if step == self.fail_at {
            // Two elements viewed as three: libtorch refuses the shape.
            let _ = Tensor::f_zeros([2], (Kind::Float, self.device))?.f_view([3])?;
        }
        if step == self.alloc_at {
            let bytes = i64::try_from(self.alloc_bytes).unwrap_or(i64::MAX);
            let _ = Tensor::f_empty([bytes], (Kind::Uint8, self.device))?;
        }
        Ok(())
    }
}

/// `[debug] data_panic_at_step`: the dataset the loader draws from, panicking when
/// asked for that step's training batch.
pub(super) struct PanicAt {
    pub inner: Arc<dyn Dataset>,
    pub step: u64,
}

impl Dataset for PanicAt {
    fn batch(&self, split: Split, key: BatchKey) -> Result<Batch> {
        if split == Split::Train && key.step == self.step {
            panic!("debug.data_panic_at_step: the data worker panics producing step {}", key.step);
        }
        self.inner.batch(split, key)
    }

    fn dataset_names(&self) -> Vec<String> {
        self.inner.dataset_names()
    }

    fn train_len(&self) -> u64 {
        self.inner.train_len()
    }

    fn seq_len(&self) -> i64 {
        self.inner.seq_len()
    }

    fn input_dim(&self) -> i64 {
        self.inner.input_dim()
    }

    fn num_classes(&self) -> i64 {
        self.inner.num_classes()
    }
}

/// A copy in host memory (`to_device` alone returns a CPU tensor itself, which
/// clipping and the update would then change).
pub(super) fn host_copy(t: &Tensor) -> Tensor {
    if t.device() == Device::Cpu {
        t.copy()
    } else {
        t.to_device(Device::Cpu)
    }
}

impl Run {
    /// `[debug] grad_spike_at`: the factor this step's loss is scaled by before
    /// backward (the reported loss is not), if it names `step`.
    pub(super) fn grad_spike_at(&self, step: u64) -> Option<f64> {
        let debug = &self.env.config.debug;
        (!debug.grad_spike_at.is_empty() && debug.grad_spike_at.contains(&step)).then_some(debug.grad_spike_factor)
    }

    /// Whether `[debug] dump_tensors_at` names `step`.
    pub(super) fn dumps_tensors_at(&self, step: u64) -> bool {
        let at = &self.env.config.debug.dump_tensors_at;
        !at.is_empty() && at.contains(&step)
    }

    /// Host copies of the parameters and of their gradients as backward left them
    /// (before the all-reduce and clipping).
    pub(super) fn tensors_before_update(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (name, p) in &self.learner.params {
            out.push((format!("param/{name}"), host_copy(&p.detach())));
            let g = p.grad();
            if g.defined() {
                out.push((format!("grad/{name}"), host_copy(&g)));
            }
        }
        out
    }

    /// Writes `<run-dir>/tensors-step<N>.rank<r>.safetensors`: `before`, each
    /// micro-batch's tensors and per-token losses (`batch<m>/inputs`, `targets`,
    /// `positions`, `segments`, `token_loss`) and the parameters after the update
    /// (`updated/<name>`).
    pub(super) fn dump_tensors(&mut self, step: u64, mut tensors: Vec<(String, Tensor)>) -> Result<()> {
        tensors.append(&mut self.staged.dumped);
        for (name, p) in &self.learner.params {
            tensors.push((format!("updated/{name}"), host_copy(&p.detach())));
        }
        let dir = &self.env.run_dir;
        std::fs::create_dir_all(dir).map_err(Error::writing(dir))?;
        let path = dir.join(format!("tensors-step{step}.rank{}.safetensors", self.env.rank));
        Tensor::write_safetensors(&tensors, &path)?;
        Ok(())
    }
}
