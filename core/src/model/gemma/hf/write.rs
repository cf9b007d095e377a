//! A [`GemmaArch`] as ptrain's keys (what `model.init_from` fills in) and as the
//! `config.json` of an export.

use serde_json::{json, Map, Value};

use super::{GemmaArch, FAMILIES};

impl GemmaArch {
    /// `(ptrain key under [model], config.json key, value)` for every key `init_from`
    /// sets but `kind`.
    pub fn keys(&self) -> Vec<(String, &'static str, toml::Value)> {
        let a = &self.args;
        let (int, float) = (toml::Value::Integer, toml::Value::Float);
        let types = toml::Value::try_from(&a.layer_types).expect("layer types serialize");
        let keys = [
            ("vocab_size", "vocab_size", int(self.vocab_size)),
            ("n_layer", "num_hidden_layers", int(self.n_layer)),
            ("n_head", "num_attention_heads", int(self.n_head)),
            ("n_embd", "hidden_size", int(self.hidden_size)),
            ("block_size", "max_position_embeddings", int(self.max_positions)),
            ("gemma.n_kv_head", "num_key_value_heads", int(a.n_kv_head)),
            ("gemma.head_dim", "head_dim", int(a.head_dim)),
            ("gemma.intermediate_size", "intermediate_size", int(a.intermediate_size)),
            ("gemma.rms_norm_eps", "rms_norm_eps", float(a.rms_norm_eps)),
            ("gemma.rope_theta", "rope_theta", float(a.rope_theta)),
            ("gemma.rope_local_theta", "rope_local_base_freq", float(a.rope_local_theta)),
            ("gemma.query_pre_attn_scalar", "query_pre_attn_scalar", float(a.query_pre_attn_scalar)),
            ("gemma.attn_softcap", "attn_logit_softcapping", float(a.attn_softcap)),
            ("gemma.final_softcap", "final_logit_softcapping", float(a.final_softcap)),
            ("gemma.sliding_window", "sliding_window", int(a.sliding_window)),
            ("gemma.layer_types", "layer_types", types),
            ("gemma.qk_norm", "model_type", toml::Value::Boolean(a.qk_norm)),
            ("gemma.hf_model_type", "model_type", toml::Value::String(a.hf_model_type.clone())),
        ];
        keys.into_iter().map(|(key, hf, value)| (key.to_string(), hf, value)).collect()
    }

    /// The `config.json` of an export: `base` (the `init_from` one, if of the same
    /// `model_type`) with every architecture key replaced; RoPE in both the 5.x and the
    /// 4.x form.
    pub fn to_json(&self, base: Option<&Map<String, Value>>) -> Map<String, Value> {
        let a = &self.args;
        let mut out = base.filter(|b| b.get("model_type").and_then(Value::as_str) == Some(&a.hf_model_type)).cloned().unwrap_or_default();
        for key in ["torch_dtype", "sliding_window_pattern", "rope_scaling", "rope_local_base_freq", "hidden_act"] {
            out.remove(key);
        }
        let gemma3 = a.hf_model_type == "gemma3_text";
        let class = FAMILIES.iter().find(|f| f.0 == a.hf_model_type).map_or("Gemma2ForCausalLM", |f| f.1);
        let cap = |c: f64| if c > 0.0 { json!(c) } else { Value::Null };
        let rope = |theta: f64| json!({"rope_type": "default", "rope_theta": theta});
        let rope_parameters = match gemma3 {
            true => json!({"full_attention": rope(a.rope_theta), "sliding_attention": rope(a.rope_local_theta)}),
            false => rope(a.rope_theta),
        };
        // transformers declares it an int.
        let scalar = a.query_pre_attn_scalar;
        let scalar = if scalar.fract() == 0.0 { json!(scalar as i64) } else { json!(scalar) };
        let keys = json!({
            "architectures": [class],
            "model_type": a.hf_model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": a.intermediate_size,
            "num_hidden_layers": self.n_layer,
            "num_attention_heads": self.n_head,
            "num_key_value_heads": a.n_kv_head,
            "head_dim": a.head_dim,
            "hidden_activation": "gelu_pytorch_tanh",
            "max_position_embeddings": self.max_positions,
            "rms_norm_eps": a.rms_norm_eps,
            "rope_parameters": rope_parameters,
            "rope_theta": a.rope_theta,
            "query_pre_attn_scalar": scalar,
            "attn_logit_softcapping": cap(a.attn_softcap),
            "final_logit_softcapping": cap(a.final_softcap),
            "sliding_window": if a.sliding_window > 0 { json!(a.sliding_window) } else { Value::Null },
            "layer_types": a.layer_types,
            "tie_word_embeddings": true,
            "attention_bias": false,
            "attention_dropout": self.attention_dropout,
            "use_bidirectional_attention": false,
            "dtype": "float32",
        });
        out.extend(keys.as_object().expect("an object").clone());
        if gemma3 {
            out.insert("rope_local_base_freq".into(), a.rope_local_theta.into());
        }
        crate::model::hf::arch::null_foreign_token_ids(&mut out, self.vocab_size);
        out
    }
}
