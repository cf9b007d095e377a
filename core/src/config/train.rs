use serde::{Deserialize, Serialize};

/// `[train]`: the loop itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    pub steps: u64,
    /// Passes over the training data, instead of `steps` when above 0: the steps
    /// are `ceil(epochs * samples / global batch)`.
    pub epochs: f64,
    /// Language models: the output projection and the loss computed this many
    /// positions at a time, so the whole `[positions, vocabulary]` logits never
    /// exist (0 = off). Unset: chosen by the vocabulary (`Config::loss_chunk`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_chunk: Option<i64>,
    /// gpt/llama: which blocks keep no activations in forward and recompute them in
    /// backward (see docs/memory.md).
    pub activation_checkpointing: ActivationCheckpointing,
    /// With `activation_checkpointing = "every_n"`: every this-many-th block.
    pub activation_checkpointing_every: i64,
    pub precision: Precision,
    pub eval_every: u64,
    pub eval_batches: u64,
    pub empty_cache_every: u64,
    pub nan_policy: NanPolicy,
    pub max_nonfinite_in_row: u64,
    pub nonfinite_check_every: u64,
}

/// `train.activation_checkpointing`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ActivationCheckpointing {
    None,
    /// Every block.
    Full,
    /// Blocks `N-1, 2N-1, ...` with `N = activation_checkpointing_every` (torchtune's
    /// selective layer checkpointing).
    EveryN,
}

impl TrainConfig {
    /// Whether block `layer` (from 0) is checkpointed.
    pub fn checkpoints_layer(&self, layer: usize) -> bool {
        match self.activation_checkpointing {
            ActivationCheckpointing::None => false,
            ActivationCheckpointing::Full => true,
            ActivationCheckpointing::EveryN => (layer as i64 + 1) % self.activation_checkpointing_every.max(1) == 0,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    Fp32,
    Bf16,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NanPolicy {
    Skip,
    Stop,
}
