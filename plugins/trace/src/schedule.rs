//! The trace schedule, as `torch.profiler.schedule` lays it out: each cycle of
//! `every` steps waits `wait` steps, warms the profiler up for `warmup` steps and
//! records `active` steps; `repeat` cycles (0: until the run ends). Cycles start at
//! step 1; `every = 0` makes a cycle exactly `wait + warmup + active` steps long,
//! as in PyTorch.

use ptrain_plugin_api::{PluginError, PluginResult, StepWindows};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    pub wait: u64,
    pub warmup: u64,
    pub active: u64,
    pub every: u64,
    pub repeat: u64,
}

impl Default for Schedule {
    /// A 3-step recording at steps 10-12, then every 1000 steps.
    fn default() -> Self {
        Schedule { wait: 8, warmup: 1, active: 3, every: 1000, repeat: 0 }
    }
}

/// Where a step falls in a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Warmup,
    /// Recording; `last` is the window's last step.
    Active {
        last: bool,
    },
}

impl Schedule {
    pub fn check(self) -> PluginResult<Schedule> {
        let bad = |what: String| Err(PluginError::msg(format!("invalid options: {what}")));
        if self.active == 0 {
            return bad("plugins.trace.active: must be at least 1".into());
        }
        let cycle = self.wait + self.warmup + self.active;
        if self.every != 0 && self.every < cycle {
            return bad(format!("plugins.trace.every: {} must be at least wait + warmup + active ({cycle}), or 0 for exactly that", self.every));
        }
        Ok(self)
    }

    /// The steps the host calls the plugin on.
    pub fn windows(&self) -> StepWindows {
        let every = if self.every == 0 { self.wait + self.warmup + self.active } else { self.every };
        StepWindows { first: self.wait + 1, length: self.warmup + self.active, every, repeat: self.repeat }
    }

    pub fn phase(&self, step: u64) -> Option<Phase> {
        let (_, offset) = self.windows().position(step)?;
        Some(if offset < self.warmup { Phase::Warmup } else { Phase::Active { last: offset + 1 == self.warmup + self.active } })
    }
}
