//! libtorch's profiler, recording input shapes to count FLOPs.

use std::ffi::c_char;

use crate::error::{check, TorchError};

extern "C" {
    fn ptx_profiler_start() -> *mut c_char;
    fn ptx_profiler_stop(flops: *mut u64, counted_ops: *mut u64) -> *mut c_char;
    fn ptx_flop_count_start() -> *mut c_char;
    fn ptx_flop_count_stop(out: *mut u64) -> *mut c_char;
}

pub fn start() -> Result<(), TorchError> {
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_profiler_start() })
}

/// Stops profiling; returns the FLOPs of the recorded operators and how many
/// operator calls had a FLOP formula.
pub fn stop() -> Result<(u64, u64), TorchError> {
    let (mut flops, mut ops) = (0, 0);
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_profiler_stop(&mut flops, &mut ops) })?;
    Ok((flops, ops))
}

/// FLOPs of the operators run between [`count_start`] and [`count_stop`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlopCounts {
    /// mm, addmm, bmm, baddbmm and conv2d, by libtorch's formulas, and oneDNN's
    /// linear (`run.cpu_matmul`), 2 x rows x out x in from its recorded shapes.
    pub matmul: u64,
    /// add and mul (one per output element), by libtorch's formulas.
    pub elementwise: u64,
    /// Fused scaled-dot-product attention, forward and backward, from the
    /// recorded shapes (libtorch has no formula for these kernels).
    pub attention: u64,
    /// Operator calls counted in `matmul` or `elementwise`.
    pub counted_ops: u64,
    pub attention_ops: u64,
}

/// Starts counting FLOPs on this thread (and the autograd threads it feeds)
/// with the legacy CPU profiler, which unlike Kineto needs no GPU tracer.
pub fn count_start() -> Result<(), TorchError> {
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_flop_count_start() })
}

pub fn count_stop() -> Result<FlopCounts, TorchError> {
    let mut out = [0u64; 5];
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_flop_count_stop(out.as_mut_ptr()) })?;
    Ok(FlopCounts { matmul: out[0], elementwise: out[1], attention: out[2], counted_ops: out[3], attention_ops: out[4] })
}
