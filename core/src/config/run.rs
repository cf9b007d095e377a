use serde::{Deserialize, Serialize};

/// `[run]`: identity and placement of the run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub name: String,
    pub run_dir: String,
    pub seed: u64,
    pub device: DeviceChoice,
    pub plugins: Vec<String>,
    pub log_every: u64,
    pub threads: u32,
    /// Which kernels run float32 matrix products on the CPU.
    #[serde(default)]
    pub cpu_matmul: CpuMatmul,
    /// Seconds all worker plugins together get to drain at the end.
    pub shutdown_timeout_s: f64,
    /// A plugin failure makes a run that otherwise completed exit 3 (for CI).
    pub strict_plugins: bool,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum DeviceChoice {
    Auto,
    Cpu,
    Cuda,
}

/// `run.cpu_matmul`: the kernels of float32 matrix products on the CPU (linear layers
/// and the chunked loss's products). libtorch carries two: MKL's, which `at::linear`
/// and `matmul` call (and so transformers), and oneDNN's, which inductor's CPU code
/// calls; `csrc/linear.cpp` in ptrain-torch-ext takes the faster per product.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CpuMatmul {
    /// oneDNN's where this libtorch has it, else ATen's.
    #[default]
    Auto,
    /// oneDNN's, or a configuration error where this libtorch lacks it.
    Onednn,
    /// ATen's (MKL's): `at::linear` and `matmul`, as PyTorch runs them.
    Aten,
}
