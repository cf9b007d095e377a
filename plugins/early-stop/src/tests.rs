use super::rule::{Mode, Progress, Rule};

fn rule(patience: u64, min_delta: f64, mode: Mode) -> Rule {
    Rule { patience, min_delta, mode, stopping_threshold: None, divergence_threshold: None, check_finite: true }
}

/// The step at which the rule stops a run whose checks see `values` at steps 10, 20, ...
fn stops_at(rule: &Rule, values: &[f64]) -> Option<u64> {
    let mut progress = Progress::default();
    values.iter().enumerate().find_map(|(i, v)| rule.check(&mut progress, 10 * (i as u64 + 1), *v, "m").map(|_| 10 * (i as u64 + 1)))
}

#[test]
fn patience_counts_checks_without_an_improvement_larger_than_min_delta() {
    let values = [5.0, 4.0, 3.95, 3.9, 3.97, 3.8];
    assert_eq!(stops_at(&rule(3, 0.0, Mode::Min), &values), None, "every dip below the best is an improvement");
    assert_eq!(stops_at(&rule(3, 0.1, Mode::Min), &values), Some(50), "3.95, 3.9, 3.97 are within 0.1 of 4.0");
    assert_eq!(stops_at(&rule(0, 0.0, Mode::Min), &values), Some(50), "patience 0 stops at the first miss");
    assert_eq!(stops_at(&rule(2, 0.0, Mode::Max), &values), Some(30), "in max mode a falling metric never improves");
}

#[test]
fn thresholds_and_non_finite_values_stop_at_once() {
    let r = Rule { stopping_threshold: Some(3.0), divergence_threshold: Some(8.0), ..rule(10, 0.0, Mode::Min) };
    assert_eq!(stops_at(&r, &[5.0, 4.0, 2.9]), Some(30));
    assert_eq!(stops_at(&r, &[5.0, 9.0]), Some(20));
    assert_eq!(stops_at(&r, &[5.0, f64::NAN]), Some(20));
    let lenient = Rule { check_finite: false, ..rule(10, 0.0, Mode::Min) };
    assert_eq!(stops_at(&lenient, &[5.0, f64::NAN, 4.0]), None);
}

#[test]
fn the_counter_carries_over_a_saved_progress() {
    let r = rule(3, 0.0, Mode::Min);
    let mut progress = Progress::default();
    for (i, v) in [2.0, 2.5, 2.6].iter().enumerate() {
        assert!(r.check(&mut progress, i as u64, *v, "m").is_none());
    }
    let mut resumed: Progress = serde_json::from_slice(&serde_json::to_vec(&progress).unwrap()).unwrap();
    assert_eq!(resumed, progress);
    assert!(r.check(&mut resumed, 4, 2.7, "m").is_some(), "the third miss in a row");
}
