//! The combinations of keys a configuration allows (what `model.init_from` and
//! `data.tokenizer` fill in is `crate::resolve`'s).

use super::{ActivationCheckpointing, ColumnMap, Config, DataFormat, DataKind, ModelKind, TaskKind, TrainOn, WeightBy, BYTES_TOKENIZER};
use crate::error::{ConfigError, Error};

/// Vocabularies this large get the chunked loss unless `train.loss_chunk` is set.
pub const AUTO_LOSS_CHUNK_VOCAB: i64 = 65_536;
/// The positions per chunk they get.
pub const AUTO_LOSS_CHUNK: i64 = 1024;

/// A value as a configuration file spells it: `"last_assistant"`, not `LastAssistant`.
fn spelled<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value).map_or_else(|_| String::new(), |v| v.to_string())
}

pub(super) fn bad(key: &str, message: impl Into<String>) -> Error {
    ConfigError { origin: "configuration".into(), key: key.into(), message: message.into() }.into()
}

/// The kinds with blocks, quoted: `"gpt" or "llama"`.
pub(super) fn quoted_kinds() -> String {
    ModelKind::with_blocks(|k| format!("\"{k}\""))
}

impl Config {
    /// Whether `data.tokenizer` applies: text or JSONL data with a tokenizer, or
    /// instruction data.
    pub fn tokenizes(&self) -> bool {
        !self.data.tokenizer.is_empty()
            && self.data.tokenizer != BYTES_TOKENIZER
            && (matches!(self.data.kind, DataKind::Text | DataKind::Jsonl) || self.data.kind.is_grpo() || self.data.kind.is_instruction())
    }

    /// The positions per chunk of the loss (0: the whole logits): `train.loss_chunk`
    /// when set, else [`AUTO_LOSS_CHUNK`] for a decoder whose vocabulary is at
    /// least [`AUTO_LOSS_CHUNK_VOCAB`] (Qwen2's 151,936, Llama 3's 128,256; not GPT-2's
    /// 50,257), where the logits dominate memory. The chunked loss is exact, so this
    /// changes memory and speed, not results.
    pub fn loss_chunk(&self) -> i64 {
        match self.train.loss_chunk {
            Some(chunk) => chunk,
            None if self.auto_loss_chunk() => AUTO_LOSS_CHUNK,
            None => 0,
        }
    }

    /// Whether the chunked loss is on because `train.loss_chunk` is unset and the vocabulary is large.
    pub fn auto_loss_chunk(&self) -> bool {
        self.train.loss_chunk.is_none() && self.model.kind.has_blocks() && self.model.vocab_size >= AUTO_LOSS_CHUNK_VOCAB
    }

    /// `train.loss_chunk` needs a model that hands out its hidden states.
    pub(super) fn validate_loss_chunk(&self) -> Result<(), Error> {
        if self.train.loss_chunk.is_some_and(|c| c > 0) && !self.model.kind.has_blocks() {
            return Err(bad("train.loss_chunk", format!("chunks a language model's output projection: model.kind = {}", quoted_kinds())));
        }
        Ok(())
    }

    /// `dist.offload_optimizer` moves parameter sharding's optimizer.
    pub(super) fn validate_offload(&self) -> Result<(), Error> {
        if self.dist.offload_optimizer && self.dist.shard != super::ShardMode::Parameters {
            return Err(bad(
                "dist.offload_optimizer",
                format!("applies to dist.shard = \"parameters\" (this run's is {:?})", self.dist.shard.name()),
            ));
        }
        Ok(())
    }

    /// `train.activation_checkpointing` recomputes the blocks of a transformer.
    pub(super) fn validate_activation_checkpointing(&self) -> Result<(), Error> {
        if self.train.activation_checkpointing != ActivationCheckpointing::None && !self.model.kind.has_blocks() {
            return Err(bad("train.activation_checkpointing", format!("recomputes a transformer's blocks: model.kind = {}", quoted_kinds())));
        }
        Ok(())
    }

    /// One micro-batch's token ids (`data.batch_size` rows of the sequence and its
    /// target, 8 bytes each) must fit in this machine's memory: a size past it is
    /// refused here, before training, rather than aborting the process when the
    /// buffer is allocated (exit 134, no summary). Only the first buffer a step needs:
    /// the activations are far larger, and their failure is a run's out of memory.
    pub(super) fn validate_batch_memory(&self) -> Result<(), Error> {
        if !self.model.kind.has_blocks() {
            return Ok(());
        }
        let seq = self.model.block_size.max(self.data.max_seq_len) as u64 + 1;
        let bytes = (self.data.batch_size as u64).checked_mul(seq).and_then(|n| n.checked_mul(8));
        let Some(memory) = memory_bytes() else { return Ok(()) };
        if bytes.is_some_and(|b| b <= memory) {
            return Ok(());
        }
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let needs = bytes.map_or_else(|| "more than 2^64 bytes".into(), |b| format!("{:.1} GiB", gib(b)));
        Err(bad(
            "data.batch_size",
            format!(
                "{}: one batch's token ids alone ({} rows x {seq} positions x 8 bytes) take {needs}, more than this machine's \
                 {:.1} GiB of memory and swap; lower data.batch_size (optim.accum_steps keeps the global batch)",
                self.data.batch_size,
                self.data.batch_size,
                gib(memory)
            ),
        ))
    }

    /// The combinations instruction data (`chat`, `prompt_completion`) allows.
    pub(super) fn validate_instruction(&self) -> Result<(), Error> {
        let data = &self.data;
        if !data.kind.is_instruction() {
            let set = [
                ("data.packing", data.packing && !data.kind.is_grpo()),
                ("data.train_on", data.train_on != TrainOn::Auto),
                ("data.format", data.format != DataFormat::Auto),
                ("data.columns", data.columns != ColumnMap::default()),
                ("data.ignore_columns", !data.ignore_columns.is_empty()),
                ("data.weight_by", data.weight_by != WeightBy::Rows),
            ];
            for (key, set) in set {
                if set {
                    return Err(bad(key, "applies to instruction data (data.kind = \"chat\" or \"prompt_completion\")"));
                }
            }
            return Ok(());
        }
        if data.tokenizer.is_empty() || data.tokenizer == BYTES_TOKENIZER {
            return Err(bad(
                "data.tokenizer",
                "instruction data needs a tokenizer.json (with the tokenizer_config.json that holds the chat template beside it); \
                 it defaults to the one beside model.init_from",
            ));
        }
        if !self.model.kind.has_blocks() {
            return Err(bad("data.kind", format!("instruction data trains a language model: model.kind = {}", quoted_kinds())));
        }
        let allowed: &[TrainOn] = match data.kind {
            DataKind::Chat => &[TrainOn::Auto, TrainOn::Assistant, TrainOn::LastAssistant, TrainOn::All],
            // DPO compares the completions: they are what is scored.
            DataKind::Preference => &[TrainOn::Auto],
            _ => &[TrainOn::Auto, TrainOn::Completion, TrainOn::All],
        };
        if !allowed.contains(&data.train_on) {
            let names: Vec<String> = allowed.iter().map(spelled).collect();
            return Err(bad(
                "data.train_on",
                format!("{} does not apply to data.kind = {}; use one of {}", spelled(&data.train_on), spelled(&data.kind), names.join(", ")),
            ));
        }
        if data.kind == DataKind::Preference {
            self.validate_preference()?;
        }
        if data.path.is_empty() && data.datasets.is_empty() {
            return Err(bad("data.path", "instruction data reads data.path or [[data.datasets]] files"));
        }
        Ok(())
    }

    /// Preference pairs: one file (and a held-out one), a positive `dpo.beta`.
    fn validate_preference(&self) -> Result<(), Error> {
        if !self.data.datasets.is_empty() {
            return Err(bad("data.datasets", "preference data reads data.path (and data.val_path); mixes are for instruction data"));
        }
        if self.data.packing && self.dpo.truncation_mode == crate::config::TruncationMode::KeepEnd {
            return Err(bad(
                "data.packing",
                "holds each pair's prompt once, which keep_end truncation would cut differently for the two answers: use dpo.truncation_mode = \"keep_start\"",
            ));
        }
        if !(self.dpo.beta > 0.0 && self.dpo.beta.is_finite()) {
            return Err(bad("dpo.beta", format!("{} must be a positive number", self.dpo.beta)));
        }
        Ok(())
    }

    pub(super) fn validate_pretrained(&self) -> Result<(), Error> {
        let m = &self.model;
        if !m.init_from.is_empty() && !m.kind.has_blocks() {
            let kinds = ModelKind::with_blocks(|k| format!("a {k}"));
            return Err(bad("model.init_from", format!("only {kinds} starts from a Hugging Face checkpoint")));
        }
        if self.data.tokenizer.is_empty() || self.data.tokenizer == BYTES_TOKENIZER {
            if !self.data.eos_token.is_empty() {
                return Err(bad("data.eos_token", "needs data.tokenizer"));
            }
            return Ok(());
        }
        if !self.tokenizes() {
            return Err(bad("data.tokenizer", "tokenizes data.kind = \"text\", \"jsonl\", \"chat\" or \"prompt_completion\""));
        }
        let language_model = m.kind.has_blocks() || (m.kind == ModelKind::Torchscript && m.torchscript.task == TaskKind::LanguageModel);
        if !language_model {
            return Err(bad(
                "data.tokenizer",
                format!("tokenized text is for language models (model.kind = {}, or torchscript with task = \"language_model\")", quoted_kinds()),
            ));
        }
        if !self.data.datasets.is_empty() && !self.data.kind.is_instruction() {
            return Err(bad(
                "data.datasets",
                "tokenized text reads data.path (and data.val_path); mixes are for classification rows and instruction data",
            ));
        }
        if !self.data.eos_token.is_empty() && !matches!(self.data.kind, DataKind::Jsonl | DataKind::PromptCompletion | DataKind::Preference) {
            return Err(bad(
                "data.eos_token",
                "separates JSONL rows or ends completions: it needs data.kind = \"jsonl\", \"prompt_completion\" or \"preference\"",
            ));
        }
        Ok(())
    }
}

/// The machine's memory and swap (Linux: `/proc/meminfo`), if known.
fn memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| info.lines().find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok());
    Some((kib("MemTotal:")? + kib("SwapTotal:").unwrap_or(0)) * 1024)
}
