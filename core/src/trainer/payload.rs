//! Converting between live tensors and checkpoint blobs (the dtypes map in
//! `ptrain_plugin_api`'s `dtype.rs`).

use ptrain_plugin_api::{DType, TensorBlob};
use tch::{Device, Tensor};

use crate::error::{Error, Result};

/// Copies a tensor to host memory (the only part of a save the loop waits for).
pub fn to_blob(name: &str, tensor: &Tensor) -> Result<TensorBlob> {
    let dtype = DType::of_kind(tensor.kind()).ok_or_else(|| Error::Other(format!("cannot checkpoint {name}: dtype {:?}", tensor.kind())))?;
    let host = tensor.detach().to_device(Device::Cpu).contiguous();
    let numel = host.numel();
    let mut data = vec![0u8; numel * dtype.size()];
    host.f_copy_data_u8(&mut data, numel)?;
    Ok(TensorBlob { name: name.into(), dtype, shape: host.size().into(), data: data.into() })
}

/// Copies checkpointed data into a live tensor of the same shape.
pub fn restore(name: &str, live: &mut Tensor, saved: &ptrain_checkpoint::Tensor) -> Result<()> {
    if saved.shape != live.size() {
        return Err(Error::Other(format!("checkpoint tensor {name} has shape {:?}, the model's is {:?}", saved.shape, live.size())));
    }
    let value = Tensor::f_from_data_size(&saved.data, &saved.shape, saved.dtype.kind())?.to_kind(live.kind()).to_device(live.device());
    tch::no_grad(|| live.f_copy_(&value))?;
    Ok(())
}
