//! Which checkpoints to keep: a pure strategy that returns actions and does no I/O.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Min,
    Max,
}

/// A committed checkpoint and its score (the monitored metric at its step, if any).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub step: u64,
    pub score: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Delete(u64),
}

#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub keep_last: usize,
    pub keep_best: usize,
    pub mode: Mode,
}

impl Retention {
    /// The best `keep_best` entries with a finite score, best first.
    pub fn best(&self, entries: &[Entry]) -> Vec<Entry> {
        let mut scored: Vec<Entry> = entries.iter().copied().filter(|e| e.score.is_some_and(f64::is_finite)).collect();
        scored.sort_by(|a, b| {
            let (x, y) = (a.score.unwrap(), b.score.unwrap());
            let order = match self.mode {
                Mode::Min => x.total_cmp(&y),
                Mode::Max => y.total_cmp(&x),
            };
            // On ties the newer checkpoint wins.
            order.then(b.step.cmp(&a.step))
        });
        scored.truncate(self.keep_best);
        scored
    }

    /// Deletions after `latest` was committed: everything that is not the latest,
    /// one of the `keep_last` newest, or one of the `keep_best` best.
    pub fn plan(&self, entries: &[Entry], latest: u64) -> Vec<Action> {
        let mut by_step: Vec<u64> = entries.iter().map(|e| e.step).collect();
        by_step.sort_unstable_by(|a, b| b.cmp(a));
        let newest: Vec<u64> = by_step.iter().copied().take(self.keep_last).collect();
        let best: Vec<u64> = self.best(entries).iter().map(|e| e.step).collect();
        let mut deletions: Vec<Action> =
            by_step.into_iter().filter(|s| *s != latest && !newest.contains(s) && !best.contains(s)).map(Action::Delete).collect();
        deletions.sort_unstable_by_key(|Action::Delete(s)| *s);
        deletions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(scores: &[(u64, Option<f64>)]) -> Vec<Entry> {
        scores.iter().map(|&(step, score)| Entry { step, score }).collect()
    }

    #[test]
    fn keeps_the_newest_and_the_best_and_deletes_the_rest() {
        let r = Retention { keep_last: 2, keep_best: 1, mode: Mode::Min };
        let e = entries(&[(10, Some(3.0)), (20, Some(1.0)), (30, None), (40, Some(2.0)), (50, None)]);
        assert_eq!(r.plan(&e, 50), vec![Action::Delete(10), Action::Delete(30)]);
    }

    #[test]
    fn never_deletes_the_latest_even_with_nothing_kept() {
        let r = Retention { keep_last: 0, keep_best: 0, mode: Mode::Min };
        let e = entries(&[(1, None), (2, None), (3, None)]);
        assert_eq!(r.plan(&e, 3), vec![Action::Delete(1), Action::Delete(2)]);
    }

    #[test]
    fn max_mode_and_non_finite_scores() {
        let r = Retention { keep_last: 1, keep_best: 1, mode: Mode::Max };
        let e = entries(&[(1, Some(0.5)), (2, Some(f64::NAN)), (3, Some(0.9)), (4, Some(0.1))]);
        assert_eq!(r.best(&e)[0].step, 3);
        assert_eq!(r.plan(&e, 4), vec![Action::Delete(1), Action::Delete(2)]);
    }
}
