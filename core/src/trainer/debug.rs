//! `[debug]` tools for testing plugins against a reference: a gradient spike
//! injected at given steps, and the tensors of given steps written out. Each
//! costs an untaken branch on other steps; the dump's I/O happens only at the
//! steps it names.

use tch::{Device, Tensor};

use super::run::Run;
use crate::error::{Error, Result};

/// A copy in host memory (`to_device` alone returns a CPU tensor itself, which
/// clipping and the update would then change).
fn host_copy(t: &Tensor) -> Tensor {
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

    /// Writes `<run-dir>/tensors-step<N>.rank<r>.safetensors`: `before` and the
    /// parameters after the update (`updated/<name>`).
    pub(super) fn dump_tensors(&self, step: u64, mut tensors: Vec<(String, Tensor)>) -> Result<()> {
        for (name, p) in &self.learner.params {
            tensors.push((format!("updated/{name}"), host_copy(&p.detach())));
        }
        let dir = &self.env.run_dir;
        std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.clone(), source })?;
        let path = dir.join(format!("tensors-step{step}.rank{}.safetensors", self.env.rank));
        Tensor::write_safetensors(&tensors, &path)?;
        Ok(())
    }
}
