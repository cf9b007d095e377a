use serde::{Deserialize, Serialize};

/// `[data]`: where batches come from and how they are produced.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    pub kind: DataKind,
    pub path: String,
    pub val_path: String,
    pub val_fraction: f64,
    pub batch_size: i64,
    pub max_seq_len: i64,
    pub num_workers: usize,
    pub prefetch: usize,
    pub pin_memory: bool,
    pub synthetic_len: usize,
    pub synthetic_features: i64,
    pub synthetic_classes: i64,
    /// A Hugging Face `tokenizer.json` for `text` and `jsonl` data (empty: bytes / classification rows).
    pub tokenizer: String,
    /// `jsonl` with a tokenizer: the field of each row that holds its text.
    pub text_field: String,
    /// `jsonl` with a tokenizer: a token appended after each row (e.g. `<|endoftext|>`).
    pub eos_token: String,
    /// Where tokenized data is cached (empty: `tokens-cache/` beside the run directory).
    pub tokens_cache: String,
    /// `chat` / `prompt_completion`: which tokens the loss is computed on.
    pub train_on: TrainOn,
    /// `chat` / `prompt_completion`: what happens to a row longer than the sequence.
    pub overflow: Overflow,
    /// `chat` / `prompt_completion`: rows concatenated into full sequences, each
    /// attending only to itself, instead of one padded row per sequence.
    pub packing: bool,
    /// Last: an array of tables must follow plain values in TOML output.
    pub datasets: Vec<DatasetSpec>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DataKind {
    /// Generated in process: byte text for `gpt`, labelled clusters for `mlp`.
    Synthetic,
    /// Any file, read as bytes (vocabulary 256), or UTF-8 text tokenized with `tokenizer`.
    Text,
    /// nanoGPT-style pre-tokenized little-endian uint16 `.bin`, memory-mapped.
    Tokens,
    /// Classification rows: `{"dataset": "a", "features": [..], "label": 3}`; with
    /// `tokenizer`, text rows `{"text": "..."}` for a language model.
    Jsonl,
    /// Conversations `{"messages": [{"role", "content"}]}` (or ShareGPT's
    /// `conversations` with `from`/`value`), rendered with the model's chat template.
    Chat,
    /// `{"prompt": .., "completion": ..}`: strings, or message lists rendered with
    /// the chat template.
    PromptCompletion,
}

impl DataKind {
    /// Instruction data: rows tokenized with their trained-token masks.
    pub fn is_instruction(self) -> bool {
        matches!(self, DataKind::Chat | DataKind::PromptCompletion)
    }
}

/// Which tokens of instruction data are trained (the rest are labelled
/// [`crate::data::IGNORE_INDEX`]). The
/// end-of-turn token closing a trained assistant turn, and the EOS after a
/// completion, are trained.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TrainOn {
    /// `assistant` for chat data, `completion` for prompt/completion data.
    Auto,
    /// Every assistant turn.
    Assistant,
    /// Only the last assistant turn of each conversation.
    LastAssistant,
    /// The completion of a prompt/completion row.
    Completion,
    /// Every token.
    All,
}

/// A row longer than the sequence: cut to fit, or left out. Either way a row whose
/// trained tokens are all cut off is left out; both are counted.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    Truncate,
    Drop,
}

/// One dataset of a weighted mix.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DatasetSpec {
    pub name: String,
    #[serde(default)]
    pub path: String,
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}
