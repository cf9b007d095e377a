use serde::{Deserialize, Serialize};

/// `[lora]`: low-rank adapters on the linear layers named by `targets`, the base
/// weights frozen. The table being present switches LoRA on (`enabled = false`
/// switches a table a file brought in off again); without it, full fine-tuning.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LoraConfig {
    pub enabled: bool,
    /// The adapters' inner width `r` (at least 1).
    pub rank: i64,
    /// The update is scaled by `alpha / rank`, as `peft` scales it.
    pub alpha: f64,
    /// Dropout on the adapters' input while training.
    pub dropout: f64,
    /// Module names (the last part of a linear layer's name); empty = every
    /// projection of the model kind ([`LoraConfig::targets`]); checked against the
    /// kind's modules by its family (`model::family::check`).
    pub targets: Vec<String>,
    /// A `peft` adapter directory whose adapters the run starts from (empty: B = 0, as
    /// peft starts); set by `model.init_adapters = "continue"`.
    pub init_from: String,
}

impl Default for LoraConfig {
    fn default() -> LoraConfig {
        LoraConfig { enabled: true, rank: 8, alpha: 16.0, dropout: 0.0, targets: Vec::new(), init_from: String::new() }
    }
}

impl LoraConfig {
    /// `alpha / rank`: what the adapters' product is multiplied by.
    pub fn scaling(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// The module names adapted in a model whose adaptable linear layers are `modules`
    /// (its family's: `model::family`): `targets`, or all of them.
    pub fn targets(&self, modules: &[&str]) -> Vec<String> {
        if !self.targets.is_empty() {
            return self.targets.clone();
        }
        modules.iter().map(|s| s.to_string()).collect()
    }

    /// Whether the linear layer named `module` (its last name part) gets an adapter, in
    /// a model whose adaptable linear layers are `modules`.
    pub fn adapts(&self, modules: &[&str], module: &str) -> bool {
        match self.targets.is_empty() {
            true => modules.contains(&module),
            false => self.targets.iter().any(|t| t == module),
        }
    }
}
