//! A run's pairs: each file's through the token cache ([`cache`]), those whose
//! prompt leaves a completion no room left out (as TRL does with `keep_start`), the
//! held-out ones split off, and what was found counted, for the log and `ptrain
//! tokenize`.

use std::path::{Path, PathBuf};

use super::{bad, cache, encode::EncodedPair, PreferenceData};
use crate::{
    config::{Config, TruncationMode},
    data::{
        text::{self, order::EpochOrder, SourceSpec},
        token_cache,
    },
    error::Result,
};

/// What the pairs hold once cut to `data.max_seq_len + 1` tokens.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PairCounts {
    /// Pairs read, from every file.
    pub pairs: u64,
    /// Left out: the prompt alone fills `data.max_seq_len + 1` tokens (keep_start).
    pub dropped_prompt_too_long: u64,
    /// Kept, with prompt + chosen or prompt + rejected cut to that many tokens.
    pub truncated: u64,
    pub train: u64,
    pub held_out: u64,
    /// The training pairs' trained (completion) tokens: an epoch's.
    pub trained_tokens: u64,
}

impl PairCounts {
    /// What the counts say, for the log and `ptrain tokenize`: `limit` is
    /// `data.max_seq_len + 1`, `mode` `dpo.truncation_mode`'s name.
    pub fn sentence(&self, limit: usize, mode: &str) -> String {
        format!(
            "{} preference pairs: {} left out as their prompt fills data.max_seq_len + 1 = {limit} tokens, {} cut to {limit} tokens \
             (dpo.truncation_mode = \"{mode}\"); {} training, {} held out; {} completion tokens trained per epoch",
            self.pairs, self.dropped_prompt_too_long, self.truncated, self.train, self.held_out, self.trained_tokens
        )
    }
}

/// The completion tokens trained of a row of `prompt` then `completion` tokens cut
/// to `limit` by keeping its start or its end: those kept, but the row's first
/// token (never a target). As [`PreferenceData::row`] cuts it.
pub(super) fn trained(prompt: usize, completion: usize, limit: usize, keep_end: bool) -> usize {
    let len = prompt + completion;
    let (start, end) = if keep_end { (len.saturating_sub(limit), len) } else { (0, len.min(limit)) };
    end.saturating_sub(prompt.max(start + 1))
}

impl PreferenceData {
    pub fn from_config(config: &Config, seq_len: i64) -> Result<PreferenceData> {
        let data = &config.data;
        let (encoder, key) = text::encoder(config)?;
        let key: Vec<&str> = key.iter().map(String::as_str).collect();
        let dir = token_cache::cache_dir(config);
        let limit = seq_len as usize + 1;
        let keep_end = config.dpo.truncation_mode == TruncationMode::KeepEnd;
        let mut counts = PairCounts::default();
        let mut files = Vec::new();
        let mut fit = |spec: &SourceSpec| -> Result<Vec<EncodedPair>> {
            let (file, pairs) = cache::prepare(spec, &encoder, &key, &dir)?;
            text::check_vocab(file.meta.max_id, config, Path::new(&spec.path))?;
            // A data.val_path naming the training file: its pairs are counted once.
            let counted = files.iter().any(|(_, f): &(String, super::cache::PairFile)| f.meta.source == file.meta.source);
            files.push((spec.name.clone(), file));
            let n = pairs.len() as u64;
            let kept: Vec<EncodedPair> = pairs.into_iter().filter(|p| keep_end || p.prompt.len() < limit).collect();
            if !counted {
                counts.pairs += n;
                counts.dropped_prompt_too_long += n - kept.len() as u64;
                counts.truncated += kept.iter().filter(|p| p.prompt.len() + p.chosen.len().max(p.rejected.len()) > limit).count() as u64;
            }
            Ok(kept)
        };
        let specs = text::sources(config);
        let train_spec = specs.iter().find(|s| s.name == "train").ok_or_else(|| bad(Path::new(""), "preference data reads data.path".into()))?;
        let mut train = fit(train_spec)?;
        let val = match specs.iter().find(|s| s.name == "val") {
            None => {
                let n = match (data.val_fraction, train.len()) {
                    (f, n) if f <= 0.0 || n < 2 => 0,
                    (f, n) => ((n as f64 * f).ceil() as usize).clamp(1, n - 1),
                };
                train.split_off(train.len() - n)
            }
            Some(spec) => fit(spec)?,
        };
        let path = PathBuf::from(&data.path);
        if train.is_empty() {
            return Err(bad(&path, format!("no pair is left to train on (every prompt is at least data.max_seq_len + 1 = {limit} tokens long)")));
        }
        // data.val_fraction = 0 and no data.val_path: nothing held out, no evaluation
        // (TRL without an eval_dataset); a held-out share asked for must hold a pair.
        let asked = specs.iter().any(|s| s.name == "val") || data.val_fraction > 0.0;
        if val.is_empty() && asked {
            return Err(bad(&path, "no pair is left for validation (set data.val_path, more rows, or data.val_fraction = 0)".into()));
        }
        (counts.train, counts.held_out) = (train.len() as u64, val.len() as u64);
        counts.trained_tokens = train
            .iter()
            .map(|p| trained(p.prompt.len(), p.chosen.len(), limit, keep_end) + trained(p.prompt.len(), p.rejected.len(), limit, keep_end))
            .sum::<usize>() as u64;
        tracing::info!("data: {}", counts.sentence(limit, config.dpo.truncation_mode.name()));
        Ok(PreferenceData {
            seq_len: seq_len as usize,
            keep_end,
            packing: data.packing,
            cross_talk: config.debug.packing_cross_talk,
            order: EpochOrder::new(config.run.seed, train.len()),
            train,
            val,
            counts,
            files,
        })
    }
}
