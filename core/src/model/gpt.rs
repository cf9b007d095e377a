//! A decoder-only transformer (bytes by default: vocabulary 256), laid out as
//! nanoGPT so parameter names match: `transformer.h.0.attn.c_attn.weight`, ...

use std::sync::Arc;

use tch::{nn, Kind, Tensor};

use super::{
    checkpointing::Checkpoints,
    kv_cache::KvCache,
    lora::{self, Targets},
    Layer, LayerKind, Model, Task,
};
use crate::{
    config::{ModelConfig, TrainConfig},
    data::Segments,
    error::Result,
};

// The forward pass uses tch's `f_` functions, so a libtorch error (a bad shape,
// out of memory) comes back as an error, not a panic.

fn linear(l: &lora::Linear, x: &Tensor, train: bool) -> Result<Tensor> {
    l.forward(x, train)
}

fn norm(l: &nn::LayerNorm, x: &Tensor, eps: f64) -> Result<Tensor> {
    Ok(x.f_layer_norm(l.normalized_shape.as_slice(), l.ws.as_ref(), l.bs.as_ref(), eps, true)?)
}

fn embed(e: &nn::Embedding, ids: &Tensor) -> Result<Tensor> {
    Ok(Tensor::f_embedding(&e.ws, ids, -1, false, false)?)
}

/// The module's name (`c_attn`, ...) picks whether LoRA adapts it.
fn init_linear(vs: nn::Path, module: &str, inp: i64, out: i64, bias: bool, stdev: f64, targets: Targets) -> lora::Linear {
    lora::Linear::new(vs, module, inp, out, bias, stdev, targets)
}

fn layer_norm(vs: nn::Path, d: i64, eps: f64) -> nn::LayerNorm {
    nn::layer_norm(vs, vec![d], nn::LayerNormConfig { eps, ..Default::default() })
}

struct Block {
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
unsafe impl Sync for Block {}

impl Block {
    fn new(vs: nn::Path, c: &ModelConfig, lo: Targets) -> Block {
        let d = c.n_embd;
        // GPT-2's scaled init of residual projections.
        let proj_std = 0.02 / (2.0 * c.n_layer as f64).sqrt();
        Block {
            ln_1: layer_norm(&vs / "ln_1", d, c.layer_norm_eps),
            c_attn: init_linear(&vs / "attn" / "c_attn", "c_attn", d, 3 * d, c.bias, 0.02, lo),
            attn_proj: init_linear(&vs / "attn" / "c_proj", "c_proj", d, d, c.bias, proj_std, lo),
            ln_2: layer_norm(&vs / "ln_2", d, c.layer_norm_eps),
            c_fc: init_linear(&vs / "mlp" / "c_fc", "c_fc", d, 4 * d, c.bias, 0.02, lo),
            mlp_proj: init_linear(&vs / "mlp" / "c_proj", "c_proj", 4 * d, d, c.bias, proj_std, lo),
            n_head: c.n_head,
            dropout: c.dropout,
            eps: c.layer_norm_eps,
            gelu: c.activation.approximate(),
        }
    }

    /// One block; with a cache, the new keys and values join it and the queries
    /// attend over all it holds; with a mask (packed rows), only where it allows.
    fn forward(&self, x: &Tensor, train: bool, cache: Option<(&mut KvCache, usize)>, mask: Option<&Tensor>) -> Result<Tensor> {
        let (b, t, d) = x.size3()?;
        let heads = |z: &Tensor| z.f_view([b, t, self.n_head, d / self.n_head])?.f_transpose(1, 2);
        let qkv = linear(&self.c_attn, &norm(&self.ln_1, x, self.eps)?, train)?.f_split(d, 2)?;
        let p = if train { self.dropout } else { 0.0 };
        let (q, k, v) = (heads(&qkv[0])?, heads(&qkv[1])?, heads(&qkv[2])?);
        let y = match (cache, mask) {
            (None, None) => Tensor::f_scaled_dot_product_attention::<Tensor>(&q, &k, &v, None, p, true, None, false)?,
            (None, Some(mask)) => Tensor::f_scaled_dot_product_attention(&q, &k, &v, Some(mask), p, false, None, false)?,
            (Some((cache, layer)), _) => {
                let seen = cache.append(layer, &k, &v)?;
                Tensor::f_scaled_dot_product_attention(&q, &seen.keys, &seen.values, seen.mask.as_ref(), 0.0, seen.causal, None, false)?
            }
        };
        let y = y.f_transpose(1, 2)?.f_contiguous()?.f_view([b, t, d])?;
        let x = x.f_add(&linear(&self.attn_proj, &y, train)?.f_dropout(self.dropout, train)?)?;
        let h = linear(&self.c_fc, &norm(&self.ln_2, &x, self.eps)?, train)?.f_gelu(self.gelu)?;
        Ok(x.f_add(&linear(&self.mlp_proj, &h, train)?.f_dropout(self.dropout, train)?)?)
    }

    /// The training forward over `[x]` or `[x, mask]`, as a checkpoint recomputes it.
    fn checkpointed(&self, inputs: &[Tensor]) -> Result<Tensor> {
        self.forward(&inputs[0], true, None, inputs.get(1))
    }
}

pub struct Gpt {
    wte: nn::Embedding,
    wpe: nn::Embedding,
    blocks: Vec<Arc<Block>>,
    ln_f: nn::LayerNorm,
    config: ModelConfig,
    checkpoints: Checkpoints,
    /// LoRA's adapters draw dropout.
    lora_draws: bool,
}

impl Gpt {
    pub fn new(vs: &nn::Path, c: &ModelConfig) -> Gpt {
        Gpt::with_lora(vs, c, Targets::NONE)
    }

    /// With LoRA adapters on the linear layers `targets` names.
    pub fn with_lora(vs: &nn::Path, c: &ModelConfig, targets: Targets) -> Gpt {
        let t = vs / "transformer";
        let emb = nn::EmbeddingConfig { ws_init: nn::Init::Randn { mean: 0.0, stdev: 0.02 }, ..Default::default() };
        Gpt {
            wte: nn::embedding(&t / "wte", c.vocab_size, c.n_embd, emb),
            wpe: nn::embedding(&t / "wpe", c.block_size, c.n_embd, emb),
            blocks: (0..c.n_layer).map(|i| Arc::new(Block::new(&t / "h" / i, c, targets))).collect(),
            ln_f: layer_norm(&t / "ln_f", c.n_embd, c.layer_norm_eps),
            config: c.clone(),
            checkpoints: Checkpoints::default(),
            lora_draws: targets.draws(),
        }
    }

    /// Activation checkpointing of the blocks `train.activation_checkpointing` picks.
    pub fn checkpoint_blocks(&mut self, train: &TrainConfig) -> Result<()> {
        self.checkpoints = Checkpoints::new(train, &self.blocks, Block::checkpointed)?;
        Ok(())
    }
}

impl Gpt {
    fn run(&self, inputs: &Tensor, train: bool, cache: Option<&mut KvCache>, packed: Option<&Segments>) -> Result<Tensor> {
        // The output head shares the token embedding (weight tying, as GPT-2).
        Ok(self.hidden(inputs, train, cache, packed)?.f_linear::<Tensor>(&self.wte.ws, None)?)
    }

    /// The final-normed hidden states, before the output projection.
    fn hidden(&self, inputs: &Tensor, train: bool, mut cache: Option<&mut KvCache>, packed: Option<&Segments>) -> Result<Tensor> {
        let (_, t) = inputs.size2()?;
        let start = cache.as_ref().map_or(0, |c| c.len());
        if let Some(c) = cache.as_deref() {
            c.reserve(t)?;
        }
        let pos = match packed {
            Some(s) => s.positions.shallow_clone(),
            None => Tensor::f_arange_start(start, start + t, (Kind::Int64, inputs.device()))?,
        };
        let mask = packed.map(|s| super::packed_attention_mask(&s.ids)).transpose()?;
        let mut x = embed(&self.wte, inputs)?.f_add(&embed(&self.wpe, &pos)?)?.f_dropout(self.config.dropout, train)?;
        let extras = mask.as_ref();
        for (i, block) in self.blocks.iter().enumerate() {
            x = match self.checkpoints.run(i, train && cache.is_none(), &x, extras.as_slice()) {
                Some(out) => out?,
                None => block.forward(&x, train, cache.as_deref_mut().map(|c| (c, i)), mask.as_ref())?,
            };
        }
        if let Some(c) = cache {
            c.advance(t);
        }
        norm(&self.ln_f, &x, self.config.layer_norm_eps)
    }
}

impl Model for Gpt {
    fn forward(&mut self, inputs: &Tensor, train: bool) -> Result<Tensor> {
        self.run(inputs, train, None, None)
    }

    fn forward_packed(&mut self, inputs: &Tensor, segments: &Segments, train: bool) -> Result<Tensor> {
        self.run(inputs, train, None, Some(segments))
    }

    fn forward_hidden(&mut self, inputs: &Tensor, segments: Option<&Segments>, train: bool) -> Result<Option<(Tensor, Tensor)>> {
        Ok(Some((self.hidden(inputs, train, None, segments)?, self.wte.ws.shallow_clone())))
    }

    fn new_cache(&self, capacity: i64) -> Option<KvCache> {
        Some(KvCache::new(self.blocks.len(), capacity.min(self.config.block_size)))
    }

    fn forward_cached(&mut self, inputs: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        self.run(inputs, false, Some(cache), None)
    }

    fn task(&self) -> Task {
        Task::LanguageModel
    }

    fn kind(&self) -> &str {
        "gpt"
    }

    fn uses_randomness(&self) -> bool {
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
