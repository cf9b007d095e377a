//! The CUDA caching allocator's history of allocations, for PyTorch's memory viz.

use std::ffi::c_char;

use crate::error::{check, free, TorchError};

extern "C" {
    fn ptx_cuda_memory_history(enabled: bool, max_entries: i64) -> *mut c_char;
    fn ptx_cuda_memory_snapshot(out: *mut *mut c_char, len: *mut i64) -> *mut c_char;
}

/// `torch.cuda.memory._record_memory_history`: on with up to `max_entries`
/// events, or off. An error without CUDA.
pub fn cuda_memory_history(enabled: bool, max_entries: i64) -> Result<(), TorchError> {
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_cuda_memory_history(enabled, max_entries) })
}

/// `torch.cuda.memory._snapshot()` pickled, as `_dump_snapshot` writes it (for
/// PyTorch's memory viz). An error without CUDA.
pub fn cuda_memory_snapshot() -> Result<Vec<u8>, TorchError> {
    let (mut out, mut len): (*mut c_char, i64) = (std::ptr::null_mut(), 0);
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_cuda_memory_snapshot(&mut out, &mut len) })?;
    // SAFETY: `len` malloc'ed bytes, now ours to copy and free.
    let bytes = unsafe { std::slice::from_raw_parts(out as *const u8, len as usize) }.to_vec();
    // SAFETY: the shim's malloc'ed memory, freed once, after its last use.
    unsafe { free(out) };
    Ok(bytes)
}
