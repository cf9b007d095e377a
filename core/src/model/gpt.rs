//! A decoder-only transformer (bytes by default: vocabulary 256), laid out as
//! nanoGPT so parameter names match: `transformer.h.0.attn.c_attn.weight`, ...
//! The family: its [`Layout`], its [`Block`] and [`Family`] (the loop around them is
//! the shared [`Decoder`]), and its descriptor [`SPEC`] (GPT-2's `config.json`
//! mapping is in `hf.rs`).

mod hf;

use tch::{Kind, Tensor};

use super::{
    decoder::{self, built, Block, BlockInput, Decoder, Family, Positions},
    family::{Build, FamilySpec, HfSpec},
    layout::{Layout, Made, Part},
    lora::{self, Targets},
};
use crate::{
    config::{Config, ModelConfig, ModelKind},
    error::Result,
};

/// The `gpt` family, registered in `model::family`.
pub const SPEC: FamilySpec = FamilySpec {
    kind: ModelKind::Gpt,
    build: Build::Decoder(build),
    kv_cache: true,
    lora_modules: &["c_attn", "c_proj", "c_fc"],
    lora_parameters: &[],
    check: shape_error,
    hf: Some(HfSpec {
        model_types: &[("gpt2", "GPT2LMHeadModel")],
        read: hf::read,
        write: hf::write,
        params: hf::params,
        canonical: hf::canonical,
        known_extra: hf::known_extra,
        absent_as_zeros: hf::absent_as_zeros,
        conv1d: true,
    }),
};

fn build(vs: &tch::nn::Path, config: &Config, targets: Targets, after_block: &mut dyn FnMut(usize)) -> Result<Box<dyn super::Model>> {
    decoder::planned(Gpt::decoder_with(vs, &config.model, targets, after_block), &config.train)
}

fn shape_error(m: &ModelConfig) -> Option<(&'static str, String)> {
    (m.n_embd % m.n_head.max(1) != 0).then(|| ("model.n_embd", format!("{} is not divisible by n_head = {}", m.n_embd, m.n_head)))
}

/// Every parameter of a `gpt` (with biases in its linear layers when `bias`), and its
/// attentions and tied head for the FLOP count.
pub fn layout(c: &ModelConfig, bias: bool) -> Layout {
    let d = c.n_embd;
    // GPT-2's scaled init of residual projections.
    let (std, proj_std) = (0.02, 0.02 / (2.0 * c.n_layer as f64).sqrt());
    let linear = |path, inp, out, std| Part::Linear { path, inp, out, bias, std };
    let norm = |weight, bias| [Part::Vector { path: weight, width: d, init: 1.0 }, Part::Vector { path: bias, width: d, init: 0.0 }];
    Layout {
        before: vec![
            Part::Table { path: "transformer.wte.weight", rows: c.vocab_size, cols: d, std },
            Part::Table { path: "transformer.wpe.weight", rows: c.block_size, cols: d, std },
        ],
        blocks_at: "transformer.h",
        exceptions: Vec::new(),
        blocks: c.n_layer,
        block: [
            &norm("ln_1.weight", "ln_1.bias")[..],
            &[
                linear("attn.c_attn", d, 3 * d, std),
                Part::Attention { path: "attn.sdpa", heads: c.n_head, head_dim: d / c.n_head.max(1) },
                linear("attn.c_proj", d, d, proj_std),
            ],
            &norm("ln_2.weight", "ln_2.bias"),
            &[linear("mlp.c_fc", d, 4 * d, std), linear("mlp.c_proj", 4 * d, d, proj_std)],
        ]
        .concat(),
        after: [&norm("transformer.ln_f.weight", "transformer.ln_f.bias")[..], &[Part::TiedHead { inp: d, out: c.vocab_size }]].concat(),
    }
}

// The forward pass uses tch's `f_` functions, so a libtorch error (a bad shape,
// out of memory) comes back as an error, not a panic.

/// A LayerNorm's weight and bias.
struct Norm(Tensor, Tensor);

impl Norm {
    fn forward(&self, x: &Tensor, eps: f64) -> Result<Tensor> {
        let d = self.0.size()[0];
        Ok(x.f_layer_norm([d], Some(&self.0), Some(&self.1), eps, true)?)
    }
}

pub struct GptBlock {
    ln_1: Norm,
    c_attn: lora::Linear,
    attn_proj: lora::Linear,
    ln_2: Norm,
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
    fn new(mut made: Made, c: &ModelConfig) -> GptBlock {
        GptBlock {
            ln_1: Norm(made.tensor("ln_1.weight"), made.tensor("ln_1.bias")),
            c_attn: made.linear("attn.c_attn"),
            attn_proj: made.linear("attn.c_proj"),
            ln_2: Norm(made.tensor("ln_2.weight"), made.tensor("ln_2.bias")),
            c_fc: made.linear("mlp.c_fc"),
            mlp_proj: made.linear("mlp.c_proj"),
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
        let qkv = self.c_attn.forward(&self.ln_1.forward(x, self.eps)?, train)?.f_split(d, 2)?;
        let p = if train { self.dropout } else { 0.0 };
        let (q, k, v) = (heads(&qkv[0])?, heads(&qkv[1])?, heads(&qkv[2])?);
        let y = input.attend.sdpa(&q, &k, &v, p, false)?;
        let y = y.f_transpose(1, 2)?.f_contiguous()?.f_view([b, t, d])?;
        let x = x.f_add(&self.attn_proj.forward(&y, train)?.f_dropout(self.dropout, train)?)?;
        let h = self.c_fc.forward(&self.ln_2.forward(&x, self.eps)?, train)?.f_gelu(self.gelu)?;
        Ok(x.f_add(&self.mlp_proj.forward(&h, train)?.f_dropout(self.dropout, train)?)?)
    }

    fn linears(&self) -> Vec<&lora::Linear> {
        vec![&self.c_attn, &self.attn_proj, &self.c_fc, &self.mlp_proj]
    }
}

/// GPT-2's embeddings (tokens + learned positions), final LayerNorm and tied head.
pub struct Gpt {
    wte: Tensor,
    wpe: Tensor,
    ln_f: Norm,
    config: ModelConfig,
    /// LoRA's adapters draw dropout.
    lora_draws: bool,
}

impl Gpt {
    /// The model, with LoRA adapters on the linear layers `targets` names.
    pub fn decoder(vs: &tch::nn::Path, c: &ModelConfig, targets: Targets) -> Decoder<Gpt> {
        Gpt::decoder_with(vs, c, targets, &mut |_| {})
    }

    /// As [`Gpt::decoder`], calling `after_block(i)` once block `i`'s variables exist.
    pub fn decoder_with(vs: &tch::nn::Path, c: &ModelConfig, targets: Targets, after_block: &mut dyn FnMut(usize)) -> Decoder<Gpt> {
        let layout = layout(c, c.gpt.bias);
        let mut outer = Made::new(vs, &layout.before, c, Targets::NONE);
        let (wte, wpe) = (outer.tensor("transformer.wte.weight"), outer.tensor("transformer.wpe.weight"));
        let blocks = (0..layout.blocks)
            .map(|i| built(GptBlock::new(Made::new(&(vs / "transformer" / "h" / i), &layout.block, c, targets), c), i, after_block))
            .collect();
        let mut after = Made::new(vs, &layout.after, c, Targets::NONE);
        let ln_f = Norm(after.tensor("transformer.ln_f.weight"), after.tensor("transformer.ln_f.bias"));
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
        let tokens = decoder::lookup(&self.wte, tokens, true)?;
        Ok(tokens.f_add(&decoder::lookup(&self.wpe, &pos, false)?)?.f_dropout(self.config.dropout, train)?)
    }

    fn norm(&self, x: &Tensor) -> Result<Tensor> {
        self.ln_f.forward(x, self.config.gpt.layer_norm_eps)
    }

    /// The token embedding (weight tying, as GPT-2).
    fn head(&self) -> &Tensor {
        &self.wte
    }

    fn draws(&self) -> bool {
        self.config.dropout > 0.0 || self.lora_draws
    }

    fn layout(&self) -> Layout {
        layout(&self.config, self.config.gpt.bias)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_matches_the_model_that_ptrain_builds() {
        let mut config = Config::default();
        config.model.n_layer = 2;
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let _gpt = Gpt::decoder(&vs.root(), &config.model, Targets::NONE);
        let mut built: Vec<(String, Vec<i64>)> = vs.variables().into_iter().map(|(n, t)| (n, t.size())).collect();
        built.sort();
        let mut table: Vec<(String, Vec<i64>)> = hf::params(&config.model).into_iter().map(|p| (p.name, p.shape)).collect();
        table.sort();
        assert_eq!(built, table);
    }
}
