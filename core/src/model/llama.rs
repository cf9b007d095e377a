//! The Llama family as `transformers` computes it (`LlamaForCausalLM`,
//! `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `MistralForCausalLM` without a sliding
//! window): its [`Layout`], its block (`block.rs`: RMSNorm in float32, rotary
//! positions, grouped-query attention, a SwiGLU MLP), its [`Family`] (the trunk the
//! mixtures of experts share, with another [`FeedForward`]), its descriptor
//! [`SPEC`], and its `config.json` mapping (`hf.rs`). Parameters carry the Hugging Face
//! names (`model.layers.0.self_attn.q_proj.weight`), so loading and exporting are a
//! copy, with no renaming or transposition.

mod block;
pub(super) mod hf;

use tch::{nn, Kind, Tensor};

use super::{
    decoder::{self, built, Decoder, Family, Positions},
    entry::AuxLoss,
    family::{Build, FamilySpec, HfSpec},
    layout::{Layout, Made, Part},
    lora::Targets,
    rope::Rope,
};
use crate::{
    config::{Config, LlamaArgs, ModelConfig, ModelKind},
    error::Result,
};
pub(super) use block::{swiglu, Dims, RmsNorm};
pub use block::{FeedForward, LlamaBlock, SwiGlu};

/// The `llama` family, registered in `model::family`.
pub const SPEC: FamilySpec = FamilySpec {
    kind: ModelKind::Llama,
    build: Build::Decoder(build),
    kv_cache: true,
    lora_modules: &["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    lora_parameters: &[],
    check: shape_error,
    hf: Some(HfSpec {
        model_types: &hf::FAMILIES,
        read: hf::read,
        write: hf::write,
        params: hf::params,
        canonical: hf::canonical,
        known_extra: hf::known_extra,
        absent_as_zeros: |_, _| false,
        conv1d: false,
    }),
};

fn build(vs: &nn::Path, config: &Config, targets: Targets, after_block: &mut dyn FnMut(usize)) -> Result<Box<dyn super::Model>> {
    decoder::planned(Llama::<SwiGlu>::decoder_with(vs, &config.model, targets, after_block), &config.train)
}

/// Shapes the `llama` kind cannot build: the key and why.
fn shape_error(m: &ModelConfig) -> Option<(&'static str, String)> {
    let a = &m.llama;
    let kv = a.kv_heads(m.n_head);
    if m.n_head % kv != 0 {
        return Some(("model.llama.n_kv_head", format!("{kv} does not divide n_head = {}", m.n_head)));
    }
    if a.head_dim == 0 && m.n_embd % m.n_head != 0 {
        return Some(("model.n_embd", format!("{} is not divisible by n_head = {} (or set model.llama.head_dim)", m.n_embd, m.n_head)));
    }
    let hd = a.head_width(m.n_embd, m.n_head);
    (hd % 2 != 0).then(|| ("model.llama.head_dim", format!("{hd} is odd: rotary embeddings turn pairs")))
}

/// `transformers`' `initializer_range`.
const INIT_STD: f64 = 0.02;

/// Every parameter of a `llama` (the names of `LlamaForCausalLM` and its kin), in the
/// order they are drawn, with its attentions and head for the FLOP count.
pub fn layout(m: &ModelConfig) -> Layout {
    let (a, d, std) = (&m.llama, m.n_embd, INIT_STD);
    let dims = dims(m);
    let (q_width, kv_width, inner) = (dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim, a.mlp_width(d));
    let linear = |path, inp, out, bias| Part::Linear { path, inp, out, bias, std };
    let norm = |path, width| Part::Vector { path, width, init: 1.0 };
    // The random initialisation draws in creation order: an untied head first.
    let head = match a.tie_embeddings {
        true => Part::TiedHead { inp: d, out: m.vocab_size },
        false => linear("lm_head", d, m.vocab_size, false),
    };
    let mut block = vec![
        norm("input_layernorm.weight", d),
        linear("self_attn.q_proj", d, q_width, a.qkv_bias),
        linear("self_attn.k_proj", d, kv_width, a.qkv_bias),
        linear("self_attn.v_proj", d, kv_width, a.qkv_bias),
        Part::Attention { path: "self_attn.sdpa", heads: dims.heads, head_dim: dims.head_dim },
        linear("self_attn.o_proj", q_width, d, a.o_bias),
    ];
    if a.qk_norm {
        block.extend([norm("self_attn.q_norm.weight", dims.head_dim), norm("self_attn.k_norm.weight", dims.head_dim)]);
    }
    block.extend([
        norm("post_attention_layernorm.weight", d),
        linear("mlp.gate_proj", d, inner, a.mlp_bias),
        linear("mlp.up_proj", d, inner, a.mlp_bias),
        linear("mlp.down_proj", inner, d, a.mlp_bias),
    ]);
    Layout {
        before: vec![head, Part::Table { path: "model.embed_tokens.weight", rows: m.vocab_size, cols: d, std }],
        blocks_at: "model.layers",
        blocks: m.n_layer,
        block,
        exceptions: Vec::new(),
        after: vec![norm("model.norm.weight", d)],
    }
}

pub(super) fn dims(m: &ModelConfig) -> Dims {
    let a: &LlamaArgs = &m.llama;
    Dims { heads: m.n_head, kv_heads: a.kv_heads(m.n_head), head_dim: a.head_width(m.n_embd, m.n_head), dropout: m.dropout }
}

/// Llama's token embedding, rotary tables, final RMSNorm and head around blocks of
/// the MLP `M` (the `llama` family's SwiGLU, the `moe` family's experts).
pub struct Llama<M: FeedForward = SwiGlu> {
    embed_tokens: Tensor,
    norm: RmsNorm,
    /// `None` when the head is the token embedding (`tie_word_embeddings`).
    lm_head: Option<Tensor>,
    rope: Rope,
    config: ModelConfig,
    /// LoRA's adapters draw dropout.
    lora_draws: bool,
    losses: M::Losses,
}

impl Llama {
    /// The model, with LoRA adapters on the linear layers `targets` names.
    pub fn decoder(vs: &nn::Path, m: &ModelConfig, targets: Targets) -> Decoder<Llama> {
        Llama::decoder_with(vs, m, targets, &mut |_| {})
    }
}

impl<M: FeedForward> Llama<M> {
    /// As [`Llama::decoder`], calling `after_block(i)` once block `i`'s variables exist.
    pub fn decoder_with(vs: &nn::Path, m: &ModelConfig, targets: Targets, after_block: &mut dyn FnMut(usize)) -> Decoder<Llama<M>> {
        let (layout, dims, eps) = (M::layout(m), dims(m), m.llama.rms_norm_eps);
        let mut outer = Made::new(vs, &layout.before, m, Targets::NONE);
        let lm_head = outer.take_linear("lm_head").map(|l| l.base.ws);
        let embed_tokens = outer.tensor("model.embed_tokens.weight");
        let layers = (0..layout.blocks)
            .map(|i| built(LlamaBlock::new(Made::new(&(vs / "model" / "layers" / i), layout.parts(i), m, targets), m, dims, i), i, after_block))
            .collect();
        let norm = RmsNorm { weight: Made::new(vs, &layout.after, m, Targets::NONE).tensor("model.norm.weight"), eps };
        let rope = Rope::new(&m.llama, dims.head_dim, m.block_size, vs.device());
        let losses = M::losses(m);
        Decoder::new(Llama { embed_tokens, norm, lm_head, rope, config: m.clone(), lora_draws: targets.draws(), losses }, layers)
    }
}

impl<M: FeedForward> Family for Llama<M> {
    type Block = LlamaBlock<M>;

    fn kind(&self) -> &'static str {
        M::KIND
    }

    fn context(&self) -> i64 {
        self.rope.positions()
    }

    fn embed(&self, tokens: &Tensor, _at: Positions, _train: bool) -> Result<Tensor> {
        decoder::lookup(&self.embed_tokens, tokens, self.lm_head.is_none())
    }

    /// In the embedding's type, as `transformers` casts them: float32 for float32
    /// weights, also under autocast (q and k then rotate in float32).
    fn rotary(&self, at: Positions, kind: Kind) -> Result<Vec<(Tensor, Tensor)>> {
        Ok(vec![match at {
            Positions::Given(p) => self.rope.at(p, kind)?,
            Positions::From { start, len } => self.rope.window(start, len, kind)?,
        }])
    }

    fn norm(&self, x: &Tensor) -> Result<Tensor> {
        self.norm.forward(x)
    }

    /// `lm_head`, or the token embedding when tied.
    fn head(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    fn draws(&self) -> bool {
        self.config.dropout > 0.0 || self.lora_draws || M::draws(&self.config)
    }

    fn layout(&self) -> Layout {
        M::layout(&self.config)
    }

    fn aux_loss(&self, collected: Vec<Tensor>, blocks: usize) -> Result<Option<AuxLoss>> {
        M::aux_loss(&self.losses, collected, blocks)
    }
}

#[cfg(test)]
mod tests;
