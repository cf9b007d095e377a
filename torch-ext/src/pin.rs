//! Page-locked host memory, for asynchronous copies to the GPU.

use std::ffi::c_char;

use tch::Tensor;

use crate::error::{check, TorchError};
use crate::list::Raw;

extern "C" {
    fn ptx_pin_memory(t: Raw, out: *mut Raw) -> *mut c_char;
    fn ptx_is_pinned(t: Raw, out: *mut bool) -> *mut c_char;
}

/// Page-locks a host tensor for asynchronous copies to the GPU (returns it as
/// it is when already pinned). Unlike tch's `pin_memory(device)` it passes no
/// device, which libtorch 2.11 deprecates with a warning per call.
pub fn pin_memory(t: &Tensor) -> Result<Tensor, TorchError> {
    let mut out: Raw = std::ptr::null_mut();
    // SAFETY: `t` is a live tensor handle for the call; `out` receives an owned one.
    check(unsafe { ptx_pin_memory(t.as_ptr() as Raw, &mut out) })?;
    // SAFETY: the shim returns a new heap `at::Tensor*`, which Tensor now owns.
    Ok(unsafe { Tensor::from_ptr(out as *mut _) })
}

/// Whether `t` is in page-locked memory (`Tensor.is_pinned()`, no device).
pub fn is_pinned(t: &Tensor) -> Result<bool, TorchError> {
    let mut out = false;
    // SAFETY: `t` is a live tensor handle for the call.
    check(unsafe { ptx_is_pinned(t.as_ptr() as Raw, &mut out) })?;
    Ok(out)
}
