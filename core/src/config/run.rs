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
