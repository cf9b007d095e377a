//! ptrain's `gpt` and `llama` parameters and their Hugging Face counterparts.
//!
//! The `llama` kind uses the Hugging Face names and layouts themselves; for it this
//! table only lists what must be there.
//!
//! ptrain's `gpt` uses nanoGPT's names, which are `GPT2LMHeadModel`'s: only the
//! layout of the linear layers differs. GPT-2's `Conv1D` stores its weight as
//! `[in, out]`, a `Linear` as `[out, in]`; the fused `c_attn` is q, k, v in that
//! order in both. The output head is tied to `transformer.wte.weight` in both.

use crate::config::{ModelConfig, ModelKind};

/// One parameter of ptrain's `gpt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// The name in ptrain's `VarStore` and checkpoints.
    pub name: String,
    /// Its shape in ptrain (`[out, in]` for linear weights).
    pub shape: Vec<i64>,
    /// Stored transposed by GPT-2 (a `Conv1D` weight).
    pub conv1d: bool,
}

impl Param {
    /// The name in a `GPT2LMHeadModel` state dict (the same as ptrain's).
    pub fn hf_name(&self) -> &str {
        &self.name
    }

    /// Its shape in GPT-2's files.
    pub fn hf_shape(&self) -> Vec<i64> {
        if self.conv1d {
            self.shape.iter().rev().copied().collect()
        } else {
            self.shape.clone()
        }
    }
}

/// Every parameter of the configured `gpt` or `llama`, in a fixed order.
pub fn params(m: &ModelConfig) -> Vec<Param> {
    match m.kind {
        ModelKind::Llama => llama_params(m),
        _ => gpt2_params(m),
    }
}

/// Every parameter of a `llama` (the names of `LlamaForCausalLM` and its kin).
pub fn llama_params(m: &ModelConfig) -> Vec<Param> {
    let (a, d) = (&m.llama, m.n_embd);
    let (hd, kv, inner) = (a.head_width(d, m.n_head), a.kv_heads(m.n_head), a.mlp_width(d));
    let p = |name: String, shape: &[i64]| Param { name, shape: shape.to_vec(), conv1d: false };
    let mut out = vec![p("model.embed_tokens.weight".into(), &[m.vocab_size, d])];
    for i in 0..m.n_layer {
        let l = |s: &str| format!("model.layers.{i}.{s}");
        let linear = |out: &mut Vec<Param>, name: &str, inp: i64, width: i64, bias: bool| {
            out.push(p(l(&format!("{name}.weight")), &[width, inp]));
            if bias {
                out.push(p(l(&format!("{name}.bias")), &[width]));
            }
        };
        out.push(p(l("input_layernorm.weight"), &[d]));
        linear(&mut out, "self_attn.q_proj", d, m.n_head * hd, a.qkv_bias);
        linear(&mut out, "self_attn.k_proj", d, kv * hd, a.qkv_bias);
        linear(&mut out, "self_attn.v_proj", d, kv * hd, a.qkv_bias);
        linear(&mut out, "self_attn.o_proj", m.n_head * hd, d, a.o_bias);
        if a.qk_norm {
            out.extend([p(l("self_attn.q_norm.weight"), &[hd]), p(l("self_attn.k_norm.weight"), &[hd])]);
        }
        out.push(p(l("post_attention_layernorm.weight"), &[d]));
        linear(&mut out, "mlp.gate_proj", d, inner, a.mlp_bias);
        linear(&mut out, "mlp.up_proj", d, inner, a.mlp_bias);
        linear(&mut out, "mlp.down_proj", inner, d, a.mlp_bias);
    }
    out.push(p("model.norm.weight".into(), &[d]));
    if !a.tie_embeddings {
        out.push(p("lm_head.weight".into(), &[m.vocab_size, d]));
    }
    out
}

/// A file's tensor name in ptrain's terms, for either kind.
pub fn canonical_for(kind: ModelKind, hf_name: &str) -> String {
    match kind {
        // Files saved from the bare `LlamaModel` lack the `model.` prefix.
        ModelKind::Llama if !hf_name.starts_with("model.") && !hf_name.starts_with("lm_head.") => format!("model.{hf_name}"),
        ModelKind::Llama => hf_name.to_string(),
        _ => canonical(hf_name),
    }
}

/// Tensors a file may hold that are not parameters of the configured model.
pub fn is_known_extra_for(m: &ModelConfig, canonical_name: &str) -> bool {
    match m.kind {
        // A tied head saved anyway, and the RoPE buffers of older checkpoints.
        ModelKind::Llama => (m.llama.tie_embeddings && canonical_name == "lm_head.weight") || canonical_name.ends_with("rotary_emb.inv_freq"),
        _ => is_known_extra(canonical_name),
    }
}

/// Every parameter of a `gpt` with biases, in a fixed order.
pub fn gpt2_params(m: &ModelConfig) -> Vec<Param> {
    let d = m.n_embd;
    let p = |name: String, shape: &[i64], conv1d| Param { name, shape: shape.to_vec(), conv1d };
    let mut out = vec![p("transformer.wte.weight".into(), &[m.vocab_size, d], false), p("transformer.wpe.weight".into(), &[m.block_size, d], false)];
    for i in 0..m.n_layer {
        let h = |s: &str| format!("transformer.h.{i}.{s}");
        out.extend([
            p(h("ln_1.weight"), &[d], false),
            p(h("ln_1.bias"), &[d], false),
            p(h("attn.c_attn.weight"), &[3 * d, d], true),
            p(h("attn.c_attn.bias"), &[3 * d], false),
            p(h("attn.c_proj.weight"), &[d, d], true),
            p(h("attn.c_proj.bias"), &[d], false),
            p(h("ln_2.weight"), &[d], false),
            p(h("ln_2.bias"), &[d], false),
            p(h("mlp.c_fc.weight"), &[4 * d, d], true),
            p(h("mlp.c_fc.bias"), &[4 * d], false),
            p(h("mlp.c_proj.weight"), &[d, 4 * d], true),
            p(h("mlp.c_proj.bias"), &[d], false),
        ]);
    }
    out.extend([p("transformer.ln_f.weight".into(), &[d], false), p("transformer.ln_f.bias".into(), &[d], false)]);
    out
}

/// A GPT-2 file's tensor name in `GPT2LMHeadModel`'s terms: files saved from the
/// bare `GPT2Model` (the hub's `gpt2`) lack the `transformer.` prefix.
pub fn canonical(hf_name: &str) -> String {
    if hf_name.starts_with("transformer.") || hf_name.starts_with("lm_head.") {
        hf_name.to_string()
    } else {
        format!("transformer.{hf_name}")
    }
}

/// Tensors GPT-2 files may hold that are not parameters: the attention mask
/// buffers of older checkpoints, and the head, tied to the token embedding.
pub fn is_known_extra(canonical_name: &str) -> bool {
    if canonical_name == "lm_head.weight" {
        return true;
    }
    let Some(rest) = canonical_name.strip_prefix("transformer.h.") else { return false };
    let mut parts = rest.splitn(2, '.');
    let layer_ok = parts.next().is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    layer_ok && matches!(parts.next(), Some("attn.bias" | "attn.masked_bias"))
}

/// Transposes a row-major `[rows, cols]` matrix of `elem`-byte elements.
pub fn transpose_bytes(data: &[u8], rows: usize, cols: usize, elem: usize) -> Vec<u8> {
    assert_eq!(data.len(), rows * cols * elem, "matrix bytes");
    let mut out = vec![0u8; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            let from = (r * cols + c) * elem;
            let to = (c * rows + r) * elem;
            out[to..to + elem].copy_from_slice(&data[from..from + elem]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_table_matches_the_model_that_ptrain_builds() {
        let mut config = Config::default();
        config.model.n_layer = 2;
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let _gpt = crate::model::Gpt::decoder(&vs.root(), &config.model, crate::model::lora::Targets::NONE);
        let mut built: Vec<(String, Vec<i64>)> = vs.variables().into_iter().map(|(n, t)| (n, t.size())).collect();
        built.sort();
        let mut table: Vec<(String, Vec<i64>)> = gpt2_params(&config.model).into_iter().map(|p| (p.name, p.shape)).collect();
        table.sort();
        assert_eq!(built, table);
    }

    #[test]
    fn the_llama_table_matches_the_model_that_ptrain_builds() {
        for (tie, qkv_bias, qk_norm) in [(false, false, false), (true, true, false), (true, false, true)] {
            let mut m = Config::default().model;
            (m.kind, m.n_layer, m.llama.n_kv_head, m.llama.tie_embeddings, m.llama.qkv_bias, m.llama.qk_norm) =
                (ModelKind::Llama, 2, 2, tie, qkv_bias, qk_norm);
            let vs = tch::nn::VarStore::new(tch::Device::Cpu);
            let _llama = crate::model::Llama::decoder(&vs.root(), &m, crate::model::lora::Targets::NONE);
            let mut built: Vec<(String, Vec<i64>)> = vs.variables().into_iter().map(|(n, t)| (n, t.size())).collect();
            built.sort();
            let mut table: Vec<(String, Vec<i64>)> = llama_params(&m).into_iter().map(|p| (p.name, p.shape)).collect();
            table.sort();
            assert_eq!(built, table, "tie {tie}, qkv_bias {qkv_bias}, qk_norm {qk_norm}");
        }
    }

    #[test]
    fn bare_model_names_get_the_prefix_and_buffers_are_known() {
        assert_eq!(canonical("h.0.attn.c_attn.weight"), "transformer.h.0.attn.c_attn.weight");
        assert_eq!(canonical("transformer.wte.weight"), "transformer.wte.weight");
        assert!(is_known_extra("transformer.h.11.attn.bias") && is_known_extra("transformer.h.0.attn.masked_bias"));
        assert!(is_known_extra("lm_head.weight"));
        assert!(!is_known_extra("transformer.h.0.attn.c_attn.bias") && !is_known_extra("transformer.h.x.attn.bias"));
    }

    #[test]
    fn transpose_moves_elements_not_bytes() {
        let m: Vec<u8> = (0u16..6).flat_map(|v| v.to_le_bytes()).collect();
        let t = transpose_bytes(&m, 2, 3, 2);
        let values: Vec<u16> = t.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        assert_eq!(values, vec![0, 3, 1, 4, 2, 5]);
    }
}
