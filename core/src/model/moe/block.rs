//! A mixture-of-experts block's MLP as `transformers` computes it, after Llama's attention
//! half and post-attention RMSNorm (`super::super::llama`): the router (`mlp.gate`: softmax
//! over the experts in float32, the `top_k` largest, renormalised with `norm_topk_prob`),
//! the chosen experts' SwiGLU outputs weighted by their routing weights
//! (`super::experts`), and Qwen2-MoE's shared expert (one more SwiGLU every token goes
//! through, scaled by a sigmoid gate). Qwen3-MoE's and Qwen2-MoE's dense blocks
//! (`mlp_only_layers`, `decoder_sparse_step`) have Llama's SwiGLU instead.

use tch::{Kind, Tensor};

use super::{
    super::{
        decoder::BlockInput,
        entry::AuxLoss,
        layout::{Layout, Made},
        llama::{FeedForward, SwiGlu},
        lora,
    },
    experts::Experts,
    router,
};
use crate::{
    config::{ModelConfig, MoeArgs},
    error::Result,
};

/// How tokens are routed, the same in every block.
#[derive(Debug, Clone, Copy)]
struct Routing {
    top_k: i64,
    /// Renormalise the top-k weights to sum to 1 (Qwen3-MoE's `norm_topk_prob`; Mixtral always).
    norm_topk_prob: bool,
    /// Mixtral's `router_jitter_noise`: in training, the MLP's input is scaled by a factor
    /// drawn from `U(1 - jitter, 1 + jitter)` per element, as transformers does.
    jitter: f64,
}

/// A mixture block's MLP: routed experts (with Qwen2-MoE's shared expert), or a dense
/// block's SwiGLU.
#[derive(Debug)]
pub enum MoeFeedForward {
    Sparse(Box<Sparse>),
    Dense(SwiGlu),
}

/// The routed experts of a block.
#[derive(Debug)]
pub struct Sparse {
    /// `mlp.gate`: `[experts, D]`, the router's logits.
    router: lora::Linear,
    experts: Experts,
    routing: Routing,
    /// Qwen2-MoE's `mlp.shared_expert` and its gate `mlp.shared_expert_gate` (`[1, D]`).
    shared: Option<(SwiGlu, lora::Linear)>,
}

impl Sparse {
    fn new(made: &mut Made, a: &MoeArgs) -> Sparse {
        let router = made.linear("mlp.gate");
        let (gate_up, down) = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj");
        let experts = Experts {
            gate_up: made.tensor(gate_up),
            down: made.tensor(down),
            adapters: [made.take_expert_adapter(gate_up), made.take_expert_adapter(down)],
        };
        let shared = (a.shared_expert_intermediate_size > 0).then(|| (SwiGlu::at(made, "mlp.shared_expert"), made.linear("mlp.shared_expert_gate")));
        let routing = Routing { top_k: a.top_k, norm_topk_prob: a.norm_topk_prob, jitter: a.router_jitter_noise };
        Sparse { router, experts, routing, shared }
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

    fn forward(&self, h: &Tensor, input: &mut BlockInput) -> Result<Tensor> {
        let train = input.train;
        let (b, t, d) = h.size3()?;
        let mut flat = h.f_reshape([b * t, d])?;
        if train && self.routing.jitter > 0.0 {
            let j = self.routing.jitter;
            flat = flat.f_mul(&flat.f_empty_like()?.f_uniform_(1.0 - j, 1.0 + j)?)?;
        }
        let (chosen, weights, logits) = self.route(&flat, train)?;
        if let Some(aux) = input.aux.as_deref_mut() {
            aux.push(logits);
        }
        let mut out = self.experts.forward(&flat, &chosen, &weights)?;
        if let Some((expert, gate)) = &self.shared {
            let scale = gate.forward(&flat, train)?.f_sigmoid()?;
            out = out.f_add(&expert.forward(&flat, train)?.f_mul(&scale)?)?;
        }
        Ok(out.f_reshape([b, t, d])?)
    }

    fn linears(&self) -> Vec<&lora::Linear> {
        let mut all = vec![&self.router];
        if let Some((expert, gate)) = &self.shared {
            all.extend(expert.linears());
            all.push(gate);
        }
        all
    }
}

impl FeedForward for MoeFeedForward {
    type Losses = router::Losses;
    const KIND: &'static str = "moe";

    fn new(made: &mut Made, m: &ModelConfig, index: i64) -> MoeFeedForward {
        match m.moe.is_sparse(index) {
            true => MoeFeedForward::Sparse(Box::new(Sparse::new(made, &m.moe))),
            false => MoeFeedForward::Dense(SwiGlu::at(made, "mlp")),
        }
    }

    fn forward(&self, h: &Tensor, input: &mut BlockInput) -> Result<Tensor> {
        match self {
            MoeFeedForward::Sparse(sparse) => sparse.forward(h, input),
            MoeFeedForward::Dense(mlp) => mlp.forward(h, input.train),
        }
    }

    fn linears(&self) -> Vec<&lora::Linear> {
        match self {
            MoeFeedForward::Sparse(sparse) => sparse.linears(),
            MoeFeedForward::Dense(mlp) => mlp.linears().to_vec(),
        }
    }

    fn layout(m: &ModelConfig) -> Layout {
        super::layout(m)
    }

    fn losses(m: &ModelConfig) -> router::Losses {
        router::Losses::new(&m.moe, m.n_layer)
    }

    /// The router losses over every sparse block's router logits.
    fn aux_loss(losses: &router::Losses, collected: Vec<Tensor>, _blocks: usize) -> Result<Option<AuxLoss>> {
        match collected.len() == losses.blocks() {
            true => losses.of(&collected).map(Some),
            // Not every block's logits (none collected: a forward after a cache).
            false => Ok(None),
        }
    }

    /// Mixtral's routing noise.
    fn draws(m: &ModelConfig) -> bool {
        m.moe.router_jitter_noise > 0.0
    }
}
