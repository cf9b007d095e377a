//! A c10d process group over a TCPStore rendezvous, and the run's collectives on it.
//!
//! Every operation is asynchronous in c10d: [`Group::start_all_reduce`] and
//! [`Group::start_broadcast`] return a [`Work`] to wait on. Timeouts are the store's and
//! the process group's own: a peer that dies or stalls makes `wait` fail with an
//! error (Gloo), or the NCCL watchdog abort the communicators after
//! `nccl_timeout` (clean-up only, unless `TORCH_NCCL_ASYNC_ERROR_HANDLING` says
//! otherwise), so that the collective, or the next one, returns an error instead
//! of the watchdog killing the process. On NCCL, `wait` only orders the current
//! stream after the collective: the host learns it is done by reading a result.

use std::{
    ffi::CString,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use ptrain_core::dist::Collectives;
use tch::{Device, Tensor};

use crate::ffi::{self, check, raw, Handles, PdGroup, PdWork};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Gloo,
    Nccl,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Gloo => "gloo",
            Backend::Nccl => "nccl",
        }
    }
}

/// Where and how to form the group.
#[derive(Debug, Clone)]
pub struct GroupSpec {
    pub master_addr: String,
    pub master_port: u16,
    pub rank: u32,
    pub world_size: u32,
    /// The rendezvous's timeout, and Gloo's for each collective.
    pub timeout: Duration,
    /// NCCL's for each collective (its watchdog's).
    pub nccl_timeout: Duration,
    pub backend: Backend,
    /// The device the run's tensors live on (NCCL stages host tensors there).
    pub device: Device,
    /// `GLOO_SOCKET_IFNAME`: network interfaces for Gloo, comma-separated.
    pub gloo_ifname: Option<String>,
    /// Under torchrun (`TORCHELASTIC_USE_AGENT_STORE=True`) its agent serves the
    /// store on MASTER_PORT: every rank joins it as a client, under this prefix.
    pub agent_store: Option<String>,
    /// Rank 0 under `ptrain launch`: the launcher's listening socket on `master_port`,
    /// which the store serves on (the launcher holds the port from before the ranks
    /// start, so nothing else can take it in between).
    pub listen_fd: Option<i32>,
}

impl GroupSpec {
    /// Gloo on the CPU over 127.0.0.1, with its own store on `port`: ranks of one
    /// machine, for tests and benchmarks.
    pub fn local_gloo(port: u16, rank: u32, world_size: u32, timeout: Duration) -> GroupSpec {
        GroupSpec {
            master_addr: "127.0.0.1".into(),
            master_port: port,
            rank,
            world_size,
            timeout,
            nccl_timeout: timeout,
            backend: Backend::Gloo,
            device: Device::Cpu,
            gloo_ifname: None,
            agent_store: None,
            listen_fd: None,
        }
    }
}

pub struct Group {
    raw: *mut PdGroup,
    spec: GroupSpec,
    busy_ns: AtomicU64,
}

// SAFETY: c10d backends take collectives from any thread (they queue them internally); the
// trainer issues them from its own thread, in the same order on every rank.
unsafe impl Send for Group {}
// SAFETY: as above; the only shared state on the Rust side is `busy_ns`, an atomic.
unsafe impl Sync for Group {}

/// A collective in flight. Dropping it without waiting abandons the result.
#[must_use = "a collective is only done once waited for"]
pub struct Work(*mut PdWork);

// SAFETY: a handle to c10d's `Work`, which may be waited for on any thread; the
// owner waits for it (or drops it) exactly once.
unsafe impl Send for Work {}

impl Work {
    pub fn wait(self) -> Result<(), String> {
        let work = self.0;
        std::mem::forget(self);
        // SAFETY: pd_work_wait takes ownership of a live work handle.
        check(unsafe { ffi::pd_work_wait(work) })
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        // SAFETY: a work that was never waited for is still ours to free.
        unsafe { ffi::pd_work_free(self.0) }
    }
}

/// Waits for all of `works` (so none is left running), returning the first error.
pub fn wait_all(works: impl IntoIterator<Item = Work>) -> Result<(), String> {
    let mut first = Ok(());
    for work in works {
        if let Err(e) = work.wait() {
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first
}

pub fn is_loopback(addr: &str) -> bool {
    addr == "localhost" || addr == "::1" || addr.starts_with("127.")
}

impl Group {
    /// Rendezvous and process-group set-up; blocks until every rank has joined or
    /// the timeout passed.
    pub fn connect(spec: GroupSpec) -> Result<Group, String> {
        if spec.backend == Backend::Nccl && !nccl_compiled() {
            return Err("this build has no NCCL: libtorch had no CUDA, or its CUDA/NCCL headers were missing at build time".into());
        }
        let host = CString::new(spec.master_addr.as_str()).map_err(|_| "MASTER_ADDR contains a NUL byte".to_string())?;
        let iface = CString::new(spec.gloo_ifname.clone().unwrap_or_default()).map_err(|_| "GLOO_SOCKET_IFNAME contains a NUL byte".to_string())?;
        let prefix = CString::new(spec.agent_store.clone().unwrap_or_default()).map_err(|_| "store prefix contains a NUL byte".to_string())?;
        let mut out = std::ptr::null_mut();
        let millis = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let backend = match spec.backend {
            Backend::Gloo => 0,
            Backend::Nccl => 1,
        };
        // SAFETY: the strings outlive the call; `out` receives an owned group.
        check(unsafe {
            ffi::pd_group_new(
                host.as_ptr(),
                spec.master_port,
                spec.rank as i32,
                spec.world_size as i32,
                millis(spec.timeout),
                millis(spec.nccl_timeout),
                backend,
                spec.agent_store.is_some(),
                spec.listen_fd.unwrap_or(-1),
                prefix.as_ptr(),
                iface.as_ptr(),
                is_loopback(&spec.master_addr),
                match spec.device {
                    Device::Cuda(i) => i as i32,
                    _ => -1,
                },
                &mut out,
            )
        })?;
        Ok(Group { raw: out, spec, busy_ns: AtomicU64::new(0) })
    }

    pub fn spec(&self) -> &GroupSpec {
        &self.spec
    }

    /// Starts an in-place sum all-reduce of a dense, contiguous tensor.
    pub fn start_all_reduce(&self, tensor: &Tensor) -> Result<Work, String> {
        let mut out = std::ptr::null_mut();
        // SAFETY: the group is live and `tensor` a live handle for the call.
        check(unsafe { ffi::pd_allreduce(self.raw, raw(tensor), &mut out) })?;
        Ok(Work(out))
    }

    /// Starts an in-place broadcast from `root`.
    pub fn start_broadcast(&self, tensor: &Tensor, root: u32) -> Result<Work, String> {
        let mut out = std::ptr::null_mut();
        // SAFETY: as in start_all_reduce.
        check(unsafe { ffi::pd_broadcast(self.raw, raw(tensor), root as i32, &mut out) })?;
        Ok(Work(out))
    }

    /// Starts a sum reduce-scatter: `out` receives this rank's part of the sum of
    /// `rows` (one tensor per rank, each shaped like `out`; they may be views).
    pub fn start_reduce_scatter(&self, out: &Tensor, rows: &Handles) -> Result<Work, String> {
        let mut work = std::ptr::null_mut();
        // SAFETY: live group; `rows` holds `len` live handles.
        check(unsafe { ffi::pd_reduce_scatter(self.raw, raw(out), rows.ptr(), rows.len() as i64, &mut work) })?;
        Ok(Work(work))
    }

    /// Starts a sum reduce-scatter of one contiguous tensor of `world * out` elements.
    pub fn start_reduce_scatter_flat(&self, out: &Tensor, input: &Tensor) -> Result<Work, String> {
        let mut work = std::ptr::null_mut();
        // SAFETY: live group and tensors.
        check(unsafe { ffi::pd_reduce_scatter_flat(self.raw, raw(out), raw(input), &mut work) })?;
        Ok(Work(work))
    }

    /// Starts an all-gather into one contiguous tensor of `world * input`
    /// elements; `input` may be this rank's part of `out` (in place).
    pub fn start_all_gather_flat(&self, out: &Tensor, input: &Tensor) -> Result<Work, String> {
        let mut work = std::ptr::null_mut();
        // SAFETY: live group and tensors.
        check(unsafe { ffi::pd_all_gather_flat(self.raw, raw(out), raw(input), &mut work) })?;
        Ok(Work(work))
    }

    /// Adds `amount` to the rendezvous store's counter `key`, returning the new value.
    pub fn store_add(&self, key: &str, amount: i64) -> Result<i64, String> {
        let key = CString::new(key).map_err(|_| "store key contains a NUL byte".to_string())?;
        let mut out = 0;
        // SAFETY: live group; `key` outlives the call; `out` is written once.
        check(unsafe { ffi::pd_store_add(self.raw, key.as_ptr(), amount, &mut out) })?;
        Ok(out)
    }

    /// Sets the rendezvous store's `key` (to "1").
    pub fn store_set(&self, key: &str) -> Result<(), String> {
        let key = CString::new(key).map_err(|_| "store key contains a NUL byte".to_string())?;
        // SAFETY: live group; `key` outlives the call.
        check(unsafe { ffi::pd_store_set(self.raw, key.as_ptr()) })
    }

    /// Whether the rendezvous store holds `key` (at once, without waiting).
    pub fn store_check(&self, key: &str) -> Result<bool, String> {
        let key = CString::new(key).map_err(|_| "store key contains a NUL byte".to_string())?;
        let mut out = false;
        // SAFETY: live group; `key` outlives the call; `out` is written once.
        check(unsafe { ffi::pd_store_check(self.raw, key.as_ptr(), &mut out) })?;
        Ok(out)
    }

    /// Runs `f`, counting its wall time as time spent communicating.
    pub fn timed<T>(&self, f: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = f();
        self.busy_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }

    pub fn busy_secs(&self) -> f64 {
        self.busy_ns.load(Ordering::Relaxed) as f64 * 1e-9
    }

    /// Adds what a failed collective most likely means to the backend's message.
    pub fn explain(&self, what: &str, error: String) -> String {
        let s = &self.spec;
        let (key, timeout) = match s.backend {
            Backend::Gloo => ("dist.timeout_s", s.timeout),
            Backend::Nccl => ("dist.nccl_timeout_s", s.nccl_timeout),
        };
        format!(
            "{what} failed on rank {} of {}: {error} (another rank exited or stopped answering; {key} = {})",
            s.rank,
            s.world_size,
            timeout.as_secs()
        )
    }

    /// Runs a collective on `tensor` in place, through a staging copy when the
    /// backend cannot take it as it is (host tensors on NCCL, non-contiguous ones).
    fn in_place(&self, tensor: &mut Tensor, op: impl FnOnce(&Tensor) -> Result<Work, String>) -> Result<(), String> {
        let wrong_device = self.spec.backend == Backend::Nccl && tensor.device() != self.spec.device;
        if !wrong_device && tensor.is_contiguous() {
            return op(tensor)?.wait();
        }
        let staged = if wrong_device { tensor.to_device(self.spec.device).contiguous() } else { tensor.contiguous() };
        op(&staged)?.wait()?;
        tensor.copy_(&staged);
        Ok(())
    }
}

impl Collectives for Group {
    fn all_reduce_sum(&self, tensor: &mut Tensor) -> Result<(), String> {
        self.timed(|| self.in_place(tensor, |t| self.start_all_reduce(t))).map_err(|e| self.explain("all-reduce", e))
    }

    fn broadcast(&self, tensor: &mut Tensor, root: u32) -> Result<(), String> {
        if root >= self.spec.world_size {
            return Err(format!("broadcast from rank {root}, but the world has {} ranks", self.spec.world_size));
        }
        self.timed(|| self.in_place(tensor, |t| self.start_broadcast(t, root))).map_err(|e| self.explain("broadcast", e))
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: the group is ours and nothing uses it after this.
        unsafe { ffi::pd_group_free(self.raw) }
    }
}

/// Whether this build has the NCCL process group.
pub fn nccl_compiled() -> bool {
    // SAFETY: a constant query.
    unsafe { ffi::pd_nccl_compiled() }
}
