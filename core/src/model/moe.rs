//! Mixtures of experts as `transformers` computes them (`Qwen3MoeForCausalLM`,
//! `Qwen2MoeForCausalLM`, `MixtralForCausalLM`): the llama family's model ([`Llama`]:
//! embedding, attention, norms, RoPE and head, keyed by `[model.llama]`) with another
//! MLP ([`MoeFeedForward`], `block.rs`): a router choosing `top_k` of `experts` SwiGLU
//! experts per token, computed as grouped products (`experts.rs`), with the router's
//! load-balancing loss and z-loss (`router.rs`); its descriptor [`SPEC`] and its
//! `config.json` mapping (`hf.rs`).
//!
//! One family for the three: they differ only in what the llama family already declares
//! (Qwen3's q/k norms, Qwen2's q/k/v biases, the RoPE base), in whether the top-k weights
//! are renormalised (`norm_topk_prob`; Mixtral always), in Qwen2-MoE's shared expert,
//! in which blocks are dense, and in the names their files use; their modules in memory
//! (transformers 5) are otherwise the same.

mod block;
mod experts;
mod hf;
mod router;

use tch::nn;

use super::{
    decoder,
    family::{Build, FamilySpec, HfSpec},
    layout::{Layout, Part},
    llama::{self, Llama},
    lora::Targets,
};
use crate::{
    config::{Config, ModelConfig, ModelKind},
    error::Result,
};
pub use block::MoeFeedForward;

/// The `moe` family, registered in `model::family`.
pub const SPEC: FamilySpec = FamilySpec {
    kind: ModelKind::Moe,
    build: Build::Decoder(build),
    kv_cache: true,
    // The router and the stacked experts are adapted when named, as peft adapts them:
    // parameters, not modules (docs/moe.md, "LoRA").
    lora_modules: &["q_proj", "k_proj", "v_proj", "o_proj"],
    lora_parameters: super::lora::experts::PARAMETERS,
    check: shape_error,
    hf: Some(HfSpec {
        model_types: &hf::FAMILIES,
        read: hf::read,
        write: hf::write,
        params: hf::params,
        // Named as the llama family's: the same trunk, the same extras.
        canonical: super::llama::hf::canonical,
        known_extra: super::llama::hf::known_extra,
        absent_as_zeros: |_, _| false,
        conv1d: false,
    }),
};

fn build(vs: &nn::Path, config: &Config, targets: Targets, after_block: &mut dyn FnMut(usize)) -> Result<Box<dyn super::Model>> {
    // Checkpointed blocks give their router logits with their output (the decoder's
    // `plan::with_aux`), so the router losses reach every block, recomputed or not.
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
/// `mlp.gate`, the stacked experts and Qwen2-MoE's shared expert and its gate, in the
/// blocks with experts (the others keep the llama family's MLP).
pub fn layout(m: &ModelConfig) -> Layout {
    let mut layout = llama::layout(m);
    let (a, d, std) = (&m.moe, m.n_embd, INIT_STD);
    let width = a.expert_width(&m.llama, d);
    let dense = layout.block.clone();
    layout.block.retain(|p| !p.path().starts_with("mlp."));
    layout.block.extend([
        Part::Linear { path: "mlp.gate", inp: d, out: a.experts, bias: false, std },
        Part::Experts { path: "mlp.experts.gate_up_proj", experts: a.experts, inp: d, out: 2 * width, active: a.top_k, std },
        Part::Experts { path: "mlp.experts.down_proj", experts: a.experts, inp: width, out: d, active: a.top_k, std },
    ]);
    let shared = a.shared_expert_intermediate_size;
    if shared > 0 {
        let linear = |path, inp, out| Part::Linear { path, inp, out, bias: false, std };
        layout.block.extend([
            linear("mlp.shared_expert.gate_proj", d, shared),
            linear("mlp.shared_expert.up_proj", d, shared),
            linear("mlp.shared_expert.down_proj", shared, d),
            linear("mlp.shared_expert_gate", d, 1),
        ]);
    }
    layout.exceptions = (0..m.n_layer).filter(|i| !a.is_sparse(*i)).map(|i| (i, dense.clone())).collect();
    layout
}

/// A mixture: the llama family's trunk and attention, its blocks' MLPs experts.
pub type Moe = Llama<MoeFeedForward>;

#[cfg(test)]
mod tests;
