//! The run's own schedule: the scheduler with every slot (the plugins'
//! attachments and the core's work), the gate the loop checks, the ticker that
//! lowers it for time cadences, and what happens to the slots of a plugin that
//! leaves. The run plans its steps here; the plugin host only delivers events to
//! the plugins a plan says are due ([`Due`]).

use std::{sync::Arc, time::Duration};

use super::{Due, Gate, Scheduler, SlotSpec, StepPlan, Ticker};

pub struct RunSchedule {
    scheduler: Scheduler,
    /// Shared with the host's services (stop and detach requests) and the
    /// signal handlers, which lower it.
    gate: Arc<Gate>,
    /// Distributed runs keep a plugin's slots when it leaves (its calls are
    /// skipped): every rank must plan the same steps, since emitting metrics and
    /// plugin collectives are collective operations.
    keep_leavers: bool,
    /// Stops with the run.
    _ticker: Option<Ticker>,
}

impl RunSchedule {
    /// The schedule of steps `first_step..=last_step` (see [`Scheduler::new`]),
    /// with the gate set to its first due step. `distributed`: time cadences are
    /// switched off (clocks differ between ranks, and what is due must be the same
    /// on all of them) and plugins that leave keep their slots.
    pub fn new(mut slots: Vec<SlotSpec>, first_step: u64, last_step: u64, eval_every: u64, gate: Arc<Gate>, distributed: bool) -> RunSchedule {
        if distributed {
            for slot in slots.iter_mut().filter(|s| s.cadence.every_secs > 0.0) {
                tracing::warn!("time-based cadences (every_secs) are ignored in distributed runs; use every = N steps");
                slot.cadence.every_secs = 0.0;
            }
        }
        let scheduler = Scheduler::new(slots, first_step, last_step, eval_every);
        gate.set(scheduler.next_due());
        let ticker = scheduler.min_period_secs().map(|secs| Ticker::start(gate.clone(), Duration::from_secs_f64((secs / 4.0).clamp(0.05, 1.0))));
        RunSchedule { scheduler, gate, keep_leavers: distributed, _ticker: ticker }
    }

    /// The hot-path check: whether anything may be due at `step`.
    #[inline(always)]
    pub fn is_due(&self, step: u64) -> bool {
        self.gate.is_due(step)
    }

    /// What is due at `step` (call only when [`RunSchedule::is_due`] says so).
    /// Opens the gate first, so requests from other threads from now on keep it
    /// lowered for the next step (the loop looks at stop requests after this).
    /// Then the plugins `leaving` names (called after the gate opened: the host's
    /// failed plugins and detach requests) leave the schedule, then it plans.
    pub fn plan(&mut self, step: u64, leaving: impl FnOnce() -> Vec<usize>) -> StepPlan {
        self.gate.open();
        let left = leaving();
        if !self.keep_leavers {
            for plugin in left {
                self.scheduler.disable_plugin(plugin, &self.gate);
            }
        }
        self.scheduler.plan(step, &self.gate)
    }

    /// Who is due at the planned step, for the plugin host.
    pub fn due(&self) -> Due<'_> {
        self.scheduler.due_now()
    }
}

#[cfg(test)]
mod tests;
