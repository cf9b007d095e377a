//! Phase times. Host clocks only: on the CPU they are exact; on CUDA a step that
//! must report detailed metrics synchronises at each boundary (only then).

use std::time::Instant;

use ptrain_plugin_api::PhaseTimes;
use tch::Device;

pub struct PhaseClock {
    sync_device: Option<usize>,
    last: Instant,
}

impl PhaseClock {
    /// Starts timing a step; `sync` makes boundaries wait for `device` (CUDA).
    pub fn start(device: Device, sync: bool) -> PhaseClock {
        let sync_device = match device {
            Device::Cuda(i) if sync => Some(i),
            _ => None,
        };
        let mut clock = PhaseClock { sync_device, last: Instant::now() };
        clock.lap();
        clock
    }

    /// Seconds since the previous lap.
    #[inline]
    pub fn lap(&mut self) -> f64 {
        if let Some(i) = self.sync_device {
            tch::Cuda::synchronize(i as i64);
        }
        let now = Instant::now();
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        elapsed
    }
}

pub fn add(total: &mut PhaseTimes, step: &PhaseTimes) {
    total.data_s += step.data_s;
    total.forward_s += step.forward_s;
    total.backward_s += step.backward_s;
    total.optimizer_s += step.optimizer_s;
    total.step_s += step.step_s;
}

pub fn diff(now: &PhaseTimes, before: &PhaseTimes, steps: u64) -> PhaseTimes {
    let n = steps.max(1) as f64;
    PhaseTimes {
        data_s: (now.data_s - before.data_s) / n,
        forward_s: (now.forward_s - before.forward_s) / n,
        backward_s: (now.backward_s - before.backward_s) / n,
        optimizer_s: (now.optimizer_s - before.optimizer_s) / n,
        step_s: (now.step_s - before.step_s) / n,
    }
}
