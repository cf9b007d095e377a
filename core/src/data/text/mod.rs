//! The text layer every form of tokenized text data builds on: instruction rows
//! (`data::instruct`), preference pairs (`data::preference`), and next, prompts for
//! on-line RL. Each form shapes its rows and keeps its own cache layout; what they
//! share lives here, once:
//!
//! - [`encoder`]: the tokenizer, the chat template, the EOS token and what is
//!   trained, as the configuration says ([`encode::Encoder`]);
//! - [`chat`]: what a template renders for a row (messages, tools, template
//!   variables) and what the encoder encodes; [`messages`]: a conversation's
//!   messages in OpenAI's or ShareGPT's form;
//! - [`sources`]: the files each source reads, their cache file and its key, and the
//!   encoding of their rows on every core;
//! - [`order`]: the order an epoch visits the samples in;
//! - [`check_vocab`]: every id within the model's vocabulary;
//! - `grid`: a micro-batch's `[B, T]` grids filled a token at a time, then the batch;
//! - [`show`]: `ptrain tokenize --show`'s rows.

pub mod chat;
pub mod encode;
pub(crate) mod grid;
pub mod messages;
pub mod order;
pub mod show;
pub mod sources;
mod words;

use std::path::{Path, PathBuf};

pub use sources::{sources, Shaper, SourceSpec};

use self::encode::Encoder;
use super::{chat_template, token_cache, tokenize};
use crate::{
    config::{Config, DataKind, TrainOn},
    error::{Error, Result},
};

/// The encoder the configuration describes, and the settings besides the files
/// that change what it produces (for cache keys).
pub fn encoder(config: &Config) -> Result<(Encoder, Vec<String>)> {
    let data = &config.data;
    let tokenizer_path = PathBuf::from(&data.tokenizer);
    let tokenizer = tokenize::load_tokenizer(&tokenizer_path)?;
    let dir = tokenizer_path.parent().map(Path::to_path_buf).unwrap_or_default();
    super::tokenizer_check::warn_once(&tokenizer, &dir);
    let template = chat_template::ChatTemplate::find(&dir)?;
    if data.kind == DataKind::Chat && template.is_none() {
        return Err(Error::Data {
            path: dir.join("tokenizer_config.json"),
            message: "data.kind = \"chat\" needs a chat template, and this tokenizer has none (no `chat_template` in tokenizer_config.json, no chat_template.jinja)".into(),
        });
    }
    let eos = if data.eos_token.is_empty() { chat_template::eos_token(&dir) } else { data.eos_token.clone() };
    let train_on = match (data.train_on, data.kind) {
        (TrainOn::Auto, DataKind::Chat) => TrainOn::Assistant,
        (TrainOn::Auto, _) => TrainOn::Completion,
        (t, _) => t,
    };
    let template_hash = hash_files(&[dir.join("tokenizer_config.json"), dir.join("chat_template.jinja"), tokenizer_path.clone()]);
    // A template that writes today's date renders differently tomorrow.
    let date = if template.as_ref().is_some_and(|t| t.uses_date) { chrono::Local::now().format("%Y-%m-%d").to_string() } else { String::new() };
    let key = vec![format!("{:?}", data.kind), format!("{train_on:?}"), eos.clone(), template_hash, date];
    Ok((Encoder::new(tokenizer, template, train_on, eos), key))
}

/// A short hash of files' contents (missing files count as empty).
fn hash_files(paths: &[PathBuf]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for p in paths {
        h.update(std::fs::read(p).unwrap_or_default());
        h.update([0]);
    }
    token_cache::hex(&h.finalize()[..8])
}

/// Refuses token ids beyond the model's vocabulary: the tokenizer of `file`'s ids
/// (`max_id` the largest) does not match the model.
pub fn check_vocab(max_id: u32, config: &Config, file: &Path) -> Result<()> {
    let vocab = config.model.vocab_size;
    if max_id as i64 >= vocab {
        return Err(Error::Data {
            path: file.to_owned(),
            message: format!(
                "token id {max_id} is beyond the model's vocabulary (model.vocab_size = {vocab}): the tokenizer does not match the model"
            ),
        });
    }
    Ok(())
}
