//! `[debug]` tools for testing plugins against a reference: a gradient spike
//! injected at given steps, and the tensors of given steps written out; and for
//! testing how a run fails: a libtorch error, an allocation too large, a data
//! worker's panic. Each costs an untaken branch on other steps; the dump's I/O
//! happens only at the steps it names.

use std::{path::Path, sync::Arc};

use tch::{Device, Kind, Reduction, Tensor};

use crate::{
    config::DebugConfig,
    data::{Batch, BatchKey, Dataset, Split},
    error::{Error, Result},
    objective::cross_entropy,
};

/// `[debug] fail_at_step`, `alloc_at_step`, `grad_spike_at` and `nonfinite_loss_at`:
/// faults injected into the loop.
pub(super) struct Faults {
    fail_at: u64,
    alloc_at: u64,
    alloc_bytes: u64,
    alloc_at_finish: bool,
    device: Device,
    spike_at: Vec<u64>,
    spike_factor: f64,
    /// Steps whose loss is made NaN.
    nan_at: Vec<u64>,
}

impl Faults {
    pub fn new(debug: &DebugConfig, device: Device) -> Faults {
        Faults {
            fail_at: debug.fail_at_step,
            alloc_at: debug.alloc_at_step,
            alloc_bytes: debug.alloc_bytes,
            alloc_at_finish: debug.alloc_at_finish,
            device,
            spike_at: debug.grad_spike_at.clone(),
            spike_factor: debug.grad_spike_factor,
            nan_at: debug.nonfinite_loss_at.clone(),
        }
    }

    /// `[debug] alloc_at_finish`: fails as an unguarded tch call fails, with a
    /// panic (the end of the run must catch it).
    pub fn at_finish(&self) {
        if self.alloc_at_finish {
            let bytes = i64::try_from(self.alloc_bytes).unwrap_or(i64::MAX);
            let _ = Tensor::empty([bytes], (Kind::Uint8, self.device));
        }
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

    /// Whether `nonfinite_loss_at` names `step`: its loss is made NaN.
    pub fn nan_at(&self, step: u64) -> bool {
        !self.nan_at.is_empty() && self.nan_at.contains(&step)
    }

    /// The factor this step's loss is scaled by before backward (the reported loss
    /// is not), if `grad_spike_at` names `step`.
    pub fn grad_spike(&self, step: u64) -> Option<f64> {
        (!self.spike_at.is_empty() && self.spike_at.contains(&step)).then_some(self.spike_factor)
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

    fn val_len(&self) -> Option<u64> {
        self.inner.val_len()
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
fn host_copy(t: &Tensor) -> Tensor {
    if t.device() == Device::Cpu {
        t.copy()
    } else {
        t.to_device(Device::Cpu)
    }
}

/// `[debug] dump_tensors_at`: a step's tensors written to
/// `<run-dir>/tensors-step<N>.rank<r>.safetensors`, so tests can compare them with
/// another implementation.
pub(super) struct TensorDump {
    at: Vec<u64>,
    /// The step's micro-batches as they come, then its parameters and gradients
    /// before the update.
    kept: Vec<(String, Tensor)>,
}

impl TensorDump {
    pub fn new(debug: &DebugConfig) -> TensorDump {
        TensorDump { at: debug.dump_tensors_at.clone(), kept: Vec::new() }
    }

    /// Whether `step` is dumped.
    pub fn at(&self, step: u64) -> bool {
        !self.at.is_empty() && self.at.contains(&step)
    }

    /// Keeps host copies of micro-batch `micro`'s tensors and, from a language
    /// model's logits, each target's loss.
    pub fn keep_batch(&mut self, micro: u64, batch: &Batch, logits: Option<&Tensor>) -> Result<()> {
        let name = |what: &str| format!("batch{micro}/{what}");
        self.kept.push((name("inputs"), host_copy(&batch.inputs)));
        self.kept.push((name("targets"), host_copy(&batch.targets)));
        if let Some(s) = &batch.segments {
            self.kept.push((name("positions"), host_copy(&s.positions)));
            self.kept.push((name("segments"), host_copy(&s.ids)));
        }
        if let Some(logits) = logits.filter(|l| l.dim() == 3) {
            self.kept.push((name("token_loss"), host_copy(&cross_entropy(logits, &batch.targets, Reduction::None)?.f_detach()?)));
        }
        Ok(())
    }

    /// Keeps host copies of the parameters and of their gradients as backward left
    /// them (before the all-reduce and clipping): `param/<name>`, `grad/<name>`.
    pub fn keep_before_update(&mut self, params: &[(String, Tensor)]) {
        for (name, p) in params {
            self.kept.push((format!("param/{name}"), host_copy(&p.detach())));
            let g = p.grad();
            if g.defined() {
                self.kept.push((format!("grad/{name}"), host_copy(&g)));
            }
        }
    }

    /// Writes what was kept and the parameters after the update (`updated/<name>`)
    /// for `step`.
    pub fn write(&mut self, step: u64, params: &[(String, Tensor)], run_dir: &Path, rank: u32) -> Result<()> {
        let mut before = std::mem::take(&mut self.kept);
        for (name, p) in params {
            before.push((format!("updated/{name}"), host_copy(&p.detach())));
        }
        std::fs::create_dir_all(run_dir).map_err(Error::writing(run_dir))?;
        let path = run_dir.join(format!("tensors-step{step}.rank{rank}.safetensors"));
        Tensor::write_safetensors(&before, &path)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
