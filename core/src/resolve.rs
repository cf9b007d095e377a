//! What the files a configuration names decide about it: `model.init_from`'s
//! `config.json` fills the model keys, `data.tokenizer` the vocabulary. Reading
//! them takes the model's Hugging Face reader and the data's tokenizer, so this
//! module sits above `config`, `model` and `data` (the configuration imports
//! neither of them), and finishes [`ConfigBuilder`]: `build` and `build_with`
//! are here.

use std::{collections::BTreeMap, path::Path};

use crate::{
    config::{self, Config, ConfigBuilder, DataKind, KeyOrigins},
    data::tokenize,
    error::{ConfigError, Error},
    model::{
        family,
        hf::{
            arch::{insert, lookup},
            HfDir,
        },
    },
};

fn bad(key: &str, message: impl Into<String>) -> Error {
    ConfigError { origin: "configuration".into(), key: key.into(), message: message.into() }.into()
}

impl ConfigBuilder {
    /// The configuration, with what `model.init_from` and `data.tokenizer` decide
    /// filled in (see [`Config::resolve_pretrained`]), validated (and the model's shape
    /// and LoRA targets by its family: [`family::check`]).
    pub fn build(self) -> Result<Config, Error> {
        self.build_with(|_| {})
    }

    /// Builds, applying `last` (typed overrides, such as command-line flags) before
    /// the checks.
    pub fn build_with(self, last: impl FnOnce(&mut Config)) -> Result<Config, Error> {
        let mut config = config::deserialize(&self.table)?;
        config.origins = KeyOrigins::new(self.explicit.clone());
        last(&mut config);
        let gone = match &self.weights_from {
            Some(run) => config.not_needed_with_checkpoint(run),
            None => None,
        };
        crate::model::init_source::materialize(&mut config, &self.explicit)?;
        config.resolve_pretrained(&self.explicit)?;
        if let Some(init_from) = gone {
            config.model.init_from = init_from;
        }
        config.validate()?;
        family::check(&config)?;
        Ok(config)
    }
}

impl Config {
    /// Fills the model keys that come from `model.init_from`'s `config.json`
    /// (`vocab_size`, `n_layer`, `n_head`, `n_embd`, `block_size`, and the table of the
    /// kind its `model_type` is read by: `[model.gpt]`, `[model.llama]`, ...), and `model.vocab_size` from `data.tokenizer` when
    /// nothing else fixes it. `explicit` maps the keys a layer set to that layer
    /// (see [`ConfigBuilder`]): one of them that disagrees is an error naming
    /// both values. Library users who build a `Config` by hand call this with an
    /// empty map.
    pub fn resolve_pretrained(&mut self, explicit: &BTreeMap<String, String>) -> Result<(), Error> {
        if !self.model.init_from.is_empty() && family::of(self.model.kind).hf.is_some() {
            let hf = HfDir::open(&self.model.init_from).map_err(|e| match (e, explicit.get("model.init_from")) {
                (Error::Config(mut c), Some(origin)) => {
                    c.origin = origin.clone();
                    Error::Config(c)
                }
                (e, _) => e,
            })?;
            let mut table = toml::Table::try_from(&self.model).expect("[model] serializes");
            for (key, hf_key, value) in hf.arch.model_keys() {
                let path = format!("model.{key}");
                let current = lookup(&table, &key).cloned();
                if let (Some(origin), Some(current)) = (explicit.get(&path), current) {
                    if current != value {
                        let hint = if key == "block_size" { "; for shorter sequences set data.max_seq_len instead" } else { "" };
                        return Err(ConfigError {
                            origin: origin.clone(),
                            key: path,
                            message: format!(
                                "{current} disagrees with {hf_key} = {value} in {} (model.init_from): leave the key out or set it to {value}{hint}",
                                hf.config_path().display()
                            ),
                        }
                        .into());
                    }
                }
                insert(&mut table, &key, value);
            }
            for (key, value) in hf.arch.defaults() {
                if !explicit.contains_key(&format!("model.{key}")) {
                    insert(&mut table, &key, value);
                }
            }
            self.model = table.try_into().map_err(|e: toml::de::Error| bad("model", e.message().to_string()))?;
            // The tokenizer saved with the model, unless the data says otherwise.
            let beside = hf.dir.join("tokenizer.json");
            if self.data.tokenizer.is_empty()
                && (matches!(self.data.kind, DataKind::Text | DataKind::Jsonl) || self.data.kind.is_grpo() || self.data.kind.is_instruction())
                && beside.is_file()
            {
                tracing::info!("data.tokenizer = {} (beside model.init_from)", beside.display());
                self.data.tokenizer = beside.display().to_string();
            }
            // Raw bytes into a model of another vocabulary train the wrong thing quietly.
            let text = matches!(self.data.kind, DataKind::Text | DataKind::Jsonl);
            if self.data.tokenizer.is_empty() && text && self.model.vocab_size != 256 {
                return Err(bad(
                    "data.tokenizer",
                    format!(
                        "is not set, and {} has no tokenizer.json beside it: without a tokenizer the data is read as raw bytes (256 ids), \
                         while the model has {} (vocab_size). Set data.tokenizer to the model's tokenizer.json, or \
                         data.tokenizer = \"bytes\" to train on raw bytes all the same",
                        hf.dir.display(),
                        self.model.vocab_size
                    ),
                ));
            }
        }
        if self.tokenizes() {
            let path = Path::new(&self.data.tokenizer);
            let vocab = tokenize::vocab_size(&tokenize::load_tokenizer(path)?) as i64;
            if self.model.init_from.is_empty() && !explicit.contains_key("model.vocab_size") {
                self.model.vocab_size = vocab;
            } else if vocab > self.model.vocab_size {
                tracing::warn!(
                    "the tokenizer {} has {vocab} ids, the model {}: data with larger ids is refused",
                    path.display(),
                    self.model.vocab_size
                );
            }
        }
        Ok(())
    }
}
