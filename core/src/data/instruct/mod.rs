//! Instruction data (`data.kind = "chat"` or `"prompt_completion"`): rows read
//! from the files people have ([`crate::data::reader`]), made into conversations
//! ([`shape`], [`messages`]), encoded once with their trained-token masks
//! ([`encode`], on every core and cached by [`source`] and [`cache`]), mixed
//! ([`mix`]), read in epochs, one row per sequence padded to the longest of the
//! micro-batch, or packed ([`pack`]) with positions restarting at each row and
//! attention kept within it. See docs/instruction-data.md.

mod cache;
pub mod encode;
pub mod messages;
mod mix;
pub(crate) mod pack;
pub mod shape;
pub mod show;
pub mod source;
mod words;

use std::path::{Path, PathBuf};

pub use self::{
    cache::Meta,
    mix::{RowCounts, SourceCounts},
};
use self::{
    cache::RowStore,
    encode::Encoder,
    pack::{EpochOrder, Samples},
    shape::Shaper,
    source::SourceSpec,
};
use super::{chat_template, grid::Grid, token_cache, tokenize, Batch, BatchKey, Dataset, Split};
use crate::{
    config::{Config, DataKind, TrainOn},
    error::{Error, Result},
};

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

/// The encoder the configuration describes, and the settings besides the files
/// that change what it produces (for cache keys).
pub fn encoder(config: &Config) -> Result<(Encoder, Vec<String>)> {
    let data = &config.data;
    let tokenizer_path = PathBuf::from(&data.tokenizer);
    let tokenizer = tokenize::load_tokenizer(&tokenizer_path)?;
    let dir = tokenizer_path.parent().map(Path::to_path_buf).unwrap_or_default();
    let template = chat_template::ChatTemplate::find(&dir)?;
    if data.kind == DataKind::Chat && template.is_none() {
        return Err(bad(&dir.join("tokenizer_config.json"), "data.kind = \"chat\" needs a chat template, and this tokenizer has none (no `chat_template` in tokenizer_config.json, no chat_template.jinja)".into()));
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

/// Every source the configuration names, in order: `data.path` ("train"), each
/// `[[data.datasets]]` entry, then `data.val_path` ("val").
pub fn sources(config: &Config) -> Vec<SourceSpec> {
    let data = &config.data;
    let spec = |name: &str, path: &str, d: Option<&crate::config::DatasetSpec>| SourceSpec {
        name: name.into(),
        path: path.into(),
        format: d.and_then(|d| d.format).unwrap_or(data.format),
        shaper: Shaper {
            kind: data.kind,
            columns: d.and_then(|d| d.columns.clone()).unwrap_or_else(|| data.columns.clone()),
            ignore: d.and_then(|d| d.ignore_columns.clone()).unwrap_or_else(|| data.ignore_columns.clone()),
        },
    };
    let mut out = Vec::new();
    if !data.path.is_empty() {
        out.push(spec("train", &data.path, None));
    }
    out.extend(data.datasets.iter().map(|d| spec(&d.name, &d.path, Some(d))));
    if !data.val_path.is_empty() {
        out.push(spec("val", &data.val_path, None));
    }
    out
}

impl InstructData {
    pub fn from_config(config: &Config, seq_len: i64) -> Result<InstructData> {
        let data = &config.data;
        let (encoder, key) = encoder(config)?;
        let key: Vec<&str> = key.iter().map(String::as_str).collect();
        let cache_dir = token_cache::cache_dir(config);
        let specs = sources(config);
        let has_val = !data.val_path.is_empty();
        let mut sources = Vec::new();
        for spec in &specs {
            let store = source::prepare(spec, &encoder, &key, &cache_dir)?;
            if store.meta.max_id as i64 >= config.model.vocab_size {
                return Err(bad(
                    &store.path,
                    format!(
                        "token id {} is beyond the model's vocabulary (model.vocab_size = {}): the tokenizer does not match the model",
                        store.meta.max_id, config.model.vocab_size
                    ),
                ));
            }
            sources.push(Source { name: spec.name.clone(), store });
        }
        let val_store = if has_val { sources.pop().map(|s| s.store) } else { None };

        let seq_len = seq_len as usize;
        let mut counts = RowCounts::default();
        let mut kept_per_source = Vec::new();
        let mut val = Vec::new();
        for (s, source) in sources.iter().enumerate() {
            let weight = data.datasets.iter().find(|d| d.name == source.name).map_or(1.0, |d| d.weight);
            let mut c = mix::SourceCounts { name: source.name.clone(), weight, ..Default::default() };
            let kept = mix::fit(&source.store, s as u16, seq_len, data.overflow, &mut counts, &mut c);
            if kept.is_empty() {
                let why = source.store.meta.first_untrained.as_deref().map(|f| format!("; the first left out: {f}")).unwrap_or_default();
                return Err(bad(
                    Path::new(&source.store.meta.source),
                    format!("no row is left to train on (every row is too long or has no trained token{why})"),
                ));
            }
            let (t, v) = mix::hold_out(kept, if has_val { 0.0 } else { data.val_fraction });
            val.extend(v);
            counts.sources.push(c);
            kept_per_source.push(t);
        }
        let trained: Vec<u64> = kept_per_source.iter().map(|rows| rows.iter().map(|e| e.trained as u64).sum()).collect();
        let weights: Vec<f64> = counts.sources.iter().map(|c| c.weight).collect();
        let copies = mix::copies(data.weight_by, &weights, &trained);
        let mut train = Vec::new();
        for (s, rows) in kept_per_source.into_iter().enumerate() {
            counts.sources[s].copies = copies[s];
            train.extend(mix::weighted(rows, copies[s], config.run.seed, s as u64));
        }
        mix::shares(&train, &mut counts.sources);
        let training_sources = sources.len();
        if let Some(store) = val_store {
            let s = sources.len() as u16;
            val = mix::fit(&store, s, seq_len, data.overflow, &mut RowCounts::default(), &mut mix::SourceCounts::default());
            sources.push(Source { name: "val".into(), store });
        }
        let first = Path::new(&sources[0].store.meta.source);
        if val.is_empty() && (has_val || data.val_fraction > 0.0) {
            return Err(bad(first, "no row is left for validation (set data.val_path, or more rows)".into()));
        }
        if train.is_empty() {
            return Err(bad(first, "no row is left to train on after weighting (a weight too small for its rows)".into()));
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
        for s in sources.iter().filter_map(|s| s.store.meta.first_untrained.as_ref().map(|f| (s, f))) {
            tracing::info!("data: {}: {} rows with no trained token, the first: {}", s.0.name, s.0.store.meta.untrained, s.1);
        }
        for c in counts.sources.iter().filter(|_| training_sources > 1) {
            tracing::info!(
                "data: {}: {} rows kept of {}, {} tokens, {} trained; weight {} ({:?}): {:.3} copies, {:.1}% of an epoch's trained tokens",
                c.name,
                c.kept,
                c.rows,
                c.tokens,
                c.trained_tokens,
                c.weight,
                data.weight_by,
                c.copies,
                100.0 * c.epoch_trained_share
            );
        }
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
    pub fn files(&self) -> Vec<(&str, &Meta, &Path, Option<f64>)> {
        self.sources.iter().map(|s| (s.name.as_str(), &s.store.meta, s.store.path.as_path(), s.store.encoded)).collect()
    }

    /// The samples `key` names, collated: inputs, targets ([`super::IGNORE_INDEX`] where not
    /// trained or padding), and for packed sequences each token's position and row.
    fn collate(&self, samples: &Samples, picks: &[usize]) -> Result<Batch> {
        let b = picks.len();
        let t = picks.iter().map(|&s| samples.positions(s)).max().unwrap_or(1).max(1);
        let mut g = Grid::new(b, t);
        let mut sources = vec![0i64; b * t];
        let mut trained = 0i64;
        for (i, &sample) in picks.iter().enumerate() {
            let mut at = i * t;
            for (k, entry) in samples.get(sample).iter().enumerate() {
                let row = self.sources[entry.source as usize].store.row(entry.row as usize);
                for p in 0..entry.positions() {
                    g.inputs[at] = row.id(p) as i64;
                    if row.trained(p + 1) {
                        g.targets[at] = row.id(p + 1) as i64;
                        trained += 1;
                    }
                    g.positions[at] = p as i64;
                    g.rows[at] = if self.cross_talk { 1 } else { k as i64 + 1 };
                    sources[at] = entry.source as i64;
                    at += 1;
                }
            }
            g.pad(i, at);
        }
        Ok(Batch {
            inputs: g.tensor(&g.inputs)?,
            targets: g.tensor(&g.targets)?,
            dataset_ids: if self.named { Some(g.tensor(&sources)?) } else { None },
            segments: if self.packing { Some(g.segments(None)?) } else { None },
            trained_tokens: Some(trained),
            reference: None,
            samples: b as i64,
            tokens: (b * t) as i64,
        })
    }
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
                // The evaluator reads each held-out sample once (`val_len`).
                Split::Val => ((key.stream + i) % self.val.len().max(1) as u64) as usize,
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

    fn val_len(&self) -> Option<u64> {
        Some(self.val.len() as u64)
    }

    fn seq_len(&self) -> i64 {
        self.seq_len as i64
    }

    fn row_counts(&self) -> Option<RowCounts> {
        Some(self.counts.clone())
    }
}
