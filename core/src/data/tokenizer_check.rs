//! Whether a folder's `tokenizer.json` splits text as transformers' `AutoTokenizer` does
//! for that folder (issue 61, item 11).
//!
//! transformers 5 loads a `qwen2` folder (and a `qwen2_moe`, `qwen3`, `qwen3_moe` one whose
//! tokenizer_config.json names `Qwen2Tokenizer`) through `Qwen2Tokenizer`, which builds its
//! own pre-tokenizer (Qwen2's pattern: digits one by one, then byte-level) and NFC
//! normalizer over the file's vocabulary and merges, whatever the file's own say. ptrain
//! encodes with the file. Where the two split a sample differently, set-up says so once.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::Mutex,
};

use tokenizers::{
    normalizers::unicode::NFC,
    pre_tokenizers::{
        byte_level::ByteLevel,
        sequence::Sequence,
        split::{Split, SplitPattern},
    },
    SplitDelimiterBehavior, Tokenizer,
};

/// transformers' `tokenization_qwen2.PRETOKENIZE_REGEX`.
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Text where the usual pre-tokenizers disagree: numbers, contractions, newlines.
const SAMPLE: &str = "In 2024 it's 42 x1234, e.g.  3.14\nDon't\n\n  stop";

/// Logs [`split_warning`] once per folder in a process: a run may build the encoder more
/// than once (under `data.kind = "prompts"`, the prompt reader and the rollout stage).
pub fn warn_once(tokenizer: &Tokenizer, dir: &Path) {
    static WARNED: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());
    let Ok(mut warned) = WARNED.lock() else { return };
    if !warned.contains(dir) {
        if let Some(warning) = split_warning(tokenizer, dir) {
            tracing::warn!("{warning}");
        }
        warned.insert(dir.to_path_buf());
    }
}

/// A warning when `AutoTokenizer` would split `SAMPLE` otherwise than `tokenizer` (loaded
/// from `dir/tokenizer.json`) does; None when they agree or the folder is not one
/// `Qwen2Tokenizer` rebuilds.
pub fn split_warning(tokenizer: &Tokenizer, dir: &Path) -> Option<String> {
    let model_type = json_str(&dir.join("config.json"), "model_type")?;
    let class = json_str(&dir.join("tokenizer_config.json"), "tokenizer_class").unwrap_or_default();
    // transformers' tokenization_auto: `qwen2` is in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS
    // (its registered class wins over the file's); the others keep a class the folder names.
    let rebuilt = model_type == "qwen2"
        || (matches!(model_type.as_str(), "qwen2_moe" | "qwen3" | "qwen3_moe") && class.trim_end_matches("Fast") == "Qwen2Tokenizer");
    if !rebuilt {
        return None;
    }
    let mut qwen2 = tokenizer.clone();
    let split = Split::new(SplitPattern::Regex(QWEN2_PATTERN.into()), SplitDelimiterBehavior::Isolated, false).ok()?;
    qwen2.with_pre_tokenizer(Some(Sequence::new(vec![split.into(), ByteLevel::new(false, true, false).into()])));
    qwen2.with_normalizer(Some(NFC)).ok()?;
    let ours = tokenizer.encode(SAMPLE, false).ok()?;
    let theirs = qwen2.encode(SAMPLE, false).ok()?;
    (ours.get_ids() != theirs.get_ids()).then(|| {
        format!(
            "{}: its pre-tokenizer splits text otherwise than Qwen2's, which transformers' AutoTokenizer uses for this \
             folder (model_type {model_type}): a sample gives {} tokens here and {} there (numbers are split digit by digit \
             there). ptrain encodes with the file; to train on what transformers encodes, re-save the tokenizer with \
             `AutoTokenizer.from_pretrained(dir).save_pretrained(dir)`",
            dir.join("tokenizer.json").display(),
            ours.len(),
            theirs.len()
        )
    })
}

fn json_str(path: &Path, key: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    value.get(key)?.as_str().map(str::to_owned)
}
