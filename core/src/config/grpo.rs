use serde::{Deserialize, Serialize};

/// `[grpo]`: Group Relative Policy Optimization on scored rollouts
/// (`data.kind = "rollouts"`), as TRL 1.16's `GRPOTrainer` defines it, with its
/// defaults (docs/rl.md maps each `GRPOConfig` argument to its key here).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GrpoConfig {
    /// Completions per prompt: a group, whose rewards are compared with each other.
    pub num_generations: u32,
    pub loss_type: GrpoLoss,
    /// The ratio's lower clip, `1 - epsilon`.
    pub epsilon: f64,
    /// The ratio's upper clip, `1 + epsilon_high`; absent = `epsilon` (TRL's `None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epsilon_high: Option<f64>,
    /// The KL penalty's weight (k3 estimator against the reference); 0 = no reference loaded.
    pub beta: f64,
    /// The k3 estimate times the importance ratio (TRL's `use_bias_correction_kl`).
    pub use_bias_correction_kl: bool,
    pub scale_rewards: ScaleRewards,
    /// Updates per batch of rollouts; above 1, the ratio is against the log-probabilities
    /// the policy gave when the rollouts were first trained on (TRL's old log-probs).
    pub num_iterations: u32,
    /// Completions that did not end with EOS are left out of the loss.
    pub mask_truncated_completions: bool,
    /// The log-probabilities are those of `logits / temperature` (the sampling temperature).
    pub temperature: f64,
    /// The longest completion: `dr_grpo` divides by it.
    pub max_completion_length: u32,
    /// The reference model when `beta > 0`: a Hugging Face directory or a ptrain
    /// checkpoint or run directory; empty = the starting model (with `[lora]`, the adapters off).
    pub reference: String,
    /// What the rollouts' reward lists are (one `[[grpo.rewards]]` per list, in order).
    pub rewards: Vec<RewardSpec>,
}

impl Default for GrpoConfig {
    fn default() -> GrpoConfig {
        GrpoConfig {
            num_generations: 8,
            loss_type: GrpoLoss::Dapo,
            epsilon: 0.2,
            epsilon_high: None,
            beta: 0.0,
            use_bias_correction_kl: true,
            scale_rewards: ScaleRewards::Group,
            num_iterations: 1,
            mask_truncated_completions: false,
            temperature: 1.0,
            max_completion_length: 512,
            reference: String::new(),
            rewards: Vec::new(),
        }
    }
}

impl GrpoConfig {
    /// The ratio's upper clip's epsilon.
    pub fn epsilon_high(&self) -> f64 {
        self.epsilon_high.unwrap_or(self.epsilon)
    }
}

/// A reward function: its name (in the metrics `rewards/<name>/mean`) and its weight.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RewardSpec {
    pub name: String,
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

/// `grpo.loss_type`: TRL's `loss_type`s of the same names, normalised as TRL does.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum GrpoLoss {
    /// Summed over the step's completion tokens, divided by their number (all ranks).
    Dapo,
    /// Each completion's token mean, averaged over the completions.
    Grpo,
    /// Each micro-batch's token mean, averaged over the micro-batches.
    Bnpo,
    /// Summed over tokens, divided by completions times `max_completion_length`.
    DrGrpo,
}

/// `grpo.scale_rewards`: what a group's centred rewards are divided by.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ScaleRewards {
    /// The group's standard deviation (+ 1e-4).
    Group,
    /// The batch's standard deviation (+ 1e-4).
    Batch,
    /// Nothing (Dr. GRPO).
    None,
}

impl super::Config {
    /// Scored rollouts: a tokenizer, one file, whole groups per micro-batch, and the
    /// `[grpo]` keys only with them.
    pub(super) fn validate_grpo(&self) -> Result<(), crate::error::Error> {
        use super::{
            combinations::{bad, quoted_kinds},
            DataKind,
        };
        let (data, grpo) = (&self.data, &self.grpo);
        if data.kind != DataKind::Rollouts {
            if *grpo != GrpoConfig::default() {
                return Err(bad("grpo", "applies to data.kind = \"rollouts\" (GRPO on scored rollouts)"));
            }
            return Ok(());
        }
        if !self.model.kind.has_blocks() {
            return Err(bad("data.kind", format!("rollouts train a language model: model.kind = {}", quoted_kinds())));
        }
        if data.tokenizer.is_empty() || data.tokenizer == super::BYTES_TOKENIZER {
            return Err(bad(
                "data.tokenizer",
                "rollouts need a tokenizer.json (its EOS ends a completion); it defaults to the one beside model.init_from",
            ));
        }
        if data.path.is_empty() || !data.datasets.is_empty() {
            return Err(bad("data.path", "rollouts are read from one file, data.path ([[data.datasets]] mixes are for instruction data)"));
        }
        if data.batch_size % grpo.num_generations as i64 != 0 {
            return Err(bad(
                "data.batch_size",
                format!(
                    "{} counts completions and must be a multiple of grpo.num_generations = {} (whole groups per micro-batch, as TRL's per_device_train_batch_size)",
                    data.batch_size, grpo.num_generations
                ),
            ));
        }
        if grpo.scale_rewards == ScaleRewards::Batch && self.optim.accum_steps > 1 {
            return Err(bad(
                "grpo.scale_rewards",
                "\"batch\" divides by the standard deviation of a micro-batch's rewards; with optim.accum_steps > 1 that is not the step's: use \"group\" or \"none\"",
            ));
        }
        let names: Vec<&str> = grpo.rewards.iter().map(|r| r.name.as_str()).collect();
        if let Some(name) = names.iter().enumerate().find(|(i, n)| n.is_empty() || names[..*i].contains(n)).map(|(_, n)| n) {
            return Err(bad("grpo.rewards", format!("each reward needs a name of its own ({name:?} is empty or given twice)")));
        }
        if grpo.rewards.iter().any(|r| !r.weight.is_finite()) {
            return Err(bad("grpo.rewards.weight", "must be a finite number"));
        }
        Ok(())
    }
}
