//! Samples of instruction data: one row each, or rows packed into sequences by
//! best-fit decreasing (TRL's default `bfd`, which keeps every row whole). The
//! order an epoch visits them in is the text layer's (`text::order`).

use std::collections::BTreeSet;

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
}
