//! A trained model outside a run (`ptrain generate`): from a ptrain checkpoint or run
//! directory, or from a Hugging Face directory (an export, or an `init_from` model),
//! with its tokenizer, end-of-sequence ids and chat template.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tch::{nn, Device};

use super::{hf, Model};
use crate::{
    config::{Config, ConfigBuilder},
    data::{chat_template::ChatTemplate, tokenize::load_tokenizer},
    error::{Error, Result},
};

pub struct Pretrained {
    pub model: Box<dyn Model>,
    /// Holds the model's parameters.
    pub vars: nn::VarStore,
    pub config: Config,
    pub tokenizer: Option<tokenizers::Tokenizer>,
    /// Where the tokenizer lives (its chat template is beside it).
    pub tokenizer_dir: Option<PathBuf>,
    /// Tokens that end a generation.
    pub eos: Vec<i64>,
}

/// `eos_token_id` of a `generation_config.json` or `config.json`: an id or a list.
fn eos_ids_in(dir: &Path) -> Vec<i64> {
    for name in [hf::GENERATION_CONFIG, hf::CONFIG_JSON] {
        let Ok(text) = std::fs::read_to_string(dir.join(name)) else { continue };
        let Ok(json) = serde_json::from_str::<Value>(&text) else { continue };
        match json.get("eos_token_id") {
            Some(Value::Number(n)) => return n.as_i64().into_iter().collect(),
            Some(Value::Array(ids)) => return ids.iter().filter_map(Value::as_i64).collect(),
            _ => {}
        }
    }
    Vec::new()
}

impl Pretrained {
    /// Opens `source`: a directory with `config.json` (Hugging Face), a `peft` adapter
    /// directory (`adapter_config.json`; the base it names), else a ptrain checkpoint
    /// or run directory (its newest valid checkpoint).
    pub fn open(source: &Path, device: Device) -> Result<Pretrained> {
        Pretrained::open_with_base(source, None, device)
    }

    /// As [`Pretrained::open`], the adapters' base model (a LoRA checkpoint's or a `peft`
    /// directory's) taken from `base` instead of where it was recorded; for a LoRA
    /// checkpoint, `base`'s weights must hash to what the run recorded.
    pub fn open_with_base(source: &Path, base: Option<&Path>, device: Device) -> Result<Pretrained> {
        if source.join(hf::ADAPTER_CONFIG).is_file() && !source.join(hf::CONFIG_JSON).is_file() {
            let (sets, base_dir) = super::adapters::peft_settings(source, base)?;
            let config = ConfigBuilder::layered(&[], &sets)?.build()?;
            let vars = nn::VarStore::new(device);
            let model = super::build(&config, &vars, &NoData)?;
            super::adapters::load_peft_weights(&vars, source)?;
            // The tokenizer saved beside the adapters (ptrain's export and TRL's
            // save_model put it there), else the base's.
            let tokenizer_dir = if source.join("tokenizer.json").is_file() { source } else { base_dir.as_path() };
            let tokenizer_path = tokenizer_dir.join("tokenizer.json");
            let mut eos = eos_ids_in(source);
            if eos.is_empty() {
                eos = eos_ids_in(&base_dir);
            }
            return Pretrained::with_tokenizer(model, vars, config, tokenizer_path.is_file().then_some(tokenizer_path), eos);
        }
        if source.join(hf::CONFIG_JSON).is_file() {
            if base.is_some() {
                let message = "--base is for a LoRA checkpoint or a peft adapter directory, and this is a whole model".into();
                return Err(Error::Checkpoint { path: source.to_owned(), message });
            }
            let set = [format!("model.init_from={}", source.display())];
            let config = ConfigBuilder::layered(&[], &set)?.build()?;
            let vars = nn::VarStore::new(device);
            let model = super::build(&config, &vars, &NoData)?;
            let tokenizer_path = source.join("tokenizer.json");
            let eos = eos_ids_in(source);
            return Pretrained::with_tokenizer(model, vars, config, tokenizer_path.is_file().then_some(tokenizer_path), eos);
        }
        let checkpoint = hf::resolve_checkpoint(source)?;
        let mut config = hf::recorded_config(&checkpoint)?;
        // The checkpoint holds every weight: build the model bare, then load them. A
        // LoRA checkpoint holds the adapters: the base comes from model.init_from.
        if let Some(base) = base {
            if config.lora().is_none() {
                let message = "--base is for LoRA checkpoints, and this run trained every weight (they are all in the checkpoint)".into();
                return Err(Error::Checkpoint { path: checkpoint, message });
            }
            config.model.init_from = base.display().to_string();
        }
        let init_from = if config.lora().is_some() { config.model.init_from.clone() } else { std::mem::take(&mut config.model.init_from) };
        let vars = nn::VarStore::new(device);
        let model = super::build(&config, &vars, &NoData)?;
        super::probe::load_checkpoint_weights(&vars, &checkpoint)?;
        if let Some(base) = base {
            super::adapters::check_base(&vars, &checkpoint, base)?;
        }
        config.model.init_from = init_from;
        let tokenizer = config.tokenizes().then(|| PathBuf::from(&config.data.tokenizer));
        let mut eos = tokenizer.as_ref().and_then(|t| t.parent()).map(eos_ids_in).unwrap_or_default();
        if eos.is_empty() && !config.model.init_from.is_empty() {
            eos = eos_ids_in(Path::new(&config.model.init_from));
        }
        Pretrained::with_tokenizer(model, vars, config, tokenizer, eos)
    }

    fn with_tokenizer(model: Box<dyn Model>, vars: nn::VarStore, config: Config, path: Option<PathBuf>, mut eos: Vec<i64>) -> Result<Pretrained> {
        let tokenizer = path.as_deref().map(load_tokenizer).transpose()?;
        let tokenizer_dir = path.as_ref().and_then(|p| p.parent()).map(Path::to_path_buf);
        if let Some(tok) = &tokenizer {
            let named = [config.data.eos_token.clone()]
                .into_iter()
                .chain(tokenizer_dir.as_deref().and_then(|d| ChatTemplate::find(d).ok().flatten()).map(|t| t.eos_token));
            for name in named.filter(|n| !n.is_empty()) {
                if let Some(id) = tok.token_to_id(&name) {
                    if !eos.contains(&(id as i64)) {
                        eos.push(id as i64);
                    }
                }
            }
        }
        Ok(Pretrained { model, vars, config, tokenizer, tokenizer_dir, eos })
    }

    /// Token ids of `text` (with the tokenizer's special tokens, as `tokenizer(text)`
    /// in Python), or its bytes for a byte-level model.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        match &self.tokenizer {
            Some(tok) => Ok(tok
                .encode(text, true)
                .map_err(|e| Error::Other(format!("tokenizing the prompt: {e}")))?
                .get_ids()
                .iter()
                .map(|&i| i as i64)
                .collect()),
            None if self.config.model.vocab_size == 256 => Ok(text.bytes().map(i64::from).collect()),
            None => Err(Error::Other(format!(
                "no tokenizer for a vocabulary of {} (the run had no data.tokenizer, or it is gone): give token ids with --prompt-ids",
                self.config.model.vocab_size
            ))),
        }
    }

    pub fn decode(&self, ids: &[i64]) -> String {
        match &self.tokenizer {
            Some(tok) => tok.decode(&ids.iter().map(|&i| i as u32).collect::<Vec<_>>(), true).unwrap_or_default(),
            None if self.config.model.vocab_size == 256 => String::from_utf8_lossy(&ids.iter().map(|&i| i as u8).collect::<Vec<_>>()).into_owned(),
            // No tokenizer to turn ids into text: show the ids.
            None => ids.iter().map(i64::to_string).collect::<Vec<_>>().join(" "),
        }
    }

    /// The chat template saved with the tokenizer.
    pub fn chat_template(&self) -> Result<ChatTemplate> {
        let dir = self.tokenizer_dir.as_deref().ok_or_else(|| Error::Other("--chat needs a tokenizer with a chat template".into()))?;
        ChatTemplate::find(dir)?.ok_or_else(|| Error::Data {
            path: dir.join("tokenizer_config.json"),
            message: "no chat_template (nor chat_template.jinja beside it): --chat needs the model's chat template".into(),
        })
    }
}

/// Building a language model needs no data.
pub(crate) struct NoData;

impl crate::data::Dataset for NoData {
    fn batch(&self, _split: crate::data::Split, _key: crate::data::BatchKey) -> Result<crate::data::Batch> {
        Err(Error::Other("a model outside a run draws no batches".into()))
    }
    fn dataset_names(&self) -> Vec<String> {
        Vec::new()
    }
    fn train_len(&self) -> u64 {
        0
    }
    fn seq_len(&self) -> i64 {
        0
    }
}
