//! GPT-2's `config.json` and ptrain's `[model]` keys, both ways, and its parameter
//! table: nanoGPT's names are `GPT2LMHeadModel`'s, and only the layout of the linear
//! layers differs. GPT-2's `Conv1D` stores its weight as `[in, out]`, a `Linear` as
//! `[out, in]`; the fused `c_attn` is q, k, v in that order in both. The output head
//! is tied to `transformer.wte.weight` in both.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::{
    config::{Activation, ModelConfig},
    model::hf::{arch::HfConfig, names},
};

/// Reads a GPT-2 `config.json` ([`crate::model::family::HfSpec::read`]).
pub(super) fn read(raw: &Map<String, Value>, _model_type: &str) -> Result<Arc<dyn HfConfig>, String> {
    Ok(Arc::new(Gpt2Arch::from_json(raw)?))
}

/// The `config.json` of an export.
pub(super) fn write(m: &ModelConfig, base: Option<&Map<String, Value>>) -> Result<Map<String, Value>, String> {
    Ok(Gpt2Arch::from_model(m).to_json(m.dropout, base))
}

/// Every parameter of `GPT2LMHeadModel`: the `gpt`'s with biases (which GPT-2 always has).
pub(super) fn params(m: &ModelConfig) -> Vec<names::Param> {
    names::from_layout(&super::layout(m, true), true)
}

/// Without biases (`model.gpt.bias = false`) the same model has zero biases.
pub(super) fn absent_as_zeros(m: &ModelConfig, name: &str) -> bool {
    !m.gpt.bias && name.ends_with(".bias") && !name.contains(".ln_")
}

/// A GPT-2 file's tensor name in `GPT2LMHeadModel`'s terms: files saved from the
/// bare `GPT2Model` (the hub's `gpt2`) lack the `transformer.` prefix.
pub(super) fn canonical(hf_name: &str) -> String {
    if hf_name.starts_with("transformer.") || hf_name.starts_with("lm_head.") {
        hf_name.to_string()
    } else {
        format!("transformer.{hf_name}")
    }
}

/// Tensors GPT-2 files may hold that are not parameters: the attention mask
/// buffers of older checkpoints, and the head, tied to the token embedding.
pub(super) fn known_extra(_m: &ModelConfig, canonical_name: &str) -> bool {
    if canonical_name == "lm_head.weight" {
        return true;
    }
    let Some(rest) = canonical_name.strip_prefix("transformer.h.") else { return false };
    let mut parts = rest.splitn(2, '.');
    let layer_ok = parts.next().is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    layer_ok && matches!(parts.next(), Some("attn.bias" | "attn.masked_bias"))
}

/// What of a GPT-2 `config.json` decides the computation, in ptrain's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpt2Arch {
    pub vocab_size: i64,
    pub n_positions: i64,
    pub n_embd: i64,
    pub n_layer: i64,
    pub n_head: i64,
    pub layer_norm_epsilon: f64,
    pub activation: Activation,
}

/// `transformers.GPT2Config`'s defaults, used for keys a `config.json` leaves out
/// (as `transformers` does).
const DEFAULTS: Gpt2Arch = Gpt2Arch {
    vocab_size: 50257,
    n_positions: 1024,
    n_embd: 768,
    n_layer: 12,
    n_head: 12,
    layer_norm_epsilon: 1e-5,
    activation: Activation::GeluTanh,
};

fn int(raw: &Map<String, Value>, key: &str, default: i64) -> Result<i64, String> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_i64().filter(|&n| n > 0).ok_or_else(|| format!("{key} = {v} is not a positive integer")),
    }
}

fn flag(raw: &Map<String, Value>, key: &str, default: bool) -> Result<bool, String> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_bool().ok_or_else(|| format!("{key} = {v} is not a boolean")),
    }
}

impl Gpt2Arch {
    /// Reads a `config.json`; anything ptrain's `gpt` cannot compute is an error naming the key.
    pub fn from_json(raw: &Map<String, Value>) -> Result<Gpt2Arch, String> {
        match raw.get("model_type").and_then(Value::as_str) {
            Some("gpt2") => {}
            Some(other) => return Err(format!("model_type = \"{other}\": ptrain starts only from GPT-2 checkpoints (model_type \"gpt2\")")),
            None => return Err("no model_type: not a transformers config.json (expected model_type \"gpt2\")".into()),
        }
        let activation = match raw.get("activation_function").and_then(Value::as_str).unwrap_or("gelu_new") {
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Activation::GeluTanh,
            "gelu" => Activation::Gelu,
            other => return Err(format!("activation_function = \"{other}\" is not supported (ptrain: gelu, gelu_new / gelu_pytorch_tanh)")),
        };
        let eps = match raw.get("layer_norm_epsilon") {
            None | Some(Value::Null) => DEFAULTS.layer_norm_epsilon,
            Some(v) => v.as_f64().filter(|e| *e > 0.0).ok_or_else(|| format!("layer_norm_epsilon = {v} is not a positive number"))?,
        };
        let arch = Gpt2Arch {
            vocab_size: int(raw, "vocab_size", DEFAULTS.vocab_size)?,
            n_positions: int(raw, "n_positions", DEFAULTS.n_positions)?,
            n_embd: int(raw, "n_embd", DEFAULTS.n_embd)?,
            n_layer: int(raw, "n_layer", DEFAULTS.n_layer)?,
            n_head: int(raw, "n_head", DEFAULTS.n_head)?,
            layer_norm_epsilon: eps,
            activation,
        };
        if arch.n_embd % arch.n_head != 0 {
            return Err(format!("n_embd = {} is not divisible by n_head = {}", arch.n_embd, arch.n_head));
        }
        if let Some(inner) = raw.get("n_inner").and_then(Value::as_i64) {
            if inner != 4 * arch.n_embd {
                return Err(format!("n_inner = {inner}: ptrain's MLP is 4 * n_embd = {} wide", 4 * arch.n_embd));
            }
        }
        // Settings that change what GPT-2 computes and that ptrain does not implement.
        for (key, supported) in
            [("tie_word_embeddings", true), ("scale_attn_weights", true), ("scale_attn_by_inverse_layer_idx", false), ("add_cross_attention", false)]
        {
            if flag(raw, key, supported)? != supported {
                return Err(format!("{key} = {}: ptrain's gpt supports only {key} = {supported}", !supported));
            }
        }
        Ok(arch)
    }

    pub fn from_model(m: &ModelConfig) -> Gpt2Arch {
        Gpt2Arch {
            vocab_size: m.vocab_size,
            n_positions: m.block_size,
            n_embd: m.n_embd,
            n_layer: m.n_layer,
            n_head: m.n_head,
            layer_norm_epsilon: m.gpt.layer_norm_eps,
            activation: m.gpt.activation,
        }
    }

    /// `(ptrain [model] key, config.json key, value)` for every key `init_from` sets.
    pub fn keys(&self) -> Vec<(&'static str, &'static str, toml::Value)> {
        vec![
            ("vocab_size", "vocab_size", toml::Value::Integer(self.vocab_size)),
            ("n_layer", "n_layer", toml::Value::Integer(self.n_layer)),
            ("n_head", "n_head", toml::Value::Integer(self.n_head)),
            ("n_embd", "n_embd", toml::Value::Integer(self.n_embd)),
            ("block_size", "n_positions", toml::Value::Integer(self.n_positions)),
            ("gpt.layer_norm_eps", "layer_norm_epsilon", toml::Value::Float(self.layer_norm_epsilon)),
            ("gpt.activation", "activation_function", toml::Value::String(self.activation.name().into())),
            // GPT-2's linear layers all have biases.
            ("gpt.bias", "(GPT-2 layers have biases)", toml::Value::Boolean(true)),
        ]
    }

    /// The first key where `m` computes something else than this checkpoint.
    fn first_mismatch(&self, m: &ModelConfig) -> Option<String> {
        let ours = Gpt2Arch::from_model(m);
        let pairs = [
            ("vocab_size", "vocab_size", ours.vocab_size, self.vocab_size),
            ("n_layer", "n_layer", ours.n_layer, self.n_layer),
            ("n_head", "n_head", ours.n_head, self.n_head),
            ("n_embd", "n_embd", ours.n_embd, self.n_embd),
            ("block_size", "n_positions", ours.n_positions, self.n_positions),
        ];
        if let Some((key, hf, a, b)) = pairs.into_iter().find(|p| p.2 != p.3) {
            return Some(format!("model.{key} = {a} but {hf} = {b}"));
        }
        if ours.layer_norm_epsilon != self.layer_norm_epsilon {
            return Some(format!("model.gpt.layer_norm_eps = {} but layer_norm_epsilon = {}", ours.layer_norm_epsilon, self.layer_norm_epsilon));
        }
        if ours.activation != self.activation {
            return Some(format!("model.gpt.activation = \"{}\" but the checkpoint's is \"{}\"", ours.activation.name(), self.activation.name()));
        }
        (!m.gpt.bias).then(|| "model.gpt.bias = false but GPT-2 layers have biases".to_string())
    }

    /// The `config.json` of an export: `base` (the `init_from` one, if any) with
    /// every architecture key replaced by ptrain's.
    pub fn to_json(&self, dropout: f64, base: Option<&Map<String, Value>>) -> Map<String, Value> {
        let mut out = base.cloned().unwrap_or_default();
        let activation = match self.activation {
            Activation::GeluTanh => "gelu_new",
            Activation::Gelu => "gelu",
        };
        let keys = json!({
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": self.vocab_size,
            "n_positions": self.n_positions,
            "n_ctx": self.n_positions,
            "n_embd": self.n_embd,
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "n_inner": null,
            "activation_function": activation,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "tie_word_embeddings": true,
            "scale_attn_weights": true,
            "scale_attn_by_inverse_layer_idx": false,
            "add_cross_attention": false,
            "resid_pdrop": dropout,
            "embd_pdrop": dropout,
            "attn_pdrop": dropout,
            "initializer_range": 0.02,
            "use_cache": true,
            "dtype": "float32",
        });
        for (k, v) in keys.as_object().expect("an object") {
            out.insert(k.clone(), v.clone());
        }
        out.remove("torch_dtype");
        // GPT2Config's default token ids (50256) are wrong for another vocabulary.
        for key in ["bos_token_id", "eos_token_id"] {
            if out.get(key).and_then(Value::as_i64).is_none_or(|id| id >= self.vocab_size) {
                out.insert(key.into(), Value::Null);
            }
        }
        out
    }
}

impl HfConfig for Gpt2Arch {
    fn model_keys(&self) -> Vec<(String, &'static str, toml::Value)> {
        self.keys().into_iter().map(|(k, hf, v)| (k.to_string(), hf, v)).collect()
    }

    fn mismatch(&self, m: &ModelConfig) -> Option<String> {
        self.first_mismatch(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_model_names_get_the_prefix_and_buffers_are_known() {
        let m = crate::config::Config::default().model;
        assert_eq!(canonical("h.0.attn.c_attn.weight"), "transformer.h.0.attn.c_attn.weight");
        assert_eq!(canonical("transformer.wte.weight"), "transformer.wte.weight");
        assert!(known_extra(&m, "transformer.h.11.attn.bias") && known_extra(&m, "transformer.h.0.attn.masked_bias"));
        assert!(known_extra(&m, "lm_head.weight"));
        assert!(!known_extra(&m, "transformer.h.0.attn.c_attn.bias") && !known_extra(&m, "transformer.h.x.attn.bias"));
    }

    fn parse(text: &str) -> Result<Gpt2Arch, String> {
        Gpt2Arch::from_json(&serde_json::from_str(text).unwrap())
    }

    #[test]
    fn missing_keys_take_gpt2_defaults_and_gelu_new_is_the_tanh_approximation() {
        let arch = parse(r#"{"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 64}"#).unwrap();
        assert_eq!((arch.n_layer, arch.vocab_size, arch.n_positions, arch.activation), (2, 50257, 1024, Activation::GeluTanh));
        let arch = parse(r#"{"model_type": "gpt2", "activation_function": "gelu", "layer_norm_epsilon": 1e-6}"#).unwrap();
        assert_eq!((arch.activation, arch.layer_norm_epsilon), (Activation::Gelu, 1e-6));
    }

    #[test]
    fn what_ptrain_cannot_compute_is_named() {
        for (text, needle) in [
            (r#"{"model_type": "llama"}"#, "model_type = \"llama\""),
            (r#"{"vocab_size": 10}"#, "no model_type"),
            (r#"{"model_type": "gpt2", "activation_function": "relu"}"#, "activation_function = \"relu\""),
            (r#"{"model_type": "gpt2", "tie_word_embeddings": false}"#, "tie_word_embeddings"),
            (r#"{"model_type": "gpt2", "n_inner": 100}"#, "n_inner = 100"),
            (r#"{"model_type": "gpt2", "n_layer": -1}"#, "n_layer = -1"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
    }

    #[test]
    fn export_json_round_trips_and_keeps_other_keys() {
        let arch = parse(r#"{"model_type": "gpt2", "n_layer": 3, "n_head": 2, "n_embd": 32, "vocab_size": 300, "n_positions": 64}"#).unwrap();
        let base: Map<String, Value> =
            serde_json::from_str(r#"{"task_specific_params": {"x": 1}, "eos_token_id": 50256, "bos_token_id": 5}"#).unwrap();
        let json = arch.to_json(0.1, Some(&base));
        assert_eq!(Gpt2Arch::from_json(&json).unwrap(), arch);
        assert_eq!(json["task_specific_params"]["x"], 1);
        assert_eq!((json["eos_token_id"].clone(), json["bos_token_id"].clone()), (Value::Null, Value::from(5)));
    }
}
