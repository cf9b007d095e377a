//! Which slots are due at a step, and when the next one is.

use std::time::Instant;

use super::{Cadence, Gate, Hook, Needs, StepWindows};

/// The core's own periodic work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoreTask {
    Progress,
    Eval,
    NonFiniteCheck,
    EmptyCache,
}

impl CoreTask {
    pub const fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Core(CoreTask),
    /// Index of a plugin instance.
    Plugin(usize),
}

#[derive(Debug, Clone, Copy)]
pub struct SlotSpec {
    pub owner: Owner,
    pub hook: Hook,
    pub cadence: Cadence,
    pub needs: Needs,
    /// Windows of steps on which the slot is also due (a plugin's
    /// [`StepWindows`]), `StepWindows::NONE` for most.
    pub windows: StepWindows,
}

#[derive(Debug)]
struct Slot {
    spec: SlotSpec,
    next_step: u64,
    last_fired: Instant,
    enabled: bool,
}

/// What is due at one step: hook and core-task bit masks, and the union of what
/// the due attachments need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepPlan {
    pub hooks: u32,
    pub core: u32,
    pub needs: Needs,
}

impl StepPlan {
    pub const NONE: StepPlan = StepPlan { hooks: 0, core: 0, needs: Needs::NONE };

    #[inline(always)]
    pub fn has(&self, hook: Hook) -> bool {
        self.hooks & hook.bit() != 0
    }

    #[inline(always)]
    pub fn core(&self, task: CoreTask) -> bool {
        self.core & task.bit() != 0
    }

    pub fn is_empty(&self) -> bool {
        self.hooks == 0 && self.core == 0
    }
}

/// Who is due at the planned step, read-only: what the run hands the plugin host
/// with a scheduled event ([`crate::host::Reach::Due`]), so the host addresses the
/// plugins due now without owning the schedule.
#[derive(Clone, Copy)]
pub struct Due<'a>(&'a Scheduler);

impl Due<'_> {
    /// What plugin `index`'s attachments to `hook` due now asked for together, or
    /// `None` if none of them is due.
    pub fn needs(&self, index: usize, hook: Hook) -> Option<Needs> {
        self.0.due_needs(Owner::Plugin(index), hook)
    }

    /// Whether an attachment to `hook` due now asked for any of `needs`.
    pub fn wants(&self, hook: Hook, needs: Needs) -> bool {
        self.0.due().any(|(_, s)| s.hook == hook && s.needs.intersects(needs))
    }
}

pub struct Scheduler {
    slots: Vec<Slot>,
    due: Vec<usize>,
    first_step: u64,
    last_step: u64,
    eval_every: u64,
}

fn next_multiple(after: u64, n: u64) -> u64 {
    (after / n + 1) * n
}

impl Scheduler {
    /// Slots for a run of steps `first_step..=last_step`; evaluation runs every
    /// `eval_every` steps (0: only at the end) and always at the last step.
    pub fn new(specs: Vec<SlotSpec>, first_step: u64, last_step: u64, eval_every: u64) -> Scheduler {
        let now = Instant::now();
        let slots = specs
            .into_iter()
            .filter(|s| !s.cadence.is_never() || !s.windows.is_none())
            .map(|spec| Slot { spec, next_step: u64::MAX, last_fired: now, enabled: true })
            .collect::<Vec<_>>();
        let mut scheduler = Scheduler { due: Vec::with_capacity(slots.len()), slots, first_step, last_step, eval_every };
        for i in 0..scheduler.slots.len() {
            scheduler.slots[i].next_step = scheduler.next_step_of(i, first_step - 1);
        }
        scheduler
    }

    /// The shortest time cadence, for the [`super::Ticker`].
    pub fn min_period_secs(&self) -> Option<f64> {
        self.slots.iter().map(|s| s.spec.cadence.every_secs).filter(|&t| t > 0.0).min_by(f64::total_cmp)
    }

    /// The step the gate should hold: the earliest step-based due step.
    pub fn next_due(&self) -> u64 {
        self.slots.iter().filter(|s| s.enabled).map(|s| s.next_step).min().unwrap_or(u64::MAX)
    }

    fn next_eval_after(&self, step: u64) -> u64 {
        let periodic = if self.eval_every > 0 { next_multiple(step, self.eval_every) } else { u64::MAX };
        if step < self.last_step {
            periodic.min(self.last_step)
        } else {
            periodic
        }
    }

    fn next_checkpoint_after(&self, step: u64) -> u64 {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].enabled && self.slots[i].spec.hook == Hook::Checkpoint)
            .map(|i| self.own_next_step(i, step))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Next step-based due step of slot `i` after `step`, ignoring `at_checkpoint`.
    fn own_next_step(&self, i: usize, step: u64) -> u64 {
        let c = &self.slots[i].spec.cadence;
        let mut next = u64::MAX;
        if c.every_steps > 0 {
            next = next.min(next_multiple(step, c.every_steps));
        }
        if c.first_step && step < self.first_step {
            next = next.min(self.first_step);
        }
        if c.at_end && step < self.last_step {
            next = next.min(self.last_step);
        }
        if c.at_eval {
            next = next.min(self.next_eval_after(step));
        }
        if let Some(in_window) = self.slots[i].spec.windows.next_after(step) {
            next = next.min(in_window);
        }
        next
    }

    fn next_step_of(&self, i: usize, step: u64) -> u64 {
        let own = self.own_next_step(i, step);
        if self.slots[i].spec.cadence.at_checkpoint && self.slots[i].spec.hook != Hook::Checkpoint {
            own.min(self.next_checkpoint_after(step))
        } else {
            own
        }
    }

    /// Decides what is due at `step` (call when the gate says so), advances every
    /// due slot, and returns the new gate value with the plan.
    pub fn plan(&mut self, step: u64, gate: &Gate) -> StepPlan {
        self.plan_at(step, gate, Instant::now())
    }

    /// [`Scheduler::plan`] at time `now` (tests pass the times they mean).
    fn plan_at(&mut self, step: u64, gate: &Gate, now: Instant) -> StepPlan {
        self.due.clear();
        let mut plan = StepPlan::NONE;
        for i in 0..self.slots.len() {
            let slot = &self.slots[i];
            if !slot.enabled {
                continue;
            }
            let by_time = slot.spec.cadence.every_secs > 0.0 && now.duration_since(slot.last_fired).as_secs_f64() >= slot.spec.cadence.every_secs;
            if slot.next_step <= step || by_time {
                self.due.push(i);
            }
        }
        for &i in &self.due {
            let spec = self.slots[i].spec;
            match spec.owner {
                Owner::Core(task) => plan.core |= task.bit(),
                Owner::Plugin(_) => {
                    plan.hooks |= spec.hook.bit();
                    plan.needs = plan.needs | spec.needs;
                }
            }
        }
        for k in 0..self.due.len() {
            let i = self.due[k];
            self.slots[i].last_fired = now;
        }
        for i in 0..self.slots.len() {
            if self.slots[i].next_step <= step {
                self.slots[i].next_step = self.next_step_of(i, step);
            }
        }
        gate.set(self.next_due());
        plan
    }

    /// Indices of the slots due at the last planned step.
    pub fn due(&self) -> impl Iterator<Item = (usize, &SlotSpec)> + '_ {
        self.due.iter().map(|&i| (i, &self.slots[i].spec))
    }

    /// What `owner`'s attachments to `hook` due at the last planned step asked
    /// for together, or `None` if none of them is due.
    pub fn due_needs(&self, owner: Owner, hook: Hook) -> Option<Needs> {
        self.due().filter(|(_, s)| s.owner == owner && s.hook == hook).map(|(_, s)| s.needs).reduce(|a, b| a | b)
    }

    /// The slots due at the last planned step, as the plugin host reads them.
    pub fn due_now(&self) -> Due<'_> {
        Due(self)
    }

    /// Stops scheduling a plugin's slots (it failed).
    pub fn disable_plugin(&mut self, plugin: usize, gate: &Gate) {
        for slot in &mut self.slots {
            if slot.spec.owner == Owner::Plugin(plugin) {
                slot.enabled = false;
            }
        }
        gate.set(self.next_due());
    }
}

#[cfg(test)]
mod tests;
