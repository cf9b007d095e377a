//! Phase times. Host clocks only: on the CPU they are exact; on CUDA a step that
//! must report detailed metrics synchronises at each boundary (only then).

use std::time::Instant;

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
