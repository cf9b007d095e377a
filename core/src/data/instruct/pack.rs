//! Samples of instruction data: one row each, or rows packed into sequences by
//! best-fit decreasing (TRL's default `bfd`, which keeps every row whole); and the
//! order an epoch visits them in.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
};

use crate::rng::Rng;

/// One row of a sample: its source, its index there, the tokens kept of it and
/// how many of those are trained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub source: u16,
    pub row: u32,
    pub len: u32,
    pub trained: u32,
}

impl Entry {
    /// Sequence positions the row takes: every token but the last is an input.
    pub fn positions(&self) -> usize {
        self.len as usize - 1
    }
}

/// Samples as lists of rows.
#[derive(Debug, Default)]
pub struct Samples {
    starts: Vec<usize>,
    entries: Vec<Entry>,
}

impl Samples {
    /// One row per sample.
    pub fn singles(entries: Vec<Entry>) -> Samples {
        Samples { starts: (0..=entries.len()).collect(), entries }
    }

    /// Rows packed into sequences of at most `capacity` positions, best fit
    /// decreasing: longest rows first, each into the fullest sequence it fits.
    pub fn packed(entries: Vec<Entry>, capacity: usize) -> Samples {
        let mut order: Vec<usize> = (0..entries.len()).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(entries[i].positions()), i));
        let mut bins: Vec<Vec<Entry>> = Vec::new();
        // (room left, bin): the first at or above a row's size is the best fit.
        let mut room: BTreeSet<(usize, usize)> = BTreeSet::new();
        for i in order {
            let need = entries[i].positions();
            let bin = match room.range((need, 0)..).next().copied() {
                Some((left, bin)) => {
                    room.remove(&(left, bin));
                    room.insert((left - need, bin));
                    bin
                }
                None => {
                    bins.push(Vec::new());
                    room.insert((capacity - need, bins.len() - 1));
                    bins.len() - 1
                }
            };
            bins[bin].push(entries[i]);
        }
        let mut samples = Samples { starts: vec![0], entries: Vec::with_capacity(entries.len()) };
        for bin in bins {
            samples.entries.extend(bin);
            samples.starts.push(samples.entries.len());
        }
        samples
    }

    pub fn len(&self) -> usize {
        self.starts.len() - 1
    }

    pub fn get(&self, sample: usize) -> &[Entry] {
        &self.entries[self.starts[sample]..self.starts[sample + 1]]
    }

    /// Positions a sample takes.
    pub fn positions(&self, sample: usize) -> usize {
        self.get(sample).iter().map(Entry::positions).sum()
    }
}

/// Which sample the n-th of the run's stream is: epoch `n / len` visits every
/// sample once in an order drawn from (seed, epoch). The last two epochs' orders
/// are kept (workers may straddle an epoch's end).
pub struct EpochOrder {
    seed: u64,
    len: usize,
    recent: Mutex<Vec<(u64, Arc<Vec<u32>>)>>,
}

impl EpochOrder {
    pub fn new(seed: u64, len: usize) -> EpochOrder {
        EpochOrder { seed, len, recent: Mutex::new(Vec::new()) }
    }

    pub fn sample(&self, n: u64) -> usize {
        let (epoch, at) = (n / self.len as u64, (n % self.len as u64) as usize);
        self.order(epoch)[at] as usize
    }

    fn order(&self, epoch: u64) -> Arc<Vec<u32>> {
        let mut recent = self.recent.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, order)) = recent.iter().find(|(e, _)| *e == epoch) {
            return order.clone();
        }
        let mut order: Vec<u32> = (0..self.len as u32).collect();
        Rng::keyed(self.seed, &[0xE70C, epoch]).shuffle(&mut order);
        let order = Arc::new(order);
        if recent.len() == 2 {
            recent.remove(0);
        }
        recent.push((epoch, order.clone()));
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(lens: &[u32]) -> Vec<Entry> {
        lens.iter().enumerate().map(|(i, &len)| Entry { source: 0, row: i as u32, len, trained: 1 }).collect()
    }

    #[test]
    fn best_fit_decreasing_fills_sequences_and_keeps_rows_whole() {
        // Positions 7, 5, 4, 3, 2, 1 into capacity 8: [7, 1], [5, 3], [4, 2].
        let samples = Samples::packed(rows(&[5, 8, 3, 6, 4, 2]), 8);
        let sizes: Vec<Vec<usize>> = (0..samples.len()).map(|s| samples.get(s).iter().map(Entry::positions).collect()).collect();
        assert_eq!(sizes, vec![vec![7, 1], vec![5, 3], vec![4, 2]]);
        let mut all: Vec<u32> = (0..samples.len()).flat_map(|s| samples.get(s).iter().map(|e| e.row)).collect();
        all.sort();
        assert_eq!(all, vec![0, 1, 2, 3, 4, 5]);
        assert!((0..samples.len()).all(|s| samples.positions(s) <= 8));
    }

    #[test]
    fn each_epoch_visits_every_sample_once_in_its_own_order() {
        let order = EpochOrder::new(7, 10);
        let first: Vec<usize> = (0..10).map(|n| order.sample(n)).collect();
        let second: Vec<usize> = (10..20).map(|n| order.sample(n)).collect();
        let mut sorted = first.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        assert_ne!(first, second);
        assert_eq!(first, (0..10).map(|n| EpochOrder::new(7, 10).sample(n)).collect::<Vec<_>>());
    }
}
