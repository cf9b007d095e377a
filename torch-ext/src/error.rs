//! The shim's error: a C++ exception's message, handed back as a string.

use std::ffi::{c_char, CStr};

extern "C" {
    fn ptx_free(message: *mut c_char);
}

/// An error raised by libtorch inside the shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchError(pub String);

impl std::fmt::Display for TorchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // libtorch appends a C++ backtrace after the first line; keep the message.
        f.write_str(self.0.lines().next().unwrap_or_default())
    }
}

impl std::error::Error for TorchError {}

pub(crate) fn check(message: *mut c_char) -> Result<(), TorchError> {
    if message.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null return is a NUL-terminated malloc'ed string we now own.
    let text = unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned();
    // SAFETY: the shim's malloc'ed memory, freed once, after its last use.
    unsafe { ptx_free(message) };
    Err(TorchError(text))
}

/// Frees a string or buffer the shim malloc'ed.
///
/// # Safety
/// `p` came from the shim, is not used after and not freed again.
pub(crate) unsafe fn free(p: *mut c_char) {
    // SAFETY: the caller's promise above.
    unsafe { ptx_free(p) }
}
