use serde::{Deserialize, Serialize};

/// `[model]`: `kind` chooses the model; the shape keys here are shared by the
/// language models (`gpt`, `llama`); each kind's own keys are in its table
/// (`[model.gpt]`, `[model.llama]`, `[model.mlp]`, `[model.torchscript]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub kind: ModelKind,
    pub vocab_size: i64,
    pub n_layer: i64,
    pub n_head: i64,
    /// The hidden size.
    pub n_embd: i64,
    /// The most positions (context length).
    pub block_size: i64,
    /// gpt: embedding, attention and residual dropout; llama: attention dropout.
    pub dropout: f64,
    /// What to start from (empty: random init): a local Hugging Face directory, a ptrain
    /// run or checkpoint directory, or a `peft` adapter directory (`model::init_source`).
    pub init_from: String,
    /// When `init_from` holds LoRA adapters (a LoRA run, a `peft` directory): merge them
    /// into their base, or train them on. Unset is refused for such a source.
    #[serde(default)]
    pub init_adapters: InitAdapters,
    // The kinds' tables last: a table must follow plain values in TOML output.
    pub gpt: GptArgs,
    pub llama: LlamaArgs,
    pub gemma: GemmaArgs,
    pub moe: MoeArgs,
    pub mlp: MlpArgs,
    pub torchscript: TorchScriptArgs,
}

/// `[model.gpt]`: what only the `gpt` kind reads.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GptArgs {
    /// Biases in the linear layers.
    pub bias: bool,
    /// `gelu` (exact, erf) or `gelu_tanh` (the tanh approximation GPT-2 uses).
    pub activation: Activation,
    pub layer_norm_eps: f64,
}

/// `[model.mlp]`: the classifier on feature vectors.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MlpArgs {
    /// Hidden layer widths.
    pub hidden: Vec<i64>,
    /// 0 = taken from the data.
    pub input_dim: i64,
    /// 0 = taken from the data.
    pub num_classes: i64,
}

/// `[model.torchscript]`: a scripted module file exported from Python.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TorchScriptArgs {
    pub path: String,
    pub task: TaskKind,
}

/// `[model.llama]`: the Llama / Qwen2 / Qwen3 / Mistral family (`model.kind = "llama"`).
/// With `init_from`, every key here comes from the checkpoint's `config.json`.
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

/// `[model.gemma]`: the Gemma 2 / Gemma 3 (text) family (`model.kind = "gemma"`), read by
/// `model/gemma.rs`. With `init_from`, every key here comes from the checkpoint's `config.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GemmaArgs {
    pub n_kv_head: i64,
    pub head_dim: i64,
    pub intermediate_size: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_local_theta: f64,
    pub query_pre_attn_scalar: f64,
    pub attn_softcap: f64,
    pub final_softcap: f64,
    pub sliding_window: i64,
    pub sliding_pattern: i64,
    pub layer_types: Vec<LayerType>,
    pub qk_norm: bool,
    pub hf_model_type: String,
}

/// `[model.moe]`: a mixture of experts (`model.kind = "moe"`, Qwen3-MoE and Mixtral), read by
/// `model/moe.rs`. Its attention, norms, RoPE and head are `[model.llama]`'s keys; every
/// block's MLP is `experts` SwiGLU experts, each token routed to `top_k` of them. With
/// `init_from`, every key here but the loss weights comes from the checkpoint's `config.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MoeArgs {
    /// Routed experts per block (`num_experts`, Mixtral's `num_local_experts`).
    pub experts: i64,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub top_k: i64,
    /// Width of each expert's SwiGLU (`moe_intermediate_size`, Mixtral's
    /// `intermediate_size`); 0 = `[model.llama]`'s MLP width.
    pub expert_intermediate_size: i64,
    /// The top-k routing weights renormalised to sum to 1 (Mixtral always does).
    pub norm_topk_prob: bool,
    /// Width of Qwen2-MoE's shared expert (`shared_expert_intermediate_size`), a SwiGLU
    /// every token goes through beside the routed ones, scaled by a sigmoid gate; 0 = none.
    pub shared_expert_intermediate_size: i64,
    /// Blocks with a dense SwiGLU of `[model.llama]`'s width instead of experts
    /// (`mlp_only_layers`).
    pub mlp_only_layers: Vec<i64>,
    /// Block `i` has experts when `(i + 1)` is a multiple of it (`decoder_sparse_step`).
    pub decoder_sparse_step: i64,
    /// Mixtral's `router_jitter_noise`: in training, the experts' input is scaled by a
    /// factor drawn from `U(1 - j, 1 + j)` per element; 0 = none.
    pub router_jitter_noise: f64,
    /// Weight of the router's load-balancing loss in the training loss
    /// (`router_aux_loss_coef`); 0 = not added (still logged as `aux_loss`).
    pub router_aux_loss_coef: f64,
    /// Weight of the router z-loss (ST-MoE: the mean over tokens of the squared
    /// log-sum-exp of the router logits, summed over blocks); 0 = off.
    pub router_z_loss_coef: f64,
    /// The Hugging Face `model_type` an export writes (`qwen3_moe`, `qwen2_moe`, `mixtral`);
    /// empty = `qwen3_moe` with `[model.llama] qk_norm`, `qwen2_moe` with a shared expert,
    /// else `mixtral`.
    pub hf_model_type: String,
}

impl MoeArgs {
    /// Block `index` has experts (else a dense SwiGLU), as transformers decides it.
    pub fn is_sparse(&self, index: i64) -> bool {
        !self.mlp_only_layers.contains(&index) && (index + 1) % self.decoder_sparse_step.max(1) == 0
    }

    /// Each expert's SwiGLU width.
    pub fn expert_width(&self, llama: &LlamaArgs, n_embd: i64) -> i64 {
        if self.expert_intermediate_size > 0 {
            self.expert_intermediate_size
        } else {
            llama.mlp_width(n_embd)
        }
    }
}

/// How a layer attends (transformers' `layer_types`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    SlidingAttention,
    FullAttention,
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

/// `model.kind`: which family of the model registry (`model::family`) builds the model.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    Gpt,
    /// Llama / Qwen2 / Qwen3 / Mistral: RMSNorm, RoPE, grouped-query attention, SwiGLU.
    Llama,
    /// Gemma 2 / Gemma 3 (text): sandwich norms, GeGLU, sliding-window layers, soft caps.
    Gemma,
    /// A mixture of experts (Qwen3-MoE, Mixtral): Llama's attention, routed SwiGLU experts.
    Moe,
    Mlp,
    Torchscript,
}

impl ModelKind {
    /// Every kind, in the order messages list them.
    pub const ALL: &'static [ModelKind] =
        &[ModelKind::Gpt, ModelKind::Llama, ModelKind::Gemma, ModelKind::Moe, ModelKind::Mlp, ModelKind::Torchscript];

    /// A decoder-only language model of repeated blocks: what activation checkpointing,
    /// `train.loss_chunk`, instruction data and tokenized text need. Every family of the
    /// model registry but `mlp` and `torchscript`; the registry's descriptors declare it
    /// too (`FamilySpec::blocks`, and a test there checks that both agree), since the
    /// configuration cannot import `model`.
    pub fn has_blocks(self) -> bool {
        !matches!(self, ModelKind::Mlp | ModelKind::Torchscript)
    }

    /// As a configuration spells it: `gpt`.
    pub fn name(self) -> String {
        serde_json::to_value(self).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
    }

    /// The kinds with blocks as a message lists them, each through `spell`: `"gpt" or "llama"`.
    pub fn with_blocks(spell: impl Fn(&str) -> String) -> String {
        or_list(ModelKind::ALL.iter().filter(|k| k.has_blocks()).map(|k| spell(&k.name())))
    }
}

/// `a`, `a or b`, `a, b or c`.
pub fn or_list(items: impl IntoIterator<Item = String>) -> String {
    let items: Vec<String> = items.into_iter().collect();
    match items.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    Classification,
    LanguageModel,
}

/// `model.init_adapters`: what a run starting from LoRA adapters does with them.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum InitAdapters {
    /// Not said (`""`): refused when `model.init_from` holds adapters.
    #[default]
    #[serde(rename = "")]
    Unset,
    /// The adapters merged into their base: the run starts from the full model.
    Merge,
    /// The base as `model.init_from`, the adapters as the run's own starting adapters.
    Continue,
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
