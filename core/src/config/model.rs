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
    /// `gelu` (exact, erf) or `gelu_tanh` (the tanh approximation GPT-2 uses).
    pub activation: Activation,
    pub layer_norm_eps: f64,
    /// A local Hugging Face GPT-2 directory to start from (empty: random init).
    pub init_from: String,
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

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    Gelu,
    GeluTanh,
}

impl Activation {
    /// libtorch's `approximate` argument of `gelu`.
    pub fn approximate(self) -> &'static str {
        match self {
            Activation::Gelu => "none",
            Activation::GeluTanh => "tanh",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Activation::Gelu => "gelu",
            Activation::GeluTanh => "gelu_tanh",
        }
    }
}
