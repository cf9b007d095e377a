//! The Gemma family as `transformers` computes it (`Gemma2ForCausalLM`,
//! `Gemma3ForCausalLM`, text only): the token embedding times `sqrt(hidden_size)`,
//! blocks of four `(1 + weight)` RMSNorms around grouped-query attention and a GeGLU MLP
//! (`block.rs`), sliding-window layers, soft-capped attention scores (Gemma 2) and
//! final logits, and for Gemma 3 q/k norms and a RoPE base of its own for the sliding
//! layers. Its [`Layout`], its [`Family`], its descriptor [`SPEC`] and its `config.json`
//! mapping (`hf.rs`); the head is the token embedding.

mod block;
mod hf;
#[cfg(test)]
mod tests;

use tch::{nn, Kind, Tensor};

use super::{
    decoder::{self, built, Decoder, Family, Positions},
    family::{Build, FamilySpec, HfSpec},
    layout::{Layout, Made, Part},
    lora::Targets,
    rope::{self, Rope},
};
use crate::{
    config::{Config, LayerType, ModelConfig, ModelKind},
    error::Result,
};
use block::{GemmaBlock, GemmaNorm};

/// The `gemma` family, registered in `model::family`.
pub const SPEC: FamilySpec = FamilySpec {
    kind: ModelKind::Gemma,
    build: Build::Decoder(build),
    kv_cache: true,
    lora_modules: &["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    lora_parameters: &[],
    check: shape_error,
    hf: Some(HfSpec {
        model_types: &hf::FAMILIES,
        read: hf::read,
        write: hf::write,
        params: |m| super::hf::names::from_layout(&layout(m), false),
        canonical: hf::canonical,
        known_extra: hf::known_extra,
        absent_as_zeros: |_, _| false,
        conv1d: false,
    }),
};

fn build(vs: &nn::Path, config: &Config, targets: Targets, after_block: &mut dyn FnMut(usize)) -> Result<Box<dyn super::Model>> {
    decoder::planned(Gemma::decoder_with(vs, &config.model, targets, after_block), &config.train)
}

/// `transformers`' `initializer_range`.
const INIT_STD: f64 = 0.02;

/// The shapes every layer shares, resolved from `[model.gemma]`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dims {
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    pub inner: i64,
    pub dropout: f64,
    /// `query_pre_attn_scalar ** -0.5`.
    pub scale: f64,
    pub attn_softcap: Option<f64>,
    pub eps: f64,
}

pub(super) fn dims(m: &ModelConfig) -> Dims {
    let g = &m.gemma;
    let head_dim = if g.head_dim > 0 { g.head_dim } else { m.n_embd / m.n_head.max(1) };
    let scalar = if g.query_pre_attn_scalar > 0.0 { g.query_pre_attn_scalar } else { head_dim as f64 };
    Dims {
        heads: m.n_head,
        kv_heads: if g.n_kv_head > 0 { g.n_kv_head } else { m.n_head },
        head_dim,
        inner: if g.intermediate_size > 0 { g.intermediate_size } else { 4 * m.n_embd },
        dropout: m.dropout,
        scale: scalar.powf(-0.5),
        attn_softcap: (g.attn_softcap > 0.0).then_some(g.attn_softcap),
        eps: g.rms_norm_eps,
    }
}

/// Each layer's type: `layer_types`, or by `sliding_pattern` (every Nth layer full,
/// as transformers' default `(i + 1) % pattern`) when there is a window.
pub(super) fn layer_types(m: &ModelConfig) -> Vec<LayerType> {
    let g = &m.gemma;
    if !g.layer_types.is_empty() {
        return g.layer_types.clone();
    }
    let sliding = |i: i64| g.sliding_window > 0 && (i + 1) % g.sliding_pattern.max(1) != 0;
    (0..m.n_layer).map(|i| if sliding(i) { LayerType::SlidingAttention } else { LayerType::FullAttention }).collect()
}

/// Shapes and settings the `gemma` kind cannot build: the key and why.
fn shape_error(m: &ModelConfig) -> Option<(&'static str, String)> {
    let (g, d) = (&m.gemma, dims(m));
    if m.n_head % d.kv_heads != 0 {
        return Some(("model.gemma.n_kv_head", format!("{} does not divide n_head = {}", d.kv_heads, m.n_head)));
    }
    if g.head_dim == 0 && m.n_embd % m.n_head != 0 {
        return Some(("model.n_embd", format!("{} is not divisible by n_head = {} (or set model.gemma.head_dim)", m.n_embd, m.n_head)));
    }
    if d.head_dim % 2 != 0 {
        return Some(("model.gemma.head_dim", format!("{} is odd: rotary embeddings turn pairs", d.head_dim)));
    }
    if !g.layer_types.is_empty() && g.layer_types.len() as i64 != m.n_layer {
        return Some(("model.gemma.layer_types", format!("has {} entries for n_layer = {} layers", g.layer_types.len(), m.n_layer)));
    }
    let sliding = g.layer_types.contains(&LayerType::SlidingAttention);
    (sliding && g.sliding_window == 0).then(|| ("model.gemma.sliding_window", "is 0 (none) while layer_types has sliding_attention layers".into()))
}

/// Every parameter of a `gemma` (the names of `Gemma2ForCausalLM` and
/// `Gemma3ForCausalLM`), in the order they are drawn, with its attentions and tied
/// head for the FLOP count. The norms start at 0: they scale by `1 + weight`.
pub fn layout(m: &ModelConfig) -> Layout {
    let (d, dims, std) = (m.n_embd, dims(m), INIT_STD);
    let (q_width, kv_width) = (dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim);
    let linear = |path, inp, out| Part::Linear { path, inp, out, bias: false, std };
    let norm = |path, width| Part::Vector { path, width, init: 0.0 };
    let mut block = vec![
        norm("input_layernorm.weight", d),
        linear("self_attn.q_proj", d, q_width),
        linear("self_attn.k_proj", d, kv_width),
        linear("self_attn.v_proj", d, kv_width),
        Part::Attention { path: "self_attn.sdpa", heads: dims.heads, head_dim: dims.head_dim },
        linear("self_attn.o_proj", q_width, d),
    ];
    if m.gemma.qk_norm {
        block.extend([norm("self_attn.q_norm.weight", dims.head_dim), norm("self_attn.k_norm.weight", dims.head_dim)]);
    }
    block.extend([
        norm("post_attention_layernorm.weight", d),
        norm("pre_feedforward_layernorm.weight", d),
        linear("mlp.gate_proj", d, dims.inner),
        linear("mlp.up_proj", d, dims.inner),
        linear("mlp.down_proj", dims.inner, d),
        norm("post_feedforward_layernorm.weight", d),
    ]);
    Layout {
        before: vec![Part::Table { path: "model.embed_tokens.weight", rows: m.vocab_size, cols: d, std }],
        blocks_at: "model.layers",
        blocks: m.n_layer,
        block,
        exceptions: Vec::new(),
        after: vec![norm("model.norm.weight", d), Part::TiedHead { inp: d, out: m.vocab_size }],
    }
}

/// Gemma's scaled token embedding, its two RoPE tables, final norm and tied head.
pub struct Gemma {
    embed_tokens: Tensor,
    /// `sqrt(hidden_size)` as transformers keeps it: a float32 scalar.
    embed_scale: Tensor,
    norm: GemmaNorm,
    /// The full-attention layers' RoPE (table 0), then the sliding layers' (table 1).
    ropes: [Rope; 2],
    config: ModelConfig,
    /// LoRA's adapters draw dropout.
    lora_draws: bool,
}

impl Gemma {
    /// The model, with LoRA adapters on the linear layers `targets` names, calling
    /// `after_block(i)` once block `i`'s variables exist.
    pub fn decoder_with(vs: &nn::Path, m: &ModelConfig, targets: Targets, after_block: &mut dyn FnMut(usize)) -> Decoder<Gemma> {
        let (layout, dims, types) = (layout(m), dims(m), layer_types(m));
        let embed_tokens = Made::new(vs, &layout.before, m, Targets::NONE).tensor("model.embed_tokens.weight");
        let layers = (0..layout.blocks)
            .map(|i| {
                let window = (types[i as usize] == LayerType::SlidingAttention).then_some(m.gemma.sliding_window);
                let made = Made::new(&(vs / "model" / "layers" / i), &layout.block, m, targets);
                built(GemmaBlock::new(made, dims, window), i, after_block)
            })
            .collect();
        let norm = GemmaNorm { weight: Made::new(vs, &layout.after, m, Targets::NONE).tensor("model.norm.weight"), eps: dims.eps };
        let local = if m.gemma.rope_local_theta > 0.0 { m.gemma.rope_local_theta } else { m.gemma.rope_theta };
        let rope = |theta| Rope::of(&rope::default_frequencies(theta, dims.head_dim, vs.device()), m.block_size);
        let embed_scale = Tensor::from_slice(&[(m.n_embd as f64).sqrt() as f32]).to_device(vs.device());
        let family =
            Gemma { embed_tokens, embed_scale, norm, ropes: [rope(m.gemma.rope_theta), rope(local)], config: m.clone(), lora_draws: targets.draws() };
        Decoder::new(family, layers)
    }
}

impl Family for Gemma {
    type Block = GemmaBlock;

    fn kind(&self) -> &'static str {
        "gemma"
    }

    fn context(&self) -> i64 {
        self.ropes[0].positions()
    }

    /// The rows times `sqrt(hidden_size)` cast to the embedding's type (as
    /// `Gemma2TextScaledWordEmbedding`: in bf16 that is 55.5 for 55.4256).
    fn embed(&self, tokens: &Tensor, _at: Positions, _train: bool) -> Result<Tensor> {
        let rows = decoder::lookup(&self.embed_tokens, tokens, true)?;
        Ok(rows.f_mul(&self.embed_scale.f_to_kind(self.embed_tokens.kind())?)?)
    }

    /// The full-attention layers' table, then the sliding layers' (their own base in
    /// Gemma 3), in the embedding's type as `transformers` casts them.
    fn rotary(&self, at: Positions, kind: Kind) -> Result<Vec<(Tensor, Tensor)>> {
        let table = |rope: &Rope| match at {
            Positions::Given(p) => rope.at(p, kind),
            Positions::From { start, len } => rope.window(start, len, kind),
        };
        Ok(vec![table(&self.ropes[0])?, table(&self.ropes[1])?])
    }

    fn norm(&self, x: &Tensor) -> Result<Tensor> {
        self.norm.forward(x)
    }

    /// The token embedding (`lm_head` is tied to it).
    fn head(&self) -> &Tensor {
        &self.embed_tokens
    }

    fn logit_softcap(&self) -> Option<f64> {
        (self.config.gemma.final_softcap > 0.0).then_some(self.config.gemma.final_softcap)
    }

    fn draws(&self) -> bool {
        self.config.dropout > 0.0 || self.lora_draws
    }

    fn layout(&self) -> Layout {
        layout(&self.config)
    }
}
