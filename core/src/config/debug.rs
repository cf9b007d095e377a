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
    /// Steps whose gradients are multiplied by `grad_spike_factor` (the loss is
    /// scaled before backward; the reported loss is not): a gradient spike, for the
    /// health plugin's anomaly detector.
    #[serde(default)]
    pub grad_spike_at: Vec<u64>,
    #[serde(default = "default_spike_factor")]
    pub grad_spike_factor: f64,
    /// Steps at which `<run-dir>/tensors-step<N>.rank<r>.safetensors` receives the
    /// parameters before the update (`param/<name>`), the gradients after backward,
    /// before clipping (`grad/<name>`), and the parameters after the update
    /// (`updated/<name>`): for checking plugins against a reference.
    #[serde(default)]
    pub dump_tensors_at: Vec<u64>,
}

fn default_spike_factor() -> f64 {
    1e3
}
