//! `plugins.<name>.critical = true`: a guard whose failure must not leave the run
//! unguarded. Its error, panic or stall (a call past `hook_warn_s`) stops the run at
//! once as failed (summary written, exit 1, `status = "failed"`, `failed_by` naming it,
//! its hook and step, and the `stop_reason` what happened); its abandonment at the end
//! fails a run that completed. Without the key the same faults only disable the plugin
//! (tests/plugins.rs). Where it shows that a plugin is critical: `plugins_loaded`, the
//! start line, `ptrain plugins info`.

mod common;

use common::*;

fn fixture(name: &str) -> String {
    let path = build_dir().join(format!("libptrain_fixture_{}.so", name.replace('-', "_")));
    assert!(path.exists(), "{} missing: build the workspace first", path.display());
    path.display().to_string()
}

/// Runs `steps` steps with `plugin` (a fixture) and `sets`; returns the summary.
fn run(steps: u64, plugin: &str, sets: &[&str], code: i32) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = ptrain();
    cmd.args(tiny_gpt(steps)).args(["--plugins", &fixture(plugin)]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    run_expect(cmd.arg("--run-dir").arg(dir.path()), code);
    summary(dir.path())
}

/// The summary of a run a critical plugin stopped: failed (issue 62, item 1: it said
/// "stopped", as a harmless early stop does), by `plugin` in `hook` at `step`, for `why`.
fn assert_stopped_by(s: &serde_json::Value, plugin: &str, why: &str) {
    assert_eq!((s["status"].as_str(), s["exit_code"].as_i64()), (Some("failed"), Some(1)), "{s}");
    assert_eq!((s["failed_by"]["plugin"].as_str(), s.get("stopped_by")), (Some(plugin), None), "{s}");
    let reason = s["stop_reason"].as_str().unwrap();
    assert!(reason.starts_with(&format!("critical plugin `{plugin}` {why}")), "{reason}");
    assert_eq!((s["error"]["kind"].as_str(), s["error"]["message"].as_str()), (Some("plugin"), Some(reason)), "{s}");
    let (hook, step) = (s["failed_by"]["hook"].as_str().unwrap(), s["failed_by"]["step"].as_u64().unwrap());
    assert!(why.contains(&format!(" in {hook} at step {step}")), "failed_by {hook} at {step}, the reason: {why}");
}

#[test]
fn a_critical_inline_plugin_that_errors_or_panics_stops_the_run_as_failed() {
    for (fault, why) in [("error_at=3", "failed in step_end at step 3: deliberate error"), ("panic_at=3", "failed in step_end at step 3")] {
        let s = run(8, "inline-faults", &[&format!("plugins.inline-faults.{fault}"), "plugins.inline-faults.critical=true"], 1);
        assert_stopped_by(&s, "inline-faults", why);
        assert_eq!(s["last_step"], 3, "stopped before the next step: {s}");
        assert_eq!(s["plugin_failures"][0]["plugin"], "inline-faults", "{s}");
    }
    // Not critical: disabled, and the run goes on to its end.
    let s = run(8, "inline-faults", &["plugins.inline-faults.error_at=3"], 0);
    assert_eq!((s["status"].as_str(), s["last_step"].as_u64()), (Some("completed"), Some(8)), "{s}");
}

#[test]
fn a_critical_inline_plugin_that_stalls_stops_the_run_once_its_hook_returns() {
    let sets = ["plugins.inline-faults.sleep_at=3", "plugins.inline-faults.sleep_ms=1500", "plugins.inline-faults.hook_warn_s=0.5"];
    let s = run(8, "inline-faults", &[sets.as_slice(), &["plugins.inline-faults.critical=true"]].concat(), 1);
    assert_stopped_by(&s, "inline-faults", "stalled in step_end at step 3 for more than 0.5s");
    assert_eq!(s["last_step"], 3, "{s}");
    assert_eq!(s["plugin_stalls"]["inline-faults"]["step"], 3, "{s}");
}

#[test]
fn a_critical_sink_that_hangs_stops_the_run_while_training_goes_on() {
    // The sink hangs for good at its first batch (step 10); a run this long ends
    // only because the stall stopped it.
    let sets = [
        "plugins.worker-faults.every=10",
        "plugins.worker-faults.hang_at=10",
        "plugins.worker-faults.hook_warn_s=0.5",
        "plugins.worker-faults.critical=true",
        "run.shutdown_timeout_s=2",
    ];
    let s = run(100_000, "worker-faults", &sets, 1);
    assert_stopped_by(&s, "worker-faults", "stalled in metrics at step 10 for more than 0.5s");
    assert!(s["last_step"].as_u64().unwrap() < 100_000, "{s}");
    assert!(s["abandoned_plugins"]["worker-faults"].as_u64().unwrap() >= 1, "{s}");
}

#[test]
fn a_critical_sink_abandoned_at_the_end_fails_a_run_that_completed() {
    // hook_warn_s (60 s) is never reached: the sink is given up on at the end.
    let sets =
        ["plugins.worker-faults.every=10", "plugins.worker-faults.hang_at=10", "plugins.worker-faults.critical=true", "run.shutdown_timeout_s=2"];
    let s = run(40, "worker-faults", &sets, 1);
    assert_eq!((s["last_step"].as_u64(), s["exit_code"].as_i64()), (Some(40), Some(1)), "{s}");
    assert!(s["abandoned_plugins"]["worker-faults"].as_u64().unwrap() >= 1, "{s}");
}

#[test]
fn worker_keys_on_an_inline_plugin_and_a_critical_that_is_no_bool_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (set, says) in [
        ("plugins.inline-faults.queue=8", "plugins.inline-faults.queue"),
        ("plugins.inline-faults.on_full=\"block\"", "plugins.inline-faults.on_full"),
        ("plugins.inline-faults.critical=1", "must be true or false"),
    ] {
        let out =
            run_expect(ptrain().args(tiny_gpt(4)).args(["--plugins", &fixture("inline-faults"), "--set", set]).arg("--run-dir").arg(dir.path()), 2);
        let err = stderr(&out);
        assert!(err.contains(says), "{set}: {err}");
        if set.contains("queue") {
            assert!(err.contains("applies to worker plugins only: `inline-faults` runs inline"), "{err}");
        }
    }
}

/// A plugin may declare itself critical (`Descriptor::critical`, plugin-api 0.5.0): its
/// failure stops the run with no key in the configuration, and `critical = false` in its
/// table overrides it.
#[test]
fn a_plugin_critical_by_its_descriptor_stops_the_run_unless_its_table_says_otherwise() {
    let s = run(8, "guard", &["plugins.guard.fail_at=3"], 1);
    assert_stopped_by(&s, "guard", "failed in step_end at step 3: budget exceeded");
    assert_eq!(s["plugins_loaded"][0]["critical"], true, "issue 62, item 2: {s}");
    let s = run(8, "guard", &["plugins.guard.fail_at=3", "plugins.guard.critical=false"], 0);
    assert_eq!((s["status"].as_str(), s["last_step"].as_u64()), (Some("completed"), Some(8)), "{s}");
    assert_eq!(s["plugins_loaded"][0]["critical"], false, "{s}");
}

/// Issue 62, item 2: `ptrain plugins info` and the run's start line say a plugin is critical.
#[test]
fn plugins_info_and_the_start_line_say_a_plugin_is_critical() {
    let info = run_expect(ptrain().args(["plugins", "info", &fixture("guard")]), 0);
    assert!(stdout(&info).contains("critical: its error, panic or stall fails the run"), "{}", stdout(&info));
    let info = run_expect(ptrain().args(["plugins", "info", &fixture("inline-faults")]), 0);
    assert!(!stdout(&info).contains("critical"), "{}", stdout(&info));
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = ptrain();
    cmd.args(tiny_gpt(2)).args(["--plugins", &format!("{},{}", fixture("guard"), fixture("inline-faults"))]);
    let out = run_expect(cmd.arg("--run-dir").arg(dir.path()).env("PTRAIN_LOG", "info"), 0);
    let line = stderr(&out).lines().find(|l| l.contains("INFO plugins: ")).map(str::to_string);
    let line = line.unwrap_or_else(|| panic!("no start line naming the plugins: {}", stderr(&out)));
    assert!(line.contains("guard 0.1.0 (inline, critical: its failure fails the run)"), "{line}");
    assert!(line.contains("inline-faults") && !line.contains("inline-faults 0.1.0 (inline, critical"), "{line}");
}
