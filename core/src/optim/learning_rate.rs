//! The learning rate an update uses, held on the device.
//!
//! The schedule is computed on the host (one closed form a step, no read of the
//! device) and written into a 0-dim tensor before the step's core runs; the fused
//! kernels read the tensor when they run. So the core itself holds no host value a
//! captured step would freeze: a CUDA graph replays its update with whatever the
//! tensor holds at the replay.

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};

/// The next update's learning rate: its value, and the same on the device.
#[derive(Debug)]
pub struct LearningRate {
    value: f64,
    /// float32 on CUDA (what the fused kernels read there), float64 elsewhere, so
    /// that the CPU kernels, which read its value, update exactly as with `value`.
    tensor: Tensor,
}

impl LearningRate {
    pub fn new(device: Device) -> Result<LearningRate> {
        let kind = if device.is_cuda() { Kind::Float } else { Kind::Double };
        let tensor = Tensor::f_zeros([], (kind, device)).map_err(|e| Error::Other(format!("learning rate: {e}")))?;
        Ok(LearningRate { value: 0.0, tensor })
    }

    /// A learning rate fixed at `lr` (the components' tests).
    pub fn at(device: Device, lr: f64) -> Result<LearningRate> {
        let mut out = LearningRate::new(device)?;
        out.set(lr)?;
        Ok(out)
    }

    /// Writes the next update's rate: a fill on the device, no sync.
    pub fn set(&mut self, lr: f64) -> Result<()> {
        self.value = lr;
        tch::no_grad(|| self.tensor.f_fill_(lr)).map(drop).map_err(|e| Error::Other(format!("learning rate: {e}")))
    }

    /// The value last set, for an update computed on the host (optimizer offload).
    pub fn value(&self) -> f64 {
        self.value
    }

    /// The rate as the fused kernels take it.
    pub fn on_device(&self) -> ptrain_torch_ext::Lr<'_> {
        ptrain_torch_ext::Lr::Tensor(&self.tensor)
    }
}
