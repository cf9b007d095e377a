use std::sync::Arc;

use super::RunSchedule;
use crate::schedule::{Cadence, Gate, Hook, Needs, Owner, SlotSpec, StepWindows};

fn plugin_slot(plugin: usize, cadence: Cadence) -> SlotSpec {
    SlotSpec { owner: Owner::Plugin(plugin), hook: Hook::StepEnd, cadence, needs: Needs::LOSS, windows: StepWindows::NONE }
}

#[test]
fn a_plugin_that_leaves_is_planned_no_more_on_one_rank() {
    let gate = Arc::new(Gate::new(0));
    let mut schedule = RunSchedule::new(vec![plugin_slot(0, Cadence::every(1))], 1, 10, 0, gate, false);
    assert!(schedule.is_due(1));
    assert!(schedule.plan(1, Vec::new).has(Hook::StepEnd));
    assert_eq!(schedule.due().needs(0, Hook::StepEnd), Some(Needs::LOSS));
    assert!(schedule.due().wants(Hook::StepEnd, Needs::LOSS));
    let plan = schedule.plan(2, || vec![0]);
    assert!(plan.is_empty(), "it left before step 2 was planned");
    assert_eq!(schedule.due().needs(0, Hook::StepEnd), None);
    assert!(!schedule.is_due(3), "nothing is left to be due");
}

#[test]
fn a_distributed_run_keeps_the_slots_of_a_plugin_that_leaves() {
    let gate = Arc::new(Gate::new(0));
    let mut schedule = RunSchedule::new(vec![plugin_slot(0, Cadence::every(1))], 1, 10, 0, gate, true);
    schedule.plan(1, Vec::new);
    // Every rank plans the same steps: the host skips the plugin's calls instead.
    assert!(schedule.plan(2, || vec![0]).has(Hook::StepEnd));
    assert!(schedule.is_due(3));
}

#[test]
fn a_distributed_run_ignores_time_cadences() {
    let gate = Arc::new(Gate::new(0));
    let slots = vec![plugin_slot(0, Cadence::every_secs(0.5)), plugin_slot(1, Cadence::every(4))];
    let schedule = RunSchedule::new(slots.clone(), 1, 10, 0, gate.clone(), true);
    assert!(schedule._ticker.is_none(), "no ticker: clocks differ between ranks");
    assert!(!schedule.is_due(3) && schedule.is_due(4), "only the step cadence is left");
    let single = RunSchedule::new(slots, 1, 10, 0, Arc::new(Gate::new(0)), false);
    assert!(single._ticker.is_some());
}

#[test]
fn a_request_made_while_the_plan_asks_who_left_is_seen_at_the_next_step() {
    let gate = Arc::new(Gate::new(0));
    let mut schedule = RunSchedule::new(vec![plugin_slot(0, Cadence::every(5))], 1, 100, 0, gate.clone(), false);
    assert!(!schedule.is_due(4) && schedule.is_due(5));
    // A plugin asks to leave (or to stop) just as the loop takes the leavers:
    // the gate was opened first, so the request keeps it lowered.
    let requests = gate.clone();
    let plan = schedule.plan(5, || {
        requests.lower();
        Vec::new()
    });
    assert!(plan.has(Hook::StepEnd));
    assert!(schedule.is_due(6), "the request is looked at by the next step, not at step 10");
}
