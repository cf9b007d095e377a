//! Preference pairs (`data.kind = "preference"`) for DPO: rows read from the files
//! people have ([`crate::data::reader`]), shaped as TRL reads them ([`rows`]),
//! tokenized as TRL 1.16's `DPOTrainer` tokenizes them ([`encode`]) on every core,
//! and collated as its `DataCollatorForPreference` does: a micro-batch of `B`
//! pairs is `2B` rows, the chosen ones (prompt + chosen) then the rejected ones
//! (prompt + rejected), each cut to `data.max_seq_len + 1` tokens by
//! `dpo.truncation_mode`, right-padded; the targets are the completion tokens.
//! With `data.packing`, a pair is one sequence holding its prompt once ([`pack`]).
//! See docs/preference.md.

pub mod encode;
mod pack;
pub mod rows;

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use rayon::prelude::*;
use tch::Tensor;

use self::encode::EncodedPair;
pub use self::pack::{CHOSEN, REJECTED};
use super::{instruct, reader::Rows, Batch, BatchKey, Dataset, Split, IGNORE_INDEX};
use crate::{
    config::{Config, TruncationMode},
    error::{Error, Result},
};

/// Rows read and encoded at a time (each batch is spread over the cores).
const BATCH_ROWS: usize = 2048;

pub struct PreferenceData {
    /// Positions of a sequence: a row keeps at most `seq_len + 1` tokens.
    seq_len: usize,
    keep_end: bool,
    /// `data.packing`: prompt + chosen + rejected in one sequence.
    packing: bool,
    /// `debug.packing_cross_talk`: the rejected answer sees the chosen one.
    cross_talk: bool,
    train: Vec<EncodedPair>,
    val: Vec<EncodedPair>,
    /// `dpo.precompute_reference`: each training and held-out pair's reference
    /// log-probabilities (chosen, rejected), set once before training.
    reference: [OnceLock<Vec<[f32; 2]>>; 2],
    order: instruct::pack::EpochOrder,
    /// Pairs read, and left out because truncation leaves a completion no token.
    pub read: u64,
    pub dropped: u64,
}

fn bad(path: &Path, message: String) -> Error {
    Error::Data { path: path.to_owned(), message }
}

/// Every pair of `path`, encoded; the first bad row is the error, naming its file
/// and line (or row).
fn read_pairs(config: &Config, path: &str, encoder: &instruct::encode::Encoder) -> Result<Vec<EncodedPair>> {
    let data = &config.data;
    let mut rows = Rows::open(path, data.format, &data.ignore_columns)?;
    let mut pairs = Vec::new();
    loop {
        let batch = rows.next_batch(BATCH_ROWS)?;
        if batch.is_empty() {
            break;
        }
        let encoded: Vec<Result<EncodedPair>> = batch
            .par_iter()
            .map(|record| {
                rows::shape(record, &data.columns, &data.ignore_columns)
                    .and_then(|pair| encode::encode(encoder, &pair))
                    .map_err(|m| record.place.error(m))
            })
            .collect();
        for pair in encoded {
            pairs.push(pair?);
        }
    }
    if pairs.is_empty() {
        return Err(bad(Path::new(path), "the file holds no rows".into()));
    }
    Ok(pairs)
}

impl PreferenceData {
    pub fn from_config(config: &Config, seq_len: i64) -> Result<PreferenceData> {
        let data = &config.data;
        let (encoder, _) = instruct::encoder(config)?;
        let limit = seq_len as usize + 1;
        let keep_end = config.dpo.truncation_mode == TruncationMode::KeepEnd;
        let mut read = 0;
        let mut dropped = 0;
        let mut fit = |path: &str| -> Result<Vec<EncodedPair>> {
            let pairs = read_pairs(config, path, &encoder)?;
            read += pairs.len() as u64;
            let vocab = config.model.vocab_size;
            if let Some(id) = pairs.iter().flat_map(|p| p.prompt.iter().chain(&p.chosen).chain(&p.rejected)).find(|&&id| id as i64 >= vocab) {
                return Err(bad(
                    Path::new(path),
                    format!("token id {id} is beyond the model's vocabulary (model.vocab_size = {vocab}): the tokenizer does not match the model"),
                ));
            }
            // As TRL: with keep_start, a pair whose prompt alone fills the sequence
            // would train on no completion token.
            let n = pairs.len() as u64;
            let kept: Vec<EncodedPair> = pairs.into_iter().filter(|p| keep_end || p.prompt.len() < limit).collect();
            dropped += n - kept.len() as u64;
            Ok(kept)
        };
        let mut train = fit(&data.path)?;
        let val = match data.val_path.as_str() {
            "" => {
                let n = match (data.val_fraction, train.len()) {
                    (f, n) if f <= 0.0 || n < 2 => 0,
                    (f, n) => ((n as f64 * f).ceil() as usize).clamp(1, n - 1),
                };
                train.split_off(train.len() - n)
            }
            val_path => fit(val_path)?,
        };
        let path = PathBuf::from(&data.path);
        if train.is_empty() {
            return Err(bad(&path, format!("no pair is left to train on (every prompt is at least data.max_seq_len + 1 = {limit} tokens long)")));
        }
        if val.is_empty() {
            return Err(bad(&path, "no pair is left for validation (set data.val_path, or more rows)".into()));
        }
        tracing::info!(
            "data: {read} preference pairs; {dropped} left out as their prompt fills {limit} tokens; {} training, {} held out",
            train.len(),
            val.len()
        );
        Ok(PreferenceData {
            seq_len: seq_len as usize,
            keep_end,
            packing: data.packing,
            cross_talk: config.debug.packing_cross_talk,
            order: instruct::pack::EpochOrder::new(config.run.seed, train.len()),
            train,
            val,
            reference: Default::default(),
            read,
            dropped,
        })
    }

    /// A completion's row: prompt + completion cut to `seq_len + 1` tokens, and which
    /// of its tokens are the completion's.
    fn row(&self, prompt: &[u32], completion: &[u32]) -> (Vec<u32>, Vec<bool>) {
        let mut ids: Vec<u32> = prompt.iter().chain(completion).copied().collect();
        let mut mask: Vec<bool> = (0..ids.len()).map(|i| i >= prompt.len()).collect();
        let limit = self.seq_len + 1;
        if ids.len() > limit {
            let range = if self.keep_end { ids.len() - limit..ids.len() } else { 0..limit };
            ids = ids[range.clone()].to_vec();
            mask = mask[range].to_vec();
        }
        (ids, mask)
    }

    fn pairs(&self, split: Split) -> &[EncodedPair] {
        match split {
            Split::Train => &self.train,
            Split::Val => &self.val,
        }
    }

    /// Pairs in `split`.
    pub fn len(&self, split: Split) -> usize {
        self.pairs(split).len()
    }

    /// The pairs `picks` of `split` (indices into it, in order) as a batch.
    pub fn batch_of(&self, split: Split, picks: &[usize]) -> Result<Batch> {
        match self.packing {
            true => self.collate_packed(split, picks),
            false => self.collate(split, picks),
        }
    }

    /// The pairs' token ids and how they are cut and collated, into `key` (for the
    /// stored reference log-probabilities: [`crate::objective`]).
    pub fn fingerprint(&self, key: &mut sha2::Sha256) {
        use sha2::Digest;
        key.update(format!("{}\0{}\0{}\0", self.seq_len, self.keep_end, self.packing));
        for (split, pairs) in [&self.train, &self.val].into_iter().enumerate() {
            key.update(format!("split {split}: {}\0", pairs.len()));
            for pair in pairs {
                for ids in [&pair.prompt, &pair.chosen, &pair.rejected] {
                    key.update((ids.len() as u64).to_le_bytes());
                    ids.iter().for_each(|id| key.update(id.to_le_bytes()));
                }
            }
        }
    }

    /// Sets the reference log-probabilities (chosen, rejected) of every pair of
    /// `split`, in order; batches carry them from then on.
    pub fn set_reference(&self, split: Split, logps: Vec<[f32; 2]>) -> Result<()> {
        if logps.len() != self.len(split) {
            return Err(Error::Other(format!("{} reference log-probabilities for {} pairs", logps.len(), self.len(split))));
        }
        self.reference[split as usize].set(logps).map_err(|_| Error::Other("the reference log-probabilities are already set".into()))
    }

    /// The precomputed reference log-probabilities of `picks`, `[2B]`, if set.
    fn reference_of(&self, split: Split, picks: &[usize]) -> Result<Option<Tensor>> {
        let Some(all) = self.reference[split as usize].get() else { return Ok(None) };
        let values: Vec<f32> = [0, 1].iter().flat_map(|&k| picks.iter().map(move |&p| all[p][k])).collect();
        Ok(Some(Tensor::f_from_slice(&values)?))
    }

    /// `picks`' pairs as `2B` rows: the chosen ones, then the rejected ones.
    fn collate(&self, split: Split, picks: &[usize]) -> Result<Batch> {
        let pairs = self.pairs(split);
        let b = picks.len();
        let rows: Vec<(Vec<u32>, Vec<bool>)> = [true, false]
            .iter()
            .flat_map(|&chosen| picks.iter().map(move |&p| (p, chosen)))
            .map(|(p, chosen)| {
                let pair = &pairs[p];
                self.row(&pair.prompt, if chosen { &pair.chosen } else { &pair.rejected })
            })
            .collect();
        let t = rows.iter().map(|(ids, _)| ids.len().saturating_sub(1)).max().unwrap_or(1).max(1);
        let mut inputs = vec![0i64; 2 * b * t];
        let mut targets = vec![IGNORE_INDEX; 2 * b * t];
        for (r, (ids, mask)) in rows.iter().enumerate() {
            for p in 0..ids.len().saturating_sub(1) {
                inputs[r * t + p] = ids[p] as i64;
                if mask[p + 1] {
                    targets[r * t + p] = ids[p + 1] as i64;
                }
            }
        }
        let shape = [2 * b as i64, t as i64];
        Ok(Batch {
            inputs: Tensor::f_from_slice(&inputs)?.f_view(shape)?,
            targets: Tensor::f_from_slice(&targets)?.f_view(shape)?,
            dataset_ids: None,
            segments: None,
            trained_tokens: None,
            reference: self.reference_of(split, picks)?,
            samples: b as i64,
            tokens: (2 * b * t) as i64,
        })
    }
}

impl Dataset for PreferenceData {
    fn batch(&self, split: Split, key: BatchKey) -> Result<Batch> {
        let picks: Vec<usize> = match split {
            Split::Train => (0..key.count).map(|i| self.order.sample(key.stream + i)).collect(),
            Split::Val => (0..key.count).map(|i| ((key.stream + i) % self.val.len() as u64) as usize).collect(),
        };
        self.batch_of(split, &picks)
    }

    fn preference(&self) -> Option<&PreferenceData> {
        Some(self)
    }

    fn dataset_names(&self) -> Vec<String> {
        Vec::new()
    }

    fn train_len(&self) -> u64 {
        self.train.len() as u64
    }

    fn seq_len(&self) -> i64 {
        self.seq_len as i64
    }
}

#[cfg(test)]
mod tests;
