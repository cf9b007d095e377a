//! Configuration: the embedded commented default, a user file layered over it,
//! then `--set section.key=value` overrides. One module per section.
//!
//! Every layer is checked as soon as it is applied (merged over what came before and
//! deserialized with unknown keys denied), so an error names its source and key path.

mod data;
mod debug;
mod dist;
mod model;
mod optim;
mod plugins;
mod run;
mod train;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

pub use data::{DataConfig, DataKind, DatasetSpec};
pub use debug::DebugConfig;
pub use dist::{DistBackend, DistConfig};
pub use model::{ModelConfig, ModelKind, TaskKind};
pub use optim::{OptimConfig, OptimName, Schedule};
pub use plugins::{CadenceOverride, OnFull, PluginSettings};
pub use run::{DeviceChoice, RunConfig};
pub use train::{NanPolicy, Precision, TrainConfig};

use crate::error::{ConfigError, Error};

/// The commented default configuration, embedded in the binary.
pub const DEFAULT_TOML: &str = include_str!("../../../configs/default.toml");

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub run: RunConfig,
    pub train: TrainConfig,
    pub model: ModelConfig,
    pub data: DataConfig,
    pub optim: OptimConfig,
    pub dist: DistConfig,
    pub debug: DebugConfig,
    /// `[plugins.<name>]` tables, interpreted by the plugin host.
    pub plugins: BTreeMap<String, toml::Table>,
}

impl Default for Config {
    fn default() -> Config {
        let table = default_table();
        deserialize(&table).expect("the embedded default config is valid")
    }
}

fn default_table() -> toml::Table {
    DEFAULT_TOML.parse().expect("the embedded default config is valid TOML")
}

/// Builds a [`Config`] from layers, checking each one as it is applied.
pub struct ConfigBuilder {
    table: toml::Table,
}

impl Default for ConfigBuilder {
    fn default() -> Self {
        ConfigBuilder { table: default_table() }
    }
}

impl ConfigBuilder {
    /// The embedded default, then `file`, then each `section.key=value` of `sets`.
    pub fn layered(file: Option<&Path>, sets: &[String]) -> Result<Self, Error> {
        let mut builder = ConfigBuilder::default();
        if let Some(path) = file {
            builder = builder.file(path)?;
        }
        for set in sets {
            builder = builder.set(set)?;
        }
        Ok(builder)
    }

    /// Layers a TOML file over the configuration so far.
    pub fn file(self, path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::MissingFile { what: "config file", path: path.to_owned() },
            _ => Error::Io { path: path.to_owned(), source: e },
        })?;
        let source = path.display().to_string();
        let layer: toml::Table = text.parse().map_err(|e: toml::de::Error| ConfigError {
            origin: source.clone(),
            key: String::new(),
            message: e.to_string().trim().replace('\n', " "),
        })?;
        self.layer(layer, &source)
    }

    /// Applies `section.key=value`; the value is read as TOML, or as a bare string.
    pub fn set(self, assignment: &str) -> Result<Self, Error> {
        let source = format!("--set {assignment}");
        let bad = |message: &str| ConfigError { origin: source.clone(), key: String::new(), message: message.into() };
        let (path, raw) = assignment.split_once('=').ok_or_else(|| bad("expected section.key=value"))?;
        let keys: Vec<&str> = path.trim().split('.').map(str::trim).collect();
        if keys.len() < 2 || keys.iter().any(|k| k.is_empty()) {
            return Err(bad("expected section.key=value").into());
        }
        let value = parse_value(raw.trim());
        let mut layer = toml::Table::new();
        let mut cursor = &mut layer;
        for key in &keys[..keys.len() - 1] {
            cursor = cursor
                .entry(key.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .expect("just inserted a table");
        }
        cursor.insert(keys[keys.len() - 1].to_string(), value);
        self.layer(layer, &source)
    }

    fn layer(mut self, layer: toml::Table, source: &str) -> Result<Self, Error> {
        merge(&mut self.table, layer);
        deserialize(&self.table).map_err(|mut e| {
            e.origin = source.to_string();
            e
        })?;
        Ok(self)
    }

    pub fn build(self) -> Result<Config, Error> {
        self.build_with(|_| {})
    }

    /// Builds, applying `last` (typed overrides, such as command-line flags) before
    /// the checks.
    pub fn build_with(self, last: impl FnOnce(&mut Config)) -> Result<Config, Error> {
        let mut config = deserialize(&self.table)?;
        last(&mut config);
        config.validate()?;
        Ok(config)
    }
}

fn parse_value(raw: &str) -> toml::Value {
    format!("v = {raw}").parse::<toml::Table>().ok().and_then(|mut t| t.remove("v")).unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

/// Deep merge: tables merge key by key, everything else (arrays too) is replaced.
fn merge(base: &mut toml::Table, layer: toml::Table) {
    for (key, value) in layer {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(base_table)), toml::Value::Table(layer_table)) => merge(base_table, layer_table),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

fn deserialize(table: &toml::Table) -> Result<Config, ConfigError> {
    let value = toml::Value::Table(table.clone());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.message().trim().to_string();
        // serde reports an unknown field at its parent's path; name the key itself.
        // Depending on the deserializer, an unknown field's path ends at its parent
        // or at the field itself; always name the field.
        let key = match message.strip_prefix("unknown field `").and_then(|m| m.split('`').next()) {
            Some(field) if path == "." || path.is_empty() => field.to_string(),
            Some(field) if path == field || path.ends_with(&format!(".{field}")) => path,
            Some(field) => format!("{path}.{field}"),
            None => path,
        };
        ConfigError { origin: "configuration".into(), key, message }
    })
}

impl Config {
    /// The fully resolved configuration, as written to `<run-dir>/config.toml`.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("config serializes")
    }

    /// Checks values that types alone cannot (ranges, combinations, files).
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |key: &str, message: String| -> Error { ConfigError { origin: "configuration".into(), key: key.into(), message }.into() };
        if self.train.steps == 0 {
            return Err(bad("train.steps", "must be at least 1".into()));
        }
        if self.data.batch_size == 0 {
            return Err(bad("data.batch_size", "must be at least 1".into()));
        }
        if self.optim.accum_steps == 0 {
            return Err(bad("optim.accum_steps", "must be at least 1".into()));
        }
        if self.model.kind == ModelKind::Gpt && self.model.n_embd % self.model.n_head.max(1) != 0 {
            return Err(bad("model.n_embd", format!("{} is not divisible by n_head = {}", self.model.n_embd, self.model.n_head)));
        }
        if self.model.kind == ModelKind::Gpt && self.model.vocab_size < 2 {
            return Err(bad("model.vocab_size", "must be at least 2".into()));
        }
        if !(0.0..1.0).contains(&self.data.val_fraction) {
            return Err(bad("data.val_fraction", "must be in [0, 1)".into()));
        }
        if !(self.debug.grad_spike_factor.is_finite() && self.debug.grad_spike_factor > 0.0) {
            return Err(bad("debug.grad_spike_factor", "must be a finite number > 0".into()));
        }
        for (key, path) in self.input_files() {
            if !path.exists() {
                return Err(Error::MissingFile { what: key, path });
            }
        }
        Ok(())
    }

    /// Every input file the configuration names, with the key that names it.
    pub fn input_files(&self) -> Vec<(&'static str, PathBuf)> {
        let mut files = Vec::new();
        let named = |s: &str| (!s.is_empty()).then(|| PathBuf::from(s));
        if self.data.kind != DataKind::Synthetic {
            if let Some(p) = named(&self.data.path) {
                files.push(("data.path", p));
            }
        }
        if let Some(p) = named(&self.data.val_path) {
            files.push(("data.val_path", p));
        }
        if self.data.kind == DataKind::Jsonl {
            files.extend(self.data.datasets.iter().filter_map(|d| named(&d.path)).map(|p| ("data.datasets.path", p)));
        }
        if self.model.kind == ModelKind::Torchscript {
            files.push(("model.path", PathBuf::from(&self.model.path)));
        }
        files
    }
}

#[cfg(test)]
mod tests;
