//! The `config.json` of `Qwen3MoeForCausalLM`, `Qwen2MoeForCausalLM` and
//! `MixtralForCausalLM` (transformers 4.x and 5.x forms), and ptrain's `[model]`,
//! `[model.llama]` and `[model.moe]` keys, both ways: the attention half is the llama
//! family's mapping (Qwen3-MoE's as `qwen3`'s, Qwen2-MoE's as `qwen2`'s, Mixtral's as
//! `mistral`'s), the experts' keys are read here. The parameter table is
//! the family's layout under transformers 5's names in memory, each stacked expert
//! tensor split into the per-expert tensors `save_pretrained` writes (and Mixtral's
//! router renamed to its `block_sparse_moe.gate`).

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::{
    config::{ModelConfig, MoeArgs},
    model::{
        hf::{arch::HfConfig, names},
        llama::hf::LlamaArch,
    },
};

/// The Hugging Face families the `moe` kind computes, with their class names.
pub const FAMILIES: [(&str, &str); 3] =
    [("qwen3_moe", "Qwen3MoeForCausalLM"), ("qwen2_moe", "Qwen2MoeForCausalLM"), ("mixtral", "MixtralForCausalLM")];

/// The llama family's `model_type` whose attention each has.
fn attention_of(model_type: &str) -> &'static str {
    match model_type {
        "mixtral" => "mistral",
        "qwen2_moe" => "qwen2",
        _ => "qwen3",
    }
}

pub(super) fn read(raw: &Map<String, Value>, model_type: &str) -> Result<Arc<dyn HfConfig>, String> {
    Ok(Arc::new(MoeArch::from_json(raw, model_type)?))
}

pub(super) fn write(m: &ModelConfig, base: Option<&Map<String, Value>>) -> Result<Map<String, Value>, String> {
    MoeArch::from_model(m).map(|a| a.to_json(base))
}

/// Every parameter of a `moe`, the experts split as `save_pretrained` writes them.
pub(super) fn params(m: &ModelConfig) -> Vec<names::Param> {
    let mixtral = MoeArch::export_type(m).is_ok_and(|t| t == "mixtral");
    let (experts, d, width) = (m.moe.experts, m.n_embd, m.moe.expert_width(&m.llama, m.n_embd));
    let mut params = names::from_layout(&super::layout(m), false);
    for p in &mut params {
        let Some((block, leaf)) = p.name.split_once(".mlp.") else { continue };
        let module = if mixtral { "block_sparse_moe" } else { "mlp" };
        let expert = |e: i64, name: &str| -> String {
            let name = match (mixtral, name) {
                (true, "gate_proj") => "w1",
                (true, "up_proj") => "w3",
                (true, _) => "w2",
                (false, name) => name,
            };
            format!("{block}.{module}.experts.{e}.{name}.weight")
        };
        p.split = match leaf {
            "gate.weight" if mixtral => vec![(format!("{block}.block_sparse_moe.gate.weight"), p.shape.clone())],
            "experts.gate_up_proj" => {
                (0..experts).flat_map(|e| [(expert(e, "gate_proj"), vec![width, d]), (expert(e, "up_proj"), vec![width, d])]).collect()
            }
            "experts.down_proj" => (0..experts).map(|e| (expert(e, "down_proj"), vec![d, width])).collect(),
            _ => continue,
        };
    }
    params
}

/// What of such a `config.json` decides the computation: its attention half as the llama
/// family reads it, and the experts.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeArch {
    llama: LlamaArch,
    moe: MoeArgs,
}

fn int(raw: &Map<String, Value>, key: &str) -> Result<Option<i64>, String> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_i64().filter(|&n| n > 0).map(Some).ok_or_else(|| format!("{key} = {v} is not a positive integer")),
    }
}

/// Qwen's dense blocks: `mlp_only_layers` and `decoder_sparse_step`.
fn dense_layers(raw: &Map<String, Value>, moe: &mut MoeArgs) -> Result<(), String> {
    moe.decoder_sparse_step = int(raw, "decoder_sparse_step")?.unwrap_or(1);
    moe.mlp_only_layers = match raw.get("mlp_only_layers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_i64().filter(|i| *i >= 0).ok_or_else(|| format!("mlp_only_layers holds {v}: not a block index")))
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(format!("mlp_only_layers = {v} is not a list of block indices")),
    };
    Ok(())
}

impl MoeArch {
    /// Reads a `config.json` whose `model_type` is one of [`FAMILIES`]; anything the `moe`
    /// kind cannot compute is an error naming the key.
    pub fn from_json(raw: &Map<String, Value>, model_type: &str) -> Result<MoeArch, String> {
        let class = FAMILIES.iter().find(|f| f.0 == model_type).map(|f| f.1).ok_or_else(|| format!("model_type = \"{model_type}\""))?;
        if let Some(other) = raw.get("architectures").and_then(Value::as_array).and_then(|a| a.iter().filter_map(Value::as_str).find(|a| *a != class))
        {
            return Err(format!("architectures = [\"{other}\"]: ptrain trains {class} (a causal language model) for model_type \"{model_type}\""));
        }
        let mut attention = raw.clone();
        attention.remove("architectures");
        let mut llama = LlamaArch::from_json(&attention, attention_of(model_type))?;
        let mut moe = crate::config::Config::default().model.moe;
        moe.experts = match (int(raw, "num_experts")?, int(raw, "num_local_experts")?) {
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) => return Err("no num_experts (num_local_experts): a config.json written by save_pretrained has it".into()),
        };
        moe.top_k = int(raw, "num_experts_per_tok")?.ok_or("no num_experts_per_tok: a config.json written by save_pretrained has it")?;
        if moe.top_k > moe.experts {
            return Err(format!("num_experts_per_tok = {} is more than the {} experts", moe.top_k, moe.experts));
        }
        moe.expert_intermediate_size = match model_type {
            "mixtral" => llama.args.intermediate_size,
            _ => int(raw, "moe_intermediate_size")?.ok_or("no moe_intermediate_size: a config.json written by save_pretrained has it")?,
        };
        moe.norm_topk_prob = model_type == "mixtral" || raw.get("norm_topk_prob").and_then(Value::as_bool).unwrap_or(false);
        if let Some(coef) = raw.get("router_aux_loss_coef").filter(|v| !v.is_null()) {
            moe.router_aux_loss_coef =
                coef.as_f64().filter(|c| *c >= 0.0).ok_or_else(|| format!("router_aux_loss_coef = {coef} is not a number >= 0"))?;
        }
        if model_type == "mixtral" {
            moe.router_jitter_noise = match raw.get("router_jitter_noise") {
                None | Some(Value::Null) => 0.0,
                Some(j) => j.as_f64().filter(|j| (0.0..1.0).contains(j)).ok_or_else(|| format!("router_jitter_noise = {j} is not in [0, 1)"))?,
            };
        } else {
            dense_layers(raw, &mut moe)?;
        }
        if model_type == "qwen2_moe" {
            moe.shared_expert_intermediate_size = int(raw, "shared_expert_intermediate_size")?
                .ok_or("no shared_expert_intermediate_size: a config.json written by save_pretrained has it")?;
            llama.args.qkv_bias = raw.get("qkv_bias").map_or(Some(true), Value::as_bool).ok_or("qkv_bias is not a boolean")?;
        }
        moe.hf_model_type = model_type.to_string();
        llama.args.hf_model_type = String::new();
        Ok(MoeArch { llama, moe })
    }

    /// The `model_type` an export writes: `hf_model_type`, or the one the llama keys fit.
    fn export_type(m: &ModelConfig) -> Result<&'static str, String> {
        let (l, a) = (&m.llama, &m.moe);
        let (shared, dense) = (a.shared_expert_intermediate_size > 0, (0..m.n_layer).any(|i| !a.is_sparse(i)));
        let fits = |t: &str| match t {
            "qwen3_moe" => l.qk_norm && !shared,
            "qwen2_moe" => !l.qk_norm && !l.o_bias && shared,
            _ => !l.qk_norm && !l.qkv_bias && !l.o_bias && !shared && !dense,
        };
        let chosen = match a.hf_model_type.as_str() {
            "" if l.qk_norm => "qwen3_moe",
            "" if shared => "qwen2_moe",
            "" => "mixtral",
            t => FAMILIES
                .iter()
                .map(|f| f.0)
                .find(|f| *f == t)
                .ok_or_else(|| format!("model.moe.hf_model_type = \"{t}\" is not qwen3_moe, qwen2_moe or mixtral"))?,
        };
        match fits(chosen) {
            true => Ok(chosen),
            false => Err(format!(
                "model.moe.hf_model_type = \"{chosen}\" with model.llama.qk_norm = {}, qkv_bias = {}, o_bias = {}, model.moe.shared_expert_intermediate_size = {}, dense blocks: {dense}: {chosen} has {}",
                l.qk_norm,
                l.qkv_bias,
                l.o_bias,
                a.shared_expert_intermediate_size,
                match chosen {
                    "qwen3_moe" => "q/k norms and no shared expert",
                    "qwen2_moe" => "a shared expert, no q/k norms and no o_proj bias",
                    _ => "no q/k norms, no attention biases, no shared expert and no dense blocks",
                }
            )),
        }
    }

    /// The configured model as such an architecture.
    pub fn from_model(m: &ModelConfig) -> Result<MoeArch, String> {
        let model_type = MoeArch::export_type(m)?;
        let mut attention = m.clone();
        attention.llama.hf_model_type = attention_of(model_type).into();
        attention.llama.mlp_bias = false;
        // Qwen2-MoE's q/k/v biases are its own key (`qkv_bias`), not qwen2's given.
        attention.llama.qkv_bias |= model_type == "qwen2_moe";
        let mut llama = LlamaArch::from_model(&attention)?;
        llama.args.qkv_bias = m.llama.qkv_bias;
        if model_type == "mixtral" {
            llama.args.intermediate_size = m.moe.expert_width(&m.llama, m.n_embd);
        }
        let mut moe = m.moe.clone();
        moe.hf_model_type = model_type.into();
        moe.expert_intermediate_size = m.moe.expert_width(&m.llama, m.n_embd);
        Ok(MoeArch { llama, moe })
    }

    /// The `config.json` of an export: the llama family's for the attention half, with
    /// the experts' keys and the class of `model_type`.
    pub fn to_json(&self, base: Option<&Map<String, Value>>) -> Map<String, Value> {
        let model_type = self.moe.hf_model_type.as_str();
        let base = base.filter(|b| b.get("model_type").and_then(Value::as_str) == Some(model_type)).map(|b| {
            let mut b = b.clone();
            b.insert("model_type".into(), attention_of(model_type).into());
            b
        });
        let mut out = self.llama.to_json(base.as_ref());
        let class = FAMILIES.iter().find(|f| f.0 == model_type).map_or("", |f| f.1);
        let a = &self.moe;
        out.insert("architectures".into(), serde_json::json!([class]));
        out.insert("model_type".into(), model_type.into());
        out.insert("num_experts_per_tok".into(), a.top_k.into());
        out.insert("router_aux_loss_coef".into(), a.router_aux_loss_coef.into());
        out.remove("mlp_bias");
        if model_type == "mixtral" {
            out.insert("num_local_experts".into(), a.experts.into());
            out.insert("intermediate_size".into(), a.expert_intermediate_size.into());
            out.insert("router_jitter_noise".into(), a.router_jitter_noise.into());
        } else {
            out.insert("num_experts".into(), a.experts.into());
            out.remove("num_local_experts");
            out.insert("moe_intermediate_size".into(), a.expert_intermediate_size.into());
            out.insert("norm_topk_prob".into(), a.norm_topk_prob.into());
            out.insert("decoder_sparse_step".into(), a.decoder_sparse_step.into());
            out.insert("mlp_only_layers".into(), serde_json::json!(a.mlp_only_layers));
        }
        if model_type == "qwen2_moe" {
            out.insert("shared_expert_intermediate_size".into(), a.shared_expert_intermediate_size.into());
            out.insert("qkv_bias".into(), self.llama.args.qkv_bias.into());
        }
        out
    }
}

impl HfConfig for MoeArch {
    fn model_keys(&self) -> Vec<(String, &'static str, toml::Value)> {
        let a = &self.moe;
        let mut keys: Vec<_> = self.llama.keys().into_iter().filter(|(k, _, _)| k != "llama.hf_model_type").collect();
        keys.extend([
            ("moe.experts".to_string(), "num_experts", toml::Value::Integer(a.experts)),
            ("moe.top_k".into(), "num_experts_per_tok", toml::Value::Integer(a.top_k)),
            ("moe.expert_intermediate_size".into(), "moe_intermediate_size", toml::Value::Integer(a.expert_intermediate_size)),
            ("moe.norm_topk_prob".into(), "norm_topk_prob", toml::Value::Boolean(a.norm_topk_prob)),
            (
                "moe.shared_expert_intermediate_size".into(),
                "shared_expert_intermediate_size",
                toml::Value::Integer(a.shared_expert_intermediate_size),
            ),
            (
                "moe.mlp_only_layers".into(),
                "mlp_only_layers",
                toml::Value::Array(a.mlp_only_layers.iter().map(|i| toml::Value::Integer(*i)).collect()),
            ),
            ("moe.decoder_sparse_step".into(), "decoder_sparse_step", toml::Value::Integer(a.decoder_sparse_step)),
            ("moe.hf_model_type".into(), "model_type", toml::Value::String(a.hf_model_type.clone())),
        ]);
        keys
    }

    /// `router_aux_loss_coef` and `router_jitter_noise` (training's, not the model's):
    /// the checkpoint's, unless the configuration sets another.
    fn defaults(&self) -> Vec<(String, toml::Value)> {
        vec![
            ("moe.router_aux_loss_coef".into(), toml::Value::Float(self.moe.router_aux_loss_coef)),
            ("moe.router_jitter_noise".into(), toml::Value::Float(self.moe.router_jitter_noise)),
        ]
    }
}
