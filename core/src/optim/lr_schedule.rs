//! Linear warmup, then cosine decay to `min_lr` (or constant).

use crate::config::{LrScheduleKind, OptimConfig};

#[derive(Debug, Clone)]
pub struct LrSchedule {
    peak: f64,
    min: f64,
    warmup: u64,
    total: u64,
    cosine: bool,
}

impl LrSchedule {
    pub fn new(config: &OptimConfig, total_steps: u64) -> LrSchedule {
        LrSchedule {
            peak: config.lr,
            min: config.min_lr,
            warmup: config.warmup_steps,
            total: total_steps,
            cosine: config.schedule == LrScheduleKind::Cosine,
        }
    }

    /// The learning rate of optimizer step `step` (from 1).
    pub fn lr(&self, step: u64) -> f64 {
        if step <= self.warmup {
            return self.peak * step as f64 / (self.warmup + 1) as f64;
        }
        if !self.cosine || self.total <= self.warmup {
            return self.peak;
        }
        let progress = ((step - self.warmup) as f64 / (self.total - self.warmup) as f64).min(1.0);
        self.min + 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()) * (self.peak - self.min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_linearly_then_decays_to_min() {
        let mut c = crate::config::Config::default().optim;
        (c.lr, c.min_lr, c.warmup_steps) = (1.0, 0.1, 9);
        let s = LrSchedule::new(&c, 109);
        assert!((s.lr(1) - 0.1).abs() < 1e-12);
        assert!((s.lr(9) - 0.9).abs() < 1e-12);
        assert!((s.lr(10) - 1.0).abs() < 1e-3);
        assert!((s.lr(59) - 0.55).abs() < 1e-9);
        assert!((s.lr(109) - 0.1).abs() < 1e-12);
        assert!(s.lr(60) > s.lr(61));
    }
}
