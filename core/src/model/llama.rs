//! The Llama family as `transformers` computes it (`LlamaForCausalLM`,
//! `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `MistralForCausalLM` without a sliding
//! window): RMSNorm in float32, rotary positions, grouped-query attention, a SwiGLU
//! MLP. Parameters carry the Hugging Face names (`model.layers.0.self_attn.q_proj.weight`),
//! so loading and exporting are a copy, with no renaming or transposition.

use std::sync::Arc;

use tch::{nn, Kind, Tensor};

use super::{
    checkpointing::Checkpoints,
    kv_cache::KvCache,
    lora::{self, Targets},
    rope::{self, Rope},
    Layer, LayerKind, Model, Task,
};
use crate::{
    config::{LlamaArgs, ModelConfig, TrainConfig},
    data::Segments,
    error::Result,
};

/// `transformers`' `initializer_range`.
const INIT_STD: f64 = 0.02;

// The forward pass uses tch's `f_` functions, so a libtorch error (a bad shape, out
// of memory) comes back as an error, not a panic.

fn apply(l: &lora::Linear, x: &Tensor, train: bool) -> Result<Tensor> {
    l.forward(x, train)
}

/// The module's name (`q_proj`, ...) picks whether LoRA adapts it.
fn linear(vs: nn::Path, module: &str, inp: i64, out: i64, bias: bool, targets: Targets) -> lora::Linear {
    lora::Linear::new(&vs / module, module, inp, out, bias, INIT_STD, targets)
}

/// `LlamaRMSNorm`: normalised in float32, cast back to the input's type, then
/// scaled by the weight (in that order: it matters in bf16).
#[derive(Debug)]
struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn new(vs: nn::Path, d: i64, eps: f64) -> RmsNorm {
        RmsNorm { weight: vs.var("weight", &[d], nn::Init::Const(1.0)), eps }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x32 = x.f_to_kind(Kind::Float)?;
        let variance = x32.f_square()?.f_mean_dim(-1, true, Kind::Float)?;
        let normed = x32.f_mul(&variance.f_add_scalar(self.eps)?.f_rsqrt()?)?;
        Ok(self.weight.f_mul(&normed.f_to_kind(x.kind())?)?)
    }
}

/// Shapes shared by every layer.
#[derive(Debug, Clone, Copy)]
struct Dims {
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    dropout: f64,
}

#[derive(Debug)]
struct DecoderLayer {
    input_norm: RmsNorm,
    q_proj: lora::Linear,
    k_proj: lora::Linear,
    v_proj: lora::Linear,
    o_proj: lora::Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    post_norm: RmsNorm,
    gate_proj: lora::Linear,
    up_proj: lora::Linear,
    down_proj: lora::Linear,
    dims: Dims,
}

// SAFETY: a layer's tensors are only read (each op makes a new tensor), which libtorch
// allows from several threads at once; the checkpoint's recompute may run it on an
// autograd worker thread.
unsafe impl Sync for DecoderLayer {}

impl DecoderLayer {
    fn new(vs: nn::Path, m: &ModelConfig, dims: Dims, lo: Targets) -> DecoderLayer {
        let (a, d) = (&m.llama, m.n_embd);
        let attn = &vs / "self_attn";
        let mlp = &vs / "mlp";
        let (q_width, kv_width, inner) = (dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim, a.mlp_width(d));
        DecoderLayer {
            input_norm: RmsNorm::new(&vs / "input_layernorm", d, a.rms_norm_eps),
            q_proj: linear(attn.clone(), "q_proj", d, q_width, a.qkv_bias, lo),
            k_proj: linear(attn.clone(), "k_proj", d, kv_width, a.qkv_bias, lo),
            v_proj: linear(attn.clone(), "v_proj", d, kv_width, a.qkv_bias, lo),
            o_proj: linear(attn.clone(), "o_proj", q_width, d, a.o_bias, lo),
            q_norm: a.qk_norm.then(|| RmsNorm::new(&attn / "q_norm", dims.head_dim, a.rms_norm_eps)),
            k_norm: a.qk_norm.then(|| RmsNorm::new(&attn / "k_norm", dims.head_dim, a.rms_norm_eps)),
            post_norm: RmsNorm::new(&vs / "post_attention_layernorm", d, a.rms_norm_eps),
            gate_proj: linear(mlp.clone(), "gate_proj", d, inner, a.mlp_bias, lo),
            up_proj: linear(mlp.clone(), "up_proj", d, inner, a.mlp_bias, lo),
            down_proj: linear(mlp, "down_proj", inner, d, a.mlp_bias, lo),
            dims,
        }
    }

    /// `[B, T, width]` projections as `[B, heads, T, head_dim]`, each head normed (Qwen3).
    fn heads(&self, x: Tensor, heads: i64, norm: Option<&RmsNorm>) -> Result<Tensor> {
        let (b, t, _) = x.size3()?;
        let x = x.f_view([b, t, heads, self.dims.head_dim])?;
        let x = match norm {
            Some(n) => n.forward(&x)?,
            None => x,
        };
        Ok(x.f_transpose(1, 2)?)
    }

    /// One layer over `x` `[B, T, D]` with those positions' cos and sin; with a cache,
    /// the new keys and values join it and the queries attend over all it holds.
    fn forward(
        &self,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        train: bool,
        cache: Option<(&mut KvCache, usize)>,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (b, t, _) = x.size3()?;
        let h = self.input_norm.forward(x)?;
        let q = self.heads(apply(&self.q_proj, &h, train)?, self.dims.heads, self.q_norm.as_ref())?;
        let k = self.heads(apply(&self.k_proj, &h, train)?, self.dims.kv_heads, self.k_norm.as_ref())?;
        let v = self.heads(apply(&self.v_proj, &h, train)?, self.dims.kv_heads, None)?;
        let (q, k) = (rope::apply(&q, cos, sin)?, rope::apply(&k, cos, sin)?);
        let p = if train { self.dims.dropout } else { 0.0 };
        let y = match (cache, mask) {
            (None, None) => Tensor::f_scaled_dot_product_attention::<Tensor>(&q, &k, &v, None, p, true, None, true)?,
            (None, Some(mask)) => Tensor::f_scaled_dot_product_attention(&q, &k, &v, Some(mask), p, false, None, true)?,
            (Some((cache, layer)), _) => {
                let seen = cache.append(layer, &k, &v)?;
                Tensor::f_scaled_dot_product_attention(&q, &seen.keys, &seen.values, seen.mask.as_ref(), 0.0, seen.causal, None, true)?
            }
        };
        let y = y.f_transpose(1, 2)?.f_reshape([b, t, self.dims.heads * self.dims.head_dim])?;
        let x = x.f_add(&apply(&self.o_proj, &y, train)?)?;
        let h = self.post_norm.forward(&x)?;
        let gated = apply(&self.gate_proj, &h, train)?.f_silu()?.f_mul(&apply(&self.up_proj, &h, train)?)?;
        Ok(x.f_add(&apply(&self.down_proj, &gated, train)?)?)
    }

    /// The training forward over `[x, cos, sin]` or `[x, cos, sin, mask]`, as a
    /// checkpoint recomputes it.
    fn checkpointed(&self, inputs: &[Tensor]) -> Result<Tensor> {
        self.forward(&inputs[0], (&inputs[1], &inputs[2]), true, None, inputs.get(3))
    }
}

pub struct Llama {
    embed_tokens: nn::Embedding,
    layers: Vec<Arc<DecoderLayer>>,
    norm: RmsNorm,
    /// `None` when the head is the token embedding (`tie_word_embeddings`).
    lm_head: Option<Tensor>,
    rope: Rope,
    config: ModelConfig,
    checkpoints: Checkpoints,
    /// LoRA's adapters draw dropout.
    lora_draws: bool,
}

impl Llama {
    pub fn new(vs: &nn::Path, m: &ModelConfig) -> Llama {
        Llama::with_lora(vs, m, Targets::NONE)
    }

    /// With LoRA adapters on the linear layers `targets` names.
    pub fn with_lora(vs: &nn::Path, m: &ModelConfig, targets: Targets) -> Llama {
        let a: &LlamaArgs = &m.llama;
        let dims = Dims { heads: m.n_head, kv_heads: a.kv_heads(m.n_head), head_dim: a.head_width(m.n_embd, m.n_head), dropout: m.dropout };
        let model = vs / "model";
        let emb = nn::EmbeddingConfig { ws_init: nn::Init::Randn { mean: 0.0, stdev: INIT_STD }, ..Default::default() };
        let lm_head =
            (!a.tie_embeddings).then(|| (vs / "lm_head").var("weight", &[m.vocab_size, m.n_embd], nn::Init::Randn { mean: 0.0, stdev: INIT_STD }));
        Llama {
            embed_tokens: nn::embedding(&model / "embed_tokens", m.vocab_size, m.n_embd, emb),
            layers: (0..m.n_layer).map(|i| Arc::new(DecoderLayer::new(&model / "layers" / i, m, dims, targets))).collect(),
            norm: RmsNorm::new(&model / "norm", m.n_embd, a.rms_norm_eps),
            lm_head,
            rope: Rope::new(a, dims.head_dim, m.block_size, vs.device()),
            config: m.clone(),
            checkpoints: Checkpoints::default(),
            lora_draws: targets.draws(),
        }
    }

    /// Activation checkpointing of the layers `train.activation_checkpointing` picks.
    pub fn checkpoint_blocks(&mut self, train: &TrainConfig) -> Result<()> {
        self.checkpoints = Checkpoints::new(train, &self.layers, DecoderLayer::checkpointed)?;
        Ok(())
    }

    fn run(&self, inputs: &Tensor, train: bool, cache: Option<&mut KvCache>, packed: Option<&Segments>) -> Result<Tensor> {
        Ok(self.hidden(inputs, train, cache, packed)?.f_linear::<Tensor>(self.head(), None)?)
    }

    /// The output projection: `lm_head`, or the token embedding when tied.
    fn head(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens.ws)
    }

    /// The final-normed hidden states, before the output projection.
    fn hidden(&self, inputs: &Tensor, train: bool, mut cache: Option<&mut KvCache>, packed: Option<&Segments>) -> Result<Tensor> {
        let t = inputs.size().last().copied().unwrap_or(0);
        let start = cache.as_ref().map_or(0, |c| c.len());
        if start + t > self.rope.positions() {
            return Err(crate::error::Error::Other(format!(
                "{} positions exceed the model's context of {} (model.block_size)",
                start + t,
                self.rope.positions()
            )));
        }
        if let Some(c) = cache.as_deref() {
            c.reserve(t)?;
        }
        let mut x = Tensor::f_embedding(&self.embed_tokens.ws, inputs, -1, false, false)?;
        // In the embedding's type, as `transformers` casts them: float32 for float32
        // weights, also under autocast (q and k then rotate in float32).
        let (cos, sin) = match packed {
            Some(s) => self.rope.at(&s.positions, x.kind())?,
            None => self.rope.window(start, t, x.kind())?,
        };
        let mask = packed.map(|s| super::packed_attention_mask(&s.ids)).transpose()?;
        let extras: Vec<&Tensor> = [&cos, &sin].into_iter().chain(mask.as_ref()).collect();
        for (i, layer) in self.layers.iter().enumerate() {
            x = match self.checkpoints.run(i, train && cache.is_none(), &x, &extras) {
                Some(out) => out?,
                None => layer.forward(&x, (&cos, &sin), train, cache.as_deref_mut().map(|c| (c, i)), mask.as_ref())?,
            };
        }
        if let Some(c) = cache {
            c.advance(t);
        }
        self.norm.forward(&x)
    }
}

impl Model for Llama {
    fn forward(&mut self, inputs: &Tensor, train: bool) -> Result<Tensor> {
        self.run(inputs, train, None, None)
    }

    fn forward_packed(&mut self, inputs: &Tensor, segments: &Segments, train: bool) -> Result<Tensor> {
        self.run(inputs, train, None, Some(segments))
    }

    fn forward_cached(&mut self, inputs: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        self.run(inputs, false, Some(cache), None)
    }

    fn forward_hidden(&mut self, inputs: &Tensor, segments: Option<&Segments>, train: bool) -> Result<Option<(Tensor, Tensor)>> {
        Ok(Some((self.hidden(inputs, train, None, segments)?, self.head().shallow_clone())))
    }

    fn new_cache(&self, capacity: i64) -> Option<KvCache> {
        Some(KvCache::new(self.layers.len(), capacity.min(self.config.block_size)))
    }

    fn task(&self) -> Task {
        Task::LanguageModel
    }

    fn kind(&self) -> &str {
        "llama"
    }

    fn uses_randomness(&self) -> bool {
        self.config.dropout > 0.0 || self.lora_draws
    }

    fn layers(&self, seq_len: i64) -> Vec<Layer> {
        let (m, t) = (&self.config, seq_len);
        let (d, a) = (m.n_embd, &m.llama);
        let (hd, kv) = (a.head_width(d, m.n_head), a.kv_heads(m.n_head));
        let (q_width, kv_width, inner) = (m.n_head * hd, kv * hd, a.mlp_width(d));
        let mut layers = Vec::new();
        for i in 0..m.n_layer {
            let name = |s: &str| format!("model.layers.{i}.{s}");
            layers.push(Layer::linear(name("self_attn.q_proj"), d, q_width, t, true));
            layers.push(Layer::linear(name("self_attn.k_proj"), d, kv_width, t, true));
            layers.push(Layer::linear(name("self_attn.v_proj"), d, kv_width, t, true));
            // Every query head attends: grouped keys and values save memory, not matmul work.
            layers.push(Layer {
                kind: LayerKind::Attention,
                heads: m.n_head as u64,
                head_dim: hd as u64,
                seq_len: t as u64,
                ..Layer::linear(name("self_attn.sdpa"), q_width, q_width, t, true)
            });
            layers.push(Layer::linear(name("self_attn.o_proj"), q_width, d, t, true));
            layers.push(Layer::linear(name("mlp.gate_proj"), d, inner, t, true));
            layers.push(Layer::linear(name("mlp.up_proj"), d, inner, t, true));
            layers.push(Layer::linear(name("mlp.down_proj"), inner, d, t, true));
        }
        layers.push(Layer::linear("lm_head", d, m.vocab_size, t, true));
        layers
    }
}
