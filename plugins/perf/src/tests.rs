//! The plugin driven as the host drives it, on made-up clocks.

use std::sync::Mutex;

use abi_stable::std_types::RStr;
use ptrain_plugin_api::{testing, Hook, HostApi, LogLevel, Outbox, PhaseTimes, Plugin, StepContext};

use super::Perf;

static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

extern "C" fn keep_warnings(_: *const (), level: LogLevel, _: RStr<'_>, message: RStr<'_>) {
    if level == LogLevel::Warn {
        WARNINGS.lock().unwrap().push(message.to_string());
    }
}

fn report(plugin: &mut Perf, step: u64, elapsed_s: f64, totals: PhaseTimes) -> Vec<(String, f64)> {
    let ctx = StepContext { step_samples: 4, step_tokens: 32, phases_total: totals, elapsed_s, ..testing::step(Hook::StepEnd, step) };
    let mut out = Outbox::new();
    plugin.on_step(&ctx, &mut out).unwrap();
    testing::scalars(&mut out)
}

fn get(metrics: &[(String, f64)], name: &str) -> f64 {
    testing::scalar(metrics, name).unwrap_or_else(|| panic!("{name} missing from {metrics:?}"))
}

/// Totals after `steps` steps of the given per-step times.
fn totals(steps: u64, data: f64, compute: f64) -> PhaseTimes {
    let n = steps as f64;
    PhaseTimes { data_s: n * data, forward_s: n * compute / 2.0, backward_s: n * compute / 2.0, optimizer_s: 0.0, step_s: n * (data + compute) }
}

#[test]
fn reports_window_means_rates_and_memory() {
    let mut plugin = Perf::new(serde_json::json!({}), HostApi::standalone()).unwrap();
    let first = report(&mut plugin, 1, 2.0, totals(1, 0.5, 1.0));
    assert!(first.iter().all(|(n, _)| !n.ends_with("_s") && !n.ends_with("per_s")), "the first step only anchors: {first:?}");
    assert!(get(&first, "perf/host_rss_bytes") > 0.0);

    let m = report(&mut plugin, 11, 4.0, totals(1, 0.5, 1.0).plus(&totals(10, 0.05, 0.15)));
    assert!((get(&m, "perf/step_s") - 0.2).abs() < 1e-12);
    assert!((get(&m, "perf/data_s") - 0.05).abs() < 1e-12);
    assert!((get(&m, "perf/data_ratio") - 0.25).abs() < 1e-12);
    assert!((get(&m, "perf/steps_per_s") - 5.0).abs() < 1e-12, "10 steps in 2 s of wall time");
    assert!((get(&m, "perf/tokens_per_s") - 160.0).abs() < 1e-9);
    assert!((get(&m, "perf/samples_per_s") - 20.0).abs() < 1e-9);
}

#[test]
fn a_slowdown_is_logged_once_naming_the_phase() {
    let host = HostApi { log: keep_warnings, ..HostApi::standalone() };
    let mut plugin = Perf::new(serde_json::json!({"slowdown_threshold": 0.3, "slowdown_window": 20}), host).unwrap();
    let mut t = totals(1, 0.5, 1.0);
    let mut elapsed = 2.0;
    for step in (1..=200).step_by(10) {
        if step > 1 {
            let data = if step > 100 { 0.2 } else { 0.05 };
            t = t.plus(&totals(10, data, 0.15));
            elapsed += 10.0 * (data + 0.15);
        }
        report(&mut plugin, step, elapsed, t);
    }
    let warnings = WARNINGS.lock().unwrap().clone();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("data phase"), "{}", warnings[0]);
    let summary = plugin.summary();
    assert_eq!(summary["slowdown"]["phase"], "data", "{summary}");
}

#[test]
fn bad_options_are_rejected_by_name() {
    for (options, key) in [
        (serde_json::json!({"threshold": 0.5}), "threshold"),
        (serde_json::json!({"slowdown_threshold": 0.0}), "slowdown_threshold"),
        (serde_json::json!({"slowdown_window": 0}), "slowdown_window"),
    ] {
        let error = Perf::new(options, HostApi::standalone()).err().expect("rejected");
        assert!(error.message().contains(key), "{}", error.message());
    }
}
