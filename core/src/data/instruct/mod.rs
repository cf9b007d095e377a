//! Instruction data (`data.kind = "chat"` or `"prompt_completion"`): rows read
//! from the files people have ([`crate::data::reader`]), made into conversations or
//! prompts and completions ([`shape`]), encoded once with their trained-token masks
//! (the text layer's encoder, on every core, cached by [`source`] and [`cache`]),
//! mixed ([`mix`]), read in epochs, one row per sequence padded to the longest of
//! the micro-batch, or packed ([`pack`]) with positions restarting at each row and
//! attention kept within it. See docs/instruction-data.md.

mod cache;
mod mix;
pub(crate) mod pack;
pub mod shape;
pub mod show;
pub mod source;

use std::path::Path;

pub use self::{
    cache::Meta,
    mix::{RowCounts, SourceCounts},
};
use self::{cache::RowStore, pack::Samples};
use super::{
    text::{
        self,
        grid::{Grid, Place},
        order::EpochOrder,
    },
    token_cache, Batch, BatchKey, Dataset, Payload, Split,
};
use crate::{
    config::Config,
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

/// The training and held-out rows of `sources` as the configuration mixes them:
/// each fitted to `seq_len + 1` tokens (`data.overflow`), its held-out share split
/// off (`data.val_fraction`, unless `has_val`), then weighted (`[[data.datasets]]`
/// weights, `data.weight_by`); and what was found, counted.
fn mixed(sources: &[Source], config: &Config, seq_len: usize, has_val: bool) -> Result<(Vec<pack::Entry>, Vec<pack::Entry>, RowCounts)> {
    let data = &config.data;
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
    Ok((train, val, counts))
}

/// Says what the rows held and what became of them.
fn say_counts(counts: &RowCounts, sources: &[Source], training_sources: usize, config: &Config, (samples, seq_len): (usize, usize)) {
    let data = &config.data;
    tracing::info!(
        "data: {} rows; {} truncated, {} dropped as longer than {} tokens, {} dropped with no trained token; {} training {} (data.packing = {})",
        counts.rows,
        counts.truncated,
        counts.dropped_too_long,
        seq_len + 1,
        counts.dropped_untrained,
        samples,
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
}

impl InstructData {
    pub fn from_config(config: &Config, seq_len: i64) -> Result<InstructData> {
        let data = &config.data;
        let (encoder, key) = text::encoder(config)?;
        let key: Vec<&str> = key.iter().map(String::as_str).collect();
        let cache_dir = token_cache::cache_dir(config);
        let specs = text::sources(config);
        let has_val = !data.val_path.is_empty();
        let mut sources = Vec::new();
        for spec in &specs {
            let store = source::prepare(spec, &encoder, &key, &cache_dir)?;
            text::check_vocab(store.meta.max_id, config, &store.path)?;
            sources.push(Source { name: spec.name.clone(), store });
        }
        let val_store = if has_val { sources.pop().map(|s| s.store) } else { None };

        let seq_len = seq_len as usize;
        let (train, mut val, counts) = mixed(&sources, config, seq_len, has_val)?;
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
        say_counts(&counts, &sources, training_sources, config, (train.len(), seq_len));
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
                let place = Place { position: 0, row: if self.cross_talk { 1 } else { k as i64 + 1 } };
                let (end, n) = g.write_row(at, entry.len as usize, |p| row.id(p), |p| row.trained(p), place);
                sources[at..end].fill(entry.source as i64);
                (at, trained) = (end, trained + n);
            }
            g.pad(i, at);
        }
        let segments = self.packing.then(|| g.segments(None)).transpose()?;
        g.batch(b, segments, self.named.then_some(&sources[..]), Payload::TrainedTokens(trained))
    }
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
