//! The `config.json` of `LlamaForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM` and
//! `MistralForCausalLM`, in both the transformers 4.x form (top-level `rope_theta`,
//! `rope_scaling`, `torch_dtype`) and the 5.x form (`rope_parameters`, `dtype`), and
//! ptrain's `[model]` / `[model.llama]` keys, both ways; the parameter table is the
//! family's layout under its own (the Hugging Face) names.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::{
    config::{LlamaArgs, ModelConfig, RopeScaling},
    model::hf::{arch::HfConfig, names},
};

/// Reads a `config.json` of one of [`FAMILIES`] ([`crate::model::family::HfSpec::read`]).
pub(super) fn read(raw: &Map<String, Value>, model_type: &str) -> Result<Arc<dyn HfConfig>, String> {
    Ok(Arc::new(LlamaArch::from_json(raw, model_type)?))
}

/// The `config.json` of an export.
pub(super) fn write(m: &ModelConfig, base: Option<&Map<String, Value>>) -> Result<Map<String, Value>, String> {
    Ok(LlamaArch::from_model(m)?.to_json(base))
}

/// Every parameter of a `llama` (the names of `LlamaForCausalLM` and its kin).
pub(super) fn params(m: &ModelConfig) -> Vec<names::Param> {
    names::from_layout(&super::layout(m), false)
}

/// Files saved from the bare `LlamaModel` lack the `model.` prefix.
pub(in crate::model) fn canonical(hf_name: &str) -> String {
    match hf_name.starts_with("model.") || hf_name.starts_with("lm_head.") {
        true => hf_name.to_string(),
        false => format!("model.{hf_name}"),
    }
}

/// A tied head saved anyway, and the RoPE buffers of older checkpoints.
pub(in crate::model) fn known_extra(m: &ModelConfig, canonical_name: &str) -> bool {
    (m.llama.tie_embeddings && canonical_name == "lm_head.weight") || canonical_name.ends_with("rotary_emb.inv_freq")
}

/// The Hugging Face families the `llama` kind computes, with their class names.
pub const FAMILIES: [(&str, &str); 4] =
    [("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM"), ("qwen3", "Qwen3ForCausalLM"), ("mistral", "MistralForCausalLM")];

/// What of such a `config.json` decides the computation.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaArch {
    pub model_type: String,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub n_layer: i64,
    pub n_head: i64,
    pub max_positions: i64,
    pub attention_dropout: f64,
    /// Every `[model.llama]` key, `hf_model_type` included.
    pub args: LlamaArgs,
}

fn int(raw: &Map<String, Value>, key: &str, default: Option<i64>) -> Result<i64, String> {
    match raw.get(key) {
        None | Some(Value::Null) => default.ok_or_else(|| format!("no {key}: a config.json written by save_pretrained has it")),
        Some(v) => v.as_i64().filter(|&n| n > 0).ok_or_else(|| format!("{key} = {v} is not a positive integer")),
    }
}

fn float(raw: &Map<String, Value>, key: &str, default: f64) -> Result<f64, String> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_f64().filter(|x| *x > 0.0).ok_or_else(|| format!("{key} = {v} is not a positive number")),
    }
}

fn flag(raw: &Map<String, Value>, key: &str) -> Result<bool, String> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(v) => v.as_bool().ok_or_else(|| format!("{key} = {v} is not a boolean")),
    }
}

/// The RoPE settings: `rope_parameters` (5.x) or `rope_scaling` plus `rope_theta` (4.x).
fn rope(raw: &Map<String, Value>, args: &mut LlamaArgs) -> Result<(), String> {
    let params = match (raw.get("rope_parameters"), raw.get("rope_scaling")) {
        (Some(Value::Object(p)), _) => p.clone(),
        (_, Some(Value::Object(p))) => p.clone(),
        (Some(Value::Null) | None, Some(Value::Null) | None) => Map::new(),
        (Some(v), _) | (_, Some(v)) => return Err(format!("rope_parameters / rope_scaling = {v} is not an object")),
    };
    args.rope_theta = float(&params, "rope_theta", float(raw, "rope_theta", 10000.0)?)?;
    let kind = params.get("rope_type").or_else(|| params.get("type")).and_then(Value::as_str).unwrap_or("default");
    if let Some(partial) = params.get("partial_rotary_factor").or_else(|| raw.get("partial_rotary_factor")).and_then(Value::as_f64) {
        if partial != 1.0 {
            return Err(format!("partial_rotary_factor = {partial}: ptrain rotates whole heads"));
        }
    }
    args.rope_scaling = match kind {
        "default" => RopeScaling::None,
        "llama3" => {
            args.rope_factor = float(&params, "factor", 8.0)?;
            args.rope_low_freq_factor = float(&params, "low_freq_factor", 1.0)?;
            args.rope_high_freq_factor = float(&params, "high_freq_factor", 4.0)?;
            args.rope_original_max_positions = int(&params, "original_max_position_embeddings", None)?;
            RopeScaling::Llama3
        }
        other => return Err(format!("rope scaling type \"{other}\" is not implemented (ptrain: default, llama3)")),
    };
    Ok(())
}

/// A sliding window that would change the result: one narrower than the context.
fn sliding_window(raw: &Map<String, Value>, model_type: &str, max_positions: i64) -> Result<(), String> {
    let window = raw.get("sliding_window").and_then(Value::as_i64);
    let active = match model_type {
        "mistral" => window.is_some(),
        "qwen2" | "qwen3" => {
            flag(raw, "use_sliding_window")?
                || raw.get("layer_types").and_then(Value::as_array).is_some_and(|l| l.iter().any(|t| t.as_str() == Some("sliding_attention")))
        }
        _ => false,
    };
    match window {
        Some(w) if active && w < max_positions => Err(format!(
            "sliding_window = {w} (below max_position_embeddings = {max_positions}): sliding-window attention is not implemented and would change the result"
        )),
        _ => Ok(()),
    }
}

impl LlamaArch {
    /// Reads a `config.json` whose `model_type` is one of [`FAMILIES`]; anything the
    /// `llama` kind cannot compute is an error naming the key.
    pub fn from_json(raw: &Map<String, Value>, model_type: &str) -> Result<LlamaArch, String> {
        let class = FAMILIES.iter().find(|f| f.0 == model_type).map(|f| f.1).ok_or_else(|| format!("model_type = \"{model_type}\""))?;
        if let Some(archs) = raw.get("architectures").and_then(Value::as_array) {
            if let Some(other) = archs.iter().filter_map(Value::as_str).find(|a| *a != class) {
                return Err(format!(
                    "architectures = [\"{other}\"]: ptrain trains {class} (a causal language model) for model_type \"{model_type}\""
                ));
            }
        }
        let act = raw.get("hidden_act").and_then(Value::as_str).unwrap_or("silu");
        if act != "silu" {
            return Err(format!("hidden_act = \"{act}\": the llama kind's MLP is SwiGLU (silu)"));
        }
        let (hidden_size, n_head) = (int(raw, "hidden_size", None)?, int(raw, "num_attention_heads", None)?);
        // Llama and Mistral derive it; Qwen2's and Qwen3's classes default to 32 instead.
        let kv_default = matches!(model_type, "llama" | "mistral").then_some(n_head);
        let mut args = crate::config::Config::default().model.llama;
        args.n_kv_head = int(raw, "num_key_value_heads", kv_default)?;
        args.head_dim = int(raw, "head_dim", Some(hidden_size / n_head))?;
        args.intermediate_size = int(raw, "intermediate_size", None)?;
        args.rms_norm_eps = float(raw, "rms_norm_eps", 1e-6)?;
        rope(raw, &mut args)?;
        args.tie_embeddings = flag(raw, "tie_word_embeddings")?;
        let attention_bias = flag(raw, "attention_bias")?;
        (args.qkv_bias, args.o_bias) = match model_type {
            "qwen2" => (true, false),
            "mistral" => (false, false),
            _ => (attention_bias, attention_bias),
        };
        args.mlp_bias = model_type == "llama" && flag(raw, "mlp_bias")?;
        args.qk_norm = model_type == "qwen3";
        args.hf_model_type = model_type.to_string();
        if n_head % args.n_kv_head != 0 {
            return Err(format!("num_attention_heads = {n_head} is not a multiple of num_key_value_heads = {}", args.n_kv_head));
        }
        let max_positions = int(raw, "max_position_embeddings", None)?;
        sliding_window(raw, model_type, max_positions)?;
        let attention_dropout = match raw.get("attention_dropout") {
            None | Some(Value::Null) => 0.0,
            Some(v) => v.as_f64().filter(|p| (0.0..1.0).contains(p)).ok_or_else(|| format!("attention_dropout = {v} is not in [0, 1)"))?,
        };
        Ok(LlamaArch {
            model_type: model_type.to_string(),
            vocab_size: int(raw, "vocab_size", None)?,
            hidden_size,
            n_layer: int(raw, "num_hidden_layers", None)?,
            n_head,
            max_positions,
            attention_dropout,
            args,
        })
    }

    /// `(ptrain key under [model], config.json key, value)` for every key `init_from` sets
    /// but `kind`.
    pub fn keys(&self) -> Vec<(String, &'static str, toml::Value)> {
        let a = &self.args;
        let int = |v: i64| toml::Value::Integer(v);
        let mut keys = vec![
            ("vocab_size".to_string(), "vocab_size", int(self.vocab_size)),
            ("n_layer".into(), "num_hidden_layers", int(self.n_layer)),
            ("n_head".into(), "num_attention_heads", int(self.n_head)),
            ("n_embd".into(), "hidden_size", int(self.hidden_size)),
            ("block_size".into(), "max_position_embeddings", int(self.max_positions)),
            ("llama.n_kv_head".into(), "num_key_value_heads", int(a.n_kv_head)),
            ("llama.head_dim".into(), "head_dim", int(a.head_dim)),
            ("llama.intermediate_size".into(), "intermediate_size", int(a.intermediate_size)),
            ("llama.rms_norm_eps".into(), "rms_norm_eps", toml::Value::Float(a.rms_norm_eps)),
            ("llama.rope_theta".into(), "rope_theta", toml::Value::Float(a.rope_theta)),
            ("llama.rope_scaling".into(), "rope_type", toml::Value::String(scaling_name(a.rope_scaling).into())),
            ("llama.tie_embeddings".into(), "tie_word_embeddings", toml::Value::Boolean(a.tie_embeddings)),
            ("llama.qkv_bias".into(), "attention_bias", toml::Value::Boolean(a.qkv_bias)),
            ("llama.o_bias".into(), "attention_bias", toml::Value::Boolean(a.o_bias)),
            ("llama.mlp_bias".into(), "mlp_bias", toml::Value::Boolean(a.mlp_bias)),
            ("llama.qk_norm".into(), "model_type", toml::Value::Boolean(a.qk_norm)),
            ("llama.hf_model_type".into(), "model_type", toml::Value::String(a.hf_model_type.clone())),
        ];
        if a.rope_scaling == RopeScaling::Llama3 {
            keys.extend([
                ("llama.rope_factor".into(), "factor", toml::Value::Float(a.rope_factor)),
                ("llama.rope_low_freq_factor".into(), "low_freq_factor", toml::Value::Float(a.rope_low_freq_factor)),
                ("llama.rope_high_freq_factor".into(), "high_freq_factor", toml::Value::Float(a.rope_high_freq_factor)),
                ("llama.rope_original_max_positions".into(), "original_max_position_embeddings", int(a.rope_original_max_positions)),
            ]);
        }
        keys
    }

    /// The configured model as such an architecture; errors name the `[model.llama]`
    /// keys that no Hugging Face family has together.
    pub fn from_model(m: &ModelConfig) -> Result<LlamaArch, String> {
        let mut args = m.llama.clone();
        (args.n_kv_head, args.head_dim, args.intermediate_size) =
            (args.kv_heads(m.n_head), args.head_width(m.n_embd, m.n_head), args.mlp_width(m.n_embd));
        let fits = |family: &str| match family {
            "llama" => args.qkv_bias == args.o_bias && !args.qk_norm,
            "qwen2" => args.qkv_bias && !args.o_bias && !args.mlp_bias && !args.qk_norm,
            "qwen3" => args.qkv_bias == args.o_bias && !args.mlp_bias && args.qk_norm,
            "mistral" => !args.qkv_bias && !args.o_bias && !args.mlp_bias && !args.qk_norm,
            _ => false,
        };
        let model_type = match args.hf_model_type.as_str() {
            "" => FAMILIES.iter().map(|f| f.0).find(|f| fits(f)),
            chosen => Some(chosen).filter(|f| fits(f)),
        }
        .map(str::to_string)
        .ok_or_else(|| {
            format!(
                "model.llama.hf_model_type = \"{}\" with qkv_bias = {}, o_bias = {}, mlp_bias = {}, qk_norm = {}: no Hugging Face family \
                 (llama, qwen2, qwen3, mistral) has these together",
                args.hf_model_type, args.qkv_bias, args.o_bias, args.mlp_bias, args.qk_norm
            )
        })?;
        args.hf_model_type = model_type.clone();
        Ok(LlamaArch {
            model_type,
            vocab_size: m.vocab_size,
            hidden_size: m.n_embd,
            n_layer: m.n_layer,
            n_head: m.n_head,
            max_positions: m.block_size,
            attention_dropout: m.dropout,
            args,
        })
    }

    /// The `config.json` of an export: `base` (the `init_from` one, if any) with every
    /// architecture key replaced; RoPE in both the 5.x and the 4.x form.
    pub fn to_json(&self, base: Option<&Map<String, Value>>) -> Map<String, Value> {
        let mut out = base.filter(|b| b.get("model_type").and_then(Value::as_str) == Some(&self.model_type)).cloned().unwrap_or_default();
        let a = &self.args;
        let class = FAMILIES.iter().find(|f| f.0 == self.model_type).map_or("LlamaForCausalLM", |f| f.1);
        let rope_type = if a.rope_scaling == RopeScaling::None { "default" } else { scaling_name(a.rope_scaling) };
        let mut rope = json!({"rope_type": rope_type, "rope_theta": a.rope_theta});
        if a.rope_scaling == RopeScaling::Llama3 {
            let extra = json!({"factor": a.rope_factor, "low_freq_factor": a.rope_low_freq_factor,
                "high_freq_factor": a.rope_high_freq_factor, "original_max_position_embeddings": a.rope_original_max_positions});
            rope.as_object_mut().expect("an object").extend(extra.as_object().expect("an object").clone());
        }
        let scaling = if a.rope_scaling == RopeScaling::None { Value::Null } else { rope.clone() };
        let keys = json!({
            "architectures": [class],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": a.intermediate_size,
            "num_hidden_layers": self.n_layer,
            "num_attention_heads": self.n_head,
            "num_key_value_heads": a.n_kv_head,
            "head_dim": a.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_positions,
            "rms_norm_eps": a.rms_norm_eps,
            "rope_parameters": rope,
            "rope_theta": a.rope_theta,
            "rope_scaling": scaling,
            "tie_word_embeddings": a.tie_embeddings,
            "attention_dropout": self.attention_dropout,
            "dtype": "float32",
        });
        out.extend(keys.as_object().expect("an object").clone());
        match self.model_type.as_str() {
            "llama" => {
                out.insert("attention_bias".into(), a.qkv_bias.into());
                out.insert("mlp_bias".into(), a.mlp_bias.into());
            }
            "qwen3" => {
                out.insert("attention_bias".into(), a.qkv_bias.into());
            }
            _ => {}
        }
        for key in ["use_sliding_window", "sliding_window", "layer_types", "max_window_layers"] {
            out.remove(key);
        }
        if self.model_type == "mistral" {
            out.insert("sliding_window".into(), Value::Null);
        }
        out.remove("torch_dtype");
        super::super::hf::arch::null_foreign_token_ids(&mut out, self.vocab_size);
        out
    }
}

impl HfConfig for LlamaArch {
    fn model_keys(&self) -> Vec<(String, &'static str, toml::Value)> {
        self.keys()
    }
}

fn scaling_name(s: RopeScaling) -> &'static str {
    match s {
        RopeScaling::None => "none",
        RopeScaling::Llama3 => "llama3",
    }
}

#[cfg(test)]
mod tests;
