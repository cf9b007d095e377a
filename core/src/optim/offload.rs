//! `dist.offload_optimizer` (ZeRO-Offload): parameter sharding's optimizer state,
//! and a float32 copy of this rank's chunks, live in host memory and the update runs
//! there. Each step the gradient chunks come over (after the reduction and
//! clipping) and the updated chunks go back to the device's master buffer, which
//! the next gathers read. Same kernels, same inputs: on the CPU the losses are those
//! of the run without offload, bit for bit.

use tch::{Device, Kind, Tensor};

use ptrain_torch_ext as ext;

use super::{update, Group, LearningRate};
use crate::{
    config::OptimConfig,
    error::{Error, Result},
};

pub(super) struct Offload {
    /// Host copies of the chunks the update reads and writes.
    pub master: Tensor,
    pub grads: Tensor,
    found_inf: Tensor,
}

fn torch(e: tch::TchError) -> Error {
    Error::Other(format!("optimizer offload: {}", crate::error::torch_message(&e)))
}

impl Offload {
    /// Host buffers for `total` elements of chunks.
    pub fn new(total: i64) -> Result<Offload> {
        let zeros = |shape: &[i64]| Tensor::f_zeros(shape, (Kind::Float, Device::Cpu)).map_err(torch);
        Ok(Offload { master: zeros(&[total])?, grads: zeros(&[total])?, found_inf: zeros(&[])? })
    }

    /// The device's chunks (at set-up, after a restore) to the host copy.
    pub fn pull(&self, master: &Tensor) -> Result<()> {
        tch::no_grad(|| self.master.shallow_clone().f_copy_(master)).map(drop).map_err(torch)
    }

    /// One update on the host, over `groups` (views of the host buffers), from the
    /// device's gradient chunks (`grads`); the result back into its chunks (`master`).
    pub fn step(
        &self,
        config: &OptimConfig,
        groups: &[Group],
        step: &mut Tensor,
        lr: &LearningRate,
        found_inf: Option<&Tensor>,
        [grads, master]: [&Tensor; 2],
    ) -> Result<()> {
        tch::no_grad(|| -> Result<()> {
            self.grads.shallow_clone().f_copy_(grads).map_err(torch)?;
            if let Some(flag) = found_inf {
                self.found_inf.shallow_clone().f_copy_(flag).map_err(torch)?;
            }
            // The host's kernels take the value: the device's tensor would be read back.
            update(config, groups, step, ext::Lr::Value(lr.value()), found_inf.map(|_| &self.found_inf))?;
            master.shallow_clone().f_copy_(&self.master).map_err(torch)?;
            Ok(())
        })
    }
}
