//! From each source's encoded rows to the epoch's samples: the rows that fit a
//! sequence (cut or left out by `data.overflow`), the held-out part, and how many
//! copies of each source an epoch holds (`weight`, by rows or by trained tokens);
//! counted per source for the log, `ptrain tokenize` and `summary.json`.

use super::{cache::RowStore, pack::Entry};
use crate::{
    config::{Overflow, WeightBy},
    rng::Rng,
};

/// What was read, cut and left out, overall and per training source.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RowCounts {
    pub rows: u64,
    pub truncated: u64,
    pub dropped_too_long: u64,
    pub dropped_untrained: u64,
    pub sources: Vec<SourceCounts>,
}

/// One training source: its rows and tokens (of the rows kept, as cut), and its
/// part of an epoch.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct SourceCounts {
    pub name: String,
    /// Rows read, and rows kept (not left out; some may be held out for validation).
    pub rows: u64,
    pub kept: u64,
    pub tokens: u64,
    pub trained_tokens: u64,
    pub weight: f64,
    /// Copies of each training row an epoch holds.
    pub copies: f64,
    /// The source's share of an epoch's trained tokens.
    pub epoch_trained_share: f64,
}

/// The rows of `store` that fit `seq_len` positions (cut or left out by
/// `overflow`), counted into `counts` and `source`.
pub fn fit(store: &RowStore, id: u16, seq_len: usize, overflow: Overflow, counts: &mut RowCounts, source: &mut SourceCounts) -> Vec<Entry> {
    let limit = seq_len + 1;
    counts.rows += store.meta.untrained;
    counts.dropped_untrained += store.meta.untrained;
    source.rows += store.meta.untrained;
    let mut kept = Vec::with_capacity(store.len());
    for r in 0..store.len() {
        counts.rows += 1;
        source.rows += 1;
        let len = store.row_len(r);
        let mut trained = store.row_trained(r);
        if len < 2 {
            counts.dropped_untrained += 1;
            continue;
        }
        if len > limit {
            if overflow == Overflow::Drop {
                counts.dropped_too_long += 1;
                continue;
            }
            trained = store.row(r).trained_within(limit);
            if trained == 0 {
                counts.dropped_untrained += 1;
                continue;
            }
            counts.truncated += 1;
        }
        let len = len.min(limit);
        source.kept += 1;
        source.tokens += len as u64;
        source.trained_tokens += trained as u64;
        kept.push(Entry { source: id, row: r as u32, len: len as u32, trained: trained as u32 });
    }
    kept
}

/// The last `fraction` of the rows held out (at least one when any are).
pub fn hold_out(mut rows: Vec<Entry>, fraction: f64) -> (Vec<Entry>, Vec<Entry>) {
    if fraction <= 0.0 || rows.len() < 2 {
        return (rows, Vec::new());
    }
    let n = ((rows.len() as f64 * fraction).ceil() as usize).clamp(1, rows.len() - 1);
    let val = rows.split_off(rows.len() - n);
    (rows, val)
}

/// Copies of each source's rows per epoch. By rows, a weight is the copies; by
/// tokens, weight `w_i` of `W` gives source `i` the share `w_i / W` of an epoch
/// that holds as many trained tokens as every source's rows once.
pub fn copies(by: WeightBy, weights: &[f64], trained: &[u64]) -> Vec<f64> {
    match by {
        WeightBy::Rows => weights.to_vec(),
        WeightBy::Tokens => {
            let total: u64 = trained.iter().sum();
            let w: f64 = weights.iter().sum();
            weights.iter().zip(trained).map(|(wi, &ti)| if ti == 0 { 0.0 } else { wi / w * total as f64 / ti as f64 }).collect()
        }
    }
}

/// `copies` of each row per epoch: whole copies, then a fixed subset drawn from
/// (seed, source) for the fraction.
pub fn weighted(rows: Vec<Entry>, copies: f64, seed: u64, source: u64) -> Vec<Entry> {
    let whole = copies.floor() as usize;
    let mut out: Vec<Entry> = (0..whole).flat_map(|_| rows.iter().copied()).collect();
    let extra = ((copies - whole as f64) * rows.len() as f64).round() as usize;
    if extra > 0 {
        let mut picked = rows.clone();
        Rng::keyed(seed, &[0x3E16, source]).shuffle(&mut picked);
        out.extend(picked.into_iter().take(extra));
    }
    out
}

/// Each source's share of the epoch's trained tokens, from the samples drawn.
pub fn shares(train: &[Entry], sources: &mut [SourceCounts]) {
    let mut per = vec![0u64; sources.len()];
    for e in train {
        if let Some(p) = per.get_mut(e.source as usize) {
            *p += e.trained as u64;
        }
    }
    let total: u64 = per.iter().sum::<u64>().max(1);
    for (s, p) in sources.iter_mut().zip(per) {
        s.epoch_trained_share = p as f64 / total as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_weights_share_the_trained_tokens() {
        // Source a trains 1000 tokens, b 9000: equal weights by tokens give each half.
        let c = copies(WeightBy::Tokens, &[1.0, 1.0], &[1000, 9000]);
        assert!((c[0] * 1000.0 - 5000.0).abs() < 1e-9 && (c[1] * 9000.0 - 5000.0).abs() < 1e-9, "{c:?}");
        assert_eq!(copies(WeightBy::Rows, &[2.0, 0.5], &[1000, 9000]), vec![2.0, 0.5]);
        // 3:1 by tokens, an epoch as large as both once.
        let c = copies(WeightBy::Tokens, &[3.0, 1.0], &[4000, 4000]);
        assert_eq!(c, vec![1.5, 0.5]);
    }

    #[test]
    fn fractions_of_copies_pick_a_fixed_subset() {
        let rows: Vec<Entry> = (0..10).map(|r| Entry { source: 0, row: r, len: 4, trained: 2 }).collect();
        let a = weighted(rows.clone(), 1.5, 7, 0);
        assert_eq!(a.len(), 15);
        assert_eq!(a, weighted(rows, 1.5, 7, 0));
    }
}
