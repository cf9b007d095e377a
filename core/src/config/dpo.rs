use serde::{Deserialize, Serialize};

/// `[dpo]`: Direct Preference Optimization on preference pairs
/// (`data.kind = "preference"`), as TRL's `DPOTrainer` defines it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DpoConfig {
    /// How far the policy may move from the reference (TRL's `beta`).
    pub beta: f64,
    pub loss: DpoLoss,
    /// The reference model: a Hugging Face directory or a ptrain checkpoint or run
    /// directory; empty = the starting model, frozen.
    pub reference: String,
    /// Every pair's reference log-probabilities computed once before training, and
    /// the reference model freed.
    pub precompute_reference: bool,
    /// Which end of a sequence longer than `data.max_seq_len + 1` tokens is kept
    /// (TRL's `truncation_mode`).
    pub truncation_mode: TruncationMode,
}

impl Default for DpoConfig {
    fn default() -> DpoConfig {
        DpoConfig {
            beta: 0.1,
            loss: DpoLoss::Sigmoid,
            reference: String::new(),
            precompute_reference: false,
            truncation_mode: TruncationMode::KeepStart,
        }
    }
}

/// `dpo.loss`: TRL's `loss_type`s of the same names.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DpoLoss {
    /// `-log sigmoid(beta * margin)`: the DPO paper's.
    Sigmoid,
    /// `(margin per completion token - 1 / (2 beta))^2`, length-normalised as TRL does.
    Ipo,
    /// `relu(1 - beta * margin)`: SLiC's.
    Hinge,
}

/// `dpo.truncation_mode`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TruncationMode {
    /// The first tokens (a pair whose prompt alone fills the length is left out).
    KeepStart,
    /// The last tokens.
    KeepEnd,
}

impl TruncationMode {
    /// As a configuration spells it.
    pub fn name(self) -> &'static str {
        match self {
            TruncationMode::KeepStart => "keep_start",
            TruncationMode::KeepEnd => "keep_end",
        }
    }
}
