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
    /// `[model.llama]`: what only the `llama` kind reads. Last: a table must follow
    /// plain values in TOML output.
    pub llama: LlamaArgs,
}

/// `[model.llama]`: the Llama / Qwen2 / Qwen3 / Mistral family (`model.kind = "llama"`).
/// The shared keys (`vocab_size`, `n_layer`, `n_head`, `n_embd` = hidden size,
/// `block_size` = max positions, `dropout` = attention dropout, `init_from`) stay in
/// `[model]`; with `init_from`, every key here comes from the checkpoint's `config.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LlamaArgs {
    /// Key/value heads (grouped-query attention); 0 = `n_head`.
    pub n_kv_head: i64,
    /// Width of one head; 0 = `n_embd / n_head`.
    pub head_dim: i64,
    /// Width of the SwiGLU MLP; 0 = 8/3 `n_embd` rounded up to a multiple of 64.
    pub intermediate_size: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// `llama3` scaling: `factor`, `low_freq_factor`, `high_freq_factor`,
    /// `original_max_position_embeddings`.
    pub rope_factor: f64,
    pub rope_low_freq_factor: f64,
    pub rope_high_freq_factor: f64,
    pub rope_original_max_positions: i64,
    /// The output head shares the token embedding (`tie_word_embeddings`).
    pub tie_embeddings: bool,
    /// Biases on q/k/v (Qwen2; Llama's and Qwen3's `attention_bias`).
    pub qkv_bias: bool,
    /// A bias on the attention output (Llama's and Qwen3's `attention_bias`).
    pub o_bias: bool,
    /// Biases in the MLP (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// RMSNorm over each head's q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// The Hugging Face `model_type` an export writes (`llama`, `qwen2`, `qwen3`,
    /// `mistral`); empty = the one the keys above fit, `llama` first.
    pub hf_model_type: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RopeScaling {
    None,
    Llama3,
}

impl LlamaArgs {
    pub fn kv_heads(&self, n_head: i64) -> i64 {
        if self.n_kv_head > 0 {
            self.n_kv_head
        } else {
            n_head
        }
    }

    pub fn head_width(&self, n_embd: i64, n_head: i64) -> i64 {
        if self.head_dim > 0 {
            self.head_dim
        } else {
            n_embd / n_head.max(1)
        }
    }

    pub fn mlp_width(&self, n_embd: i64) -> i64 {
        if self.intermediate_size > 0 {
            self.intermediate_size
        } else {
            (8 * n_embd / 3 + 63) / 64 * 64
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    Gpt,
    /// Llama / Qwen2 / Qwen3 / Mistral: RMSNorm, RoPE, grouped-query attention, SwiGLU.
    Llama,
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

impl ModelConfig {
    /// Shapes the `llama` kind cannot build: an error message naming the key.
    pub fn llama_shape_error(&self) -> Option<(&'static str, String)> {
        let a = &self.llama;
        let kv = a.kv_heads(self.n_head);
        if self.n_head % kv != 0 {
            return Some(("model.llama.n_kv_head", format!("{kv} does not divide n_head = {}", self.n_head)));
        }
        if a.head_dim == 0 && self.n_embd % self.n_head != 0 {
            return Some(("model.n_embd", format!("{} is not divisible by n_head = {} (or set model.llama.head_dim)", self.n_embd, self.n_head)));
        }
        let hd = a.head_width(self.n_embd, self.n_head);
        (hd % 2 != 0).then(|| ("model.llama.head_dim", format!("{hd} is odd: rotary embeddings turn pairs")))
    }
}
