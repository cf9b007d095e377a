//! A decoder-only transformer (bytes by default: vocabulary 256), laid out as
//! nanoGPT so parameter names match: `transformer.h.0.attn.c_attn.weight`, ...
//! Its [`Block`] and [`Family`]; the loop around them is the shared [`Decoder`].

use tch::{nn, Kind, Tensor};

use super::{
    decoder::{self, built, normal_unless_loaded, Block, BlockInput, Decoder, Family, Positions},
    lora::{self, Targets},
    Layer, LayerKind,
};
use crate::{config::ModelConfig, error::Result};

// The forward pass uses tch's `f_` functions, so a libtorch error (a bad shape,
// out of memory) comes back as an error, not a panic.

fn norm(l: &nn::LayerNorm, x: &Tensor, eps: f64) -> Result<Tensor> {
    Ok(x.f_layer_norm(l.normalized_shape.as_slice(), l.ws.as_ref(), l.bs.as_ref(), eps, true)?)
}

/// The module's name (`c_attn`, ...) picks whether LoRA adapts it.
fn init_linear(vs: nn::Path, module: &str, inp: i64, out: i64, bias: bool, ws_init: nn::Init, targets: Targets) -> lora::Linear {
    lora::Linear::new(vs, module, inp, out, bias, ws_init, targets)
}

fn layer_norm(vs: nn::Path, d: i64, eps: f64) -> nn::LayerNorm {
    nn::layer_norm(vs, vec![d], nn::LayerNormConfig { eps, ..Default::default() })
}

pub struct GptBlock {
    ln_1: nn::LayerNorm,
    c_attn: lora::Linear,
    attn_proj: lora::Linear,
    ln_2: nn::LayerNorm,
    c_fc: lora::Linear,
    mlp_proj: lora::Linear,
    n_head: i64,
    dropout: f64,
    eps: f64,
    /// `gelu`'s `approximate` argument: "none" or "tanh" (GPT-2's `gelu_new`).
    gelu: &'static str,
}

// SAFETY: a block's tensors are only read (each op makes a new tensor), which libtorch
// allows from several threads at once; the checkpoint's recompute may run it on an
// autograd worker thread.
unsafe impl Sync for GptBlock {}

impl GptBlock {
    fn new(vs: nn::Path, c: &ModelConfig, lo: Targets) -> GptBlock {
        let d = c.n_embd;
        // GPT-2's scaled init of residual projections.
        let (init, proj_init) = (normal_unless_loaded(c, 0.02), normal_unless_loaded(c, 0.02 / (2.0 * c.n_layer as f64).sqrt()));
        GptBlock {
            ln_1: layer_norm(&vs / "ln_1", d, c.gpt.layer_norm_eps),
            c_attn: init_linear(&vs / "attn" / "c_attn", "c_attn", d, 3 * d, c.gpt.bias, init, lo),
            attn_proj: init_linear(&vs / "attn" / "c_proj", "c_proj", d, d, c.gpt.bias, proj_init, lo),
            ln_2: layer_norm(&vs / "ln_2", d, c.gpt.layer_norm_eps),
            c_fc: init_linear(&vs / "mlp" / "c_fc", "c_fc", d, 4 * d, c.gpt.bias, init, lo),
            mlp_proj: init_linear(&vs / "mlp" / "c_proj", "c_proj", 4 * d, d, c.gpt.bias, proj_init, lo),
            n_head: c.n_head,
            dropout: c.dropout,
            eps: c.gpt.layer_norm_eps,
            gelu: c.gpt.activation.approximate(),
        }
    }
}

impl Block for GptBlock {
    fn forward(&self, x: &Tensor, input: &mut BlockInput) -> Result<Tensor> {
        let train = input.train;
        let (b, t, d) = x.size3()?;
        let heads = |z: &Tensor| z.f_view([b, t, self.n_head, d / self.n_head])?.f_transpose(1, 2);
        let qkv = self.c_attn.forward(&norm(&self.ln_1, x, self.eps)?, train)?.f_split(d, 2)?;
        let p = if train { self.dropout } else { 0.0 };
        let (q, k, v) = (heads(&qkv[0])?, heads(&qkv[1])?, heads(&qkv[2])?);
        let y = input.attend.sdpa(&q, &k, &v, p, false)?;
        let y = y.f_transpose(1, 2)?.f_contiguous()?.f_view([b, t, d])?;
        let x = x.f_add(&self.attn_proj.forward(&y, train)?.f_dropout(self.dropout, train)?)?;
        let h = self.c_fc.forward(&norm(&self.ln_2, &x, self.eps)?, train)?.f_gelu(self.gelu)?;
        Ok(x.f_add(&self.mlp_proj.forward(&h, train)?.f_dropout(self.dropout, train)?)?)
    }

    fn linears(&self) -> Vec<&lora::Linear> {
        vec![&self.c_attn, &self.attn_proj, &self.c_fc, &self.mlp_proj]
    }
}

/// GPT-2's embeddings (tokens + learned positions), final LayerNorm and tied head.
pub struct Gpt {
    wte: nn::Embedding,
    wpe: nn::Embedding,
    ln_f: nn::LayerNorm,
    config: ModelConfig,
    /// LoRA's adapters draw dropout.
    lora_draws: bool,
}

impl Gpt {
    /// The model, with LoRA adapters on the linear layers `targets` names.
    pub fn decoder(vs: &nn::Path, c: &ModelConfig, targets: Targets) -> Decoder<Gpt> {
        Gpt::decoder_with(vs, c, targets, &mut |_| {})
    }

    /// As [`Gpt::decoder`], calling `after_block(i)` once block `i`'s variables exist.
    pub fn decoder_with(vs: &nn::Path, c: &ModelConfig, targets: Targets, after_block: &mut dyn FnMut(usize)) -> Decoder<Gpt> {
        let t = vs / "transformer";
        let emb = nn::EmbeddingConfig { ws_init: normal_unless_loaded(c, 0.02), ..Default::default() };
        let wte = nn::embedding(&t / "wte", c.vocab_size, c.n_embd, emb);
        let wpe = nn::embedding(&t / "wpe", c.block_size, c.n_embd, emb);
        let blocks = (0..c.n_layer).map(|i| built(GptBlock::new(&t / "h" / i, c, targets), i, after_block)).collect();
        let ln_f = layer_norm(&t / "ln_f", c.n_embd, c.gpt.layer_norm_eps);
        Decoder::new(Gpt { wte, wpe, ln_f, config: c.clone(), lora_draws: targets.draws() }, blocks)
    }
}

impl Family for Gpt {
    type Block = GptBlock;

    fn kind(&self) -> &'static str {
        "gpt"
    }

    fn context(&self) -> i64 {
        self.config.block_size
    }

    fn embed(&self, tokens: &Tensor, at: Positions, train: bool) -> Result<Tensor> {
        let pos = match at {
            Positions::Given(p) => p.shallow_clone(),
            Positions::From { start, len } => Tensor::f_arange_start(start, start + len, (Kind::Int64, tokens.device()))?,
        };
        // wte is the head too; wpe is not.
        let tokens = decoder::lookup(&self.wte.ws, tokens, true)?;
        Ok(tokens.f_add(&decoder::lookup(&self.wpe.ws, &pos, false)?)?.f_dropout(self.config.dropout, train)?)
    }

    fn norm(&self, x: &Tensor) -> Result<Tensor> {
        norm(&self.ln_f, x, self.config.gpt.layer_norm_eps)
    }

    /// The token embedding (weight tying, as GPT-2).
    fn head(&self) -> &Tensor {
        &self.wte.ws
    }

    fn draws(&self) -> bool {
        self.config.dropout > 0.0 || self.lora_draws
    }

    fn layers(&self, seq_len: i64) -> Vec<Layer> {
        let (d, t) = (self.config.n_embd, seq_len);
        let mut layers = Vec::new();
        for i in 0..self.config.n_layer {
            let name = |s: &str| format!("transformer.h.{i}.{s}");
            layers.push(Layer::linear(name("attn.c_attn"), d, 3 * d, t, true));
            layers.push(Layer {
                kind: LayerKind::Attention,
                heads: self.config.n_head as u64,
                head_dim: (d / self.config.n_head) as u64,
                seq_len: t as u64,
                ..Layer::linear(name("attn.sdpa"), d, d, t, true)
            });
            layers.push(Layer::linear(name("attn.c_proj"), d, d, t, true));
            layers.push(Layer::linear(name("mlp.c_fc"), d, 4 * d, t, true));
            layers.push(Layer::linear(name("mlp.c_proj"), 4 * d, d, t, true));
        }
        layers.push(Layer::linear("lm_head", d, self.config.vocab_size, t, true));
        layers
    }
}
