//! Gradient clipping on the device, and zeroing the gradients.

use std::ffi::c_char;

use tch::Tensor;

use crate::error::{check, TorchError};
use crate::list::{Raw, TensorList};

extern "C" {
    fn ptx_clip_grad_norm(grads: *const Raw, n: i64, max_norm: f64, out_norm: *mut Raw) -> *mut c_char;
    fn ptx_foreach_zero(ts: *const Raw, n: i64) -> *mut c_char;
}

/// The global L2 norm of `grads`, clipping them to `max_norm` when it is positive,
/// all on the device (as `clip_grad_norm_(foreach=True)`).
pub fn clip_grad_norm(grads: &TensorList, max_norm: f64) -> Result<Tensor, TorchError> {
    let mut out: Raw = std::ptr::null_mut();
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_clip_grad_norm(grads.ptr(), grads.len() as i64, max_norm, &mut out) })?;
    // SAFETY: the shim returns a new heap `at::Tensor*`, which Tensor now owns.
    Ok(unsafe { Tensor::from_ptr(out as *mut _) })
}

/// `torch._foreach_zero_`. An empty list is nothing to zero (the foreach kernel
/// itself refuses one).
pub fn zero_all(tensors: &TensorList) -> Result<(), TorchError> {
    if tensors.is_empty() {
        return Ok(());
    }
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_foreach_zero(tensors.ptr(), tensors.len() as i64) })
}
