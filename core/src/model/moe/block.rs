//! A mixture-of-experts block as `transformers` computes it: Llama's attention half, then
//! the post-attention RMSNorm, the router (`mlp.gate`: softmax over the experts in
//! float32, the `top_k` largest, renormalised with `norm_topk_prob`) and the chosen
//! experts' SwiGLU outputs weighted by their routing weights (`super::experts`).

use tch::{Kind, Tensor};

use super::{
    super::{
        decoder::{Block, BlockInput},
        layout::Made,
        llama::{Dims, RmsNorm, SelfAttention},
        lora,
    },
    experts::Experts,
};
use crate::error::Result;

/// How tokens are routed, the same in every block.
#[derive(Debug, Clone, Copy)]
pub(super) struct Routing {
    pub(super) top_k: i64,
    /// Renormalise the top-k weights to sum to 1 (Qwen3-MoE's `norm_topk_prob`; Mixtral always).
    pub(super) norm_topk_prob: bool,
}

#[derive(Debug)]
pub struct MoeBlock {
    attention: SelfAttention,
    post_norm: RmsNorm,
    /// `mlp.gate`: `[experts, D]`, the router's logits.
    router: lora::Linear,
    experts: Experts,
    routing: Routing,
}

// SAFETY: a block's tensors are only read (each op makes a new tensor), which libtorch
// allows from several threads at once; the checkpoint's recompute may run it on an
// autograd worker thread.
unsafe impl Sync for MoeBlock {}

impl MoeBlock {
    /// The block of the variables `made` from its layout (`super::layout`).
    pub(super) fn new(mut made: Made, dims: Dims, rms_norm_eps: f64, routing: Routing) -> MoeBlock {
        MoeBlock {
            attention: SelfAttention::new(&mut made, dims, rms_norm_eps),
            post_norm: RmsNorm { weight: made.tensor("post_attention_layernorm.weight"), eps: rms_norm_eps },
            router: made.linear("mlp.gate"),
            experts: Experts { gate_up: made.tensor("mlp.experts.gate_up_proj"), down: made.tensor("mlp.experts.down_proj") },
            routing,
        }
    }

    /// The experts each of `x`'s `[N, D]` tokens goes to (`[N, top_k]`, int64) and their
    /// weights (`[N, top_k]`, in `x`'s type), and the router's logits `[N, experts]`.
    fn route(&self, x: &Tensor, train: bool) -> Result<(Tensor, Tensor, Tensor)> {
        let logits = self.router.forward(x, train)?;
        let probs = logits.f_softmax(-1, Kind::Float)?;
        let (top, chosen) = probs.f_topk(self.routing.top_k, -1, true, true)?;
        let top = match self.routing.norm_topk_prob {
            true => top.f_div(&top.f_sum_dim_intlist(-1, true, Kind::Float)?)?,
            false => top,
        };
        Ok((chosen, top.f_to_kind(x.kind())?, logits))
    }
}

impl Block for MoeBlock {
    fn forward(&self, x: &Tensor, input: &mut BlockInput) -> Result<Tensor> {
        let train = input.train;
        let x = self.attention.forward(x, input)?;
        let h = self.post_norm.forward(&x)?;
        let (b, t, d) = h.size3()?;
        let flat = h.f_reshape([b * t, d])?;
        let (chosen, weights, logits) = self.route(&flat, train)?;
        if let Some(aux) = input.aux.as_deref_mut() {
            aux.push(logits);
        }
        let out = self.experts.forward(&flat, &chosen, &weights)?;
        Ok(x.f_add(&out.f_reshape([b, t, d])?)?)
    }

    fn linears(&self) -> Vec<&lora::Linear> {
        let [q, k, v, o] = self.attention.linears();
        vec![q, k, v, o, &self.router]
    }
}
