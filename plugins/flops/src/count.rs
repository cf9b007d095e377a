//! Model FLOPs counted from the model's own description of its layers: the matmul
//! work of a training step, as PaLM's MFU and nanoGPT's `estimate_mfu` count it.

use ptrain_plugin_api::{LayerKind, LayerSpec};

/// FLOPs of one sample through a model, forward and backward.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerSample {
    pub forward: u64,
    pub backward: u64,
}

impl PerSample {
    pub fn total(self) -> u64 {
        self.forward + self.backward
    }
}

/// (forward, backward) FLOPs of one layer for one sample.
///
/// A matmul of `[n, k] x [k, m]` is `2nkm`. The backward pass of a linear layer is
/// one such product for the weight gradient and, when the input needs a gradient,
/// one for the input gradient. Attention (no weights) is QK^T and PV forward and
/// four products backward; causal masking is not discounted (PaLM's convention).
/// Embedding lookups and norms do no matmul work and count zero.
pub fn layer(l: &LayerSpec<'_>) -> (u64, u64) {
    match l.kind {
        // Conv2d as its im2col matmul: in_features = C_in*kh*kw, positions = output pixels.
        LayerKind::Linear | LayerKind::Conv2d => {
            let forward = 2 * l.in_features * l.out_features * l.positions;
            (forward, if l.input_grad { 2 * forward } else { forward })
        }
        LayerKind::Attention => {
            let width = if l.heads * l.head_dim > 0 { l.heads * l.head_dim } else { l.in_features };
            let forward = 4 * l.positions * l.seq_len * width;
            (forward, if l.input_grad { 2 * forward } else { 0 })
        }
        LayerKind::Embedding | LayerKind::Norm => (0, 0),
    }
}

pub fn per_sample(layers: &[LayerSpec<'_>]) -> PerSample {
    layers.iter().map(layer).fold(PerSample::default(), |acc, (f, b)| PerSample { forward: acc.forward + f, backward: acc.backward + b })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linear(inp: u64, out: u64, positions: u64, input_grad: bool) -> LayerSpec<'static> {
        LayerSpec {
            name: "layer".into(),
            kind: LayerKind::Linear,
            in_features: inp,
            out_features: out,
            positions,
            heads: 0,
            head_dim: 0,
            seq_len: 0,
            input_grad,
        }
    }

    fn attention(heads: u64, head_dim: u64, t: u64) -> LayerSpec<'static> {
        LayerSpec { kind: LayerKind::Attention, heads, head_dim, seq_len: t, ..linear(heads * head_dim, heads * head_dim, t, true) }
    }

    #[test]
    fn an_mlp_is_three_passes_less_the_first_input_gradient() {
        let dims = [32u64, 128, 64, 4];
        let layers: Vec<_> = dims.windows(2).enumerate().map(|(i, w)| linear(w[0], w[1], 1, i > 0)).collect();
        let forward: u64 = dims.windows(2).map(|w| 2 * w[0] * w[1]).sum();
        let count = per_sample(&layers);
        assert_eq!(count.forward, forward);
        assert_eq!(count.total(), 3 * forward - 2 * 32 * 128);
    }

    #[test]
    fn a_gpt_is_six_n_per_token_plus_the_attention_term() {
        let (n_layer, d, t, vocab) = (3u64, 48u64, 20u64, 256u64);
        let mut layers = Vec::new();
        for _ in 0..n_layer {
            layers.extend([
                linear(d, 3 * d, t, true),
                attention(4, d / 4, t),
                linear(d, d, t, true),
                linear(d, 4 * d, t, true),
                linear(4 * d, d, t, true),
            ]);
        }
        layers.push(linear(d, vocab, t, true));
        let params = n_layer * 12 * d * d + d * vocab;
        assert_eq!(per_sample(&layers).total(), t * (6 * params + 12 * n_layer * d * t));
    }

    #[test]
    fn lookups_and_norms_are_free() {
        let norm = LayerSpec { kind: LayerKind::Norm, ..linear(8, 8, 4, true) };
        let embedding = LayerSpec { kind: LayerKind::Embedding, ..linear(256, 8, 4, false) };
        assert_eq!(per_sample(&[norm, embedding]), PerSample::default());
    }
}
