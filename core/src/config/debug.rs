use serde::{Deserialize, Serialize};

/// `[debug]`: fault injection, for testing the fault handling itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DebugConfig {
    /// Steps whose loss is replaced by NaN (exercises `train.nan_policy`).
    pub nonfinite_loss_at: Vec<u64>,
}
