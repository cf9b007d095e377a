//! Choosing the device and describing it.

use tch::Device;

use crate::{
    config::{CpuMatmul, DeviceChoice},
    error::{Error, Result},
};

/// Loads libtorch's CUDA library if it exists. Rust links with `--as-needed`, which
/// can drop libtorch_cuda (nothing references it directly) and with it CUDA itself;
/// Python's torch loads it unconditionally, and so do we.
pub fn load_cuda_runtime() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: loading libtorch_cuda only runs its static registrations.
        if let Ok(lib) = unsafe { libloading::Library::new("libtorch_cuda.so") } {
            std::mem::forget(lib);
        }
    });
}

/// Resolves `auto|cpu|cuda` to a device; `local_rank` picks the GPU.
pub fn select(choice: DeviceChoice, local_rank: usize) -> Result<Device> {
    load_cuda_runtime();
    let cuda = tch::Cuda::is_available();
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Auto if !cuda => Ok(Device::Cpu),
        DeviceChoice::Cuda if !cuda => {
            Err(Error::Device { device: "cuda".into(), message: "CUDA is not available (no GPU, or libtorch without CUDA)".into() })
        }
        DeviceChoice::Auto | DeviceChoice::Cuda => {
            shim_has_cuda(ptrain_torch_ext::cuda::compiled())?;
            let count = tch::Cuda::device_count() as usize;
            let index = gpu_index(local_rank, count);
            tracing::info!("device cuda:{index} (local rank {local_rank} mod {count} visible CUDA device(s))");
            Ok(Device::Cuda(index))
        }
    }
}

/// Applies `run.cpu_matmul` to this process (libtorch's state, like `torch.backends`):
/// `onednn` where this libtorch has no oneDNN is refused before training.
pub fn set_cpu_matmul(choice: CpuMatmul) -> Result<()> {
    let torch = |e: ptrain_torch_ext::TorchError| Error::Other(format!("run.cpu_matmul: {e}"));
    let on = ptrain_torch_ext::linear::set_onednn_matmuls(choice != CpuMatmul::Aten).map_err(torch)?;
    if choice == CpuMatmul::Onednn && !on {
        return Err(Error::Device {
            device: "cpu".into(),
            message: "run.cpu_matmul = \"onednn\", but this libtorch has no oneDNN (or torch.backends.mkldnn is off): use \"auto\" or \"aten\""
                .into(),
        });
    }
    tracing::debug!("float32 CPU matrix products: {}", if on { "oneDNN's where faster" } else { "ATen's (MKL)" });
    Ok(())
}

/// The GPU of a local rank: `local_rank % visible`, so that a launcher giving each
/// task its own GPU (`CUDA_VISIBLE_DEVICES` per rank, Slurm `--gpus-per-task=1`)
/// puts every rank on its `cuda:0`, and one that shows all GPUs to every rank puts
/// local rank r on `cuda:r`.
pub fn gpu_index(local_rank: usize, visible: usize) -> usize {
    local_rank % visible.max(1)
}

/// A CUDA run needs the shim's CUDA parts (device name, allocator statistics,
/// memory snapshots): without them the GPU's name is empty, memory reads 0 and
/// the flops plugin's MFU is wrong. Refused before training.
pub fn shim_has_cuda(compiled: bool) -> Result<()> {
    if compiled {
        return Ok(());
    }
    Err(Error::Device {
        device: "cuda".into(),
        message: "this build of ptrain has no CUDA support in its libtorch shim (ptrain-torch-ext was built without the CUDA headers: \
                  see the build's warning; set CUDA_HOME or run scripts/bootstrap.sh, then rebuild), so it cannot train on CUDA; \
                  use --device cpu"
            .into(),
    })
}

/// A human name: `cpu` or the GPU's name.
pub fn name(device: Device) -> String {
    match device {
        Device::Cuda(i) => ptrain_torch_ext::cuda::device_name(i as i32).unwrap_or_else(|_| format!("cuda:{i}")),
        _ => "cpu".to_string(),
    }
}

pub fn label(device: Device) -> String {
    match device {
        Device::Cuda(i) => format!("cuda:{i}"),
        _ => "cpu".to_string(),
    }
}

/// Peak memory in bytes: the CUDA allocator's peak, or the process's peak RSS.
pub fn peak_memory(device: Device) -> u64 {
    match device {
        Device::Cuda(i) => ptrain_torch_ext::cuda::memory(i as i32).map(|m| m.peak.max(0) as u64).unwrap_or(0),
        _ => proc_status_kib("VmHWM:").unwrap_or(0) * 1024,
    }
}

/// Current memory in bytes: CUDA allocated, or resident set size.
pub fn current_memory(device: Device) -> u64 {
    match device {
        Device::Cuda(i) => ptrain_torch_ext::cuda::memory(i as i32).map(|m| m.allocated.max(0) as u64).unwrap_or(0),
        _ => host_rss(),
    }
}

pub fn host_rss() -> u64 {
    proc_status_kib("VmRSS:").unwrap_or(0) * 1024
}

fn proc_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].trim().trim_end_matches("kB").trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_ranks_wrap_around_the_visible_gpus() {
        // One GPU per task (CUDA_VISIBLE_DEVICES per rank): every rank on cuda:0.
        assert_eq!((0..4).map(|r| gpu_index(r, 1)).collect::<Vec<_>>(), [0, 0, 0, 0]);
        // Every GPU visible to every rank: local rank r on cuda:r.
        assert_eq!((0..4).map(|r| gpu_index(r, 4)).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(gpu_index(5, 2), 1);
    }

    #[test]
    fn a_cuda_run_without_the_shims_cuda_is_a_usage_error() {
        assert!(shim_has_cuda(true).is_ok());
        let err = shim_has_cuda(false).unwrap_err();
        assert!(err.is_usage(), "exit 2 before training");
        let text = err.to_string();
        assert!(text.contains("no CUDA support") && text.contains("--device cpu"), "{text}");
    }
}
