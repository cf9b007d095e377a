//! libtorch's fused optimizer kernels (`torch._fused_adamw_`, `torch._fused_sgd_`).

use std::ffi::c_char;

use tch::Tensor;

use crate::error::{check, TorchError};
use crate::list::{opt, Raw, TensorList};

extern "C" {
    fn ptx_fused_adamw(
        params: *const Raw,
        grads: *const Raw,
        exp_avgs: *const Raw,
        exp_avg_sqs: *const Raw,
        steps: *const Raw,
        n: i64,
        lr: f64,
        lr_tensor: Raw,
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
        lr_tensor: Raw,
        momentum: f64,
        weight_decay: f64,
        nesterov: bool,
        found_inf: Raw,
    ) -> *mut c_char;
}

/// The learning rate a fused call updates with.
#[derive(Debug, Clone, Copy)]
pub enum Lr<'a> {
    /// A host value, passed to the kernel as an argument.
    Value(f64),
    /// A 0-dim tensor the kernel reads when it runs: float32 on CUDA (so a captured
    /// step replays with the value it holds at the replay), any float on the CPU.
    Tensor(&'a Tensor),
}

impl Lr<'_> {
    /// The pair the shim takes: a value, and a tensor handle that wins when not null.
    fn raw(self) -> (f64, Raw) {
        match self {
            Lr::Value(lr) => (lr, std::ptr::null_mut()),
            Lr::Tensor(t) => (0.0, t.as_ptr() as Raw),
        }
    }
}

/// Hyper-parameters of one fused AdamW call.
#[derive(Debug, Clone, Copy)]
pub struct AdamW<'a> {
    pub lr: Lr<'a>,
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
    let (lr, lr_tensor) = hp.lr.raw();
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
            lr,
            lr_tensor,
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
pub struct Sgd<'a> {
    pub lr: Lr<'a>,
    pub momentum: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
}

/// `torch._fused_sgd_` with zero-initialised momentum buffers (ignored when
/// `momentum` is 0).
pub fn fused_sgd(params: &TensorList, grads: &TensorList, momentum_bufs: &TensorList, hp: Sgd, found_inf: Option<&Tensor>) -> Result<(), TorchError> {
    let n = params.len();
    assert!(grads.len() == n && (hp.momentum == 0.0 || momentum_bufs.len() == n));
    let (lr, lr_tensor) = hp.lr.raw();
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe {
        ptx_fused_sgd(
            params.ptr(),
            grads.ptr(),
            momentum_bufs.ptr(),
            n as i64,
            lr,
            lr_tensor,
            hp.momentum,
            hp.weight_decay,
            hp.nesterov,
            opt(found_inf),
        )
    })
}
