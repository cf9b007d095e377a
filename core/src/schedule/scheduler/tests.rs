use super::*;
use crate::schedule::{Cadence, Gate, Hook, Needs, StepWindows};

fn spec(owner: Owner, hook: Hook, cadence: Cadence) -> SlotSpec {
    SlotSpec { owner, hook, cadence, needs: Needs::NONE, windows: StepWindows::NONE }
}

/// Steps in 1..=last at which the scheduler plans `hook` for plugin 0.
fn fired(specs: Vec<SlotSpec>, last: u64, eval_every: u64, hook: Hook) -> Vec<u64> {
    let mut s = Scheduler::new(specs, 1, last, eval_every);
    let gate = Gate::new(s.next_due());
    let mut out = Vec::new();
    for step in 1..=last {
        if gate.is_due(step) && s.plan(step, &gate).has(hook) {
            out.push(step);
        }
    }
    out
}

#[test]
fn every_n_with_first_step_and_end() {
    let c = Cadence::every(10).with_first_step().with_end();
    assert_eq!(fired(vec![spec(Owner::Plugin(0), Hook::StepEnd, c)], 35, 0, Hook::StepEnd), vec![1, 10, 20, 30, 35]);
}

#[test]
fn at_eval_follows_eval_steps_and_the_last_step() {
    let c = Cadence::NEVER.with_eval();
    assert_eq!(fired(vec![spec(Owner::Plugin(0), Hook::Metrics, c)], 25, 10, Hook::Metrics), vec![10, 20, 25]);
}

#[test]
fn at_checkpoint_follows_the_checkpoint_attachment() {
    let ckpt = spec(Owner::Plugin(1), Hook::Checkpoint, Cadence::every(7));
    let sink = spec(Owner::Plugin(0), Hook::Metrics, Cadence::NEVER.with_checkpoint());
    assert_eq!(fired(vec![ckpt, sink], 22, 0, Hook::Metrics), vec![7, 14, 21]);
}

#[test]
fn the_gate_stays_closed_between_due_steps() {
    let specs =
        vec![spec(Owner::Plugin(0), Hook::StepEnd, Cadence::every(50)), spec(Owner::Core(CoreTask::Progress), Hook::StepEnd, Cadence::every(20))];
    let mut s = Scheduler::new(specs, 1, 1000, 0);
    let gate = Gate::new(s.next_due());
    let mut planned = Vec::new();
    for step in 1..=100 {
        if gate.is_due(step) {
            planned.push(step);
            s.plan(step, &gate);
        }
    }
    assert_eq!(planned, vec![20, 40, 50, 60, 80, 100]);
}

#[test]
fn a_lowered_gate_plans_nothing_extra_and_reopens() {
    let mut s = Scheduler::new(vec![spec(Owner::Plugin(0), Hook::StepEnd, Cadence::every(10))], 1, 100, 0);
    let gate = Gate::new(s.next_due());
    gate.lower();
    assert!(gate.is_due(3));
    // The loop opens the gate before it looks at requests and plans.
    gate.open();
    assert!(s.plan(3, &gate).is_empty());
    assert!(!gate.is_due(4));
    assert!(gate.is_due(10));
}

#[test]
fn time_cadence_fires_when_its_period_passed() {
    let mut s = Scheduler::new(vec![spec(Owner::Plugin(0), Hook::Metrics, Cadence::every_secs(0.01))], 1, 100, 0);
    // Times from the scheduler's start on, as the plan is told them: nothing
    // depends on how fast this machine runs the test.
    let (start, ms) = (std::time::Instant::now(), std::time::Duration::from_millis);
    let gate = Gate::new(s.next_due());
    assert!(!gate.is_due(1));
    gate.lower();
    assert!(s.plan_at(1, &gate, start + ms(10)).has(Hook::Metrics));
    assert!(!s.plan_at(2, &gate, start + ms(19)).has(Hook::Metrics), "9 ms after it fired");
    assert!(s.plan_at(3, &gate, start + ms(20)).has(Hook::Metrics), "10 ms after it fired");
}

#[test]
fn disabled_plugins_are_not_planned() {
    let mut s = Scheduler::new(vec![spec(Owner::Plugin(0), Hook::StepEnd, Cadence::every(2))], 1, 10, 0);
    let gate = Gate::new(s.next_due());
    s.disable_plugin(0, &gate);
    assert_eq!(s.next_due(), u64::MAX);
    assert!(!gate.is_due(2));
}

#[test]
fn resumed_runs_start_counting_after_the_resume_step() {
    let mut s = Scheduler::new(vec![spec(Owner::Plugin(0), Hook::StepEnd, Cadence::every(10).with_first_step())], 26, 40, 0);
    let gate = Gate::new(s.next_due());
    let steps: Vec<u64> = (26..=40).filter(|&st| gate.is_due(st) && s.plan(st, &gate).has(Hook::StepEnd)).collect();
    assert_eq!(steps, vec![26, 30, 40]);
}

#[test]
fn step_windows_are_due_on_every_step_inside_them_and_nowhere_else() {
    let windows = StepWindows { first: 9, length: 4, every: 20, repeat: 0 };
    let slot = SlotSpec { windows, ..spec(Owner::Plugin(0), Hook::StepStart, Cadence::NEVER) };
    assert_eq!(fired(vec![slot], 60, 0, Hook::StepStart), vec![9, 10, 11, 12, 29, 30, 31, 32, 49, 50, 51, 52]);
}

#[test]
fn step_windows_stop_after_repeat_and_join_a_cadence() {
    let windows = StepWindows { first: 3, length: 2, every: 10, repeat: 2 };
    let slot = SlotSpec { windows, ..spec(Owner::Plugin(0), Hook::StepEnd, Cadence::every(25)) };
    assert_eq!(fired(vec![slot], 60, 0, Hook::StepEnd), vec![3, 4, 13, 14, 25, 50]);
}

#[test]
fn a_resumed_run_enters_a_window_midway() {
    let windows = StepWindows { first: 5, length: 3, every: 0, repeat: 0 };
    let slot = SlotSpec { windows, ..spec(Owner::Plugin(0), Hook::StepStart, Cadence::NEVER) };
    let mut s = Scheduler::new(vec![slot], 7, 20, 0);
    let gate = Gate::new(s.next_due());
    let planned: Vec<u64> = (7..=20).filter(|&step| gate.is_due(step) && s.plan(step, &gate).has(Hook::StepStart)).collect();
    assert_eq!(planned, vec![7]);
}
