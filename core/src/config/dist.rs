use serde::{Deserialize, Serialize};

/// `[dist]`: data-parallel settings; ranks come from the torchrun/Slurm environment.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DistConfig {
    pub backend: DistBackend,
    pub timeout_s: u64,
    pub bucket_mb: f64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DistBackend {
    Auto,
    Gloo,
    Nccl,
}
