use ptrain_plugin_api::StepWindows;

use super::schedule::{Phase, Schedule};

#[test]
fn the_default_records_steps_10_to_12_then_every_1000() {
    let s = Schedule::default().check().unwrap();
    assert_eq!(s.windows(), StepWindows { first: 9, length: 4, every: 1000, repeat: 0 });
    let phases: Vec<(u64, Phase)> = (1..=2100).filter_map(|step| s.phase(step).map(|p| (step, p))).collect();
    let active = |last| Phase::Active { last };
    assert_eq!(
        phases,
        vec![
            (9, Phase::Warmup),
            (10, active(false)),
            (11, active(false)),
            (12, active(true)),
            (1009, Phase::Warmup),
            (1010, active(false)),
            (1011, active(false)),
            (1012, active(true)),
            (2009, Phase::Warmup),
            (2010, active(false)),
            (2011, active(false)),
            (2012, active(true)),
        ]
    );
}

#[test]
fn every_zero_is_pytorchs_back_to_back_cycles_and_repeat_bounds_them() {
    let s = Schedule { wait: 1, warmup: 0, active: 2, every: 0, repeat: 2 }.check().unwrap();
    let steps: Vec<u64> = (1..=20).filter(|&step| s.phase(step).is_some()).collect();
    assert_eq!(steps, vec![2, 3, 5, 6]);
}

#[test]
fn impossible_schedules_are_refused() {
    assert!(Schedule { active: 0, ..Schedule::default() }.check().is_err());
    let e = Schedule { every: 5, ..Schedule::default() }.check().unwrap_err();
    assert!(e.message().contains("plugins.trace.every: 5 must be"), "{e}");
}
