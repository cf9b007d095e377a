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
    /// attending only to itself, instead of one padded row per sequence. Preference
    /// pairs: a pair one sequence, its prompt once. GRPO (`rollouts`, `prompts`): a
    /// group one sequence, its prompt once.
    pub packing: bool,
    /// `chat` / `prompt_completion`: how the files are read (detected by default).
    pub format: DataFormat,
    /// `chat` / `prompt_completion`: columns of the rows that are neither used nor
    /// passed to the chat template, left out on purpose (any other such column is
    /// an error naming it).
    pub ignore_columns: Vec<String>,
    /// `[[data.datasets]]` of instruction data: what a `weight` shares out.
    pub weight_by: WeightBy,
    /// `chat` / `prompt_completion`: the names the rows use (a table: after the
    /// plain values in TOML output).
    pub columns: ColumnMap,
    /// Last: an array of tables must follow plain values in TOML output.
    pub datasets: Vec<DatasetSpec>,
}

/// Whether a data path is a glob pattern (`data/train-*.parquet`): its files are
/// found when the data is read, not checked to exist up front.
pub fn is_pattern(path: &str) -> bool {
    path.contains(['*', '?', '['])
}

/// How instruction data files are read.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum DataFormat {
    /// Detected: Parquet and Arrow by their magic bytes, then `.jsonl`, then a
    /// first character `[` (a JSON array) or not (JSON Lines); directories of
    /// shards and `datasets.save_to_disk` directories by what they hold.
    #[default]
    Auto,
    /// One JSON object per line (gzip or zstd compressed too).
    Jsonl,
    /// One JSON array of objects.
    Json,
    /// Apache Parquet (one file, or a directory or glob of shards).
    Parquet,
    /// Arrow IPC (`datasets.save_to_disk`).
    Arrow,
}

impl DataFormat {
    /// The configuration's spelling.
    pub fn name(self) -> &'static str {
        match self {
            DataFormat::Auto => "auto",
            DataFormat::Jsonl => "jsonl",
            DataFormat::Json => "json",
            DataFormat::Parquet => "parquet",
            DataFormat::Arrow => "arrow",
        }
    }
}

/// What `weight` means in a mix of instruction datasets.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum WeightBy {
    /// Copies of each row per epoch.
    #[default]
    Rows,
    /// The share of the epoch's trained tokens.
    Tokens,
}

/// Where a row keeps what ptrain reads: the column (or message key) each of
/// ptrain's names is spelled as in the files. Defaults are the names themselves.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ColumnMap {
    /// The conversation, a list of messages (OpenAI's `messages`).
    pub messages: String,
    /// ShareGPT's conversation (messages with `from` / `value`).
    pub conversations: String,
    /// A message's role key (ShareGPT's `from` is read too).
    pub role: String,
    /// A message's text key (ShareGPT's `value` is read too).
    pub content: String,
    /// The tool schemas: a list, or a JSON string of one.
    pub tools: String,
    /// Alpaca: the system prompt, the instruction, its input, the answer and
    /// earlier `[user, assistant]` pairs.
    pub system: String,
    pub instruction: String,
    pub input: String,
    pub output: String,
    pub history: String,
    /// Prompt/completion rows.
    pub prompt: String,
    pub completion: String,
}

impl Default for ColumnMap {
    fn default() -> ColumnMap {
        let s = |n: &str| n.to_string();
        ColumnMap {
            messages: s("messages"),
            conversations: s("conversations"),
            role: s("role"),
            content: s("content"),
            tools: s("tools"),
            system: s("system"),
            instruction: s("instruction"),
            input: s("input"),
            output: s("output"),
            history: s("history"),
            prompt: s("prompt"),
            completion: s("completion"),
        }
    }
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
    /// Preference pairs `{"prompt", "chosen", "rejected"}` (strings, or message
    /// lists rendered with the chat template) for DPO (`[dpo]`, docs/preference.md).
    Preference,
    /// Scored rollouts for GRPO (`[grpo]`, docs/rl.md): one group a line, `prompt_ids`
    /// or `prompt`, `completion_ids` or `completions` (one per generation) and
    /// `rewards` (one number per completion, or one list per reward function).
    Rollouts,
    /// Prompts for GRPO sampled in the run (`[grpo]`, docs/rl.md): `prompt` (a string,
    /// or messages rendered with the chat template and its generation prompt) and any
    /// other columns, which the rewards read.
    Prompts,
}

impl DataKind {
    /// GRPO's data: scored rollouts, or prompts sampled in the run.
    pub fn is_grpo(self) -> bool {
        matches!(self, DataKind::Rollouts | DataKind::Prompts)
    }

    /// Rows read from the files people have and tokenized with their trained-token
    /// masks: instruction data (`chat`, `prompt_completion`) and preference pairs.
    pub fn is_instruction(self) -> bool {
        matches!(self, DataKind::Chat | DataKind::PromptCompletion | DataKind::Preference)
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
    /// Instruction data: this file's form, columns and left-out columns when they
    /// differ from `data.format`, `data.columns`, `data.ignore_columns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<DataFormat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<ColumnMap>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_columns: Option<Vec<String>>,
}

fn one() -> f64 {
    1.0
}
