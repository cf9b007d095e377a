//! Per-tensor reductions over a tensor list in a few fused kernels (`torch._foreach_*`).

use std::ffi::c_char;

use tch::Tensor;

use crate::error::{check, TorchError};
use crate::list::{Raw, TensorList};

extern "C" {
    fn ptx_foreach_norm(ts: *const Raw, n: i64, ord: f64, out: *mut Raw) -> *mut c_char;
    fn ptx_foreach_sub_(a: *const Raw, b: *const Raw, n: i64) -> *mut c_char;
    fn ptx_foreach_mul_scalar(ts: *const Raw, n: i64, scalar: f64, out: *mut Raw) -> *mut c_char;
}

/// `torch._foreach_norm(ts, ord, dtype=float64)` stacked into one `[n]` tensor
/// on the tensors' device: `ord = 2.0` the L2 norms, `ord = 0.0` the counts of
/// non-zero entries (NaN and infinities count as non-zero).
pub fn norms(ts: &TensorList, ord: f64) -> Result<Tensor, TorchError> {
    let mut out: Raw = std::ptr::null_mut();
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_foreach_norm(ts.ptr(), ts.len() as i64, ord, &mut out) })?;
    // SAFETY: the shim returns a new heap `at::Tensor*`, which Tensor now owns.
    Ok(unsafe { Tensor::from_ptr(out as *mut _) })
}

/// `a[i] -= b[i]` in place (`torch._foreach_sub_`).
pub fn sub_(a: &TensorList, b: &TensorList) -> Result<(), TorchError> {
    assert_eq!(a.len(), b.len());
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_foreach_sub_(a.ptr(), b.ptr(), a.len() as i64) })
}

/// `ts[i] * scalar` as new tensors (`torch._foreach_mul`).
pub fn mul_scalar(ts: &TensorList, scalar: f64) -> Result<TensorList, TorchError> {
    let mut out: Vec<Raw> = vec![std::ptr::null_mut(); ts.len()];
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_foreach_mul_scalar(ts.ptr(), ts.len() as i64, scalar, out.as_mut_ptr()) })?;
    // SAFETY: each is a new heap `at::Tensor*` the shim hands over.
    Ok(TensorList::new(out.into_iter().map(|p| unsafe { Tensor::from_ptr(p as *mut _) }).collect()))
}
