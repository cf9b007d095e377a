//! A value whose gradients were computed in the forward pass: the chunked
//! cross-entropy's loss, with d loss / d hidden and d loss / d weight already made
//! chunk by chunk. Backward hands those gradients on without copying them
//! (`csrc/precomputed.cpp`).

use std::ffi::c_char;

use tch::Tensor;

use crate::{
    error::check,
    list::{opt, Raw},
    TorchError,
};

extern "C" {
    fn ptx_precomputed(hidden: Raw, weight: Raw, value: Raw, grad_hidden: Raw, grad_weight: Raw, out: *mut Raw) -> *mut c_char;
}

/// `value` (a scalar), whose gradient with respect to `hidden` is `grad_hidden` and
/// with respect to `weight` is `grad_weight` (`None`: a frozen weight). The
/// gradients must have their tensors' shapes and dtypes; backward scales them in
/// place by the incoming gradient, so they must not be used afterwards.
pub fn precomputed(hidden: &Tensor, weight: &Tensor, value: &Tensor, grad_hidden: Tensor, grad_weight: Option<Tensor>) -> Result<Tensor, TorchError> {
    let mut out: Raw = std::ptr::null_mut();
    // SAFETY: every handle is a live tensor borrowed (or, for the gradients, owned) for the
    // call; the shim copies the at::Tensor values it keeps (reference counts), writes one
    // owned heap tensor to `out` and catches C++ exceptions.
    check(unsafe {
        ptx_precomputed(
            hidden.as_ptr() as Raw,
            weight.as_ptr() as Raw,
            value.as_ptr() as Raw,
            grad_hidden.as_ptr() as Raw,
            opt(grad_weight.as_ref()),
            &mut out,
        )
    })?;
    // SAFETY: on success the shim wrote a heap `at::Tensor*` that we now own.
    Ok(unsafe { Tensor::from_ptr(out as *mut _) })
}
