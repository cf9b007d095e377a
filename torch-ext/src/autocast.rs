//! Autocast regions (`torch.autocast`) and the dtype they cast to.

use std::ffi::c_char;

use crate::error::{check, TorchError};

extern "C" {
    fn ptx_autocast_enter(cuda: bool, was_enabled: *mut bool, was_dtype: *mut i32) -> *mut c_char;
    fn ptx_autocast_exit(cuda: bool, was_enabled: bool, was_dtype: i32) -> *mut c_char;
    fn ptx_autocast_dtype(cuda: bool, out: *mut i32) -> *mut c_char;
}

/// Runs `f` with autocast to bfloat16 on the CPU (`cuda` false) or on CUDA, as
/// `torch.autocast(device_type, torch.bfloat16)` does.
/// On leaving, the autocast state before it (enabled flag and dtype) is back.
pub fn autocast_bf16<T>(cuda: bool, f: impl FnOnce() -> T) -> Result<T, TorchError> {
    let (mut was_enabled, mut was_dtype) = (false, 0);
    // SAFETY: the shim writes only through out-pointers to our locals; it catches C++
    // exceptions and returns them as a message.
    check(unsafe { ptx_autocast_enter(cuda, &mut was_enabled, &mut was_dtype) })?;
    // Leaves the region even if `f` panics.
    struct Exit(bool, bool, i32);
    impl Drop for Exit {
        fn drop(&mut self) {
            // SAFETY: the shim takes plain values and catches C++ exceptions.
            let _ = check(unsafe { ptx_autocast_exit(self.0, self.1, self.2) });
        }
    }
    let _exit = Exit(cuda, was_enabled, was_dtype);
    Ok(f())
}

/// The dtype autocast casts to on the CPU (`cuda` false) or CUDA, this thread
/// (`torch.get_autocast_dtype`): libtorch's defaults are bfloat16 and float16.
pub fn autocast_dtype(cuda: bool) -> Result<tch::Kind, TorchError> {
    let mut code = 0;
    // SAFETY: reads this thread's autocast state into `code`.
    check(unsafe { ptx_autocast_dtype(cuda, &mut code) })?;
    match code {
        5 => Ok(tch::Kind::Half),
        6 => Ok(tch::Kind::Float),
        15 => Ok(tch::Kind::BFloat16),
        other => Err(TorchError(format!("autocast dtype with scalar type code {other}"))),
    }
}
