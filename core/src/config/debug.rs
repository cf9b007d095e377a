use serde::{Deserialize, Serialize};

/// `[debug]`: fault injection, for testing the fault handling itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DebugConfig {
    /// Steps whose loss is replaced by NaN (exercises `train.nan_policy`).
    pub nonfinite_loss_at: Vec<u64>,
    /// Every rank writes its final parameters to `<run-dir>/params-rank<r>.safetensors`
    /// (checks that data-parallel ranks stayed identical).
    #[serde(default)]
    pub dump_params: bool,
}
