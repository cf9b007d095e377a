//! Phase times. Host clocks only: on the CPU they are exact; on CUDA a step that
//! must report detailed metrics synchronises at each boundary (only then).

use std::time::Instant;

use ptrain_plugin_api::PhaseTimes;
use tch::Device;

/// A phase of a training step, or the time spent in inline plugins' step hooks,
/// which is kept apart so it never inflates a phase.
#[derive(Clone, Copy)]
pub enum Phase {
    Data,
    Forward,
    Backward,
    Optimizer,
    Hooks,
}

/// Times one step, phase by phase.
pub struct StepTimer {
    sync_device: Option<usize>,
    last: Instant,
    pub phases: PhaseTimes,
    pub hooks_s: f64,
}

impl StepTimer {
    /// Starts timing a step; `sync` makes boundaries wait for `device` (CUDA).
    pub fn start(device: Device, sync: bool) -> StepTimer {
        let sync_device = match device {
            Device::Cuda(i) if sync => Some(i),
            _ => None,
        };
        let mut timer = StepTimer { sync_device, last: Instant::now(), phases: PhaseTimes::default(), hooks_s: 0.0 };
        timer.lap();
        timer
    }

    /// Books the time since the previous lap to `phase`.
    #[inline]
    pub fn book(&mut self, phase: Phase) {
        let secs = self.lap();
        let p = &mut self.phases;
        *match phase {
            Phase::Data => &mut p.data_s,
            Phase::Forward => &mut p.forward_s,
            Phase::Backward => &mut p.backward_s,
            Phase::Optimizer => &mut p.optimizer_s,
            Phase::Hooks => &mut self.hooks_s,
        } += secs;
    }

    /// The step's phase times, with the whole step (hooks included) in `step_s`.
    pub fn finish(mut self) -> (PhaseTimes, f64) {
        let p = &mut self.phases;
        p.step_s = p.data_s + p.forward_s + p.backward_s + p.optimizer_s + self.hooks_s;
        (self.phases, self.hooks_s)
    }

    #[inline]
    fn lap(&mut self) -> f64 {
        if let Some(i) = self.sync_device {
            tch::Cuda::synchronize(i as i64);
        }
        let now = Instant::now();
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        elapsed
    }
}
