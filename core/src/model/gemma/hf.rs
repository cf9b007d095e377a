//! The `config.json` of `Gemma2ForCausalLM` and `Gemma3ForCausalLM` (`gemma3_text`), in
//! the transformers 5.x form (`rope_parameters`, per layer type for Gemma 3;
//! `layer_types`; `dtype`) and the 4.x form (`rope_theta`, `rope_local_base_freq`,
//! `sliding_window_pattern`, `torch_dtype`), and ptrain's `[model]` / `[model.gemma]`
//! keys, both ways. What the config sets that ptrain does not compute is an error
//! naming the key.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::{
    config::{GemmaArgs, LayerType, ModelConfig},
    model::hf::arch::HfConfig,
};

mod write;

/// The `model_type`s the `gemma` kind computes, with their class names.
pub const FAMILIES: [(&str, &str); 2] = [("gemma2", "Gemma2ForCausalLM"), ("gemma3_text", "Gemma3ForCausalLM")];

/// What of such a `config.json` decides the computation.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmaArch {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub n_layer: i64,
    pub n_head: i64,
    pub max_positions: i64,
    pub attention_dropout: f64,
    /// Every `[model.gemma]` key, resolved (`layer_types` listed, `hf_model_type` set).
    pub args: GemmaArgs,
}

pub(super) fn read(raw: &Map<String, Value>, model_type: &str) -> Result<Arc<dyn HfConfig>, String> {
    Ok(Arc::new(GemmaArch::from_json(raw, model_type)?))
}

pub(super) fn write(m: &ModelConfig, base: Option<&Map<String, Value>>) -> Result<Map<String, Value>, String> {
    Ok(GemmaArch::from_model(m)?.to_json(base))
}

/// Files saved from the bare model lack the `model.` prefix.
pub(super) fn canonical(hf_name: &str) -> String {
    match hf_name.starts_with("model.") || hf_name.starts_with("lm_head.") {
        true => hf_name.to_string(),
        false => format!("model.{hf_name}"),
    }
}

/// The tied head saved anyway, and RoPE buffers.
pub(super) fn known_extra(_m: &ModelConfig, canonical_name: &str) -> bool {
    canonical_name == "lm_head.weight" || canonical_name.contains("rotary_emb.")
}

/// A key's value, `None` when absent; `Some(Value::Null)` when written as null.
fn number(raw: &Map<String, Value>, key: &str, default: Option<f64>) -> Result<Option<f64>, String> {
    match raw.get(key) {
        None => Ok(default),
        Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().filter(|x| *x > 0.0).map(Some).ok_or_else(|| format!("{key} = {v} is not a positive number")),
    }
}

fn int(raw: &Map<String, Value>, key: &str, default: Option<i64>) -> Result<i64, String> {
    match raw.get(key) {
        None | Some(Value::Null) => default.ok_or_else(|| format!("no {key}: a config.json written by save_pretrained has it")),
        Some(v) => v.as_i64().filter(|&n| n > 0).ok_or_else(|| format!("{key} = {v} is not a positive integer")),
    }
}

/// `key` must be `want` (or absent): ptrain computes nothing else.
fn only(raw: &Map<String, Value>, key: &str, want: Value, why: &str) -> Result<(), String> {
    match raw.get(key) {
        Some(v) if !v.is_null() && *v != want => Err(format!("{key} = {v}: {why}")),
        _ => Ok(()),
    }
}

/// RoPE's bases `(global, local)`: `rope_parameters` (5.x, per layer type for Gemma
/// 3), or `rope_theta` and `rope_local_base_freq` (4.x); the default type only.
fn rope(raw: &Map<String, Value>, gemma3: bool) -> Result<(f64, f64), String> {
    let default_theta = if gemma3 { 1e6 } else { 1e4 };
    let top = number(raw, "rope_theta", Some(default_theta))?.unwrap_or(default_theta);
    let local_top = number(raw, "rope_local_base_freq", Some(1e4))?.unwrap_or(1e4);
    let check = |params: &Value, key: &str| -> Result<Option<f64>, String> {
        let kind = params.get("rope_type").or_else(|| params.get("type")).and_then(Value::as_str).unwrap_or("default");
        if kind != "default" {
            return Err(format!("{key}: rope_type = \"{kind}\" is not implemented for gemma (ptrain: default)"));
        }
        if let Some(partial) = params.get("partial_rotary_factor").and_then(Value::as_f64).filter(|p| *p != 1.0) {
            return Err(format!("{key}: partial_rotary_factor = {partial}: ptrain rotates whole heads"));
        }
        Ok(params.get("rope_theta").and_then(Value::as_f64))
    };
    if let Some(scaling) = raw.get("rope_scaling").filter(|v| !v.is_null()) {
        check(scaling, "rope_scaling")?;
    }
    match raw.get("rope_parameters").filter(|v| !v.is_null()) {
        None => Ok((top, if gemma3 { local_top } else { top })),
        Some(p) if gemma3 && p.get("full_attention").is_some() => {
            let global = p.get("full_attention").map(|f| check(f, "rope_parameters.full_attention")).transpose()?.flatten();
            let local = p.get("sliding_attention").map(|s| check(s, "rope_parameters.sliding_attention")).transpose()?.flatten();
            Ok((global.unwrap_or(top), local.unwrap_or(local_top)))
        }
        Some(p) => {
            let theta = check(p, "rope_parameters")?.unwrap_or(top);
            Ok((theta, if gemma3 { local_top } else { theta }))
        }
    }
}

/// Each layer's type: `layer_types`, or the pattern (Gemma 2: every 2nd layer full;
/// Gemma 3: every `sliding_window_pattern`-th, default 6).
fn layer_types(raw: &Map<String, Value>, gemma3: bool, n_layer: i64) -> Result<Vec<LayerType>, String> {
    if let Some(types) = raw.get("layer_types").filter(|v| !v.is_null()) {
        let bad = || format!("layer_types = {types}: expected {n_layer} of \"sliding_attention\" and \"full_attention\"");
        let list = types.as_array().filter(|l| l.len() as i64 == n_layer).ok_or_else(bad)?;
        return list.iter().map(|t| serde_json::from_value(t.clone()).map_err(|_| bad())).collect();
    }
    let pattern = if gemma3 { int(raw, "sliding_window_pattern", Some(6))? } else { 2 };
    Ok((0..n_layer).map(|i| if (i + 1) % pattern != 0 { LayerType::SlidingAttention } else { LayerType::FullAttention }).collect())
}

impl GemmaArch {
    /// Reads a `config.json` whose `model_type` is one of [`FAMILIES`].
    pub fn from_json(raw: &Map<String, Value>, model_type: &str) -> Result<GemmaArch, String> {
        let class = FAMILIES.iter().find(|f| f.0 == model_type).map(|f| f.1).ok_or_else(|| format!("model_type = \"{model_type}\""))?;
        if let Some(other) = raw.get("architectures").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).find(|a| *a != class)
        {
            return Err(format!("architectures = [\"{other}\"]: ptrain trains {class} (a causal language model) for model_type \"{model_type}\""));
        }
        let gemma3 = model_type == "gemma3_text";
        only(raw, "hidden_activation", json!("gelu_pytorch_tanh"), "the gemma kind's MLP is GeGLU with gelu_pytorch_tanh")?;
        only(raw, "tie_word_embeddings", json!(true), "ptrain's gemma ties its head to the token embedding")?;
        only(raw, "attention_bias", json!(false), "ptrain's gemma has no attention biases")?;
        only(raw, "use_bidirectional_attention", json!(false), "ptrain's gemma is a causal language model")?;
        if gemma3 {
            only(raw, "attn_logit_softcapping", Value::Null, "transformers' Gemma 3 does not apply it (ptrain: null)")?;
        }
        let (hidden_size, n_head, n_layer) =
            (int(raw, "hidden_size", None)?, int(raw, "num_attention_heads", None)?, int(raw, "num_hidden_layers", None)?);
        let mut args = crate::config::Config::default().model.gemma;
        (args.n_kv_head, args.head_dim) = (int(raw, "num_key_value_heads", Some(4))?, int(raw, "head_dim", Some(256))?);
        args.intermediate_size = int(raw, "intermediate_size", None)?;
        args.rms_norm_eps = number(raw, "rms_norm_eps", Some(1e-6))?.unwrap_or(1e-6);
        (args.rope_theta, args.rope_local_theta) = rope(raw, gemma3)?;
        args.query_pre_attn_scalar = number(raw, "query_pre_attn_scalar", Some(256.0))?.ok_or("query_pre_attn_scalar = null: Gemma scales by it")?;
        args.attn_softcap = number(raw, "attn_logit_softcapping", (!gemma3).then_some(50.0))?.unwrap_or(0.0);
        args.final_softcap = number(raw, "final_logit_softcapping", (!gemma3).then_some(30.0))?.unwrap_or(0.0);
        args.layer_types = layer_types(raw, gemma3, n_layer)?;
        args.sliding_window = match (raw.get("sliding_window"), args.layer_types.contains(&LayerType::SlidingAttention)) {
            (None, _) => 4096,
            (Some(Value::Null), false) => 0,
            (Some(Value::Null), true) => return Err("sliding_window = null while layer_types has sliding_attention layers".into()),
            (Some(v), _) => v.as_i64().filter(|&w| w > 0).ok_or_else(|| format!("sliding_window = {v} is not a positive integer"))?,
        };
        (args.qk_norm, args.hf_model_type) = (gemma3, model_type.to_string());
        if n_head % args.n_kv_head != 0 {
            return Err(format!("num_attention_heads = {n_head} is not a multiple of num_key_value_heads = {}", args.n_kv_head));
        }
        let attention_dropout = raw.get("attention_dropout").and_then(Value::as_f64).unwrap_or(0.0);
        let max_positions = int(raw, "max_position_embeddings", None)?;
        Ok(GemmaArch { vocab_size: int(raw, "vocab_size", None)?, hidden_size, n_layer, n_head, max_positions, attention_dropout, args })
    }

    /// The configured model as such an architecture; errors name the `[model.gemma]`
    /// keys that neither Gemma 2 nor Gemma 3 has together.
    pub fn from_model(m: &ModelConfig) -> Result<GemmaArch, String> {
        let (mut args, dims) = (m.gemma.clone(), super::dims(m));
        (args.n_kv_head, args.head_dim, args.intermediate_size) = (dims.kv_heads, dims.head_dim, dims.inner);
        if args.query_pre_attn_scalar == 0.0 {
            args.query_pre_attn_scalar = dims.head_dim as f64;
        }
        args.rope_local_theta = if args.rope_local_theta > 0.0 { args.rope_local_theta } else { args.rope_theta };
        args.layer_types = super::layer_types(m);
        let chosen = match args.hf_model_type.as_str() {
            "" if args.qk_norm => "gemma3_text",
            "" => "gemma2",
            other => other,
        };
        let why = match chosen {
            "gemma2" if args.qk_norm => Some("qk_norm = true (Gemma 2 has no q/k norms)"),
            "gemma2" if args.rope_local_theta != args.rope_theta => Some("rope_local_theta differs from rope_theta (Gemma 2 has one base)"),
            "gemma3_text" if !args.qk_norm => Some("qk_norm = false (Gemma 3 norms q and k)"),
            "gemma3_text" if args.attn_softcap > 0.0 => Some("attn_softcap > 0 (transformers' Gemma 3 does not cap attention)"),
            "gemma2" | "gemma3_text" => None,
            _ => Some("no such Hugging Face family (gemma2, gemma3_text)"),
        };
        if let Some(why) = why {
            return Err(format!("model.gemma.hf_model_type = \"{}\" exports as {chosen}, but {why}", args.hf_model_type));
        }
        args.hf_model_type = chosen.to_string();
        let (vocab_size, hidden_size, n_layer, n_head, max_positions) = (m.vocab_size, m.n_embd, m.n_layer, m.n_head, m.block_size);
        Ok(GemmaArch { vocab_size, hidden_size, n_layer, n_head, max_positions, attention_dropout: m.dropout, args })
    }
}

impl HfConfig for GemmaArch {
    fn model_keys(&self) -> Vec<(String, &'static str, toml::Value)> {
        self.keys()
    }
}
