//! Activation checkpointing (`torch.utils.checkpoint`, reentrant): a block whose
//! forward keeps no activations and is recomputed in backward, with the RNG and
//! autocast state its forward saw, so dropout draws the same numbers and the
//! gradients are the ones the stored activations would have given.
//!
//! The block is Rust code that the C++ autograd Function (`csrc/checkpoint.cpp`)
//! calls back through an `extern "C"` trampoline; errors and panics in it come back
//! as errors (of forward, or of the `backward()` that recomputed it), never as an
//! unwind across the FFI boundary.

use std::{
    ffi::{c_char, c_void},
    panic::{catch_unwind, AssertUnwindSafe},
};

use tch::Tensor;

use crate::{error::check, list::Raw, TorchError};

type BlockFn = dyn Fn(&[Tensor]) -> Result<Tensor, String> + Send + Sync;
type Callback = extern "C" fn(ctx: *mut c_void, inputs: *mut Raw, n: i64, out: *mut Raw) -> *mut c_char;
type Release = extern "C" fn(ctx: *mut c_void);

extern "C" {
    fn ptx_checkpoint_message(text: *const c_char, len: i64) -> *mut c_char;
    fn ptx_checkpoint_new(call: Callback, release: Release, ctx: *mut c_void, out: *mut Raw) -> *mut c_char;
    fn ptx_checkpoint_free(block: Raw);
    fn ptx_checkpoint_apply(block: Raw, inputs: *const Raw, n: i64, out: *mut Raw) -> *mut c_char;
}

/// The most tensors a checkpointed block takes (the hidden state and its extras).
pub const MAX_INPUTS: usize = 8;

/// A block run under activation checkpointing. Made once per block (not per step):
/// the graphs of the steps share it, and it lives until the last of them is gone.
pub struct Checkpoint {
    block: Raw,
}

// SAFETY: the handle is a reference-counted C++ object (atomic counts) holding a
// `Send + Sync` closure; nothing in it is tied to the thread that made it.
unsafe impl Send for Checkpoint {}
// SAFETY: as above; `apply` only reads the handle.
unsafe impl Sync for Checkpoint {}

impl Checkpoint {
    /// `block` maps the inputs given to [`Checkpoint::apply`] to the block's output.
    /// It runs twice per step: in forward (without a graph) and in backward (with one),
    /// possibly on an autograd worker thread.
    pub fn new(block: impl Fn(&[Tensor]) -> Result<Tensor, String> + Send + Sync + 'static) -> Result<Checkpoint, TorchError> {
        let boxed: Box<Box<BlockFn>> = Box::new(Box::new(block));
        let ctx = Box::into_raw(boxed) as *mut c_void;
        let mut handle: Raw = std::ptr::null_mut();
        // SAFETY: `ctx` is a leaked `Box<Box<BlockFn>>` that the C++ object owns from
        // here on and gives back once through `release`; `handle` receives one reference.
        let made = check(unsafe { ptx_checkpoint_new(call, release, ctx, &mut handle) });
        if let Err(e) = made {
            release(ctx);
            return Err(e);
        }
        Ok(Checkpoint { block: handle })
    }

    /// The block's output for `x` (the differentiable hidden state) and `extras`
    /// (tensors passed through without gradient: RoPE tables, an attention mask).
    /// With grad enabled, only the inputs are kept for backward.
    pub fn apply(&self, x: &Tensor, extras: &[&Tensor]) -> Result<Tensor, TorchError> {
        if extras.len() + 1 > MAX_INPUTS {
            return Err(TorchError(format!("a checkpointed block takes at most {MAX_INPUTS} tensors, not {}", extras.len() + 1)));
        }
        // On the stack: a step allocates nothing here.
        let mut raw: [Raw; MAX_INPUTS] = [std::ptr::null_mut(); MAX_INPUTS];
        raw[0] = x.as_ptr() as Raw;
        for (slot, t) in raw[1..].iter_mut().zip(extras) {
            *slot = t.as_ptr() as Raw;
        }
        let mut out: Raw = std::ptr::null_mut();
        // SAFETY: the handles are live tensors borrowed for the call (the shim copies
        // them); `out` receives an owned tensor; C++ exceptions come back as a message.
        check(unsafe { ptx_checkpoint_apply(self.block, raw.as_ptr(), extras.len() as i64 + 1, &mut out) })?;
        // SAFETY: the shim returns a new heap `at::Tensor*`, which Tensor now owns.
        Ok(unsafe { Tensor::from_ptr(out as *mut _) })
    }
}

impl Drop for Checkpoint {
    fn drop(&mut self) {
        // SAFETY: drops the one reference `new` gave us; graphs still using the block
        // hold their own.
        unsafe { ptx_checkpoint_free(self.block) }
    }
}

/// A message the shim frees (with `free`) after turning it into an exception.
fn message(text: &str) -> *mut c_char {
    // SAFETY: the shim copies `len` bytes from `text` into a malloc'ed C string.
    unsafe { ptx_checkpoint_message(text.as_ptr() as *const c_char, text.len() as i64) }
}

/// The trampoline the C++ Function calls: runs the block, catching its panics.
extern "C" fn call(ctx: *mut c_void, inputs: *mut Raw, n: i64, out: *mut Raw) -> *mut c_char {
    // SAFETY: the shim passes `n` heap `at::Tensor*` that we now own (each is freed
    // when its Tensor drops, whatever happens next).
    let tensors: Vec<Tensor> = (0..n as usize).map(|i| unsafe { Tensor::from_ptr(*inputs.add(i) as *mut _) }).collect();
    // SAFETY: `ctx` is the `Box<Box<BlockFn>>` given to `ptx_checkpoint_new`, alive
    // until `release`, which the shim calls only when no graph can call us any more.
    let block: &BlockFn = unsafe { &**(ctx as *const Box<BlockFn>) };
    match catch_unwind(AssertUnwindSafe(|| block(&tensors))) {
        Ok(Ok(output)) => {
            // SAFETY: `out` is the shim's out-pointer; the handle's ownership passes to
            // the shim, so the Tensor must not drop it.
            unsafe { *out = output.as_ptr() as Raw };
            std::mem::forget(output);
            std::ptr::null_mut()
        }
        Ok(Err(e)) => message(&e),
        Err(panic) => {
            let what = panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str)).unwrap_or("a panic");
            message(&format!("the checkpointed block panicked: {what}"))
        }
    }
}

extern "C" fn release(ctx: *mut c_void) {
    // SAFETY: `ctx` came from `Box::into_raw` in `Checkpoint::new` and is released once.
    drop(unsafe { Box::from_raw(ctx as *mut Box<BlockFn>) });
}

#[cfg(test)]
mod tests;
