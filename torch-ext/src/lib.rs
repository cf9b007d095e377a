//! libtorch functionality that tch does not wrap, through a small C++ shim compiled
//! against the same headers and libraries as tch itself.
//!
//! Tensor lists cross as arrays of tch handles; callers keep a [`TensorList`] built
//! once so a training step allocates nothing here.
//!
//! One file per job; the C++ each calls is in `csrc/` (`optim.cpp` also holds
//! clipping, `trace.cpp` the CUDA memory history).

mod autocast;
pub mod checkpoint;
mod clip;
pub mod cuda;
pub mod cuda_graph;
mod error;
pub mod foreach;
pub mod grads;
pub mod linear;
mod list;
mod memory_history;
mod optim;
mod pin;
mod precomputed;
pub mod profiler;
pub mod sharding;
mod swiglu;
pub mod trace;

pub use autocast::{autocast_bf16, autocast_dtype};
pub use checkpoint::Checkpoint;
pub use clip::{clip_grad_norm, zero_all};
pub use error::TorchError;
pub use list::TensorList;
pub use optim::{fused_adamw, fused_sgd, AdamW, Lr, Sgd};
pub use pin::{is_pinned, pin_memory};
pub use precomputed::precomputed;
pub use swiglu::{recompute_swiglu_product, swiglu};

#[cfg(test)]
mod tests;
