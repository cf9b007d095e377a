//! `at::cuda::CUDAGraph`: work captured once and replayed without launching it
//! again. Capture and warm-up run a closure on a side stream; a closure's panic is
//! carried across the C++ frames and resumed here, never unwound through them.
//! Every call is an error without CUDA.

use std::{
    any::Any,
    ffi::{c_char, c_void},
    panic::{self, AssertUnwindSafe},
};

use crate::error::{check, TorchError};

type StreamFn = extern "C" fn(ctx: *mut c_void);

extern "C" {
    fn ptx_cuda_graph_new(out: *mut *mut c_void) -> *mut c_char;
    fn ptx_cuda_graph_free(graph: *mut c_void);
    fn ptx_cuda_on_side_stream(f: StreamFn, ctx: *mut c_void) -> *mut c_char;
    fn ptx_cuda_graph_capture(graph: *mut c_void, pool_hi: u64, pool_lo: u64, f: StreamFn, ctx: *mut c_void) -> *mut c_char;
    fn ptx_cuda_graph_replay(graph: *mut c_void) -> *mut c_char;
    fn ptx_cuda_graph_pool(graph: *mut c_void, hi: *mut u64, lo: *mut u64) -> *mut c_char;
    fn ptx_cuda_graph_pool_handle(hi: *mut u64, lo: *mut u64) -> *mut c_char;
}

/// A memory pool captured graphs allocate from; graphs replayed in the order they
/// were captured can share one (one graph per shape bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool(u64, u64);

impl Pool {
    /// A fresh pool for several graphs.
    pub fn new() -> Result<Pool, TorchError> {
        needs_a_device()?;
        let (mut hi, mut lo) = (0, 0);
        // SAFETY: the shim writes two integers through our out-pointers and catches C++ exceptions.
        check(unsafe { ptx_cuda_graph_pool_handle(&mut hi, &mut lo) })?;
        Ok(Pool(hi, lo))
    }
}

/// libtorch's CUDA calls raise without a device, but name the missing driver or
/// device in words of their own; this says what needed one.
fn needs_a_device() -> Result<(), TorchError> {
    match crate::cuda::device_count() {
        0 => Err(TorchError("a CUDA graph needs a CUDA device, and this host has none".into())),
        _ => Ok(()),
    }
}

/// A closure and, once it ran, its result or its panic.
struct Call<F, T> {
    f: Option<F>,
    out: Option<std::thread::Result<T>>,
}

extern "C" fn trampoline<F: FnOnce() -> T, T>(ctx: *mut c_void) {
    // SAFETY: `ctx` is the `Call<F, T>` `run_inside` passed, alive and borrowed by
    // no one else for the length of the shim's call, which calls this at most once.
    let call = unsafe { &mut *(ctx as *mut Call<F, T>) };
    if let Some(f) = call.f.take() {
        call.out = Some(panic::catch_unwind(AssertUnwindSafe(f)));
    }
}

/// Calls `shim` with `f` behind the trampoline; `f`'s result, or its panic resumed.
fn run_inside<F: FnOnce() -> T, T>(f: F, shim: impl FnOnce(StreamFn, *mut c_void) -> *mut c_char) -> Result<T, TorchError> {
    let mut call = Call { f: Some(f), out: None };
    let failed = check(shim(trampoline::<F, T>, &mut call as *mut Call<F, T> as *mut c_void));
    match (call.out, failed) {
        (Some(Err(panic)), _) => panic::resume_unwind(panic as Box<dyn Any + Send>),
        (_, Err(e)) => Err(e),
        (Some(Ok(out)), Ok(())) => Ok(out),
        (None, Ok(())) => Err(TorchError("the shim returned without running the closure".into())),
    }
}

/// Runs `f` on a side stream ordered after the current stream's work (a warm-up
/// step before capture, as `torch.cuda.graph`'s callers do).
pub fn on_side_stream<T>(f: impl FnOnce() -> T) -> Result<T, TorchError> {
    needs_a_device()?;
    // SAFETY: the shim calls the trampoline with `ctx` at most once, before it returns,
    // and catches C++ exceptions.
    run_inside(f, |tramp, ctx| unsafe { ptx_cuda_on_side_stream(tramp, ctx) })
}

/// One captured graph.
pub struct CudaGraph {
    raw: *mut c_void,
}

impl CudaGraph {
    pub fn new() -> Result<CudaGraph, TorchError> {
        needs_a_device()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the shim writes a new graph's handle (or null) through our out-pointer.
        check(unsafe { ptx_cuda_graph_new(&mut raw) })?;
        Ok(CudaGraph { raw })
    }

    /// Captures what `f` queues on the device, in `pool` (`None`: the graph's own).
    /// `f`'s tensors are the graph's static buffers: a replay recomputes them in place.
    pub fn capture<T>(&mut self, pool: Option<Pool>, f: impl FnOnce() -> T) -> Result<T, TorchError> {
        let Pool(hi, lo) = pool.unwrap_or(Pool(0, 0));
        let raw = self.raw;
        // SAFETY: `raw` is this graph's live handle; the shim calls the trampoline with
        // `ctx` at most once, before it returns, and catches C++ exceptions.
        run_inside(f, |tramp, ctx| unsafe { ptx_cuda_graph_capture(raw, hi, lo, tramp, ctx) })
    }

    /// Launches the captured work again, on the current stream.
    pub fn replay(&self) -> Result<(), TorchError> {
        // SAFETY: `raw` is this graph's live handle; the shim catches C++ exceptions.
        check(unsafe { ptx_cuda_graph_replay(self.raw) })
    }

    /// The pool this graph allocated from, for the next bucket's capture.
    pub fn pool(&self) -> Result<Pool, TorchError> {
        let (mut hi, mut lo) = (0, 0);
        // SAFETY: `raw` is this graph's live handle; the shim writes through our out-pointers.
        check(unsafe { ptx_cuda_graph_pool(self.raw, &mut hi, &mut lo) })?;
        Ok(Pool(hi, lo))
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `ptx_cuda_graph_new`, is freed once, here.
        unsafe { ptx_cuda_graph_free(self.raw) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_cuda_device_every_call_is_an_error_that_says_so() {
        if crate::cuda::device_count() > 0 {
            return; // the device's own checks (gpu/validate.sh) cover a host with one
        }
        let e = CudaGraph::new().err().expect("no graph without a device");
        assert!(e.0.contains("CUDA device"), "{e}");
        let mut ran = false;
        let e = on_side_stream(|| ran = true).expect_err("no side stream without a device");
        assert!(e.0.contains("CUDA device") && !ran, "{e}");
        assert!(Pool::new().is_err());
    }
}
