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
