//! SwiGLU's gating `silu(gate) * up`, keeping only `gate` and `up` for backward, and
//! the product itself recomputed from them where a later matmul would keep it
//! (`csrc/swiglu.cpp`): the gradients are autograd's bit for bit, without the saved
//! `silu(gate)` nor the saved product.

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

extern "C" {
    fn ptx_recompute_swiglu_product(out: Raw, product: Raw, gate: Raw, up: Raw, dropped: *mut i64) -> *mut c_char;
}

/// Op-level selective recompute of `product = swiglu(gate, up)`: wherever the graph
/// from `out` back to `product` saves `product` for backward (a matmul's input, as the
/// down projection's weight or LoRA A gradient needs it), it is dropped and recomputed
/// from `gate` and `up` when backward needs it, with autograd's own backward, so the
/// gradients are the same bit for bit. Returns how many saved tensors were dropped (0
/// without a graph).
pub fn recompute_swiglu_product(out: &Tensor, product: &Tensor, gate: &Tensor, up: &Tensor) -> Result<usize, TorchError> {
    let mut dropped: i64 = 0;
    // SAFETY: every handle is a live tensor borrowed for the call; the shim keeps
    // copies (reference counts) of gate and up in the hooks it registers, writes only
    // `dropped` and catches C++ exceptions.
    check(unsafe {
        ptx_recompute_swiglu_product(out.as_ptr() as Raw, product.as_ptr() as Raw, gate.as_ptr() as Raw, up.as_ptr() as Raw, &mut dropped)
    })?;
    Ok(dropped as usize)
}
