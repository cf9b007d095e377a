//! What a due step computes on the device, and what it reads back once.
//!
//! At `AfterBackward` the parameters are copied (only on due steps: the update
//! needs their values before the optimizer changes them) and per tensor the
//! gradient's L2 norm, its non-zero and non-finite entry counts and the
//! parameter's L2 norm are computed with `torch._foreach_norm` (a few fused
//! kernels for the whole model). At `StepEnd` the copies become the updates in
//! place and their norms join the others in one `[5, n]` tensor, read once.

use ptrain_plugin_api::NamedTensor;
use ptrain_torch_ext::{foreach, TensorList, TorchError};
use tch::{Device, Kind, Tensor};

/// Rows of the per-tensor statistics.
pub const GRAD_NORM: usize = 0;
pub const GRAD_NONZERO: usize = 1;
pub const GRAD_NONFINITE: usize = 2;
pub const PARAM_NORM: usize = 3;
pub const UPDATE_NORM: usize = 4;
pub const ROWS: usize = 5;

/// A due step between its `AfterBackward` and its `StepEnd`.
pub struct Pending {
    pub step: u64,
    /// The parameters before the update.
    before: TensorList,
    /// `[4, n]` float64 on the device: the rows above but the update's.
    stats: Tensor,
}

fn owned(tensors: &[NamedTensor<'_>]) -> Vec<Tensor> {
    tensors.iter().map(|t| t.tensor.shallow_clone().unwrap_or_else(|| Tensor::zeros([0], (Kind::Float, Device::Cpu)))).collect()
}

/// Launches the gradient and parameter reductions of `step`; no host sync.
pub fn measure(step: u64, params: &[NamedTensor<'_>], grads: &[NamedTensor<'_>]) -> Result<Pending, TorchError> {
    tch::no_grad(|| {
        let params: Vec<Tensor> = owned(params).iter().map(Tensor::detach).collect();
        let grads: Vec<Tensor> = owned(grads).into_iter().zip(&params).map(|(g, p)| if g.defined() { g } else { p.zeros_like() }).collect();
        let before = TensorList::new(params.iter().map(Tensor::copy).collect());
        let params = TensorList::new(params);
        let grads = TensorList::new(grads);
        // x * 0 is 0 for finite x and NaN otherwise: its non-zero count is the
        // non-finite count.
        let nonfinite = foreach::norms(&foreach::mul_scalar(&grads, 0.0)?, 0.0)?;
        let rows = [foreach::norms(&grads, 2.0)?, foreach::norms(&grads, 0.0)?, nonfinite, foreach::norms(&params, 2.0)?];
        Ok(Pending { step, before, stats: Tensor::stack(&rows, 0) })
    })
}

impl Pending {
    /// Adds the update norms (`params` after the update) and reads everything:
    /// `[ROWS][n]`. The one host sync of a due step.
    pub fn finish(self, params: &[NamedTensor<'_>]) -> Result<Vec<Vec<f64>>, TorchError> {
        tch::no_grad(|| {
            let after = TensorList::new(owned(params).iter().map(Tensor::detach).collect());
            if after.len() != self.before.len() {
                return Err(TorchError(format!("{} parameters after the update, {} before", after.len(), self.before.len())));
            }
            foreach::sub_(&self.before, &after)?;
            let update = foreach::norms(&self.before, 2.0)?;
            let all = Tensor::cat(&[self.stats, update.unsqueeze(0)], 0).to_device(Device::Cpu);
            let flat = Vec::<f64>::try_from(all.flatten(0, -1)).map_err(|e| TorchError(e.to_string()))?;
            let n = self.before.len();
            Ok((0..ROWS).map(|r| flat[r * n..(r + 1) * n].to_vec()).collect())
        })
    }
}
