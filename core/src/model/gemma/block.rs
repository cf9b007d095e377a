//! The Gemma block as `transformers` computes it (`Gemma2DecoderLayer`,
//! `Gemma3DecoderLayer`): sandwich norms (each sub-layer's input and output normed),
//! grouped-query attention scaled by `query_pre_attn_scalar ** -0.5` (soft-capped in
//! Gemma 2; q/k norms in Gemma 3), within a sliding window on sliding layers, and a
//! GeGLU MLP (`gelu_pytorch_tanh`).

use tch::{Kind, Tensor};

use super::{
    super::{
        attention::{split_heads, HeadNorm, Scores},
        decoder::{Block, BlockInput},
        layout::Made,
        lora, rope,
    },
    Dims,
};
use crate::error::{Error, Result};

/// `Gemma2RMSNorm`: normalised and scaled by `1 + weight` in float32, then cast back
/// to the input's type (Llama casts before scaling: it matters in bf16).
#[derive(Debug)]
pub(super) struct GemmaNorm {
    pub(super) weight: Tensor,
    pub(super) eps: f64,
}

impl GemmaNorm {
    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x32 = x.f_to_kind(Kind::Float)?;
        let variance = x32.f_square()?.f_mean_dim(-1, true, Kind::Float)?;
        let normed = x32.f_mul(&variance.f_add_scalar(self.eps)?.f_rsqrt()?)?;
        let scale = self.weight.f_to_kind(Kind::Float)?.f_add_scalar(1.0)?;
        Ok(normed.f_mul(&scale)?.f_to_kind(x.kind())?)
    }
}

impl HeadNorm for GemmaNorm {
    fn norm(&self, x: &Tensor) -> Result<Tensor> {
        self.forward(x)
    }
}

#[derive(Debug)]
pub struct GemmaBlock {
    input_norm: GemmaNorm,
    q_proj: lora::Linear,
    k_proj: lora::Linear,
    v_proj: lora::Linear,
    o_proj: lora::Linear,
    q_norm: Option<GemmaNorm>,
    k_norm: Option<GemmaNorm>,
    post_attention_norm: GemmaNorm,
    pre_feedforward_norm: GemmaNorm,
    gate_proj: lora::Linear,
    up_proj: lora::Linear,
    down_proj: lora::Linear,
    post_feedforward_norm: GemmaNorm,
    dims: Dims,
    /// A sliding layer's window (`None`: a full-attention layer).
    window: Option<i64>,
}

// SAFETY: a layer's tensors are only read (each op makes a new tensor), which libtorch
// allows from several threads at once; the checkpoint's recompute may run it on an
// autograd worker thread.
unsafe impl Sync for GemmaBlock {}

impl GemmaBlock {
    /// The block of the variables `made` from its layout (`super::layout`).
    pub(super) fn new(mut made: Made, dims: Dims, window: Option<i64>) -> GemmaBlock {
        let eps = dims.eps;
        let mut norm = |path: &str| GemmaNorm { weight: made.tensor(path), eps };
        let (input_norm, post_attention_norm) = (norm("input_layernorm.weight"), norm("post_attention_layernorm.weight"));
        let (pre_feedforward_norm, post_feedforward_norm) = (norm("pre_feedforward_layernorm.weight"), norm("post_feedforward_layernorm.weight"));
        let mut qk_norm = |path: &str| made.take_tensor(path).map(|weight| GemmaNorm { weight, eps });
        let (q_norm, k_norm) = (qk_norm("self_attn.q_norm.weight"), qk_norm("self_attn.k_norm.weight"));
        GemmaBlock {
            input_norm,
            q_proj: made.linear("self_attn.q_proj"),
            k_proj: made.linear("self_attn.k_proj"),
            v_proj: made.linear("self_attn.v_proj"),
            o_proj: made.linear("self_attn.o_proj"),
            q_norm,
            k_norm,
            post_attention_norm,
            pre_feedforward_norm,
            gate_proj: made.linear("mlp.gate_proj"),
            up_proj: made.linear("mlp.up_proj"),
            down_proj: made.linear("mlp.down_proj"),
            post_feedforward_norm,
            dims,
            window,
        }
    }

    /// `[B, T, width]` projections as `[B, heads, T, head_dim]`, each head normed (Gemma 3).
    fn heads(&self, x: Tensor, heads: i64, norm: Option<&GemmaNorm>) -> Result<Tensor> {
        split_heads(x, heads, self.dims.head_dim, norm.map(|n| n as &dyn HeadNorm))
    }

    /// The attention sub-layer's output (before its post-norm) over the normed `h`.
    fn attention(&self, h: &Tensor, input: &mut BlockInput) -> Result<Tensor> {
        let (train, dims) = (input.train, self.dims);
        let (cos, sin) = input.rotary.ok_or_else(|| Error::Other("a gemma layer needs RoPE's tables".into()))?;
        let (b, t, _) = h.size3()?;
        let [q, k, v] = lora::forward_shared([&self.q_proj, &self.k_proj, &self.v_proj], h, train)?;
        let q = rope::apply(&self.heads(q, dims.heads, self.q_norm.as_ref())?, cos, sin)?;
        let k = rope::apply(&self.heads(k, dims.kv_heads, self.k_norm.as_ref())?, cos, sin)?;
        let v = self.heads(v, dims.kv_heads, None)?;
        let dropout = if train { dims.dropout } else { 0.0 };
        let scores = Scores { dropout, gqa: true, scale: Some(dims.scale), softcap: dims.attn_softcap };
        let y = input.attend.attention(&q, &k, &v, &scores)?;
        let y = y.f_transpose(1, 2)?.f_reshape([b, t, dims.heads * dims.head_dim])?;
        self.o_proj.forward(&y, train)
    }
}

impl Block for GemmaBlock {
    /// One layer over `x` `[B, T, D]` with RoPE's cos and sin at its positions.
    fn forward(&self, x: &Tensor, input: &mut BlockInput) -> Result<Tensor> {
        let train = input.train;
        let y = self.attention(&self.input_norm.forward(x)?, input)?;
        let x = x.f_add(&self.post_attention_norm.forward(&y)?)?;
        let h = self.pre_feedforward_norm.forward(&x)?;
        let [gate, up] = lora::forward_shared([&self.gate_proj, &self.up_proj], &h, train)?;
        let y = self.down_proj.forward(&gate.f_gelu("tanh")?.f_mul(&up)?, train)?;
        Ok(x.f_add(&self.post_feedforward_norm.forward(&y)?)?)
    }

    fn linears(&self) -> Vec<&lora::Linear> {
        vec![&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj, &self.gate_proj, &self.up_proj, &self.down_proj]
    }

    /// Sliding layers turn by the local base (table 1), full ones by the global (table 0).
    fn rotary_table(&self) -> usize {
        usize::from(self.window.is_some())
    }

    fn window(&self) -> Option<i64> {
        self.window
    }
}
