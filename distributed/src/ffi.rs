//! The shim's C ABI (csrc/pd.h) and the handle arrays it takes.

use std::ffi::{c_char, c_void, CStr};

use tch::Tensor;

pub type Raw = *mut c_void;

#[repr(C)]
pub struct PdGroup {
    _private: [u8; 0],
}

#[repr(C)]
pub struct PdWork {
    _private: [u8; 0],
}

extern "C" {
    fn pd_free(message: *mut c_char);
    pub fn pd_nccl_compiled() -> bool;
    pub fn pd_group_new(
        host: *const c_char,
        port: u16,
        rank: i32,
        world: i32,
        timeout_ms: i64,
        nccl_timeout_ms: i64,
        backend: i32,
        agent_store: bool,
        listen_fd: i32,
        prefix: *const c_char,
        iface: *const c_char,
        loopback: bool,
        device: i32,
        out: *mut *mut PdGroup,
    ) -> *mut c_char;
    pub fn pd_group_free(group: *mut PdGroup);
    pub fn pd_store_add(group: *mut PdGroup, key: *const c_char, amount: i64, out: *mut i64) -> *mut c_char;
    pub fn pd_store_set(group: *mut PdGroup, key: *const c_char) -> *mut c_char;
    pub fn pd_store_check(group: *mut PdGroup, key: *const c_char, out: *mut bool) -> *mut c_char;
    pub fn pd_allreduce(group: *mut PdGroup, tensor: Raw, out: *mut *mut PdWork) -> *mut c_char;
    pub fn pd_broadcast(group: *mut PdGroup, tensor: Raw, root: i32, out: *mut *mut PdWork) -> *mut c_char;
    pub fn pd_reduce_scatter(group: *mut PdGroup, out: Raw, rows: *const Raw, n: i64, work: *mut *mut PdWork) -> *mut c_char;
    pub fn pd_reduce_scatter_flat(group: *mut PdGroup, out: Raw, input: Raw, work: *mut *mut PdWork) -> *mut c_char;
    pub fn pd_all_gather_flat(group: *mut PdGroup, out: Raw, input: Raw, work: *mut *mut PdWork) -> *mut c_char;
    pub fn pd_work_wait(work: *mut PdWork) -> *mut c_char;
    pub fn pd_work_free(work: *mut PdWork);
    pub fn pd_copy(dst: *const Raw, src: *const Raw, n: i64) -> *mut c_char;
    pub fn pd_scale_copy(flat: Raw, scale: f64, grads: *const Raw, views: *const Raw, n: i64) -> *mut c_char;
}

/// Turns the shim's error convention (null or a malloc'ed message) into a Result.
pub fn check(message: *mut c_char) -> Result<(), String> {
    if message.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null return is a NUL-terminated malloc'ed string we now own.
    let text = unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned();
    // SAFETY: the shim's malloc'ed memory, freed once, after its last use.
    unsafe { pd_free(message) };
    Err(text.trim_end().to_string())
}

pub fn raw(t: &Tensor) -> Raw {
    t.as_ptr() as Raw
}

/// Tensors and their raw handles, built once so a step passes arrays without
/// allocating.
pub struct Handles {
    _tensors: Vec<Tensor>,
    raw: Vec<Raw>,
}

// SAFETY: the handles point into `tensors`, which are Send.
unsafe impl Send for Handles {}

impl Handles {
    pub fn new(tensors: Vec<Tensor>) -> Handles {
        let raw = tensors.iter().map(raw).collect();
        Handles { _tensors: tensors, raw }
    }

    pub fn len(&self) -> usize {
        self.raw.len()
    }

    pub fn ptr(&self) -> *const Raw {
        self.raw.as_ptr()
    }
}
