//! The learning rate of each optimizer step: a linear warmup, then cosine or linear
//! decay to the floor (`OptimConfig::floor`), or constant.
//!
//! Two conventions, each the one its users compare against:
//! - `cosine` and `constant` are nanoGPT's: warmup step `k` (from 1) has `lr * k /
//!   (warmup + 1)`, so no step trains at 0, and the cosine reaches the floor at the
//!   last step.
//! - `linear` is transformers' `get_linear_schedule_with_warmup` under `Trainer`:
//!   step `k` has the rate its `LambdaLR` holds after `k - 1` scheduler steps, so the
//!   first warmup step trains at 0 and the last step at `lr / (total - warmup)`,
//!   computed with the same operations (equal to the last bit; `tests/lr_schedule.rs`).

use crate::config::{LrScheduleKind, OptimConfig};

#[derive(Debug, Clone)]
pub struct LrSchedule {
    peak: f64,
    min: f64,
    /// `min / peak`: the linear schedule's floor, as transformers' `min_lr_rate`.
    min_ratio: f64,
    warmup: u64,
    total: u64,
    kind: LrScheduleKind,
}

impl LrSchedule {
    pub fn new(config: &OptimConfig, total_steps: u64) -> LrSchedule {
        let min = config.floor();
        LrSchedule {
            peak: config.lr,
            min,
            min_ratio: config.min_lr.map_or(config.min_lr_ratio, |m| m / config.lr),
            warmup: config.warmup(total_steps),
            total: total_steps,
            kind: config.schedule,
        }
    }

    /// The learning rate of optimizer step `step` (from 1).
    pub fn lr(&self, step: u64) -> f64 {
        if self.kind == LrScheduleKind::Linear {
            return self.peak * self.linear_factor(step.saturating_sub(1));
        }
        if step <= self.warmup {
            return self.peak * step as f64 / (self.warmup + 1) as f64;
        }
        if self.kind == LrScheduleKind::Constant || self.total <= self.warmup {
            return self.peak;
        }
        let progress = ((step - self.warmup) as f64 / (self.total - self.warmup) as f64).min(1.0);
        self.min + 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()) * (self.peak - self.min)
    }

    /// transformers' `_get_linear_schedule_with_warmup_lr_lambda(current)`, with a
    /// floor applied as its `*_with_min_lr` schedules apply `min_lr_rate`.
    fn linear_factor(&self, current: u64) -> f64 {
        if current < self.warmup {
            return current as f64 / self.warmup.max(1) as f64;
        }
        let factor = (self.total.saturating_sub(current) as f64 / self.total.saturating_sub(self.warmup).max(1) as f64).max(0.0);
        match self.min_ratio > 0.0 {
            true => factor * (1.0 - self.min_ratio) + self.min_ratio,
            false => factor,
        }
    }

    /// One line for the run's log: the schedule as resolved.
    pub fn describe(&self) -> String {
        let rate = |x: f64| if x == 0.0 { "0".to_string() } else { format!("{x:e}") };
        let kind = format!("{:?}", self.kind).to_lowercase();
        let to = match self.kind {
            LrScheduleKind::Constant => String::new(),
            _ => format!(" -> {}", rate(self.min)),
        };
        format!("lr {kind}: warmup {} of {} steps, peak {}{to}", self.warmup, self.total, rate(self.peak))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_linearly_then_decays_to_min() {
        let mut c = crate::config::Config::default().optim;
        (c.lr, c.min_lr, c.warmup_steps) = (1.0, Some(0.1), 9);
        let s = LrSchedule::new(&c, 109);
        assert!((s.lr(1) - 0.1).abs() < 1e-12);
        assert!((s.lr(9) - 0.9).abs() < 1e-12);
        assert!((s.lr(10) - 1.0).abs() < 1e-3);
        assert!((s.lr(59) - 0.55).abs() < 1e-9);
        assert!((s.lr(109) - 0.1).abs() < 1e-12);
        assert!(s.lr(60) > s.lr(61));
    }

    #[test]
    fn the_floor_is_a_ratio_of_the_peak_unless_min_lr_is_set() {
        let mut c = crate::config::Config::default().optim;
        (c.lr, c.min_lr, c.min_lr_ratio, c.warmup_steps) = (2e-5, None, 0.1, 0);
        assert_eq!(LrSchedule::new(&c, 10).lr(10), 0.1 * 2e-5);
        c.min_lr = Some(1e-7);
        assert_eq!(LrSchedule::new(&c, 10).lr(10), 1e-7);
    }

    #[test]
    fn linear_decays_to_the_floor_after_a_ratio_of_warmup() {
        let mut c = crate::config::Config::default().optim;
        (c.lr, c.min_lr, c.min_lr_ratio, c.warmup_ratio, c.schedule) = (1.0, None, 0.5, 0.1, LrScheduleKind::Linear);
        let s = LrSchedule::new(&c, 20);
        // warmup ceil(0.1 * 20) = 2: steps 1, 2 at 0, 1/2; step 3 at the peak.
        assert_eq!([s.lr(1), s.lr(2), s.lr(3)], [0.0, 0.5, 1.0]);
        // After the last step (21, scheduler step 20) the factor is 0: the floor.
        assert_eq!(s.lr(21), 0.5);
        assert!(s.lr(4) > s.lr(5) && s.lr(20) > 0.5);
    }
}
