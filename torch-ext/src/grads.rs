//! `.grad` tensors as views of one flat buffer, releasing and rebinding them, and the storage a
//! tensor keeps alive (for memory figures measured from what is held).

use std::{collections::BTreeMap, ffi::c_char};

use tch::Tensor;

use crate::error::{check, TorchError};
use crate::list::{Raw, TensorList};

extern "C" {
    fn ptx_attach_flat_grads(params: *const Raw, n: i64, flat: Raw) -> *mut c_char;
    fn ptx_detach_grads(params: *const Raw, n: i64) -> *mut c_char;
    fn ptx_storage(t: Raw, grad: bool, address: *mut u64, nbytes: *mut u64) -> *mut c_char;
    fn ptx_bind_grads(params: *const Raw, lists: *const Raw, n: i64) -> *mut c_char;
    fn ptx_unbind_grads(lists: *const Raw, n: i64) -> *mut c_char;
}

/// Makes each parameter's `.grad` a view of `flat`, in order from offset 0, so
/// backward accumulates into `flat`.
pub fn attach_flat(params: &TensorList, flat: &Tensor) -> Result<(), TorchError> {
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_attach_flat_grads(params.ptr(), params.len() as i64, flat.as_ptr() as Raw) })
}

/// Sets every parameter's `.grad` to undefined (PyTorch's `grad = None`).
pub fn detach(params: &TensorList) -> Result<(), TorchError> {
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_detach_grads(params.ptr(), params.len() as i64) })
}

/// Points `grads[i]` at `params[i]`'s `.grad` as backward left it (a parameter
/// backward did not reach gets a zero gradient), in place: the list's handles stay
/// the same, so nothing is allocated and the raw array stays valid.
pub fn bind(params: &TensorList, grads: &mut TensorList) -> Result<(), TorchError> {
    if params.len() != grads.len() {
        return Err(TorchError(format!("{} parameters but {} gradient handles", params.len(), grads.len())));
    }
    // SAFETY: both arrays hold `len` live handles (checked above); the shim assigns through
    // the gradient handles, which `grads` owns and we borrow mutably; it catches C++ exceptions.
    check(unsafe { ptx_bind_grads(params.ptr(), grads.ptr(), params.len() as i64) })
}

/// Makes every handle of `grads` undefined, so the list keeps no gradient alive.
pub fn unbind(grads: &mut TensorList) -> Result<(), TorchError> {
    // SAFETY: the array holds `len` live handles, which `grads` owns and we borrow mutably;
    // the shim resets them in place and catches C++ exceptions.
    check(unsafe { ptx_unbind_grads(grads.ptr(), grads.len() as i64) })
}

fn storage(t: &Tensor, grad: bool) -> Result<(u64, u64), TorchError> {
    let (mut address, mut nbytes) = (0, 0);
    // SAFETY: the shim takes live tensors' handles, borrowed for the call, and writes only through
    // out-pointers to our locals; it catches C++ exceptions and returns them as a message.
    check(unsafe { ptx_storage(t.as_ptr() as Raw, grad, &mut address, &mut nbytes) })?;
    Ok((address, nbytes))
}

/// Bytes of the distinct storages that `tensors` and the `.grad` of `grads_of`
/// keep alive: views of one buffer count it once, undefined tensors count 0.
pub fn held_bytes<'a>(tensors: impl IntoIterator<Item = &'a Tensor>, grads_of: impl IntoIterator<Item = &'a Tensor>) -> Result<u64, TorchError> {
    let mut seen = BTreeMap::new();
    for t in tensors {
        let (address, nbytes) = storage(t, false)?;
        seen.insert(address, nbytes);
    }
    for t in grads_of {
        let (address, nbytes) = storage(t, true)?;
        seen.insert(address, nbytes);
    }
    seen.remove(&0);
    Ok(seen.values().sum())
}
