use serde::{Deserialize, Serialize};

/// `[model]`: one flat table; each kind reads its own keys (see default.toml).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub kind: ModelKind,
    pub vocab_size: i64,
    pub n_layer: i64,
    pub n_head: i64,
    pub n_embd: i64,
    pub block_size: i64,
    pub dropout: f64,
    pub bias: bool,
    pub hidden: Vec<i64>,
    pub input_dim: i64,
    pub num_classes: i64,
    pub path: String,
    pub task: TaskKind,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    Gpt,
    Mlp,
    Torchscript,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    Classification,
    LanguageModel,
}
