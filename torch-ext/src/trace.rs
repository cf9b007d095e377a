//! libtorch's Kineto profiler, driven as `torch.profiler.profile` drives it, its
//! Chrome trace export, and user-scope spans in the trace.

use std::ffi::{c_char, CString};

use crate::error::{check, TorchError};
use crate::list::Raw;

// The CUDA memory history is recorded alongside a trace; its home is `memory_history.rs`.
pub use crate::memory_history::{cuda_memory_history, cuda_memory_snapshot};

extern "C" {
    fn ptx_trace_prepare(cuda: bool, shapes: bool, memory: bool) -> *mut c_char;
    fn ptx_trace_start(cuda: bool, shapes: bool, memory: bool) -> *mut c_char;
    fn ptx_trace_metadata(key: *const c_char, value: *const c_char) -> *mut c_char;
    fn ptx_trace_stop(sync_device: i32, result: *mut Raw) -> *mut c_char;
    fn ptx_trace_save(result: Raw, path: *const c_char) -> *mut c_char;
    fn ptx_trace_free(result: Raw);
    fn ptx_record_begin(name: *const c_char, handle: *mut Raw) -> *mut c_char;
    fn ptx_record_end(handle: Raw) -> *mut c_char;
}

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
