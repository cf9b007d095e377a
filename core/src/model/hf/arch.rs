//! Which architecture a `config.json` describes, and the `[model]` keys it decides.

use serde_json::{Map, Value};

use super::{llama_config::FAMILIES, Gpt2Arch, LlamaArch};
use crate::config::{ModelConfig, ModelKind};

/// A Hugging Face architecture ptrain computes.
#[derive(Debug, Clone, PartialEq)]
pub enum HfArch {
    /// `GPT2LMHeadModel`: ptrain's `gpt`.
    Gpt2(Gpt2Arch),
    /// `LlamaForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `MistralForCausalLM`: ptrain's `llama`.
    Llama(LlamaArch),
}

impl HfArch {
    pub fn from_json(raw: &Map<String, Value>) -> Result<HfArch, String> {
        match raw.get("model_type").and_then(Value::as_str) {
            Some("gpt2") => Gpt2Arch::from_json(raw).map(HfArch::Gpt2),
            Some(t) if FAMILIES.iter().any(|f| f.0 == t) => LlamaArch::from_json(raw, t).map(HfArch::Llama),
            Some(other) => Err(format!("model_type = \"{other}\": ptrain starts from gpt2, llama, qwen2, qwen3 and mistral checkpoints")),
            None => Err("no model_type: not a transformers config.json (expected model_type gpt2, llama, qwen2, qwen3 or mistral)".into()),
        }
    }

    pub fn kind(&self) -> ModelKind {
        match self {
            HfArch::Gpt2(_) => ModelKind::Gpt,
            HfArch::Llama(_) => ModelKind::Llama,
        }
    }

    /// `(key path under [model], config.json key, value)` for every key `init_from`
    /// decides, `kind` first.
    pub fn model_keys(&self) -> Vec<(String, &'static str, toml::Value)> {
        match self {
            HfArch::Gpt2(a) => std::iter::once(("kind".to_string(), "model_type", toml::Value::String("gpt".into())))
                .chain(a.model_keys().into_iter().map(|(k, hf, v)| (k.to_string(), hf, v)))
                .collect(),
            HfArch::Llama(a) => a.model_keys(),
        }
    }

    /// The first key where `m` computes something else than this checkpoint.
    pub fn mismatch(&self, m: &ModelConfig) -> Option<String> {
        let table = toml::Table::try_from(m).expect("[model] serializes");
        self.model_keys().into_iter().find_map(|(path, hf_key, value)| {
            let current = lookup(&table, &path);
            (current != Some(&value)).then(|| format!("model.{path} = {} but {hf_key} = {value}", current.map_or("(none)".into(), |c| c.to_string())))
        })
    }
}

/// The value at dotted `path` of `table`.
pub fn lookup<'a>(table: &'a toml::Table, path: &str) -> Option<&'a toml::Value> {
    let (parents, last) = match path.rsplit_once('.') {
        Some((parents, last)) => (Some(parents), last),
        None => (None, path),
    };
    let mut t = table;
    for key in parents.into_iter().flat_map(|p| p.split('.')) {
        t = t.get(key)?.as_table()?;
    }
    t.get(last)
}

/// Sets the value at dotted `path` of `table`, creating tables on the way.
pub fn insert(table: &mut toml::Table, path: &str, value: toml::Value) {
    let mut keys: Vec<&str> = path.split('.').collect();
    let last = keys.pop().expect("a key");
    let mut t = table;
    for key in keys {
        t = t.entry(key.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new())).as_table_mut().expect("a table");
    }
    t.insert(last.to_string(), value);
}
