use serde::{Deserialize, Serialize};

/// `[optim]`: optimizer, schedule, clipping and accumulation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OptimConfig {
    pub name: OptimName,
    pub lr: f64,
    pub min_lr: f64,
    pub warmup_steps: u64,
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
    Cosine,
    Constant,
}
