//! SwiGLU's gating `silu(gate) * up`, keeping only `gate` and `up` for backward
//! (`csrc/swiglu.cpp`): the gradients are autograd's bit for bit, without the saved
//! `silu(gate)`.

use std::ffi::c_char;

use tch::Tensor;

use crate::{error::check, list::Raw, TorchError};

extern "C" {
    fn ptx_swiglu(gate: Raw, up: Raw, out: *mut Raw) -> *mut c_char;
}

/// `silu(gate) * up`, recomputing `silu(gate)` in backward.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor, TorchError> {
    let mut out: Raw = std::ptr::null_mut();
    // SAFETY: both handles are live tensors borrowed for the call; the shim copies the
    // at::Tensor values it keeps (reference counts), writes one owned heap tensor to
    // `out` and catches C++ exceptions.
    check(unsafe { ptx_swiglu(gate.as_ptr() as Raw, up.as_ptr() as Raw, &mut out) })?;
    // SAFETY: on success the shim wrote a heap `at::Tensor*` that we now own.
    Ok(unsafe { Tensor::from_ptr(out as *mut _) })
}
