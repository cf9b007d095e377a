//! libtorch functionality that tch does not wrap, through a small C++ shim compiled
//! against the same headers and libraries as tch itself.
//!
//! Tensor lists cross as arrays of tch handles; callers keep a [`TensorList`] built
//! once so a training step allocates nothing here.

use std::ffi::{c_char, c_void, CStr};

use tch::Tensor;

type Raw = *mut c_void;

extern "C" {
    fn ptx_free(message: *mut c_char);
    fn ptx_fused_adamw(
        params: *const Raw,
        grads: *const Raw,
        exp_avgs: *const Raw,
        exp_avg_sqs: *const Raw,
        steps: *const Raw,
        n: i64,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        found_inf: Raw,
    ) -> *mut c_char;
    fn ptx_fused_sgd(
        params: *const Raw,
        grads: *const Raw,
        momentum_bufs: *const Raw,
        n: i64,
        lr: f64,
        momentum: f64,
        weight_decay: f64,
        nesterov: bool,
        found_inf: Raw,
    ) -> *mut c_char;
    fn ptx_clip_grad_norm(grads: *const Raw, n: i64, max_norm: f64, out_norm: *mut Raw) -> *mut c_char;
    fn ptx_foreach_zero(ts: *const Raw, n: i64) -> *mut c_char;
    fn ptx_profiler_start() -> *mut c_char;
    fn ptx_profiler_stop(flops: *mut u64, counted_ops: *mut u64) -> *mut c_char;
    fn ptx_flop_count_start() -> *mut c_char;
    fn ptx_flop_count_stop(out: *mut u64) -> *mut c_char;
    fn ptx_autocast_enter(cuda: bool, was_enabled: *mut bool, was_dtype: *mut i32) -> *mut c_char;
    fn ptx_autocast_exit(cuda: bool, was_enabled: bool, was_dtype: i32) -> *mut c_char;
    fn ptx_cuda_compiled() -> bool;
    fn ptx_cuda_device_count() -> i64;
    fn ptx_cuda_empty_cache() -> *mut c_char;
    fn ptx_cuda_memory(device: i32, allocated: *mut i64, peak: *mut i64, reserved: *mut i64) -> *mut c_char;
    fn ptx_cuda_device_name(device: i32, buffer: *mut c_char, size: i64) -> *mut c_char;
    fn ptx_foreach_norm(ts: *const Raw, n: i64, ord: f64, out: *mut Raw) -> *mut c_char;
    fn ptx_foreach_sub_(a: *const Raw, b: *const Raw, n: i64) -> *mut c_char;
    fn ptx_foreach_mul_scalar(ts: *const Raw, n: i64, scalar: f64, out: *mut Raw) -> *mut c_char;
    fn ptx_trace_prepare(cuda: bool, shapes: bool, memory: bool) -> *mut c_char;
    fn ptx_trace_start(cuda: bool, shapes: bool, memory: bool) -> *mut c_char;
    fn ptx_trace_metadata(key: *const c_char, value: *const c_char) -> *mut c_char;
    fn ptx_trace_stop(sync_device: i32, result: *mut Raw) -> *mut c_char;
    fn ptx_trace_save(result: Raw, path: *const c_char) -> *mut c_char;
    fn ptx_trace_free(result: Raw);
    fn ptx_record_begin(name: *const c_char, handle: *mut Raw) -> *mut c_char;
    fn ptx_record_end(handle: Raw) -> *mut c_char;
    fn ptx_cuda_memory_history(enabled: bool, max_entries: i64) -> *mut c_char;
    fn ptx_cuda_memory_snapshot(out: *mut *mut c_char, len: *mut i64) -> *mut c_char;
    fn ptx_pin_memory(t: Raw, out: *mut Raw) -> *mut c_char;
    fn ptx_is_pinned(t: Raw, out: *mut bool) -> *mut c_char;
    fn ptx_autocast_dtype(cuda: bool, out: *mut i32) -> *mut c_char;
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

fn check(message: *mut c_char) -> Result<(), TorchError> {
    if message.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null return is a NUL-terminated malloc'ed string we now own.
    let text = unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned();
    // SAFETY: the shim's malloc'ed memory, freed once, after its last use.
    unsafe { ptx_free(message) };
    Err(TorchError(text))
}

/// The raw handles of a fixed list of tensors, which keeps the tensors alive.
pub struct TensorList {
    tensors: Vec<Tensor>,
    raw: Vec<Raw>,
}

// SAFETY: the handles are owned by `tensors`, which are Send.
unsafe impl Send for TensorList {}

impl TensorList {
    pub fn new(tensors: Vec<Tensor>) -> TensorList {
        let raw = tensors.iter().map(|t| t.as_ptr() as Raw).collect();
        TensorList { tensors, raw }
    }

    /// `tensor` repeated `n` times (one shared step counter for a whole group).
    pub fn repeat(tensor: &Tensor, n: usize) -> TensorList {
        TensorList::new((0..n).map(|_| tensor.shallow_clone()).collect())
    }

    pub fn len(&self) -> usize {
        self.raw.len()
    }

    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    fn ptr(&self) -> *const Raw {
        self.raw.as_ptr()
    }
}

fn opt(t: Option<&Tensor>) -> Raw {
    t.map_or(std::ptr::null_mut(), |t| t.as_ptr() as Raw)
}

/// Hyper-parameters of one fused AdamW call.
#[derive(Debug, Clone, Copy)]
pub struct AdamW {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub weight_decay: f64,
    pub eps: f64,
}

/// `torch._fused_adamw_`: one kernel for the whole group. When `found_inf` holds
/// 1.0 the update is skipped on the device (no host sync). `steps` must already
/// be incremented for this step.
pub fn fused_adamw(
    params: &TensorList,
    grads: &TensorList,
    exp_avgs: &TensorList,
    exp_avg_sqs: &TensorList,
    steps: &TensorList,
    hp: AdamW,
    found_inf: Option<&Tensor>,
) -> Result<(), TorchError> {
    let n = params.len();
    assert!(grads.len() == n && exp_avgs.len() == n && exp_avg_sqs.len() == n && steps.len() == n);
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe {
        ptx_fused_adamw(
            params.ptr(),
            grads.ptr(),
            exp_avgs.ptr(),
            exp_avg_sqs.ptr(),
            steps.ptr(),
            n as i64,
            hp.lr,
            hp.beta1,
            hp.beta2,
            hp.weight_decay,
            hp.eps,
            opt(found_inf),
        )
    })
}

/// Hyper-parameters of one fused SGD call.
#[derive(Debug, Clone, Copy)]
pub struct Sgd {
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
}

/// `torch._fused_sgd_` with zero-initialised momentum buffers (ignored when
/// `momentum` is 0).
pub fn fused_sgd(params: &TensorList, grads: &TensorList, momentum_bufs: &TensorList, hp: Sgd, found_inf: Option<&Tensor>) -> Result<(), TorchError> {
    let n = params.len();
    assert!(grads.len() == n && (hp.momentum == 0.0 || momentum_bufs.len() == n));
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe {
        ptx_fused_sgd(params.ptr(), grads.ptr(), momentum_bufs.ptr(), n as i64, hp.lr, hp.momentum, hp.weight_decay, hp.nesterov, opt(found_inf))
    })
}

/// The global L2 norm of `grads`, clipping them to `max_norm` when it is positive,
/// all on the device (as `clip_grad_norm_(foreach=True)`).
pub fn clip_grad_norm(grads: &TensorList, max_norm: f64) -> Result<Tensor, TorchError> {
    let mut out: Raw = std::ptr::null_mut();
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_clip_grad_norm(grads.ptr(), grads.len() as i64, max_norm, &mut out) })?;
    // SAFETY: the shim returns a new heap `at::Tensor*`, which Tensor now owns.
    Ok(unsafe { Tensor::from_ptr(out as *mut _) })
}

/// `torch._foreach_zero_`.
pub fn zero_all(tensors: &TensorList) -> Result<(), TorchError> {
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_foreach_zero(tensors.ptr(), tensors.len() as i64) })
}

pub mod checkpoint;
pub mod grads;

pub use checkpoint::Checkpoint;

/// libtorch's profiler, recording input shapes to count FLOPs.
pub mod profiler {
    use super::*;

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
        /// mm, addmm, bmm, baddbmm and conv2d, by libtorch's formulas.
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
}

/// Per-tensor reductions over a tensor list in a few fused kernels (`torch._foreach_*`).
pub mod foreach {
    use super::*;

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
}

/// libtorch's Kineto profiler, driven as `torch.profiler.profile` drives it, and
/// its Chrome trace export.
pub mod trace {
    use std::ffi::CString;

    use super::*;

    /// What a trace records besides the operators.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Options {
        /// CUDA kernels and memory copies (CUPTI).
        pub cuda: bool,
        /// Input shapes of each operator (`record_shapes`).
        pub shapes: bool,
        /// Allocations and frees (`profile_memory`).
        pub memory: bool,
    }

    fn c_string(s: &str) -> Result<CString, TorchError> {
        CString::new(s).map_err(|e| TorchError(e.to_string()))
    }

    /// The schedule's warm-up: the tracer is set up and records nothing yet.
    pub fn prepare(o: Options) -> Result<(), TorchError> {
        // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
        // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
        check(unsafe { ptx_trace_prepare(o.cuda, o.shapes, o.memory) })
    }

    /// Starts recording on this thread (after [`prepare`]).
    pub fn start(o: Options) -> Result<(), TorchError> {
        // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
        // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
        check(unsafe { ptx_trace_start(o.cuda, o.shapes, o.memory) })
    }

    /// While recording: `value_json` (a JSON value) under `key` at the top of the
    /// trace, as torch.profiler adds `distributedInfo`.
    pub fn metadata(key: &str, value_json: &str) -> Result<(), TorchError> {
        let (key, value) = (c_string(key)?, c_string(value_json)?);
        // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
        // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
        check(unsafe { ptx_trace_metadata(key.as_ptr(), value.as_ptr()) })
    }

    /// A recorded trace, to be written (on any thread) with [`Recorded::save`].
    pub struct Recorded(Raw);

    // SAFETY: the result is plain data once the profiler is disabled; it is used by one
    // thread at a time.
    unsafe impl Send for Recorded {}

    impl Recorded {
        /// Chrome trace JSON at `path`, as `export_chrome_trace` writes it.
        pub fn save(&self, path: &std::path::Path) -> Result<(), TorchError> {
            let path = c_string(&path.to_string_lossy())?;
            // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
            // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
            check(unsafe { ptx_trace_save(self.0, path.as_ptr()) })
        }
    }

    impl Drop for Recorded {
        fn drop(&mut self) {
            // SAFETY: the handle came from `ptx_trace_stop` and is freed once, here.
            unsafe { ptx_trace_free(self.0) }
        }
    }

    /// Stops recording and returns what was recorded. With `cuda_device`, first
    /// waits for that GPU to finish what was queued (as torch.profiler's exit
    /// does): otherwise the window's last kernels are still running when Kineto
    /// stops collecting, and the trace misses them.
    pub fn stop(cuda_device: Option<i32>) -> Result<Recorded, TorchError> {
        let mut result: Raw = std::ptr::null_mut();
        // SAFETY: `result` receives an owned trace, which Recorded frees.
        check(unsafe { ptx_trace_stop(cuda_device.unwrap_or(-1), &mut result) })?;
        Ok(Recorded(result))
    }

    /// A user-scope span in the trace (`torch.profiler.record_function`), open
    /// until [`Span::end`] (or drop). libtorch's record functions must end on the
    /// thread that began them: a span moved to another thread is not ended there
    /// (`end` returns an error, drop leaves it open) rather than ended wrongly.
    pub struct Span {
        handle: Raw,
        thread: std::thread::ThreadId,
    }

    // SAFETY: the handle is only used on the thread that began the span (`end` and
    // drop check `thread`), so moving the owner between threads never touches it
    // elsewhere.
    unsafe impl Send for Span {}

    impl Span {
        pub fn begin(name: &str) -> Result<Span, TorchError> {
            let name = c_string(name)?;
            let mut handle: Raw = std::ptr::null_mut();
            // SAFETY: the shim reads the NUL-terminated `name` and writes the new
            // record's handle into our local; C++ exceptions come back as a message.
            check(unsafe { ptx_record_begin(name.as_ptr(), &mut handle) })?;
            Ok(Span { handle, thread: std::thread::current().id() })
        }

        /// Ends the span; an error on any thread but the one that began it.
        pub fn end(mut self) -> Result<(), TorchError> {
            if std::thread::current().id() != self.thread {
                self.handle = std::ptr::null_mut();
                return Err(TorchError("a trace span must end on the thread that began it".into()));
            }
            let handle = std::mem::replace(&mut self.handle, std::ptr::null_mut());
            // SAFETY: the handle came from `ptx_record_begin`, on this thread (checked
            // above), and is ended once: `self.handle` is null from here on.
            check(unsafe { ptx_record_end(handle) })
        }
    }

    impl Drop for Span {
        fn drop(&mut self) {
            if !self.handle.is_null() && std::thread::current().id() == self.thread {
                // SAFETY: the handle came from `ptx_record_begin` on this thread and
                // was not ended (`end` nulls it).
                let _ = check(unsafe { ptx_record_end(self.handle) });
            }
        }
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
        unsafe { ptx_free(out) };
        Ok(bytes)
    }
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

/// Page-locks a host tensor for asynchronous copies to the GPU (returns it as
/// it is when already pinned). Unlike tch's `pin_memory(device)` it passes no
/// device, which libtorch 2.11 deprecates with a warning per call.
pub fn pin_memory(t: &Tensor) -> Result<Tensor, TorchError> {
    let mut out: Raw = std::ptr::null_mut();
    // SAFETY: `t` is a live tensor handle for the call; `out` receives an owned one.
    check(unsafe { ptx_pin_memory(t.as_ptr() as Raw, &mut out) })?;
    // SAFETY: the shim returns a new heap `at::Tensor*`, which Tensor now owns.
    Ok(unsafe { Tensor::from_ptr(out as *mut _) })
}

/// Whether `t` is in page-locked memory (`Tensor.is_pinned()`, no device).
pub fn is_pinned(t: &Tensor) -> Result<bool, TorchError> {
    let mut out = false;
    // SAFETY: `t` is a live tensor handle for the call.
    check(unsafe { ptx_is_pinned(t.as_ptr() as Raw, &mut out) })?;
    Ok(out)
}

/// CUDA helpers; all are harmless no-ops without CUDA.
pub mod cuda {
    use super::*;

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
}

#[cfg(test)]
mod tests;
