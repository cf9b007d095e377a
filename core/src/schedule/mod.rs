//! The run's schedule: when each periodic thing is due (hook points and cadences).
//!
//! Everything periodic in a run, the core's own work (progress lines, evaluation,
//! non-finite checks, `empty_cache`) and every plugin attachment, is a slot in one
//! [`Scheduler`], which the run owns through its [`RunSchedule`]. The scheduler
//! keeps a single [`Gate`]: the next step at which any slot may be due. The loop
//! asks `gate.is_due(step)`, one atomic load and one integer comparison, and only
//! then asks the scheduler what is due. Time cadences, signals and stop requests
//! lower the gate from other threads. The plugin host plans nothing: it is handed
//! who is due ([`Due`]) with each scheduled event.

mod gate;
mod run;
mod scheduler;

pub use gate::{Gate, Ticker};
pub use ptrain_plugin_api::{Cadence, Hook, Needs, StepWindows};
pub use run::RunSchedule;
pub use scheduler::{CoreTask, Due, Owner, Scheduler, SlotSpec, StepPlan};
