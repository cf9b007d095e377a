//! Instruction data (`data.kind = "chat"` or `"prompt_completion"`): rows encoded
//! once with their trained-token masks ([`encode`], cached by [`cache`]), read in
//! epochs, one row per sequence padded to the longest of the micro-batch, or
//! packed ([`pack`]) with positions restarting at each row and attention kept
//! within it. See docs/instruction-data.md.

mod cache;
pub mod encode;
mod pack;
pub mod rows;

use std::path::{Path, PathBuf};

use tch::Tensor;

use self::{
    cache::RowStore,
    encode::Encoder,
    pack::{Entry, EpochOrder, Samples},
};
use super::{chat_template, token_cache, tokenize, Batch, BatchKey, Dataset, Segments, Split, IGNORE_INDEX};
use crate::{
    config::{Config, DataKind, Overflow, TrainOn},
    error::{Error, Result},
    rng::Rng,
};

/// What was left out or cut, for the log and the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RowCounts {
    pub rows: u64,
    pub truncated: u64,
    pub dropped_too_long: u64,
    pub dropped_untrained: u64,
}

struct Source {
    name: String,
    store: RowStore,
}

pub struct InstructData {
    seq_len: usize,
    packing: bool,
    cross_talk: bool,
    sources: Vec<Source>,
    /// Named `[[data.datasets]]`: batches carry per-token source ids.
    named: bool,
    training_sources: usize,
    train: Samples,
    val: Samples,
    order: EpochOrder,
    pub counts: RowCounts,
}

fn bad(path: &Path, message: String) -> Error {
    Error::Data { path: path.to_owned(), message }
}

impl InstructData {
    pub fn from_config(config: &Config, seq_len: i64) -> Result<InstructData> {
        let data = &config.data;
        let tokenizer_path = PathBuf::from(&data.tokenizer);
        let tokenizer = tokenize::load_tokenizer(&tokenizer_path)?;
        let dir = tokenizer_path.parent().map(Path::to_path_buf).unwrap_or_default();
        let template = chat_template::ChatTemplate::find(&dir)?;
        let conversational = data.kind == DataKind::Chat;
        if conversational && template.is_none() {
            return Err(bad(&dir.join("tokenizer_config.json"), "data.kind = \"chat\" needs a chat template, and this tokenizer has none (no `chat_template` in tokenizer_config.json, no chat_template.jinja)".into()));
        }
        let eos = if data.eos_token.is_empty() { chat_template::eos_token(&dir) } else { data.eos_token.clone() };
        let train_on = match (data.train_on, data.kind) {
            (TrainOn::Auto, DataKind::Chat) => TrainOn::Assistant,
            (TrainOn::Auto, _) => TrainOn::Completion,
            (t, _) => t,
        };
        let template_hash = hash_files(&[dir.join("tokenizer_config.json"), dir.join("chat_template.jinja"), tokenizer_path.clone()]);
        let encoder = Encoder::new(tokenizer, template, train_on, eos.clone());
        let cache_dir = token_cache::cache_dir(config);
        let kind = format!("{:?}", data.kind);
        let train_on_name = format!("{train_on:?}");
        let key = [kind.as_str(), train_on_name.as_str(), eos.as_str(), template_hash.as_str()];
        let open = |path: &str| cache::prepare(Path::new(path), data.kind, &encoder, &key, &cache_dir);

        let mut sources = Vec::new();
        if !data.path.is_empty() {
            sources.push(Source { name: "train".into(), store: open(&data.path)? });
        }
        for spec in &data.datasets {
            sources.push(Source { name: spec.name.clone(), store: open(&spec.path)? });
        }
        let val_store = match data.val_path.as_str() {
            "" => None,
            p => Some(open(p)?),
        };
        for store in sources.iter().map(|s| &s.store).chain(val_store.as_ref()) {
            if store.max_id as i64 >= config.model.vocab_size {
                return Err(bad(
                    &store.path,
                    format!(
                        "token id {} is beyond the model's vocabulary (model.vocab_size = {}): the tokenizer does not match the model",
                        store.max_id, config.model.vocab_size
                    ),
                ));
            }
        }

        let seq_len = seq_len as usize;
        let mut counts = RowCounts::default();
        let (mut train, mut val) = (Vec::new(), Vec::new());
        for (s, source) in sources.iter().enumerate() {
            counts.rows += source.store.untrained;
            counts.dropped_untrained += source.store.untrained;
            let kept = fit(&source.store, s as u16, seq_len, data.overflow, &mut counts);
            if kept.is_empty() {
                return Err(bad(&source.store.path, "no row is left to train on (every row is too long or has no trained token)".into()));
            }
            let weight = data.datasets.iter().find(|d| d.name == source.name).map_or(1.0, |d| d.weight);
            let (t, v) = hold_out(kept, if val_store.is_some() { 0.0 } else { data.val_fraction });
            train.extend(weighted(t, weight, config.run.seed, s as u64));
            val.extend(v);
        }
        let training_sources = sources.len();
        if let Some(store) = val_store {
            let s = sources.len() as u16;
            val = fit(&store, s, seq_len, data.overflow, &mut RowCounts::default());
            sources.push(Source { name: "val".into(), store });
        }
        if val.is_empty() {
            return Err(bad(&sources[0].store.path, "no row is left for validation (set data.val_path, or more rows)".into()));
        }
        let (train, val) = if data.packing {
            (Samples::packed(train, seq_len), Samples::packed(val, seq_len))
        } else {
            (Samples::singles(train), Samples::singles(val))
        };
        tracing::info!(
            "data: {} rows; {} truncated, {} dropped as longer than {} tokens, {} dropped with no trained token; {} training {} (data.packing = {})",
            counts.rows,
            counts.truncated,
            counts.dropped_too_long,
            seq_len + 1,
            counts.dropped_untrained,
            train.len(),
            if data.packing { "sequences" } else { "rows" },
            data.packing
        );
        Ok(InstructData {
            seq_len,
            packing: data.packing,
            cross_talk: config.debug.packing_cross_talk,
            named: !data.datasets.is_empty(),
            training_sources,
            sources,
            order: EpochOrder::new(config.run.seed, train.len()),
            train,
            val,
            counts,
        })
    }

    /// Each source file and the cache file holding its encoded rows.
    pub fn files(&self) -> Vec<(String, PathBuf, usize)> {
        self.sources.iter().map(|s| (s.name.clone(), s.store.path.clone(), s.store.len())).collect()
    }

    /// The samples `key` names, collated: inputs, targets ([`IGNORE_INDEX`] where not
    /// trained or padding), and for packed sequences each token's position and row.
    fn collate(&self, samples: &Samples, picks: &[usize]) -> Result<Batch> {
        let b = picks.len();
        let t = picks.iter().map(|&s| samples.positions(s)).max().unwrap_or(1).max(1);
        let mut inputs = vec![0i64; b * t];
        let mut targets = vec![IGNORE_INDEX; b * t];
        let mut positions = vec![0i64; b * t];
        let mut rows = vec![0i64; b * t];
        let mut sources = vec![0i64; b * t];
        let mut trained = 0i64;
        for (i, &sample) in picks.iter().enumerate() {
            let mut at = i * t;
            for (k, entry) in samples.get(sample).iter().enumerate() {
                let row = self.sources[entry.source as usize].store.row(entry.row as usize);
                for p in 0..entry.positions() {
                    inputs[at] = row.id(p) as i64;
                    if row.trained(p + 1) {
                        targets[at] = row.id(p + 1) as i64;
                        trained += 1;
                    }
                    positions[at] = p as i64;
                    rows[at] = if self.cross_talk { 1 } else { k as i64 + 1 };
                    sources[at] = entry.source as i64;
                    at += 1;
                }
            }
            // Padding continues the positions, in a segment of its own.
            for (p, q) in (at..(i + 1) * t).enumerate() {
                positions[q] = p as i64;
            }
        }
        let shape = [b as i64, t as i64];
        let tensor = |v: &[i64]| -> Result<Tensor> { Ok(Tensor::f_from_slice(v)?.f_view(shape)?) };
        Ok(Batch {
            inputs: tensor(&inputs)?,
            targets: tensor(&targets)?,
            dataset_ids: if self.named { Some(tensor(&sources)?) } else { None },
            segments: if self.packing { Some(Segments { positions: tensor(&positions)?, ids: tensor(&rows)?, prefix: None }) } else { None },
            trained_tokens: Some(trained),
            samples: b as i64,
            tokens: (b * t) as i64,
        })
    }
}

/// The rows of `store` that fit `seq_len` positions (cut or left out by
/// `overflow`), counted.
fn fit(store: &RowStore, source: u16, seq_len: usize, overflow: Overflow, counts: &mut RowCounts) -> Vec<Entry> {
    let limit = seq_len + 1;
    let mut kept = Vec::with_capacity(store.len());
    for r in 0..store.len() {
        counts.rows += 1;
        let len = store.row_len(r);
        if len < 2 {
            counts.dropped_untrained += 1;
            continue;
        }
        if len > limit {
            if overflow == Overflow::Drop {
                counts.dropped_too_long += 1;
                continue;
            }
            if !store.row(r).trains_within(limit) {
                counts.dropped_untrained += 1;
                continue;
            }
            counts.truncated += 1;
        }
        kept.push(Entry { source, row: r as u32, len: len.min(limit) as u32 });
    }
    kept
}

/// The last `fraction` of the rows held out (at least one when any are).
fn hold_out(mut rows: Vec<Entry>, fraction: f64) -> (Vec<Entry>, Vec<Entry>) {
    if fraction <= 0.0 || rows.len() < 2 {
        return (rows, Vec::new());
    }
    let n = ((rows.len() as f64 * fraction).ceil() as usize).clamp(1, rows.len() - 1);
    let val = rows.split_off(rows.len() - n);
    (rows, val)
}

/// `weight` copies of each row per epoch: whole copies, then a fixed subset drawn
/// from (seed, source) for the fraction.
fn weighted(rows: Vec<Entry>, weight: f64, seed: u64, source: u64) -> Vec<Entry> {
    let whole = weight.floor() as usize;
    let mut out: Vec<Entry> = (0..whole).flat_map(|_| rows.iter().copied()).collect();
    let extra = ((weight - whole as f64) * rows.len() as f64).round() as usize;
    if extra > 0 {
        let mut picked = rows.clone();
        Rng::keyed(seed, &[0x3E16, source]).shuffle(&mut picked);
        out.extend(picked.into_iter().take(extra));
    }
    out
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

impl Dataset for InstructData {
    fn batch(&self, split: Split, key: BatchKey) -> Result<Batch> {
        let picks: Vec<usize> = (0..key.count)
            .map(|i| match split {
                Split::Train => self.order.sample(key.stream + i),
                Split::Val => ((key.stream + i) % self.val.len() as u64) as usize,
            })
            .collect();
        self.collate(if split == Split::Train { &self.train } else { &self.val }, &picks)
    }

    fn dataset_names(&self) -> Vec<String> {
        if self.named {
            // The training sources: a `data.val_path` file comes after them.
            self.sources.iter().take(self.training_sources).map(|s| s.name.clone()).collect()
        } else {
            Vec::new()
        }
    }

    fn train_len(&self) -> u64 {
        self.train.len() as u64
    }

    fn seq_len(&self) -> i64 {
        self.seq_len as i64
    }

    fn row_counts(&self) -> Option<RowCounts> {
        Some(self.counts)
    }
}
