//! The `python` plugin: a module's functions called by the built binary at the
//! cadences the module declares, with the step's tensors as `torch.Tensor`s sharing the
//! host's memory; a guard that asks to stop; and the plugin rules for Python code: an
//! exception disables the plugin (or, critical, fails the run), a call that never
//! returns (a sleep, a busy loop holding the GIL) is abandoned after `timeout_s` and the
//! process still exits.

mod common;

use std::path::Path;

use common::*;

/// Runs `steps` steps with the module `source` as `plugins.python.module=mod_under_test`,
/// plus `plugins`, `sets`, expecting exit `code`; returns the run directory (kept) and
/// the process output.
fn run(source: &str, steps: u64, plugins: &str, sets: &[&str], code: i32) -> (tempfile::TempDir, std::process::Output) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mod_under_test.py"), source).unwrap();
    let mut cmd = ptrain();
    cmd.args(tiny_gpt(steps)).args(["--plugins", plugins, "--set", "plugins.python.module=mod_under_test"]);
    cmd.arg("--set").arg(format!("plugins.python.path={}", dir.path().display()));
    for set in sets {
        cmd.args(["--set", set]);
    }
    let output = run_expect(cmd.arg("--run-dir").arg(dir.path().join("run")), code);
    (dir, output)
}

fn record(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("run/record.json")).unwrap()).unwrap()
}

/// Records what it is called with, reads tensors, emits the loss it read, stops the run.
const MONITOR: &str = r#"
import json, os
import ptrain

EVERY = {"on_after_forward": 5, "on_after_backward": 4, "on_step_end": 3, "on_metrics": 5}
calls, kept = [], {}

def on_run_start(run):
    kept["run_dir"] = run["run_dir"]
    calls.append(["run_start", run["start_step"], run["total_steps"]])

def on_after_forward(ctx):
    loss, logits = ctx["loss"], ctx["logits"]
    calls.append(["after_forward", ctx["step"], list(logits.shape), str(logits.dtype), str(logits.device), loss.requires_grad])
    return {"pymon/loss": float(loss)}

def on_after_backward(ctx):
    grads, params = ctx["grads"], ctx["params"]
    name = sorted(params)[0]
    if ctx["step"] == 4:
        # Kept past the call: zero copy means the optimizer's later updates show in it.
        kept["param"], kept["then"] = params[name], params[name].clone()
    calls.append(["after_backward", ctx["step"], sorted(grads) == sorted(params), list(grads[name].shape) == list(params[name].shape)])

def on_step_end(ctx):
    calls.append(["step_end", ctx["step"], ctx["steps_run"]])
    if ctx["step"] == 12:
        calls.append(["changed_in_place", not bool((kept["param"] == kept["then"]).all())])
        ptrain.request_stop("seen enough at step 12")

def on_metrics(step, metrics):
    calls.append(["metrics", step, sorted(k for k in metrics if k.startswith(("train/loss", "pymon/")))])

def on_run_end(end):
    with open(os.path.join(kept["run_dir"], "record.json"), "w") as f:
        json.dump(calls, f)
    return {"calls": len(calls)}
"#;

fn calls<'a>(record: &'a serde_json::Value, kind: &str) -> Vec<&'a serde_json::Value> {
    record.as_array().unwrap().iter().filter(|c| c[0] == kind).collect()
}

#[test]
fn a_module_runs_at_its_cadences_reads_the_steps_tensors_and_stops_the_run() {
    // jsonl at every step: its train/loss is then the step's own (a mean since the last batch).
    let (dir, _) = run(MONITOR, 40, "python,jsonl", &["plugins.jsonl.every=1"], 0);
    let s = summary(&dir.path().join("run"));
    assert_eq!((s["status"].as_str(), s["stopped_by"].as_str(), s["last_step"].as_u64()), (Some("stopped"), Some("python"), Some(12)), "{s}");
    assert_eq!(s["plugins"]["python"]["returned"]["calls"].as_u64().map(|n| n > 0), Some(true), "{s}");
    let record = record(dir.path());
    let steps = |kind: &str| calls(&record, kind).iter().map(|c| c[1].as_u64().unwrap()).collect::<Vec<_>>();
    assert_eq!(steps("run_start"), [0]);
    // Exactly the declared cadences: the host never called the plugin between them.
    assert_eq!(steps("step_end"), [3, 6, 9, 12]);
    assert_eq!(steps("after_backward"), [4, 8, 12]);
    assert_eq!(steps("after_forward"), [5, 10]);
    // Metrics every 5 steps (an early stop's last step has no batch of its own).
    assert_eq!(steps("metrics"), [5, 10]);
    let forward = calls(&record, "after_forward")[0];
    assert_eq!(forward[2], serde_json::json!([8, 32, forward[2][2].as_u64().unwrap()]), "logits [batch, seq, vocab]: {forward}");
    assert_eq!((forward[3].as_str(), forward[4].as_str(), forward[5].as_bool()), (Some("torch.float32"), Some("cpu"), Some(false)), "{forward}");
    assert!(calls(&record, "after_backward").iter().all(|c| c[2] == true && c[3] == true), "{record}");
    assert_eq!(calls(&record, "changed_in_place")[0][1], true, "the parameter Python kept is the host's own memory: {record}");
    // The loss the module read is the step's loss the core reports (one micro-batch).
    let rows = read_jsonl(&dir.path().join("run/metrics.jsonl"));
    for step in [5, 10] {
        let row = rows.iter().find(|r| r["step"] == step).unwrap_or_else(|| panic!("no row at {step}: {rows:?}"));
        let (ours, core) = (row["pymon/loss"].as_f64().unwrap(), row["train/loss"].as_f64().unwrap());
        assert!((ours - core).abs() <= 1e-6 * core.abs(), "step {step}: {ours} vs {core}");
    }
}

const RAISES: &str = r#"
EVERY = {"on_step_end": 2}

def on_step_end(ctx):
    if ctx["step"] == 4:
        raise ValueError("loss looks wrong")
"#;

#[test]
fn an_exception_disables_the_plugin_or_fails_the_run_when_it_is_critical() {
    let (dir, _) = run(RAISES, 8, "python", &[], 0);
    let s = summary(&dir.path().join("run"));
    assert_eq!((s["status"].as_str(), s["last_step"].as_u64()), (Some("completed"), Some(8)), "{s}");
    let failure = &s["plugin_failures"][0];
    assert_eq!((failure["plugin"].as_str(), failure["hook"].as_str(), failure["step"].as_u64()), (Some("python"), Some("step_end"), Some(4)), "{s}");
    let error = failure["error"].as_str().unwrap();
    assert!(error.contains("ValueError: loss looks wrong") && error.contains("mod_under_test.py\", line 6"), "{error}");

    let (dir, _) = run(RAISES, 8, "python", &["plugins.python.critical=true"], 1);
    let s = summary(&dir.path().join("run"));
    assert_eq!((s["status"].as_str(), s["failed_by"]["plugin"].as_str(), s["last_step"].as_u64()), (Some("failed"), Some("python"), Some(4)), "{s}");
}

const HANGS: &str = r#"
import time
EVERY = {"on_step_end": 3, "on_metrics": 5}

def on_step_end(ctx):
    if ctx["step"] == 6:
        time.sleep(10**6)

def on_metrics(step, metrics):
    if step == 10:
        while True:  # holds the GIL
            pass
"#;

#[test]
fn a_call_that_never_returns_is_abandoned_and_the_process_exits() {
    // A step hook that sleeps forever: the training thread waits timeout_s, then goes on.
    let (dir, _) = run(HANGS, 8, "python", &["plugins.python.timeout_s=1"], 0);
    let s = summary(&dir.path().join("run"));
    assert_eq!((s["status"].as_str(), s["last_step"].as_u64()), (Some("completed"), Some(8)), "{s}");
    let failure = &s["plugin_failures"][0];
    assert_eq!((failure["hook"].as_str(), failure["step"].as_u64()), (Some("step_end"), Some(6)), "{s}");
    assert!(failure["error"].as_str().unwrap().contains("did not return within 1s"), "{s}");

    // A sink in a busy loop: training never waits for it; the end waits timeout_s.
    let hangs_sink = HANGS.replace("ctx[\"step\"] == 6", "False");
    let (dir, _) = run(&hangs_sink, 20, "python", &["plugins.python.timeout_s=1"], 0);
    let s = summary(&dir.path().join("run"));
    assert_eq!((s["status"].as_str(), s["last_step"].as_u64()), (Some("completed"), Some(20)), "{s}");
    let failure = &s["plugin_failures"][0];
    let error = failure["error"].as_str().unwrap();
    assert!(error.contains("on_metrics has been running since step 10") || error.contains("on_metrics, which has been running since step 10"), "{s}");

    // Critical: the stall fails the run.
    let (dir, _) = run(HANGS, 8, "python", &["plugins.python.timeout_s=1", "plugins.python.critical=true"], 1);
    let s = summary(&dir.path().join("run"));
    assert_eq!((s["status"].as_str(), s["failed_by"]["plugin"].as_str(), s["last_step"].as_u64()), (Some("failed"), Some("python"), Some(6)), "{s}");
}

#[test]
fn a_module_that_cannot_load_is_refused_before_training() {
    for (source, sets, what) in [
        ("import no_such_package\n", vec![], "cannot import `mod_under_test`: ModuleNotFoundError: No module named 'no_such_package'"),
        ("def on_step_end(ctx):\n    pass\n", vec![], "`on_step_end` has no cadence: declare how often it runs, EVERY = {\"on_step_end\": 50}"),
        ("EVERY = {\"on_step_end\": \"often\"}\ndef on_step_end(ctx):\n    pass\n", vec![], "EVERY[\"on_step_end\"]: often: a number of steps"),
        ("EVERY = {\"on_stepend\": 5}\n", vec![], "EVERY names `on_stepend`, which the module does not define"),
        ("", vec!["plugins.python.timeout_s=0"], "timeout_s = 0: must be > 0"),
    ] {
        let (_, output) = run(source, 4, "python", &sets, 2);
        let err = stderr(&output);
        assert!(err.contains("error: plugin python: ") && err.contains(what), "{err}");
    }
    let mut cmd = ptrain();
    let output = run_expect(cmd.args(tiny_gpt(4)).args(["--plugins", "python"]), 2);
    assert!(stderr(&output).contains("option `module` is required"), "{}", stderr(&output));
}

#[test]
fn the_scaffolds_module_passes_its_own_tests_against_this_ptrain() {
    let dir = tempfile::tempdir().unwrap();
    let crate_dir = dir.path().join("grad-guard");
    let output = run_expect(ptrain().args(["plugins", "new", "grad-guard", "--python", "--dir"]).arg(&crate_dir), 0);
    assert!(stdout(&output).contains("-m unittest -v"), "{}", stdout(&output));
    for file in ["grad_guard.py", "test_grad_guard.py", "README.md"] {
        assert!(crate_dir.join(file).is_file(), "{file} missing");
    }
    // Its unit tests (a recording stand-in for `ptrain`) and a real run of this binary.
    let output = run_expect(python().args(["-m", "unittest", "-v"]).current_dir(&crate_dir).env("PTRAIN", bin()), 0);
    let report = stderr(&output);
    assert!(report.contains("Run.test_ptrain_loads_it_and_records_its_metric) ... ok") && report.contains("Ran 4 tests"), "{report}");
}

#[test]
fn on_eval_runs_at_every_evaluation_with_its_loss() {
    let source = "def on_eval(ctx):\n    return {\"pyeval/loss\": ctx[\"scalars\"][\"eval/loss\"], \"pyeval/step\": ctx[\"step\"]}\n";
    let (dir, _) = run(source, 10, "python,jsonl", &["train.eval_every=4", "plugins.jsonl.every=100"], 0);
    let rows = read_jsonl(&dir.path().join("run/metrics.jsonl"));
    let evals: Vec<(f64, f64, f64)> = rows
        .iter()
        .filter(|r| r["pyeval/loss"].is_number())
        .map(|r| {
            (r["step"].as_f64().unwrap(), r["pyeval/step"].as_f64().unwrap(), r["pyeval/loss"].as_f64().unwrap() - r["eval/loss"].as_f64().unwrap())
        })
        .collect();
    assert_eq!(evals, [(4.0, 4.0, 0.0), (8.0, 8.0, 0.0), (10.0, 10.0, 0.0)], "{rows:?}");
}
