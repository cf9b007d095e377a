//! Configuration: the embedded commented default, the user's files layered over it
//! in order, then `--set section.key=value` overrides. One module per section.
//!
//! Every layer is checked as soon as it is applied (merged over what came before and
//! deserialized with unknown keys denied), so an error names its source and key path.

mod combinations;
mod data;
mod debug;
mod dist;
mod dpo;
mod flat_keys;
mod grpo;
mod grpo_sampling;
mod lora;
mod model;
mod optim;
mod origins;
mod paths;
mod plugins;
mod ranges;
mod run;
mod standalone;
mod toml_layers;
mod train;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

pub use combinations::{AUTO_LOSS_CHUNK, AUTO_LOSS_CHUNK_VOCAB};
pub use data::{is_pattern, ColumnMap, DataConfig, DataFormat, DataKind, DatasetSpec, Overflow, TrainOn, WeightBy};
pub use debug::DebugConfig;
pub use dist::{DistBackend, DistConfig, ShardMode};
pub use dpo::{DpoConfig, DpoLoss, TruncationMode};
pub(crate) use flat_keys::move_flat_keys;
use flat_keys::refuse_flat_keys;
pub use grpo::{GrpoConfig, GrpoLoss, RewardKind, RewardSpec, ScaleRewards};
pub use lora::LoraConfig;
pub use model::{
    or_list, Activation, GemmaArgs, GptArgs, InitAdapters, LayerType, LlamaArgs, MlpArgs, ModelConfig, ModelKind, MoeArgs, RopeScaling, TaskKind,
    TorchScriptArgs,
};
pub use optim::{LrScheduleKind, OptimConfig, OptimName};
pub use origins::KeyOrigins;
pub(crate) use paths::looks_like_hub_name;
pub use plugins::{check_tables_claimed, explain_option_error, CadenceOverride, OnFull, PluginSettings};
pub use run::{CpuMatmul, DeviceChoice, RunConfig};
pub use standalone::{keep_sources, run_dir_of, TOKENIZER_DIR, TOKENIZER_FILES};
pub use train::{ActivationCheckpointing, NanPolicy, Precision, TrainConfig};

use ptrain_plugin_api::unknown_key;
use toml_layers::{flat_model_keys, merge, parse_layer, parse_toml, parse_value, read_file, record_keys};

use crate::error::{ConfigError, Error};

/// The commented default configuration, embedded in the binary. The crate owns
/// this copy; `configs/default.toml`, the one users read, must stay equal to it
/// (a test in `config/tests.rs` says so when they differ).
pub const DEFAULT_TOML: &str = include_str!("default.toml");

/// `data.tokenizer = "bytes"`: the data is raw bytes (ids 0-255), said explicitly.
pub const BYTES_TOKENIZER: &str = "bytes";

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
    /// `[dpo]`: what DPO does with preference data (`data.kind = "preference"`).
    #[serde(default)]
    pub dpo: DpoConfig,
    /// `[grpo]`: GRPO on scored rollouts (`data.kind = "rollouts"`).
    #[serde(default)]
    pub grpo: GrpoConfig,
    /// `[lora]`: absent (the default) = full fine-tuning; see [`Config::lora`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
    /// `[plugins.<name>]` tables, interpreted by the plugin host.
    pub plugins: BTreeMap<String, toml::Table>,
    /// Which file or `--set` set each key, for errors found after layering.
    #[serde(skip)]
    pub origins: KeyOrigins,
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
    pub(crate) table: toml::Table,
    /// Dotted paths of the keys a layer set (rather than the default), with the
    /// layer that set them last: `model.init_from` may fill only the others.
    pub(crate) explicit: BTreeMap<String, String>,
    /// The run whose checkpoint the weights come from (see [`ConfigBuilder::weights_from`]).
    pub(crate) weights_from: Option<PathBuf>,
}

impl Default for ConfigBuilder {
    fn default() -> Self {
        ConfigBuilder { table: default_table(), explicit: BTreeMap::new(), weights_from: None }
    }
}

impl ConfigBuilder {
    /// The embedded default, then each of `files` in order (a later file's keys win),
    /// then each `section.key=value` of `sets`.
    pub fn layered(files: &[PathBuf], sets: &[String]) -> Result<Self, Error> {
        let mut builder = ConfigBuilder::default();
        for path in files {
            builder = builder.file(path)?;
        }
        for set in sets {
            builder = builder.set(set)?;
        }
        Ok(builder)
    }

    /// Layers a TOML file over the configuration so far.
    pub fn file(self, path: &Path) -> Result<Self, Error> {
        let text = read_file(path)?;
        let origin = path.display().to_string();
        let mut layer = parse_layer(&text, &origin)?;
        paths::resolve_in_file(&mut layer, path.parent().unwrap_or(Path::new("")));
        self.layer(layer, &origin)
    }

    /// Layers a run's or a checkpoint's recorded `config.toml` ([`Self::recorded`]).
    pub fn recorded_file(self, path: &Path) -> Result<Self, Error> {
        let text = read_file(path)?;
        self.recorded(&text, &path.display().to_string())
    }

    /// The weights come from a checkpoint of `run_dir` (resuming, `ptrain logits
    /// --checkpoint`): a `model.init_from` directory that is gone is not needed (the
    /// configuration has its architecture keys), and a `data.tokenizer` that is gone
    /// is replaced by the copy the run kept (see [`keep_sources`]).
    pub fn weights_from(mut self, run_dir: Option<PathBuf>) -> Self {
        self.weights_from = run_dir;
        self
    }

    /// Layers TOML text over the configuration so far; `origin` names it in errors.
    pub fn toml(self, text: &str, origin: &str) -> Result<Self, Error> {
        let layer = parse_layer(text, origin)?;
        self.layer(layer, origin)
    }

    /// Layers a configuration a run recorded (its or a checkpoint's `config.toml`,
    /// absolute paths): one written before the model kinds' tables has their keys
    /// flat in `[model]` (`hidden`, `bias`, `path`, ...); they are read into their
    /// tables, where a user's file or `--set` is refused them.
    pub fn recorded(self, text: &str, origin: &str) -> Result<Self, Error> {
        let mut layer = parse_toml(text, origin)?;
        flat_model_keys(&mut layer, origin, true)?;
        self.layer(layer, origin)
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
        flat_model_keys(&mut layer, &source, false)?;
        self.layer(layer, &source)
    }

    fn layer(mut self, layer: toml::Table, source: &str) -> Result<Self, Error> {
        record_keys(&layer, "", source, &mut self.explicit);
        merge(&mut self.table, layer);
        ranges::check(&self.table, source)?;
        deserialize(&self.table).map_err(|mut e| {
            e.origin = source.to_string();
            e
        })?;
        Ok(self)
    }

    // `build` and `build_with`, which resolve what `model.init_from` and
    // `data.tokenizer` decide, are in `crate::resolve`: reading those files takes
    // the model's and the data's readers, which import this module.

    /// A configuration a run already resolved (a checkpoint's `config.toml`), as
    /// recorded: not resolved again, and its input files need not exist any more.
    pub fn build_recorded(self) -> Result<Config, Error> {
        Ok(deserialize(&self.table)?)
    }
}

pub(crate) fn deserialize(table: &toml::Table) -> Result<Config, ConfigError> {
    let value = toml::Value::Table(table.clone());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.message().trim().to_string();
        ConfigError { origin: "configuration".into(), key: unknown_key::key(&path, &message), message: unknown_key::with_suggestion(message) }
    })
}

impl Config {
    /// The fully resolved configuration, as written to `<run-dir>/config.toml`.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("config serializes")
    }

    /// Checks values that types alone cannot (ranges, combinations, files).
    pub fn validate(&self) -> Result<(), Error> {
        // Named by the file or --set that set the key, where one layer did.
        let bad = |key: &str, message: String| -> Error {
            self.origins.locate(ConfigError { origin: "configuration".into(), key: key.into(), message }).into()
        };
        // Again on the whole: typed overrides (command-line flags) skip the layers.
        let table = toml::Table::try_from(self).expect("config serializes");
        ranges::check(&table, "configuration")?;
        if let Some(min_lr) = self.optim.min_lr.filter(|&m| m > self.optim.lr) {
            return Err(bad(
                "optim.min_lr",
                format!(
                    "{min_lr} is above optim.lr = {}: must be <= lr (or leave min_lr out: optim.min_lr_ratio sets the floor as a fraction of lr)",
                    self.optim.lr
                ),
            ));
        }
        // The model's shape is its family's to check (`model::family::check`, after these).
        if self.model.kind.has_blocks() && self.data.max_seq_len > self.model.block_size {
            return Err(bad(
                "data.max_seq_len",
                format!(
                    "{} is above the model's context, model.block_size = {} (n_positions / max_position_embeddings with model.init_from): \
                     sequences would be cut to {}; set data.max_seq_len to at most that",
                    self.data.max_seq_len, self.model.block_size, self.model.block_size
                ),
            ));
        }
        self.validate_pretrained()?;
        self.validate_instruction()?;
        self.validate_grpo()?;
        self.validate_loss_chunk()?;
        self.validate_activation_checkpointing()?;
        self.validate_offload()?;
        self.validate_batch_memory()?;
        for (key, path) in self.input_files() {
            if !path.exists() {
                return Err(Error::MissingFile { what: key, path });
            }
        }
        Ok(())
    }

    /// The LoRA settings when the run trains adapters (`[lora]` present and enabled).
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.lora.as_ref().filter(|l| l.enabled)
    }

    /// Every input file the configuration names, with the key that names it.
    pub fn input_files(&self) -> Vec<(&'static str, PathBuf)> {
        let mut files = Vec::new();
        let named = |s: &str| (!s.is_empty()).then(|| PathBuf::from(s));
        // A glob's files are found (or said missing) when the data is read.
        let data_file = |s: &str| named(s).filter(|_| !(self.data.kind.is_instruction() && is_pattern(s)));
        if self.data.kind != DataKind::Synthetic {
            if let Some(p) = data_file(&self.data.path) {
                files.push(("data.path", p));
            }
        }
        if let Some(p) = data_file(&self.data.val_path) {
            files.push(("data.val_path", p));
        }
        if self.data.kind == DataKind::Jsonl || self.data.kind.is_instruction() {
            files.extend(self.data.datasets.iter().filter_map(|d| data_file(&d.path)).map(|p| ("data.datasets.path", p)));
        }
        if self.model.kind == ModelKind::Torchscript {
            files.push(("model.torchscript.path", PathBuf::from(&self.model.torchscript.path)));
        }
        if let Some(p) = named(&self.data.tokenizer).filter(|_| self.data.tokenizer != BYTES_TOKENIZER) {
            files.push(("data.tokenizer", p));
        }
        files
    }
}

#[cfg(test)]
mod tests;
