use serde::{Deserialize, Serialize};

/// `[dist]`: data-parallel settings; ranks come from the torchrun/Slurm environment.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DistConfig {
    pub backend: DistBackend,
    /// The rendezvous's timeout, and Gloo's for every collective.
    pub timeout_s: u64,
    /// NCCL's collective timeout (its watchdog's), larger than `timeout_s`: on a
    /// GPU, ranks drift apart for as long as the host runs ahead of the device, or
    /// rank 0 waits for a checkpoint write (PyTorch's NCCL default is 10 minutes).
    pub nccl_timeout_s: u64,
    /// How long the ranks wait for each other at the end of the run (through the
    /// rendezvous store): rank 0 gets there only after its final save and its
    /// plugins' drain, which may take longer than a collective's `timeout_s`.
    #[serde(default = "end_timeout_s")]
    pub end_timeout_s: u64,
    pub bucket_mb: f64,
    /// What each rank keeps only a slice of (ZeRO stage 1, 2 or 3).
    #[serde(default)]
    pub shard: ShardMode,
    /// `shard = "parameters"`: release a block's gathered parameters after its
    /// forward and gather them again for its backward (FSDP's default); `false`
    /// keeps them from forward to backward (less communication, more memory).
    #[serde(default = "reshard_after_forward")]
    pub reshard_after_forward: bool,
    /// `shard = "parameters"`: keep the optimizer state (and a float32 copy of this
    /// rank's chunks) in host memory and run the update there (ZeRO-Offload), for a
    /// device that holds the chunks but not AdamW's moments.
    #[serde(default)]
    pub offload_optimizer: bool,
}

fn end_timeout_s() -> u64 {
    1800
}

fn reshard_after_forward() -> bool {
    true
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DistBackend {
    Auto,
    Gloo,
    Nccl,
}

/// `dist.shard`: `none` replicates everything (plain data parallelism);
/// `optimizer` (ZeRO-1) gives each rank the optimizer state of its 1/world slice
/// of the parameters; `gradients` (ZeRO-2) also reduce-scatters the gradients so a
/// rank keeps only its slice's; `parameters` (ZeRO-3, FSDP) also keeps only a slice
/// of every parameter between steps, gathering each block's just before it runs.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ShardMode {
    #[default]
    None,
    Optimizer,
    Gradients,
    Parameters,
}

impl ShardMode {
    pub fn name(self) -> &'static str {
        match self {
            ShardMode::None => "none",
            ShardMode::Optimizer => "optimizer",
            ShardMode::Gradients => "gradients",
            ShardMode::Parameters => "parameters",
        }
    }
}
