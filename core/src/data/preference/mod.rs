//! Preference pairs (`data.kind = "preference"`) for DPO: rows read from the files
//! people have ([`crate::data::reader`]), shaped as TRL reads them ([`rows`]),
//! tokenized as TRL 1.16's `DPOTrainer` tokenizes them ([`encode`]) on every core
//! into the token cache ([`cache`], read back by [`load`]), and collated as its
//! `DataCollatorForPreference` does: a micro-batch of `B` pairs is `2B` rows, the chosen ones (prompt + chosen) then the rejected ones
//! (prompt + rejected), each cut to `data.max_seq_len + 1` tokens by
//! `dpo.truncation_mode`, right-padded; the targets are the completion tokens.
//! With `data.packing`, a pair is one sequence holding its prompt once ([`pack`]).
//! See docs/preference.md.

mod cache;
pub mod encode;
mod load;
mod pack;
pub mod rows;
pub mod show;

use std::path::Path;

use tch::Tensor;

use self::encode::EncodedPair;
pub use self::{
    cache::{PairFile, PairMeta},
    load::PairCounts,
    pack::{CHOSEN, REJECTED},
};
use super::{
    text::{
        grid::{Grid, Place},
        order::EpochOrder,
    },
    Batch, BatchKey, Dataset, Payload, Split,
};
use crate::error::{Error, Result};

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
    order: EpochOrder,
    /// What the pairs hold, and which were left out.
    pub counts: PairCounts,
    /// Each source's name and cache file.
    files: Vec<(String, PairFile)>,
}

fn bad(path: &Path, message: String) -> Error {
    Error::Data { path: path.to_owned(), message }
}

impl PreferenceData {
    /// Each source (its name) and the cache file holding its encoded pairs.
    pub fn files(&self) -> &[(String, PairFile)] {
        &self.files
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

    /// Each of `picks`' index among the dataset's pairs (the training ones, then
    /// the held-out ones): the payload by which DPO finds a pair's precomputed
    /// reference log-probabilities.
    fn pair_ids(&self, split: Split, picks: &[usize]) -> Result<Payload> {
        let offset = if split == Split::Train { 0 } else { self.train.len() };
        let ids: Vec<i64> = picks.iter().map(|&p| (offset + p) as i64).collect();
        Ok(Payload::Pairs(Tensor::f_from_slice(&ids)?))
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
        let mut g = Grid::new(2 * b, t);
        for (r, (ids, mask)) in rows.iter().enumerate() {
            g.write_row(r * t, ids.len(), |p| ids[p], |p| mask[p], Place { position: 0, row: 0 });
        }
        g.batch(b, None, None, self.pair_ids(split, picks)?)
    }
}

impl Dataset for PreferenceData {
    fn batch(&self, split: Split, key: BatchKey) -> Result<Batch> {
        let picks: Vec<usize> = match split {
            Split::Train => (0..key.count).map(|i| self.order.sample(key.stream + i)).collect(),
            // The evaluator reads each held-out pair once (`val_len`).
            Split::Val => (0..key.count).map(|i| ((key.stream + i) % self.val.len().max(1) as u64) as usize).collect(),
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

    fn val_len(&self) -> Option<u64> {
        Some(self.val.len() as u64)
    }

    fn seq_len(&self) -> i64 {
        self.seq_len as i64
    }
}

#[cfg(test)]
mod tests;
