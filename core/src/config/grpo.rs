use serde::{Deserialize, Serialize};

/// `[grpo]`: Group Relative Policy Optimization on scored rollouts
/// (`data.kind = "rollouts"`) or on completions sampled from prompts (`"prompts"`), as TRL 1.16's `GRPOTrainer` defines it, with its
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
    /// What the rollouts' reward lists are (one `[[grpo.rewards]]` per list, in order),
    /// or (`data.kind = "prompts"`) the reward functions that score the completions.
    pub rewards: Vec<RewardSpec>,
    /// Sampling (`data.kind = "prompts"`), as transformers' processors: keep the `top_k`
    /// most likely tokens (0 = all).
    pub top_k: i64,
    /// Keep the most likely tokens whose probability reaches `top_p` (1 = all).
    pub top_p: f64,
    /// Drop tokens less likely than `min_p` times the most likely one (absent = none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f64>,
    /// CTRL's penalty on the tokens of the prompt and completion so far (1 = none).
    pub repetition_penalty: f64,
    /// Every this many steps, the step's completions with their rewards go to
    /// `completions.jsonl` in the run directory (0 = never).
    pub log_completions_every: u64,
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
            top_k: 0,
            top_p: 1.0,
            min_p: None,
            repetition_penalty: 1.0,
            log_completions_every: 0,
        }
    }
}

impl GrpoConfig {
    /// The ratio's upper clip's epsilon.
    pub fn epsilon_high(&self) -> f64 {
        self.epsilon_high.unwrap_or(self.epsilon)
    }
}

impl super::Config {
    /// The plugins the run loads: `run.plugins` (`--plugins`), then each reward plugin
    /// a `[[grpo.rewards]] kind = "plugin"` names that it does not (by name or by path:
    /// the same library is one plugin), as a reward function is named once in TRL's
    /// `reward_funcs`.
    pub fn plugins_to_load(&self) -> Vec<String> {
        let mut plugins = self.run.plugins.clone();
        let sampling = self.data.kind == super::DataKind::Prompts;
        let rewards = self.grpo.rewards.iter().filter(|r| sampling && r.kind == Some(RewardKind::Plugin));
        for name in rewards.filter_map(|r| r.plugin.as_ref()) {
            if !plugins.iter().any(|p| p == name || crate::host::loader::same_library(p, name)) {
                plugins.push(name.clone());
            }
        }
        plugins
    }
}

/// A reward function: its name (in the metrics `rewards/<name>/mean`), its weight and,
/// when the run samples (`data.kind = "prompts"`), what computes it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RewardSpec {
    pub name: String,
    #[serde(default = "one")]
    pub weight: f64,
    /// A built-in reward (`data.kind = "prompts"`); absent with rollouts (the rows carry them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<RewardKind>,
    /// `regex`: 1.0 when the completion matches it; `exact`: the regex whose first group
    /// (or whole match) extracts the answer (absent: the whole completion, trimmed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// `exact`: the row's column holding the right answer.
    #[serde(default = "answer")]
    pub column: String,
    /// `length`: the completion length (in characters) that scores 0, the best.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<u32>,
    /// `command`: the program and its arguments, started once at set-up; JSON lines of
    /// completions in on its stdin, one line of scores out (rl.md, "Reward commands").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// `plugin`: the reward plugin's name (`Descriptor::reward`); the reward loads it,
    /// as if `run.plugins` named it (rl.md, "Writing a reward plugin").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// `command` and `plugin`: the longest wait for a micro-batch's scores before the
    /// run fails (absent: 120 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
}

fn answer() -> String {
    "answer".into()
}

/// `[[grpo.rewards]] kind`: the built-in rewards and a command's (rl.md).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RewardKind {
    /// 1.0 when the decoded completion matches `pattern`, else 0.0.
    Regex,
    /// 1.0 when the answer `pattern` extracts equals the row's `column`, else 0.0;
    /// `None` (TRL's) when the row has no such column.
    Exact,
    /// `-|target - characters|`, the length reward of TRL's quickstart (`reward_len`).
    Length,
    /// The scores an external process answers (`command`), one JSON line a micro-batch.
    Command,
    /// The scores a reward plugin answers (`plugin`), on its worker thread.
    Plugin,
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
        if !data.kind.is_grpo() {
            if *grpo != GrpoConfig::default() {
                return Err(bad("grpo", "applies to data.kind = \"rollouts\" or \"prompts\" (GRPO)"));
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
        match data.kind {
            DataKind::Prompts => self.validate_sampling(),
            _ => match grpo.rewards.iter().find(|r| r.kind.is_some()) {
                Some(r) => Err(bad(
                    "grpo.rewards.kind",
                    format!(
                        "{:?} computes a reward from sampled completions: rollouts carry their rewards (data.kind = \"prompts\" samples)",
                        r.name
                    ),
                )),
                None => Ok(()),
            },
        }
    }
}
