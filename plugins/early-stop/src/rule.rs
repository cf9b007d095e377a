//! The stopping rule, as Lightning's `EarlyStopping` evaluates it at each check:
//! non-finite, then the stopping threshold, then the divergence threshold, then
//! improvement by more than `min_delta` (which resets the patience counter) or
//! one more check without it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Min,
    Max,
}

impl Mode {
    /// Whether `a` is better than `b`.
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            Mode::Min => a < b,
            Mode::Max => a > b,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub patience: u64,
    pub min_delta: f64,
    pub mode: Mode,
    pub stopping_threshold: Option<f64>,
    pub divergence_threshold: Option<f64>,
    pub check_finite: bool,
}

/// What survives in checkpoints.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// The best value so far and the step it was seen at.
    pub best: Option<(u64, f64)>,
    /// Checks since the last improvement.
    pub wait: u64,
    pub checks: u64,
}

impl Rule {
    /// Takes the check of `value` at `step`; a reason to stop, if it is one.
    pub fn check(&self, progress: &mut Progress, step: u64, value: f64, monitor: &str) -> Option<String> {
        progress.checks += 1;
        if self.check_finite && !value.is_finite() {
            return Some(format!("{monitor} = {value} is not finite at step {step}"));
        }
        let word = if self.mode == Mode::Min { "below" } else { "above" };
        if let Some(t) = self.stopping_threshold {
            if self.mode.better(value, t) {
                return Some(format!("{monitor} = {value:.6} reached the stopping threshold ({word} {t}) at step {step}"));
            }
        }
        if let Some(t) = self.divergence_threshold {
            if self.mode.better(t, value) {
                let worse = if self.mode == Mode::Min { "above" } else { "below" };
                return Some(format!("{monitor} = {value:.6} diverged ({worse} the divergence threshold {t}) at step {step}"));
            }
        }
        let target = progress.best.map(|(_, best)| if self.mode == Mode::Min { best - self.min_delta } else { best + self.min_delta });
        if target.is_none_or(|t| self.mode.better(value, t)) {
            progress.best = Some((step, value));
            progress.wait = 0;
            return None;
        }
        progress.wait += 1;
        if progress.wait >= self.patience {
            let (best_step, best) = progress.best.expect("a best value once there is a target");
            return Some(format!(
                "{monitor} did not improve by more than {} for {} check(s) (best {best:.6} at step {best_step}, now {value:.6} at step {step})",
                self.min_delta, progress.wait
            ));
        }
        None
    }
}
