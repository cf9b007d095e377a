//! The slowdown detector: compares the per-step phase times of a rolling window
//! with those of the run's first window, and fires once when the step time has
//! grown past a threshold, naming the phase that grew most.
//!
//! It is fed the host's cumulative phase totals at the plugin's reports, so it
//! costs nothing between them; windows are spans between two reports at least
//! `window` steps apart.

use std::collections::VecDeque;

use ptrain_plugin_api::PhaseTimes;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Data,
    Forward,
    Backward,
    Optimizer,
}

impl Phase {
    pub const ALL: [Phase; 4] = [Phase::Data, Phase::Forward, Phase::Backward, Phase::Optimizer];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Data => "data",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
        }
    }

    pub fn of(self, p: &PhaseTimes) -> f64 {
        match self {
            Phase::Data => p.data_s,
            Phase::Forward => p.forward_s,
            Phase::Backward => p.backward_s,
            Phase::Optimizer => p.optimizer_s,
        }
    }
}

/// Mean phase times per step over steps `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    pub first: u64,
    pub last: u64,
    pub per_step: PhaseTimes,
}

/// Cumulative phase totals after `step`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Point {
    step: u64,
    totals: PhaseTimes,
}

fn span(from: &Point, to: &Point) -> Span {
    Span { first: from.step + 1, last: to.step, per_step: to.totals.per_step_since(&from.totals, to.step - from.step) }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Slowdown {
    pub baseline: Span,
    pub recent: Span,
    /// Relative growth of the step time: 0.35 is 35% slower.
    pub growth: f64,
    pub phase: Phase,
}

impl Slowdown {
    pub fn message(&self, threshold: f64) -> String {
        let (b, r) = (&self.baseline.per_step, &self.recent.per_step);
        format!(
            "step time grew {:.0}% (threshold {:.0}%): {:.4} s per step over steps {}-{}, {:.4} s over steps {}-{}; \
             the {} phase grew most ({:.4} -> {:.4} s per step)",
            self.growth * 100.0,
            threshold * 100.0,
            b.step_s,
            self.baseline.first,
            self.baseline.last,
            r.step_s,
            self.recent.first,
            self.recent.last,
            self.phase.name(),
            self.phase.of(b),
            self.phase.of(r),
        )
    }
}

pub struct Detector {
    threshold: f64,
    window: u64,
    anchor: Option<Point>,
    baseline: Option<Span>,
    /// Report points since the baseline, oldest first, trimmed to one window.
    points: VecDeque<Point>,
    latest: Option<Span>,
    fired: bool,
}

impl Detector {
    /// `threshold`: relative growth that fires (0.2 = 20%); `window`: steps per window.
    pub fn new(threshold: f64, window: u64) -> Detector {
        Detector { threshold, window: window.max(1), anchor: None, baseline: None, points: VecDeque::new(), latest: None, fired: false }
    }

    pub fn threshold(&self) -> f64 {
        self.threshold
    }

    pub fn baseline(&self) -> Option<&Span> {
        self.baseline.as_ref()
    }

    /// The most recent full rolling window.
    pub fn latest(&self) -> Option<&Span> {
        self.latest.as_ref()
    }

    /// The latest window's step time over the baseline's.
    pub fn ratio(&self) -> Option<f64> {
        let (b, l) = (self.baseline?, self.latest?);
        (b.per_step.step_s > 0.0).then(|| l.per_step.step_s / b.per_step.step_s)
    }

    pub fn fired(&self) -> bool {
        self.fired
    }

    /// Marks the warning as given (a resumed run that already warned).
    pub fn set_fired(&mut self, fired: bool) {
        self.fired = fired;
    }

    /// Feeds the cumulative phase totals after `step`; returns the slowdown the
    /// first time the rolling window is slower than the baseline by the threshold.
    /// The first point only anchors the baseline, so warm-up before it is excluded.
    pub fn observe(&mut self, step: u64, totals: PhaseTimes) -> Option<Slowdown> {
        let point = Point { step, totals };
        let Some(anchor) = self.anchor else {
            self.anchor = Some(point);
            return None;
        };
        let Some(baseline) = self.baseline else {
            if step >= anchor.step + self.window {
                self.baseline = Some(span(&anchor, &point));
                self.points = VecDeque::from([point]);
            }
            return None;
        };
        self.points.push_back(point);
        while self.points.len() > 1 && step >= self.points[1].step + self.window {
            self.points.pop_front();
        }
        let from = self.points[0];
        if step < from.step + self.window {
            return None;
        }
        let recent = span(&from, &point);
        self.latest = Some(recent);
        let (base, now) = (baseline.per_step.step_s, recent.per_step.step_s);
        if self.fired || base <= 0.0 || now <= base * (1.0 + self.threshold) {
            return None;
        }
        self.fired = true;
        let phase = Phase::ALL
            .into_iter()
            .max_by(|a, b| (a.of(&recent.per_step) - a.of(&baseline.per_step)).total_cmp(&(b.of(&recent.per_step) - b.of(&baseline.per_step))))
            .expect("four phases");
        Some(Slowdown { baseline, recent, growth: now / base - 1.0, phase })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per-step phase times: data, forward, backward, optimizer.
    fn times(d: f64, f: f64, b: f64, o: f64) -> PhaseTimes {
        PhaseTimes { data_s: d, forward_s: f, backward_s: b, optimizer_s: o, step_s: d + f + b + o }
    }

    /// Runs steps 1..=`steps` with `at(step)` per-step times, reporting every
    /// `every` steps as the host's cumulative totals; returns every slowdown.
    fn drive(detector: &mut Detector, steps: u64, every: u64, at: impl Fn(u64) -> PhaseTimes) -> Vec<(u64, Slowdown)> {
        let mut totals = PhaseTimes::default();
        let mut fired = Vec::new();
        for step in 1..=steps {
            let t = at(step);
            totals = PhaseTimes {
                data_s: totals.data_s + t.data_s,
                forward_s: totals.forward_s + t.forward_s,
                backward_s: totals.backward_s + t.backward_s,
                optimizer_s: totals.optimizer_s + t.optimizer_s,
                step_s: totals.step_s + t.step_s,
            };
            if step == 1 || step % every == 0 {
                if let Some(s) = detector.observe(step, totals) {
                    fired.push((step, s));
                }
            }
        }
        fired
    }

    const STEADY: (f64, f64, f64, f64) = (0.01, 0.03, 0.05, 0.01);

    fn steady() -> PhaseTimes {
        times(STEADY.0, STEADY.1, STEADY.2, STEADY.3)
    }

    #[test]
    fn a_data_stall_fires_once_and_names_the_data_phase() {
        let mut d = Detector::new(0.2, 100);
        let slow = |s: u64| if s > 400 { times(0.06, STEADY.1, STEADY.2, STEADY.3) } else { steady() };
        let fired = drive(&mut d, 1000, 50, slow);
        assert_eq!(fired.len(), 1, "{fired:?}");
        let (step, s) = &fired[0];
        assert_eq!(s.phase, Phase::Data);
        assert!(*step > 400 && *step <= 500, "fires within a window of the stall: {step}");
        assert_eq!((s.baseline.first, s.baseline.last), (2, 150), "the first report span of a full window after the warm-up step");
        assert!((s.baseline.per_step.step_s - 0.1).abs() < 1e-9);
        assert!(s.growth > 0.2);
        let message = s.message(d.threshold());
        assert!(message.contains("data phase") && message.contains("20%"), "{message}");
        assert!((d.ratio().unwrap() - 1.5).abs() < 1e-9, "the latest window is all slow steps");
    }

    #[test]
    fn the_phase_that_grew_is_named_not_the_largest_one() {
        let mut d = Detector::new(0.2, 100);
        let slow = |s: u64| if s > 300 { times(STEADY.0, STEADY.1, 0.06, 0.04) } else { steady() };
        let fired = drive(&mut d, 600, 20, slow);
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].1.phase, Phase::Optimizer, "optimizer grew by 0.03 s, backward by 0.01 s");
    }

    #[test]
    fn growth_under_the_threshold_does_not_fire() {
        let slower = |s: u64| if s > 300 { times(STEADY.0, STEADY.1, STEADY.2 + 0.015, STEADY.3) } else { steady() };
        assert!(drive(&mut Detector::new(0.2, 100), 1000, 50, slower).is_empty(), "15% < 20%");
        let fired = drive(&mut Detector::new(0.1, 100), 1000, 50, slower);
        assert_eq!(fired.len(), 1, "15% > 10%");
        assert_eq!(fired[0].1.phase, Phase::Backward);
    }

    #[test]
    fn a_slow_start_is_the_baseline_and_a_warmed_up_run_never_fires() {
        let mut d = Detector::new(0.2, 50);
        let warming = |s: u64| if s == 1 { times(5.0, 1.0, 1.0, 1.0) } else { steady() };
        assert!(drive(&mut d, 500, 10, warming).is_empty());
        assert!((d.baseline().unwrap().per_step.step_s - 0.1).abs() < 1e-9, "step 1 is left out");
    }

    #[test]
    fn nothing_fires_before_the_baseline_window_is_complete() {
        let mut d = Detector::new(0.2, 100);
        let slow = |s: u64| if s > 50 { times(1.0, 0.0, 0.0, 0.0) } else { steady() };
        let fired = drive(&mut d, 150, 10, slow);
        assert!(fired.is_empty(), "steps 2-101 are the baseline, slow or not: {fired:?}");
        assert!(d.ratio().is_none(), "no full window after the baseline yet");
    }

    #[test]
    fn a_warning_given_before_a_resume_is_not_repeated() {
        let mut d = Detector::new(0.2, 100);
        d.set_fired(true);
        let slow = |s: u64| if s > 200 { times(1.0, 0.0, 0.0, 0.0) } else { steady() };
        assert!(drive(&mut d, 600, 50, slow).is_empty());
    }
}
