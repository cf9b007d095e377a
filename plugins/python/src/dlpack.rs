//! Host tensors to `torch.Tensor` through DLPack: the capsule points at the tensor's
//! own memory, on its device, and owns a reference to it (a `tch::Tensor` sharing its
//! storage), so the memory stays valid for as long as Python keeps the tensor, even
//! past the call that handed it over.

use dlpark::{
    ffi::{DLDataType, DLDevice, DLManagedTensor},
    legacy,
    metadata::Dynamic,
};
use pyo3::prelude::*;
use tch::{Device, Kind, Tensor};

fn dtype(kind: Kind) -> Option<DLDataType> {
    Some(match kind {
        Kind::Float => DLDataType::F32,
        Kind::Double => DLDataType::F64,
        Kind::Half => DLDataType::F16,
        Kind::BFloat16 => DLDataType::BF16,
        Kind::Int64 => DLDataType::I64,
        Kind::Int => DLDataType::I32,
        Kind::Int16 => DLDataType::I16,
        Kind::Int8 => DLDataType::I8,
        Kind::Uint8 => DLDataType::U8,
        Kind::Bool => DLDataType::BOOL,
        _ => return None,
    })
}

fn device(device: Device) -> Option<DLDevice> {
    match device {
        Device::Cpu => Some(DLDevice::CPU),
        Device::Cuda(index) => Some(DLDevice::cuda(index as i32)),
        _ => None,
    }
}

/// `tensor` (a defined one) as a `torch.Tensor` sharing its memory. The Python tensor is
/// detached from autograd: a module reads the step's values, it cannot change the graph.
pub fn to_torch<'py>(py: Python<'py>, from_dlpack: &Bound<'py, PyAny>, tensor: Tensor) -> PyResult<Bound<'py, PyAny>> {
    let kind = tensor.kind();
    let (Some(dtype), Some(device)) = (dtype(kind), device(tensor.device())) else {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!("a {kind:?} tensor on {:?} has no DLPack form", tensor.device())));
    };
    let data = tensor.data_ptr();
    let (shape, strides) = (tensor.size(), tensor.stride());
    let metadata = Dynamic::new(shape, strides);
    let mut managed =
        metadata.initialize_as::<DLManagedTensor>(Box::new(tensor)).map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("DLPack: {e}")))?;
    managed.set_data(data).set_dtype(dtype).set_device(device);
    // SAFETY: `data` is the tensor's first element (storage offset included), on
    // `device`, laid out by `shape` and `strides` in elements of `dtype`; the boxed
    // tensor that owns a reference to that storage is the capsule's context, dropped
    // by its deleter, so the memory outlives every Python view of it.
    let capsule: legacy::Dlpack = unsafe { managed.finish() };
    from_dlpack.call1((capsule.into_pyobject(py)?,))
}
