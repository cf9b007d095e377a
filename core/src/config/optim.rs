use serde::{Deserialize, Serialize};

/// `[optim]`: optimizer, schedule, clipping and accumulation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OptimConfig {
    pub name: OptimName,
    pub lr: f64,
    /// The floor the decay ends at, as an absolute rate; when set, it is the floor
    /// and `min_lr_ratio` is not used ([`OptimConfig::floor`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_lr: Option<f64>,
    /// The floor as a fraction of `lr` (transformers decays to 0: 0.0).
    pub min_lr_ratio: f64,
    pub warmup_steps: u64,
    /// The warmup as a fraction of the run's steps (transformers' `warmup_ratio`):
    /// above 0, it replaces `warmup_steps` ([`OptimConfig::warmup`]).
    pub warmup_ratio: f64,
    pub schedule: LrScheduleKind,
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub momentum: f64,
    pub nesterov: bool,
    pub grad_clip: f64,
    pub accum_steps: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OptimName {
    Adamw,
    Sgd,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LrScheduleKind {
    /// Warmup, then half a cosine down to the floor (nanoGPT's).
    Cosine,
    /// Warmup, then a straight line down to the floor: transformers'
    /// `get_linear_schedule_with_warmup` (`lr_scheduler_type = "linear"`).
    Linear,
    /// Warmup, then `lr`.
    Constant,
}

impl OptimConfig {
    /// The rate the decay ends at: `min_lr` when set, else `min_lr_ratio * lr`.
    pub fn floor(&self) -> f64 {
        self.min_lr.unwrap_or(self.min_lr_ratio * self.lr)
    }

    /// Warmup steps of a run of `total_steps`: `ceil(warmup_ratio * total_steps)`
    /// when the ratio is above 0 (as transformers rounds it), else `warmup_steps`.
    pub fn warmup(&self, total_steps: u64) -> u64 {
        match self.warmup_ratio > 0.0 {
            true => (self.warmup_ratio * total_steps as f64).ceil() as u64,
            false => self.warmup_steps,
        }
    }
}
