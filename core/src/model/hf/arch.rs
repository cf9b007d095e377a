//! Which architecture a `config.json` describes, and the `[model]` keys it decides:
//! the family registered for its `model_type` ([`crate::model::family`]) reads it.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::{
    config::{ModelConfig, ModelKind},
    model::family::{self, FamilySpec},
};

/// A `config.json` as its family read it.
pub trait HfConfig: std::fmt::Debug + Send + Sync {
    /// `(key path under [model], config.json key, value)` for every key `init_from`
    /// decides but `kind` (its family's).
    fn model_keys(&self) -> Vec<(String, &'static str, toml::Value)>;

    /// `(key path under [model], value)` for the keys `init_from` gives a default a
    /// configuration may override (a mixture's `router_aux_loss_coef`, a training
    /// choice rather than the architecture). Default: none.
    fn defaults(&self) -> Vec<(String, toml::Value)> {
        Vec::new()
    }

    /// The first key where `m` computes something else than this checkpoint.
    fn mismatch(&self, m: &ModelConfig) -> Option<String> {
        first_mismatch(self.model_keys(), m)
    }
}

/// A Hugging Face architecture ptrain computes: its family and what its `config.json` says.
#[derive(Debug, Clone)]
pub struct HfArch {
    pub family: &'static FamilySpec,
    pub model_type: String,
    config: Arc<dyn HfConfig>,
}

impl HfArch {
    pub fn from_json(raw: &Map<String, Value>) -> Result<HfArch, String> {
        let model_type = raw
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("no model_type: not a transformers config.json (expected model_type {})", family::model_types("or")))?;
        let (family, _) = family::by_model_type(model_type)
            .ok_or_else(|| format!("model_type = \"{model_type}\": ptrain starts from {} checkpoints", family::model_types("and")))?;
        let hf = family.hf.as_ref().expect("a family reading a model_type has a Hugging Face mapping");
        Ok(HfArch { family, model_type: model_type.to_string(), config: (hf.read)(raw, model_type)? })
    }

    pub fn kind(&self) -> ModelKind {
        self.family.kind
    }

    /// `(key path under [model], config.json key, value)` for every key `init_from`
    /// decides, `kind` first.
    pub fn model_keys(&self) -> Vec<(String, &'static str, toml::Value)> {
        let kind = ("kind".to_string(), "model_type", toml::Value::String(self.kind().name()));
        std::iter::once(kind).chain(self.config.model_keys()).collect()
    }

    /// The keys `init_from` fills unless the configuration sets them ([`HfConfig::defaults`]).
    pub fn defaults(&self) -> Vec<(String, toml::Value)> {
        self.config.defaults()
    }

    /// The first key where `m` computes something else than this checkpoint.
    pub fn mismatch(&self, m: &ModelConfig) -> Option<String> {
        match m.kind == self.kind() {
            true => self.config.mismatch(m),
            false => first_mismatch(self.model_keys(), m),
        }
    }
}

/// The first of `keys` whose value `m` does not have.
pub fn first_mismatch(keys: Vec<(String, &'static str, toml::Value)>, m: &ModelConfig) -> Option<String> {
    let table = toml::Table::try_from(m).expect("[model] serializes");
    keys.into_iter().find_map(|(path, hf_key, value)| {
        let current = lookup(&table, &path);
        (current != Some(&value)).then(|| format!("model.{path} = {} but {hf_key} = {value}", current.map_or("(none)".into(), |c| c.to_string())))
    })
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

/// Writes `bos`/`eos`/`pad_token_id` as null where an id (or one of a list) lies
/// outside the exported model's vocabulary: a written config.json names no token the
/// model does not have. Shared by every family's writer.
pub fn null_foreign_token_ids(out: &mut Map<String, Value>, vocab_size: i64) {
    let fits = |v: &Value| v.as_i64().is_some_and(|id| (0..vocab_size).contains(&id));
    for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
        let ok = out.get(key).is_none_or(|v| v.is_null() || fits(v) || v.as_array().is_some_and(|ids| ids.iter().all(fits)));
        if !ok {
            out.insert(key.into(), Value::Null);
        }
    }
}
