use serde::{Deserialize, Serialize};

use super::{Config, ModelKind};
use crate::error::{ConfigError, Error};

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
    /// projection of the model kind ([`LoraConfig::targets`]).
    pub targets: Vec<String>,
}

impl Default for LoraConfig {
    fn default() -> LoraConfig {
        LoraConfig { enabled: true, rank: 8, alpha: 16.0, dropout: 0.0, targets: Vec::new() }
    }
}

/// The linear layers LoRA can adapt, per model kind.
pub const LLAMA_MODULES: &[&str] = &["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];
pub const GPT_MODULES: &[&str] = &["c_attn", "c_proj", "c_fc"];

impl LoraConfig {
    /// `alpha / rank`: what the adapters' product is multiplied by.
    pub fn scaling(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// The module names adapted for `kind`: `targets`, or all the kind has.
    pub fn targets(&self, kind: ModelKind) -> Vec<String> {
        if !self.targets.is_empty() {
            return self.targets.clone();
        }
        modules(kind).iter().map(|s| s.to_string()).collect()
    }

    /// Whether the linear layer named `module` (its last name part) gets an adapter.
    pub fn adapts(&self, kind: ModelKind, module: &str) -> bool {
        match self.targets.is_empty() {
            true => modules(kind).contains(&module),
            false => self.targets.iter().any(|t| t == module),
        }
    }
}

/// The adaptable linear layers of `kind` (none for `mlp` and `torchscript`).
pub fn modules(kind: ModelKind) -> &'static [&'static str] {
    match kind {
        ModelKind::Llama => LLAMA_MODULES,
        ModelKind::Gpt => GPT_MODULES,
        ModelKind::Mlp | ModelKind::Torchscript => &[],
    }
}

impl Config {
    /// LoRA's checks: adapters for the linear layers the model kind has.
    pub(super) fn validate_lora(&self) -> Result<(), Error> {
        let Some(lora) = self.lora() else { return Ok(()) };
        // Named by the file or --set that set the key (`lora.targets` for `lora.targets[1]`).
        let bad = |key: String, message: String| -> Error {
            let set = key.split('[').next().unwrap_or_default().to_string();
            let located = self.origins.locate(ConfigError { origin: "configuration".into(), key: set, message });
            ConfigError { key, ..located }.into()
        };
        let kind = self.model.kind;
        let own = modules(kind);
        if own.is_empty() {
            return Err(bad("lora".into(), format!("model.kind = {kind:?} has no linear layers LoRA adapts: use \"gpt\" or \"llama\"")));
        }
        for (i, target) in lora.targets.iter().enumerate() {
            if own.contains(&target.as_str()) {
                continue;
            }
            let key = format!("lora.targets[{i}]");
            let every = LLAMA_MODULES.iter().chain(GPT_MODULES);
            let message = match every.clone().any(|m| m == target) {
                true => format!("model.kind = {kind:?} has no module `{target}`; its linear layers: {}", own.join(", ")),
                false => match ptrain_plugin_api::unknown_key::closest(target, every.copied()) {
                    Some(near) => format!("unknown module `{target}`: did you mean `{near}`? (model.kind = {kind:?} has {})", own.join(", ")),
                    None => format!("unknown module `{target}` (model.kind = {kind:?} has {})", own.join(", ")),
                },
            };
            return Err(bad(key, message));
        }
        Ok(())
    }
}
