//! Borrowing host tensors as `tch::Tensor` (feature `tch`). The plugin links the
//! same libtorch as the host, so a handle is a plain `at::Tensor*`.

use std::mem::ManuallyDrop;

use crate::context::TensorRef;

impl TensorRef {
    /// Calls `f` with the tensor borrowed, or returns `None` for a null handle.
    /// The tensor is never freed here: the host owns it.
    pub fn with<R>(&self, f: impl FnOnce(&tch::Tensor) -> R) -> Option<R> {
        if self.ptr.is_null() {
            return None;
        }
        // SAFETY: the host passes live `at::Tensor*` from `tch::Tensor::as_ptr` for
        // the duration of the call; ManuallyDrop keeps us from freeing it.
        let tensor = ManuallyDrop::new(unsafe { tch::Tensor::from_ptr(self.ptr as *mut _) });
        Some(f(&tensor))
    }

    /// A new handle to the same storage, owned by the caller (it may outlive the call).
    pub fn shallow_clone(&self) -> Option<tch::Tensor> {
        self.with(|t| t.shallow_clone())
    }

    /// Wraps a tensor the caller keeps alive for as long as the handle is used.
    pub fn of(tensor: &tch::Tensor) -> TensorRef {
        TensorRef { ptr: tensor.as_ptr() as *mut () }
    }
}
