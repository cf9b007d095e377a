//! The Llama family as `transformers` computes it (`LlamaForCausalLM`,
//! `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `MistralForCausalLM` without a sliding
//! window): RMSNorm in float32, rotary positions, grouped-query attention, a SwiGLU
//! MLP. Parameters carry the Hugging Face names (`model.layers.0.self_attn.q_proj.weight`),
//! so loading and exporting are a copy, with no renaming or transposition.

use tch::{nn, Kind, Tensor};

use super::{
    decoder::{self, built, normal_unless_loaded, Block, BlockInput, Decoder, Family, Positions},
    lora::{self, Targets},
    rope::{self, Rope},
    Layer, LayerKind,
};
use crate::{
    config::{LlamaArgs, ModelConfig},
    error::Result,
};

/// `transformers`' `initializer_range`.
const INIT_STD: f64 = 0.02;

// The forward pass uses tch's `f_` functions, so a libtorch error (a bad shape, out
// of memory) comes back as an error, not a panic.

/// The module's name (`q_proj`, ...) picks whether LoRA adapts it.
fn linear(vs: nn::Path, module: &str, inp: i64, out: i64, bias: bool, m: &ModelConfig, targets: Targets) -> lora::Linear {
    lora::Linear::new(&vs / module, module, inp, out, bias, normal_unless_loaded(m, INIT_STD), targets)
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

/// SwiGLU's gating `silu(gate) * up`, keeping only `gate` and `up` for backward
/// ([`ptrain_torch_ext::swiglu`], as Liger's fused SwiGLU): autograd's two nodes would
/// also keep `silu(gate)`, one more `[tokens, intermediate]` tensor per block (10 MB
/// at Qwen2-0.5B's 4,864 and 512 tokens). The gradients are autograd's bit for bit.
fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    #[cfg(test)]
    if tests::UNFUSED.get() {
        return Ok(gate.f_silu()?.f_mul(up)?);
    }
    ptrain_torch_ext::swiglu(gate, up).map_err(|e| crate::error::Error::Other(format!("swiglu: {e}")))
}

/// Backward recomputes the SwiGLU product `gated` from `gate` and `up` (which the fused
/// SwiGLU keeps anyway) instead of keeping it for the down projection `down`, whose
/// weight gradient (full fine-tuning) or adapter A gradient (LoRA) needs it: an
/// elementwise op recomputed for one `[tokens, intermediate]` tensor less per block
/// (10 MB at Qwen2-0.5B's 4,864 and 512 tokens; 240 MB over its 24 blocks), with
/// autograd's own backward, so the gradients are the same bit for bit. Torchtitan's
/// op-level selective recompute, for this op. Nothing to do without a graph (evaluation,
/// a checkpointed block's forward), nor with LoRA dropout in training (the adapter's A
/// then keeps its dropped-out input, not the product).
fn recompute_in_backward(down: &Tensor, gated: &Tensor, gate: &Tensor, up: &Tensor) -> Result<()> {
    #[cfg(test)]
    if tests::PRODUCT_KEPT.get() {
        return Ok(());
    }
    let _dropped = ptrain_torch_ext::recompute_swiglu_product(down, gated, gate, up)
        .map_err(|e| crate::error::Error::Other(format!("swiglu recompute: {e}")))?;
    #[cfg(test)]
    tests::PRODUCTS_DROPPED.set(tests::PRODUCTS_DROPPED.get() + _dropped);
    Ok(())
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
pub struct LlamaBlock {
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
unsafe impl Sync for LlamaBlock {}

impl LlamaBlock {
    fn new(vs: nn::Path, m: &ModelConfig, dims: Dims, lo: Targets) -> LlamaBlock {
        let (a, d) = (&m.llama, m.n_embd);
        let attn = &vs / "self_attn";
        let mlp = &vs / "mlp";
        let (q_width, kv_width, inner) = (dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim, a.mlp_width(d));
        LlamaBlock {
            input_norm: RmsNorm::new(&vs / "input_layernorm", d, a.rms_norm_eps),
            q_proj: linear(attn.clone(), "q_proj", d, q_width, a.qkv_bias, m, lo),
            k_proj: linear(attn.clone(), "k_proj", d, kv_width, a.qkv_bias, m, lo),
            v_proj: linear(attn.clone(), "v_proj", d, kv_width, a.qkv_bias, m, lo),
            o_proj: linear(attn.clone(), "o_proj", q_width, d, a.o_bias, m, lo),
            q_norm: a.qk_norm.then(|| RmsNorm::new(&attn / "q_norm", dims.head_dim, a.rms_norm_eps)),
            k_norm: a.qk_norm.then(|| RmsNorm::new(&attn / "k_norm", dims.head_dim, a.rms_norm_eps)),
            post_norm: RmsNorm::new(&vs / "post_attention_layernorm", d, a.rms_norm_eps),
            gate_proj: linear(mlp.clone(), "gate_proj", d, inner, a.mlp_bias, m, lo),
            up_proj: linear(mlp.clone(), "up_proj", d, inner, a.mlp_bias, m, lo),
            down_proj: linear(mlp, "down_proj", inner, d, a.mlp_bias, m, lo),
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
}

impl Block for LlamaBlock {
    /// One layer over `x` `[B, T, D]` with RoPE's cos and sin at its positions.
    fn forward(&self, x: &Tensor, input: &mut BlockInput) -> Result<Tensor> {
        let train = input.train;
        let (cos, sin) = input.rotary.ok_or_else(|| crate::error::Error::Other("a llama layer needs RoPE's tables".into()))?;
        let (b, t, _) = x.size3()?;
        let h = self.input_norm.forward(x)?;
        let [q, k, v] = lora::forward_shared([&self.q_proj, &self.k_proj, &self.v_proj], &h, train)?;
        let q = self.heads(q, self.dims.heads, self.q_norm.as_ref())?;
        let k = self.heads(k, self.dims.kv_heads, self.k_norm.as_ref())?;
        let v = self.heads(v, self.dims.kv_heads, None)?;
        let (q, k) = (rope::apply(&q, cos, sin)?, rope::apply(&k, cos, sin)?);
        let p = if train { self.dims.dropout } else { 0.0 };
        let y = input.attend.sdpa(&q, &k, &v, p, true)?;
        let y = y.f_transpose(1, 2)?.f_reshape([b, t, self.dims.heads * self.dims.head_dim])?;
        let x = x.f_add(&self.o_proj.forward(&y, train)?)?;
        let h = self.post_norm.forward(&x)?;
        let [gate, up] = lora::forward_shared([&self.gate_proj, &self.up_proj], &h, train)?;
        let gated = swiglu(&gate, &up)?;
        let down = self.down_proj.forward_with(&gated, Some((&gate, &up)), train)?;
        recompute_in_backward(&down, &gated, &gate, &up)?;
        Ok(x.f_add(&down)?)
    }

    fn linears(&self) -> Vec<&lora::Linear> {
        vec![&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj, &self.gate_proj, &self.up_proj, &self.down_proj]
    }
}

/// Llama's token embedding, rotary tables, final RMSNorm and head.
pub struct Llama {
    embed_tokens: nn::Embedding,
    norm: RmsNorm,
    /// `None` when the head is the token embedding (`tie_word_embeddings`).
    lm_head: Option<Tensor>,
    rope: Rope,
    config: ModelConfig,
    /// LoRA's adapters draw dropout.
    lora_draws: bool,
}

impl Llama {
    /// The model, with LoRA adapters on the linear layers `targets` names.
    pub fn decoder(vs: &nn::Path, m: &ModelConfig, targets: Targets) -> Decoder<Llama> {
        Llama::decoder_with(vs, m, targets, &mut |_| {})
    }

    /// As [`Llama::decoder`], calling `after_block(i)` once block `i`'s variables exist.
    pub fn decoder_with(vs: &nn::Path, m: &ModelConfig, targets: Targets, after_block: &mut dyn FnMut(usize)) -> Decoder<Llama> {
        let a: &LlamaArgs = &m.llama;
        let dims = Dims { heads: m.n_head, kv_heads: a.kv_heads(m.n_head), head_dim: a.head_width(m.n_embd, m.n_head), dropout: m.dropout };
        let model = vs / "model";
        let emb = nn::EmbeddingConfig { ws_init: normal_unless_loaded(m, INIT_STD), ..Default::default() };
        // The random initialisation draws in creation order: changing it changes the weights.
        let lm_head = (!a.tie_embeddings).then(|| (vs / "lm_head").var("weight", &[m.vocab_size, m.n_embd], normal_unless_loaded(m, INIT_STD)));
        let embed_tokens = nn::embedding(&model / "embed_tokens", m.vocab_size, m.n_embd, emb);
        let layers = (0..m.n_layer).map(|i| built(LlamaBlock::new(&model / "layers" / i, m, dims, targets), i, after_block)).collect();
        let norm = RmsNorm::new(&model / "norm", m.n_embd, a.rms_norm_eps);
        let rope = Rope::new(a, dims.head_dim, m.block_size, vs.device());
        Decoder::new(Llama { embed_tokens, norm, lm_head, rope, config: m.clone(), lora_draws: targets.draws() }, layers)
    }
}

impl Family for Llama {
    type Block = LlamaBlock;

    fn kind(&self) -> &'static str {
        "llama"
    }

    fn context(&self) -> i64 {
        self.rope.positions()
    }

    fn embed(&self, tokens: &Tensor, _at: Positions, _train: bool) -> Result<Tensor> {
        decoder::lookup(&self.embed_tokens.ws, tokens, self.lm_head.is_none())
    }

    /// In the embedding's type, as `transformers` casts them: float32 for float32
    /// weights, also under autocast (q and k then rotate in float32).
    fn rotary(&self, at: Positions, kind: Kind) -> Result<Option<(Tensor, Tensor)>> {
        Ok(Some(match at {
            Positions::Given(p) => self.rope.at(p, kind)?,
            Positions::From { start, len } => self.rope.window(start, len, kind)?,
        }))
    }

    fn norm(&self, x: &Tensor) -> Result<Tensor> {
        self.norm.forward(x)
    }

    /// `lm_head`, or the token embedding when tied.
    fn head(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens.ws)
    }

    fn draws(&self) -> bool {
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

#[cfg(test)]
mod tests;
