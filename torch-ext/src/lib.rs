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
    fn ptx_autocast_enter(cuda: bool, was_enabled: *mut bool) -> *mut c_char;
    fn ptx_autocast_exit(cuda: bool, was_enabled: bool) -> *mut c_char;
    fn ptx_cuda_compiled() -> bool;
    fn ptx_cuda_device_count() -> i64;
    fn ptx_cuda_empty_cache() -> *mut c_char;
    fn ptx_cuda_memory(device: i32, allocated: *mut i64, peak: *mut i64, reserved: *mut i64) -> *mut c_char;
    fn ptx_cuda_device_name(device: i32, buffer: *mut c_char, size: i64) -> *mut c_char;
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
    unsafe { ptx_free(message) };
    Err(TorchError(text))
}

/// The raw handles of a fixed list of tensors, which keeps the tensors alive.
pub struct TensorList {
    tensors: Vec<Tensor>,
    raw: Vec<Raw>,
}

// The handles are owned by `tensors`, which are Send.
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
    check(unsafe {
        ptx_fused_sgd(params.ptr(), grads.ptr(), momentum_bufs.ptr(), n as i64, hp.lr, hp.momentum, hp.weight_decay, hp.nesterov, opt(found_inf))
    })
}

/// The global L2 norm of `grads`, clipping them to `max_norm` when it is positive,
/// all on the device (as `clip_grad_norm_(foreach=True)`).
pub fn clip_grad_norm(grads: &TensorList, max_norm: f64) -> Result<Tensor, TorchError> {
    let mut out: Raw = std::ptr::null_mut();
    check(unsafe { ptx_clip_grad_norm(grads.ptr(), grads.len() as i64, max_norm, &mut out) })?;
    // SAFETY: the shim returns a new heap `at::Tensor*`, which Tensor now owns.
    Ok(unsafe { Tensor::from_ptr(out as *mut _) })
}

/// `torch._foreach_zero_`.
pub fn zero_all(tensors: &TensorList) -> Result<(), TorchError> {
    check(unsafe { ptx_foreach_zero(tensors.ptr(), tensors.len() as i64) })
}

pub mod grads;

/// libtorch's profiler, recording input shapes to count FLOPs.
pub mod profiler {
    use super::*;

    pub fn start() -> Result<(), TorchError> {
        check(unsafe { ptx_profiler_start() })
    }

    /// Stops profiling; returns the FLOPs of the recorded operators and how many
    /// operator calls had a FLOP formula.
    pub fn stop() -> Result<(u64, u64), TorchError> {
        let (mut flops, mut ops) = (0, 0);
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
        check(unsafe { ptx_flop_count_start() })
    }

    pub fn count_stop() -> Result<FlopCounts, TorchError> {
        let mut out = [0u64; 5];
        check(unsafe { ptx_flop_count_stop(out.as_mut_ptr()) })?;
        Ok(FlopCounts { matmul: out[0], elementwise: out[1], attention: out[2], counted_ops: out[3], attention_ops: out[4] })
    }
}

/// Runs `f` with autocast to bfloat16 on the CPU (`cuda` false) or on CUDA, as
/// `torch.autocast(device_type, torch.bfloat16)` does.
pub fn autocast_bf16<T>(cuda: bool, f: impl FnOnce() -> T) -> Result<T, TorchError> {
    let mut was_enabled = false;
    check(unsafe { ptx_autocast_enter(cuda, &mut was_enabled) })?;
    // Leaves the region even if `f` panics.
    struct Exit(bool, bool);
    impl Drop for Exit {
        fn drop(&mut self) {
            let _ = check(unsafe { ptx_autocast_exit(self.0, self.1) });
        }
    }
    let _exit = Exit(cuda, was_enabled);
    Ok(f())
}

/// CUDA helpers; all are harmless no-ops without CUDA.
pub mod cuda {
    use super::*;

    /// Whether this build has the CUDA parts (libtorch had CUDA at build time).
    pub fn compiled() -> bool {
        unsafe { ptx_cuda_compiled() }
    }

    pub fn device_count() -> i64 {
        unsafe { ptx_cuda_device_count() }
    }

    pub fn empty_cache() -> Result<(), TorchError> {
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
        check(unsafe { ptx_cuda_memory(device, &mut m.allocated, &mut m.peak, &mut m.reserved) })?;
        Ok(m)
    }

    pub fn device_name(device: i32) -> Result<String, TorchError> {
        let mut buffer = [0 as c_char; 256];
        check(unsafe { ptx_cuda_device_name(device, buffer.as_mut_ptr(), buffer.len() as i64) })?;
        Ok(unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().into_owned())
    }
}

#[cfg(test)]
mod tests;
