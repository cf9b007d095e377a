//! A fixed list of tensors as the array of raw handles the shim takes.

use std::ffi::c_void;

use tch::Tensor;

/// A tensor handle as the shim takes it (`at::Tensor*`).
pub(crate) type Raw = *mut c_void;

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

    pub(crate) fn ptr(&self) -> *const Raw {
        self.raw.as_ptr()
    }
}

pub(crate) fn opt(t: Option<&Tensor>) -> Raw {
    t.map_or(std::ptr::null_mut(), |t| t.as_ptr() as Raw)
}
