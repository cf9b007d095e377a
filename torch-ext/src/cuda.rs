//! CUDA information and the caching allocator's figures; all are harmless no-ops
//! without CUDA.

use std::ffi::{c_char, CStr};

use crate::error::{check, TorchError};

extern "C" {
    fn ptx_cuda_compiled() -> bool;
    fn ptx_cuda_device_count() -> i64;
    fn ptx_cuda_empty_cache() -> *mut c_char;
    fn ptx_cuda_memory(device: i32, allocated: *mut i64, peak: *mut i64, reserved: *mut i64) -> *mut c_char;
    fn ptx_cuda_device_name(device: i32, buffer: *mut c_char, size: i64) -> *mut c_char;
}

/// Whether this build has the CUDA parts (libtorch had CUDA at build time).
pub fn compiled() -> bool {
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    unsafe { ptx_cuda_compiled() }
}

pub fn device_count() -> i64 {
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    unsafe { ptx_cuda_device_count() }
}

pub fn empty_cache() -> Result<(), TorchError> {
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_cuda_empty_cache() })
}

/// Caching-allocator bytes on `device`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    pub allocated: i64,
    pub peak: i64,
    pub reserved: i64,
}

pub fn memory(device: i32) -> Result<Memory, TorchError> {
    let mut m = Memory::default();
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_cuda_memory(device, &mut m.allocated, &mut m.peak, &mut m.reserved) })?;
    Ok(m)
}

pub fn device_name(device: i32) -> Result<String, TorchError> {
    let mut buffer = [0 as c_char; 256];
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_cuda_device_name(device, buffer.as_mut_ptr(), buffer.len() as i64) })?;
    // SAFETY: the shim wrote a NUL-terminated name into `buffer`, truncated to its length.
    Ok(unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().into_owned())
}
