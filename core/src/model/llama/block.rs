//! The Llama block as `transformers` computes it: RMSNorm in float32, grouped-query
//! attention over rotated queries and keys (q/k RMSNorm for Qwen3), then a [`FeedForward`]:
//! Llama's SwiGLU, or a mixture of experts (`model/moe`).

use tch::{Kind, Tensor};

use super::super::{
    attention::{split_heads, HeadNorm},
    decoder::{Block, BlockInput},
    entry::AuxLoss,
    layout::{Layout, Made},
    lora, rope,
};
use crate::{config::ModelConfig, error::Result};

/// `LlamaRMSNorm`: normalised in float32, cast back to the input's type, then
/// scaled by the weight (in that order: it matters in bf16).
#[derive(Debug)]
pub(in crate::model) struct RmsNorm {
    pub(in crate::model) weight: Tensor,
    pub(in crate::model) eps: f64,
}

impl RmsNorm {
    pub(in crate::model) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x32 = x.f_to_kind(Kind::Float)?;
        let variance = x32.f_square()?.f_mean_dim(-1, true, Kind::Float)?;
        let normed = x32.f_mul(&variance.f_add_scalar(self.eps)?.f_rsqrt()?)?;
        Ok(self.weight.f_mul(&normed.f_to_kind(x.kind())?)?)
    }
}

impl HeadNorm for RmsNorm {
    fn norm(&self, x: &Tensor) -> Result<Tensor> {
        self.forward(x)
    }
}

/// SwiGLU's gating `silu(gate) * up`, keeping only `gate` and `up` for backward
/// ([`ptrain_torch_ext::swiglu`], as Liger's fused SwiGLU): autograd's two nodes would
/// also keep `silu(gate)`, one more `[tokens, intermediate]` tensor per block (10 MB
/// at Qwen2-0.5B's 4,864 and 512 tokens). The gradients are autograd's bit for bit.
pub(in crate::model) fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    #[cfg(test)]
    if super::tests::UNFUSED.get() {
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
    if super::tests::PRODUCT_KEPT.get() {
        return Ok(());
    }
    let _dropped = ptrain_torch_ext::recompute_swiglu_product(down, gated, gate, up)
        .map_err(|e| crate::error::Error::Other(format!("swiglu recompute: {e}")))?;
    #[cfg(test)]
    super::tests::PRODUCTS_DROPPED.set(super::tests::PRODUCTS_DROPPED.get() + _dropped);
    Ok(())
}

/// Shapes shared by every layer.
#[derive(Debug, Clone, Copy)]
pub(in crate::model) struct Dims {
    pub(in crate::model) heads: i64,
    pub(in crate::model) kv_heads: i64,
    pub(in crate::model) head_dim: i64,
    pub(in crate::model) dropout: f64,
}

/// A Llama block's first half, the residual included: RMSNorm, grouped-query attention
/// over rotated queries and keys (q/k RMSNorm for Qwen3).
#[derive(Debug)]
pub(in crate::model) struct SelfAttention {
    input_norm: RmsNorm,
    q_proj: lora::Linear,
    k_proj: lora::Linear,
    v_proj: lora::Linear,
    o_proj: lora::Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    dims: Dims,
}

impl SelfAttention {
    /// Its variables, taken from `made` (its layout's `input_layernorm` and `self_attn.*`).
    pub(in crate::model) fn new(made: &mut Made, dims: Dims, rms_norm_eps: f64) -> SelfAttention {
        SelfAttention {
            input_norm: RmsNorm { weight: made.tensor("input_layernorm.weight"), eps: rms_norm_eps },
            q_proj: made.linear("self_attn.q_proj"),
            k_proj: made.linear("self_attn.k_proj"),
            v_proj: made.linear("self_attn.v_proj"),
            o_proj: made.linear("self_attn.o_proj"),
            q_norm: made.take_tensor("self_attn.q_norm.weight").map(|weight| RmsNorm { weight, eps: rms_norm_eps }),
            k_norm: made.take_tensor("self_attn.k_norm.weight").map(|weight| RmsNorm { weight, eps: rms_norm_eps }),
            dims,
        }
    }

    /// `[B, T, width]` projections as `[B, heads, T, head_dim]`, each head normed (Qwen3).
    fn heads(&self, x: Tensor, heads: i64, norm: Option<&RmsNorm>) -> Result<Tensor> {
        split_heads(x, heads, self.dims.head_dim, norm.map(|n| n as &dyn HeadNorm))
    }

    /// `x` plus the attention over it (`[B, T, D]`), with RoPE's cos and sin at its positions.
    pub(in crate::model) fn forward(&self, x: &Tensor, input: &mut BlockInput) -> Result<Tensor> {
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
        Ok(x.f_add(&self.o_proj.forward(&y, train)?)?)
    }

    pub(in crate::model) fn linears(&self) -> [&lora::Linear; 4] {
        [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj]
    }
}

/// A block's second half, after the post-attention RMSNorm: Llama's SwiGLU ([`SwiGlu`])
/// or a mixture of experts (`model/moe`). The trunk around the blocks
/// ([`super::Llama`]) is the same for every kind of MLP; what differs by kind is here.
pub trait FeedForward: std::fmt::Debug + Send + 'static + Sized {
    /// What the family adds up over a forward's blocks (a mixture's router losses).
    type Losses: Send + 'static;

    /// `model.kind`.
    const KIND: &'static str;

    /// Block `index`'s MLP of the variables `made` from the family's layout.
    fn new(made: &mut Made, m: &ModelConfig, index: i64) -> Self;

    /// Its output `[B, T, D]` for the normed hidden states `h`.
    fn forward(&self, h: &Tensor, input: &mut BlockInput) -> Result<Tensor>;

    /// Its linear layers (LoRA's).
    fn linears(&self) -> Vec<&lora::Linear>;

    /// Every parameter of the family, in the order they are drawn.
    fn layout(m: &ModelConfig) -> Layout;

    fn losses(m: &ModelConfig) -> Self::Losses;

    /// The auxiliary loss from what the blocks put in [`BlockInput::aux`].
    fn aux_loss(_losses: &Self::Losses, _collected: Vec<Tensor>, _blocks: usize) -> Result<Option<AuxLoss>> {
        Ok(None)
    }

    /// Training draws random numbers besides dropout and LoRA's (routing noise).
    fn draws(_m: &ModelConfig) -> bool {
        false
    }
}

/// Llama's MLP, `down(silu(gate(h)) * up(h))`, at `{prefix}.gate_proj` and its kin (`mlp`;
/// a mixture's dense blocks and Qwen2-MoE's shared expert are one too).
#[derive(Debug)]
pub struct SwiGlu {
    gate_proj: lora::Linear,
    up_proj: lora::Linear,
    down_proj: lora::Linear,
}

impl SwiGlu {
    pub(in crate::model) fn at(made: &mut Made, prefix: &str) -> SwiGlu {
        SwiGlu {
            gate_proj: made.linear(&format!("{prefix}.gate_proj")),
            up_proj: made.linear(&format!("{prefix}.up_proj")),
            down_proj: made.linear(&format!("{prefix}.down_proj")),
        }
    }

    pub(in crate::model) fn forward(&self, h: &Tensor, train: bool) -> Result<Tensor> {
        let [gate, up] = lora::forward_shared([&self.gate_proj, &self.up_proj], h, train)?;
        let gated = swiglu(&gate, &up)?;
        let down = self.down_proj.forward_with(&gated, Some((&gate, &up)), train)?;
        recompute_in_backward(&down, &gated, &gate, &up)?;
        Ok(down)
    }

    pub(in crate::model) fn linears(&self) -> [&lora::Linear; 3] {
        [&self.gate_proj, &self.up_proj, &self.down_proj]
    }
}

impl FeedForward for SwiGlu {
    type Losses = ();
    const KIND: &'static str = "llama";

    fn new(made: &mut Made, _m: &ModelConfig, _index: i64) -> SwiGlu {
        SwiGlu::at(made, "mlp")
    }

    fn forward(&self, h: &Tensor, input: &mut BlockInput) -> Result<Tensor> {
        SwiGlu::forward(self, h, input.train)
    }

    fn linears(&self) -> Vec<&lora::Linear> {
        SwiGlu::linears(self).to_vec()
    }

    fn layout(m: &ModelConfig) -> Layout {
        super::layout(m)
    }

    fn losses(_m: &ModelConfig) {}
}

/// A Llama block: the attention half, the post-attention RMSNorm, and its MLP `M`.
#[derive(Debug)]
pub struct LlamaBlock<M = SwiGlu> {
    attention: SelfAttention,
    post_norm: RmsNorm,
    mlp: M,
}

// SAFETY: a layer's tensors are only read (each op makes a new tensor), which libtorch
// allows from several threads at once; the checkpoint's recompute may run it on an
// autograd worker thread.
unsafe impl<M> Sync for LlamaBlock<M> {}

impl<M: FeedForward> LlamaBlock<M> {
    /// Block `index` of the variables `made` from its layout (`super::layout`).
    pub(in crate::model) fn new(mut made: Made, m: &ModelConfig, dims: Dims, index: i64) -> LlamaBlock<M> {
        let eps = m.llama.rms_norm_eps;
        LlamaBlock {
            attention: SelfAttention::new(&mut made, dims, eps),
            post_norm: RmsNorm { weight: made.tensor("post_attention_layernorm.weight"), eps },
            mlp: M::new(&mut made, m, index),
        }
    }
}

impl<M: FeedForward> Block for LlamaBlock<M> {
    /// One layer over `x` `[B, T, D]` with RoPE's cos and sin at its positions.
    fn forward(&self, x: &Tensor, input: &mut BlockInput) -> Result<Tensor> {
        let x = self.attention.forward(x, input)?;
        let h = self.post_norm.forward(&x)?;
        Ok(x.f_add(&self.mlp.forward(&h, input)?)?)
    }

    fn linears(&self) -> Vec<&lora::Linear> {
        let mut all = self.attention.linears().to_vec();
        all.extend(self.mlp.linears());
        all
    }
}
