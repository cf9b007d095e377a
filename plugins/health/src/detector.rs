//! The gradient spike detector: a robust z-score of the total gradient norm
//! against the median and the median absolute deviation (MAD) of the last
//! `window` checks. Robust statistics keep one earlier spike from hiding the next.

use std::collections::VecDeque;

/// MAD times this estimates the standard deviation of normally distributed values.
const MAD_TO_SD: f64 = 1.4826;
/// The spread is floored at this fraction of the median, so a steady history does
/// not turn small wobbles into anomalies.
const MIN_RELATIVE_SPREAD: f64 = 0.1;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// `None` while the history is shorter than `min_checks`.
    pub zscore: Option<f64>,
    pub median: f64,
    /// Checks the value was judged against.
    pub baseline: usize,
    pub anomaly: bool,
}

pub struct SpikeDetector {
    window: usize,
    threshold: f64,
    min_checks: usize,
    history: VecDeque<f64>,
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

impl SpikeDetector {
    pub fn new(window: usize, threshold: f64, min_checks: usize) -> SpikeDetector {
        SpikeDetector { window, threshold, min_checks, history: VecDeque::with_capacity(window + 1) }
    }

    /// Judges `value` against the history, then adds it (a finite value only). A
    /// non-finite value is always an anomaly.
    pub fn check(&mut self, value: f64) -> Verdict {
        let mut sorted: Vec<f64> = self.history.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        let med = if sorted.is_empty() { f64::NAN } else { median(&sorted) };
        let baseline = sorted.len();
        let verdict = if !value.is_finite() {
            Verdict { zscore: Some(f64::INFINITY), median: med, baseline, anomaly: true }
        } else if sorted.len() < self.min_checks {
            Verdict { zscore: None, median: med, baseline, anomaly: false }
        } else {
            let mut deviations: Vec<f64> = sorted.iter().map(|v| (v - med).abs()).collect();
            deviations.sort_by(f64::total_cmp);
            let spread = (MAD_TO_SD * median(&deviations)).max(MIN_RELATIVE_SPREAD * med.abs()).max(f64::MIN_POSITIVE);
            let z = (value - med) / spread;
            Verdict { zscore: Some(z), median: med, baseline, anomaly: z > self.threshold }
        };
        if value.is_finite() {
            self.history.push_back(value);
            while self.history.len() > self.window {
                self.history.pop_front();
            }
        }
        verdict
    }

    pub fn history(&self) -> Vec<f64> {
        self.history.iter().copied().collect()
    }

    /// Restores a saved history (the newest `window` values of it).
    pub fn restore(&mut self, history: &[f64]) {
        self.history = history.iter().copied().filter(|v| v.is_finite()).collect();
        while self.history.len() > self.window {
            self.history.pop_front();
        }
    }
}
