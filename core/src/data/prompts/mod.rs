//! Prompts for GRPO sampled in the run (`data.kind = "prompts"`): rows with a `prompt`
//! (a string tokenized as it is, or messages rendered with the chat template and its
//! generation prompt) and any other columns (an `answer`, a `solution`), which reach the
//! rewards as TRL passes dataset columns. Read whole at set-up; a micro-batch of `B`
//! completions is `B / grpo.num_generations` prompts, carried to the rollout stage
//! ([`crate::rollout`]) in the batch's payload ([`Prompts`]): the stage samples, scores
//! and turns them into scored rollouts before the step's core sees them.
//!
//! With `grpo.num_iterations = k`, the k steps of a generation read the same prompts
//! (as [`super::rollouts`] reads the same groups), and the stage trains them on the
//! completions it sampled on the first.

use std::{path::Path, sync::Arc};

use tch::{Kind, Tensor};

use super::{
    reader::{Record, Rows},
    rollouts::{generation_stream, rows::prompt_text},
    text::{self, encode::Encoder, order::EpochOrder},
    Batch, BatchKey, Dataset, Payload, Split,
};
use crate::{
    config::{ColumnMap, Config},
    error::{Error, Result},
};

/// One prompt and the row it came from.
#[derive(Debug)]
pub struct PromptRow {
    /// The prompt as the model sees it (rendered), and its tokens.
    pub text: String,
    pub ids: Vec<u32>,
    /// The row's columns as JSON (the prompt included), for the rewards.
    pub columns: serde_json::Map<String, serde_json::Value>,
}

/// A micro-batch's prompts, each to be sampled `grpo.num_generations` times.
#[derive(Debug, Clone)]
pub struct Prompts {
    pub rows: Vec<Arc<PromptRow>>,
    /// Which micro-batch of which generation this is (the same on each of its
    /// iterations): where the stage keeps its completions and GRPO its old log-probs.
    pub slot: u64,
    /// 0 on a generation's first step, up to `grpo.num_iterations - 1`.
    pub iteration: u64,
}

pub struct PromptData {
    rows: Vec<Arc<PromptRow>>,
    order: EpochOrder,
    seq_len: usize,
    generations: u64,
    iterations: u64,
    accum: u64,
}

impl PromptData {
    pub fn from_config(config: &Config, seq_len: i64) -> Result<PromptData> {
        let (encoder, _) = text::encoder(config)?;
        let path = Path::new(&config.data.path);
        let grpo = &config.grpo;
        // A prompt and its longest completion are one row of at most seq_len + 1 tokens.
        let longest = seq_len as usize + 1;
        let mut rows = Vec::new();
        let mut reader = Rows::open(&config.data.path, config.data.format, &[])?;
        loop {
            let records = reader.next_batch(1024)?;
            if records.is_empty() {
                break;
            }
            for record in records {
                let row = prompt_row(&record, &encoder, &config.data.columns).map_err(|m| record.place.error(m))?;
                if row.ids.len() + grpo.max_completion_length as usize > longest {
                    return Err(record.place.error(format!(
                        "the prompt is {} tokens: with grpo.max_completion_length = {} that is more than data.max_seq_len + 1 = {longest} (raise data.max_seq_len or shorten the prompt)",
                        row.ids.len(),
                        grpo.max_completion_length
                    )));
                }
                text::check_vocab(row.ids.iter().copied().max().unwrap_or(0), config, path)?;
                rows.push(Arc::new(row));
            }
        }
        if rows.is_empty() {
            return Err(Error::Data { path: path.to_owned(), message: "holds no prompts".into() });
        }
        tracing::info!("prompts: {} from {}, {} completions each", rows.len(), path.display(), grpo.num_generations);
        Ok(PromptData {
            order: EpochOrder::new(config.run.seed, rows.len()),
            rows,
            seq_len: seq_len as usize,
            generations: grpo.num_generations as u64,
            iterations: grpo.num_iterations.max(1) as u64,
            accum: config.optim.accum_steps.max(1),
        })
    }
}

/// The prompt `record` holds, with its columns.
fn prompt_row(record: &Record, encoder: &Encoder, columns: &ColumnMap) -> std::result::Result<PromptRow, String> {
    let prompt = record
        .get("prompt")
        .filter(|v| !v.is_none())
        .ok_or_else(|| format!("a prompt row needs a `prompt` (a string or a message list); the row's columns: {}", record.column_names()))?;
    let text = prompt_text(record, prompt, encoder, columns)?;
    let ids = encoder.ids(&text, false)?;
    if ids.is_empty() {
        return Err("the prompt is empty".into());
    }
    let columns = record
        .columns
        .iter()
        .map(|(name, value)| serde_json::to_value(value).map(|v| (name.to_string(), v)).map_err(|e| format!("column `{name}`: {e}")))
        .collect::<std::result::Result<_, _>>()?;
    Ok(PromptRow { text, ids, columns })
}

impl Dataset for PromptData {
    fn batch(&self, split: Split, key: BatchKey) -> Result<Batch> {
        if split == Split::Val {
            return Err(Error::Other("prompts have no held-out part".into()));
        }
        let g = self.generations;
        let (stream, iteration) = generation_stream(&key, self.iterations, self.accum);
        let rows = (0..key.count / g).map(|j| self.rows[self.order.sample(stream / g + j)].clone()).collect();
        // The rollout stage makes the inputs and targets from the completions it samples.
        let empty = Tensor::f_zeros([0, 1], (Kind::Int64, tch::Device::Cpu))?;
        Ok(Batch {
            inputs: empty.shallow_clone(),
            targets: empty,
            dataset_ids: None,
            segments: None,
            payload: Payload::Prompts(Prompts { rows, slot: stream, iteration }),
            samples: key.count as i64,
            tokens: 0,
        })
    }

    fn dataset_names(&self) -> Vec<String> {
        Vec::new()
    }

    /// Completions, each counted once per iteration: the epochs count generations.
    fn train_len(&self) -> u64 {
        self.rows.len() as u64 * self.generations * self.iterations
    }

    fn val_len(&self) -> Option<u64> {
        Some(0)
    }

    fn seq_len(&self) -> i64 {
        self.seq_len as i64
    }
}
