//! Mixtures of experts as `transformers` computes them (`Qwen3MoeForCausalLM`,
//! `MixtralForCausalLM`): Llama's embedding, attention, norms, RoPE and head (the
//! `llama` family's code, keyed by `[model.llama]`), and in every block, in place of its
//! MLP, a router choosing `top_k` of `experts` SwiGLU experts per token (`block.rs`),
//! computed as grouped products (`experts.rs`), with the router's load-balancing loss
//! and z-loss (`router.rs`); its descriptor [`SPEC`] and its `config.json` mapping
//! (`hf.rs`).
//!
//! One family for both: Qwen3-MoE and Mixtral differ only in what the llama family
//! already declares (Qwen3's q/k norms, RoPE base), in whether the top-k weights are
//! renormalised (`norm_topk_prob`; Mixtral always) and in the names their files use;
//! their modules in memory (transformers 5) are the same.

mod block;
mod experts;
mod hf;
mod router;

use tch::{nn, Kind, Tensor};

use super::{
    decoder::{self, built, Decoder, Family, Positions},
    entry::AuxLoss,
    family::{Build, FamilySpec, HfSpec},
    layout::{Layout, Made, Part},
    llama::{self, Dims, RmsNorm},
    lora::Targets,
    rope::Rope,
};
use crate::{
    config::{ActivationCheckpointing, Config, ModelConfig, ModelKind},
    error::{ConfigError, Result},
};
use block::MoeBlock;

/// The `moe` family, registered in `model::family`.
pub const SPEC: FamilySpec = FamilySpec {
    kind: ModelKind::Moe,
    build: Build::Decoder(build),
    kv_cache: true,
    // The router and the stacked experts are not linear layers peft adapts by module
    // name (docs/moe.md, "LoRA").
    lora_modules: &["q_proj", "k_proj", "v_proj", "o_proj"],
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
    let a = &config.model.moe;
    let losses = a.router_aux_loss_coef > 0.0 || a.router_z_loss_coef > 0.0;
    if losses && config.train.activation_checkpointing != ActivationCheckpointing::None {
        // A checkpointed block keeps no graph of its router in forward, so the router
        // losses would reach only the blocks not checkpointed.
        let message = "a mixture of experts' router losses need every block's router logits with their graph, which a checkpointed \
                       block does not keep: set model.moe.router_aux_loss_coef = 0 and router_z_loss_coef = 0 to checkpoint";
        return Err(ConfigError { origin: "configuration".into(), key: "train.activation_checkpointing".into(), message: message.into() }.into());
    }
    decoder::planned(Moe::decoder_with(vs, &config.model, targets, after_block), &config.train)
}

/// Shapes the `moe` kind cannot build: the key and why.
fn shape_error(m: &ModelConfig) -> Option<(&'static str, String)> {
    if m.moe.top_k > m.moe.experts {
        return Some(("model.moe.top_k", format!("{} is more than model.moe.experts = {}", m.moe.top_k, m.moe.experts)));
    }
    (llama::SPEC.check)(m)
}

/// `transformers`' `initializer_range`.
const INIT_STD: f64 = 0.02;

/// Every parameter of a `moe` (transformers 5's names in memory), in the order they are
/// drawn: the llama family's, with the MLP's three layers replaced by the router
/// `mlp.gate` and the stacked experts.
pub fn layout(m: &ModelConfig) -> Layout {
    let mut layout = llama::layout(m);
    let (a, d, std) = (&m.moe, m.n_embd, INIT_STD);
    let width = a.expert_width(&m.llama, d);
    layout.block.retain(|p| !p.path().starts_with("mlp."));
    layout.block.extend([
        Part::Linear { path: "mlp.gate", inp: d, out: a.experts, bias: false, std },
        Part::Experts { path: "mlp.experts.gate_up_proj", experts: a.experts, inp: d, out: 2 * width, active: a.top_k, std },
        Part::Experts { path: "mlp.experts.down_proj", experts: a.experts, inp: width, out: d, active: a.top_k, std },
    ]);
    layout
}

/// A mixture's embedding, rotary tables, final RMSNorm and head (Llama's), and its
/// router losses' weights.
pub struct Moe {
    embed_tokens: Tensor,
    norm: RmsNorm,
    /// `None` when the head is the token embedding (`tie_word_embeddings`).
    lm_head: Option<Tensor>,
    rope: Rope,
    config: ModelConfig,
    lora_draws: bool,
    router: router::Losses,
}

impl Moe {
    /// The model, calling `after_block(i)` once block `i`'s variables exist.
    pub fn decoder_with(vs: &nn::Path, m: &ModelConfig, targets: Targets, after_block: &mut dyn FnMut(usize)) -> Decoder<Moe> {
        let (layout, eps) = (layout(m), m.llama.rms_norm_eps);
        let a = &m.llama;
        let dims = Dims { heads: m.n_head, kv_heads: a.kv_heads(m.n_head), head_dim: a.head_width(m.n_embd, m.n_head), dropout: m.dropout };
        let mut outer = Made::new(vs, &layout.before, m, Targets::NONE);
        let lm_head = outer.take_linear("lm_head").map(|l| l.base.ws);
        let embed_tokens = outer.tensor("model.embed_tokens.weight");
        let routing = block::Routing { top_k: m.moe.top_k, norm_topk_prob: m.moe.norm_topk_prob };
        let layers = (0..layout.blocks)
            .map(|i| built(MoeBlock::new(Made::new(&(vs / "model" / "layers" / i), &layout.block, m, targets), dims, eps, routing), i, after_block))
            .collect();
        let norm = RmsNorm { weight: Made::new(vs, &layout.after, m, Targets::NONE).tensor("model.norm.weight"), eps };
        let rope = Rope::new(&m.llama, dims.head_dim, m.block_size, vs.device());
        let router = router::Losses::new(&m.moe, m.n_layer);
        Decoder::new(Moe { embed_tokens, norm, lm_head, rope, config: m.clone(), lora_draws: targets.draws(), router }, layers)
    }
}

impl Family for Moe {
    type Block = MoeBlock;

    fn kind(&self) -> &'static str {
        "moe"
    }

    fn context(&self) -> i64 {
        self.rope.positions()
    }

    fn embed(&self, tokens: &Tensor, _at: Positions, _train: bool) -> Result<Tensor> {
        decoder::lookup(&self.embed_tokens, tokens, self.lm_head.is_none())
    }

    fn rotary(&self, at: Positions, kind: Kind) -> Result<Vec<(Tensor, Tensor)>> {
        Ok(vec![match at {
            Positions::Given(p) => self.rope.at(p, kind)?,
            Positions::From { start, len } => self.rope.window(start, len, kind)?,
        }])
    }

    fn norm(&self, x: &Tensor) -> Result<Tensor> {
        self.norm.forward(x)
    }

    fn head(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    fn draws(&self) -> bool {
        self.config.dropout > 0.0 || self.lora_draws
    }

    fn layout(&self) -> Layout {
        layout(&self.config)
    }

    /// The router losses over every block's router logits.
    fn aux_loss(&self, collected: Vec<Tensor>, blocks: usize) -> Result<Option<AuxLoss>> {
        match collected.len() == blocks {
            true => self.router.of(&collected).map(Some),
            // Checkpointed blocks gave none (build refuses that with router losses on).
            false => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests;
