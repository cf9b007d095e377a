//! What parameter sharding (ZeRO-3 / FSDP) needs below tch: a gathered block's
//! memory released and re-allocated under its tensors ([`resize_storage`]), and a
//! callback when a tensor's gradient is computed ([`on_grad`]), the points where a
//! block's backward begins (its output's gradient) and ends (its input's).

use std::{
    ffi::{c_char, c_void},
    panic::{catch_unwind, AssertUnwindSafe},
    sync::Arc,
};

use tch::Tensor;

use crate::{error::check, list::Raw, TorchError};

/// What runs when a gradient is computed, on the thread running backward.
pub type GradCallback = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

type Hook = extern "C" fn(ctx: *mut c_void) -> *mut c_char;
type Release = extern "C" fn(ctx: *mut c_void);

extern "C" {
    fn ptx_storage_resize(t: Raw, nbytes: i64) -> *mut c_char;
    fn ptx_hook_message(text: *const c_char, len: i64) -> *mut c_char;
    fn ptx_on_grad(t: Raw, call: Hook, release: Release, ctx: *mut c_void) -> *mut c_char;
    fn ptx_grad_enabled() -> bool;
}

/// Whether autograd records operations on this thread now (off under `no_grad`, and
/// in an activation checkpoint's forward; on when backward recomputes it).
pub fn grad_enabled() -> bool {
    // SAFETY: a thread-local query without arguments.
    unsafe { ptx_grad_enabled() }
}

/// Gives the storage under `t` (and every view of it) `nbytes` bytes of fresh memory
/// from its own allocator, content undefined, or none with 0. Shapes, offsets and
/// what autograd saved stay; they see the new memory (FSDP's storage resize).
pub fn resize_storage(t: &Tensor, nbytes: u64) -> Result<(), TorchError> {
    // SAFETY: a live handle borrowed for the call; C++ exceptions come back as a message.
    check(unsafe { ptx_storage_resize(t.as_ptr() as Raw, nbytes as i64) })
}

/// Runs `callback` when the gradient of `t` (which must require one) has been
/// computed, before it flows on; its error fails the backward that ran it.
pub fn on_grad(t: &Tensor, callback: GradCallback) -> Result<(), TorchError> {
    let ctx = Box::into_raw(Box::new(callback)) as *mut c_void;
    // SAFETY: `ctx` is a leaked `Box<GradCallback>` the C++ hook owns from here on (even
    // when registering fails) and gives back once through `release`.
    check(unsafe { ptx_on_grad(t.as_ptr() as Raw, call, release, ctx) })
}

extern "C" fn call(ctx: *mut c_void) -> *mut c_char {
    // SAFETY: `ctx` is the `Box<GradCallback>` given to `ptx_on_grad`, alive until `release`.
    let callback: &GradCallback = unsafe { &*(ctx as *const GradCallback) };
    let text = match catch_unwind(AssertUnwindSafe(|| callback())) {
        Ok(Ok(())) => return std::ptr::null_mut(),
        Ok(Err(e)) => e,
        Err(panic) => {
            let what = panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str)).unwrap_or("a panic");
            format!("a gradient hook panicked: {what}")
        }
    };
    // SAFETY: the shim copies `len` bytes into a malloc'ed C string it frees after use.
    unsafe { ptx_hook_message(text.as_ptr() as *const c_char, text.len() as i64) }
}

extern "C" fn release(ctx: *mut c_void) {
    // SAFETY: `ctx` came from `Box::into_raw` in `on_grad` and is released once.
    drop(unsafe { Box::from_raw(ctx as *mut GradCallback) });
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tch::{Kind, Tensor};

    use super::*;

    #[test]
    fn a_resized_storage_keeps_its_views_and_autograds_saved_references() {
        let full = Tensor::zeros([6], (Kind::Float, tch::Device::Cpu));
        let w = full.narrow(0, 0, 6).view([2, 3]).set_requires_grad(false);
        let _ = full.shallow_clone().fill_(2.0);
        let p = Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        tch::no_grad(|| p.shallow_clone().set_data(&w));
        let x = Tensor::ones([1, 2], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let y = x.matmul(&p).sum(Kind::Float);
        resize_storage(&full, 0).unwrap();
        assert_eq!(crate::grads::held_bytes([&full], []).unwrap(), 0, "released");
        resize_storage(&full, 24).unwrap();
        let _ = full.shallow_clone().fill_(3.0);
        y.backward();
        // d(sum(x @ p))/dx = row sums of p: the new memory's 3s, three columns.
        assert_eq!(Vec::<f32>::try_from(x.grad().view([-1])).unwrap(), vec![9.0, 9.0]);
        assert_eq!(p.size(), [2, 3]);
    }

    #[test]
    fn a_gradient_hook_runs_once_per_backward_and_its_error_fails_it() {
        let calls = Arc::new(AtomicUsize::new(0));
        let x = Tensor::ones([2], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let y = &x * 2.0;
        let seen = calls.clone();
        let count = move || {
            seen.fetch_add(1, Ordering::SeqCst);
            Ok(())
        };
        on_grad(&y, Arc::new(count)).unwrap();
        y.sum(Kind::Float).backward();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let z = &x * 3.0;
        on_grad(&z, Arc::new(|| Err("gather failed on rank 1".into()))).unwrap();
        let err = z.sum(Kind::Float).f_backward().unwrap_err().to_string();
        assert!(err.contains("gather failed on rank 1"), "{err}");
    }
}
