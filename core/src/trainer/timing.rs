//! Phase times. Host clocks only: on the CPU they are exact; on CUDA a step that
//! must report detailed metrics synchronises at each boundary (only then), and
//! every due step waits for the device before its timer ends ([`StepTimer::settle`]),
//! so the host reads that follow (loss, non-finite flags) find the GPU idle and
//! its time is booked to the steps that queued it.

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
    /// The CUDA device, if the run is on one.
    cuda: Option<usize>,
    /// Whether every boundary synchronises (detailed metrics).
    sync_device: Option<usize>,
    last: Instant,
    pub phases: PhaseTimes,
    pub hooks_s: f64,
}

impl StepTimer {
    /// Starts timing a step; `sync` makes boundaries wait for `device` (CUDA).
    pub fn start(device: Device, sync: bool) -> StepTimer {
        let cuda = match device {
            Device::Cuda(i) => Some(i),
            _ => None,
        };
        let sync_device = cuda.filter(|_| sync);
        let mut timer = StepTimer { cuda, sync_device, last: Instant::now(), phases: PhaseTimes::default(), hooks_s: 0.0 };
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

    /// Waits for the GPU to finish what the step queued and books the wait to
    /// `phase`. Called on due steps only: their host reads would wait anyway, and
    /// outside the timer that GPU time would count in no step (tokens/s too high,
    /// step times too low). A no-op on the CPU.
    pub fn settle(&mut self, phase: Phase) {
        if let Some(i) = self.cuda {
            tch::Cuda::synchronize(i as i64);
        }
        self.book(phase);
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
