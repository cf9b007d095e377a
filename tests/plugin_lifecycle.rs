//! Which plugin method is called when, for inline and worker plugins, whether they
//! declare `RunStart`/`RunEnd` attachments or not (docs/plugins.md, "Lifecycle"), and
//! `--strict-plugins`. The `lifecycle-*` fixtures record every call they get, with
//! its step, in their summary fragment.

mod common;

use std::{collections::BTreeMap, path::PathBuf};

use common::*;

fn fixture(name: &str) -> String {
    let path = build_dir().join(format!("libptrain_fixture_{}.so", name.replace('-', "_")));
    assert!(path.exists(), "{} missing: build the workspace first", path.display());
    path.display().to_string()
}

type Calls = BTreeMap<String, Vec<u64>>;

/// What a lifecycle fixture recorded: method -> steps (for the state methods, the
/// number of the save).
fn calls(summary: &serde_json::Value, plugin: &str) -> Calls {
    serde_json::from_value(summary["plugins"][plugin].clone()).unwrap_or_else(|e| panic!("{plugin}'s calls in {summary}: {e}"))
}

fn expected(entries: &[(&str, &[u64])]) -> Calls {
    entries.iter().map(|(method, steps)| (method.to_string(), steps.to_vec())).collect()
}

/// Runs `steps` steps with both recorders (and `extra` plugins), evaluating every 5
/// steps, the inline one's step hook every 3 steps emitting a metric, the worker's
/// metrics every 4 steps.
fn run(steps: u64, run_dir: &PathBuf, extra: &str, sets: &[&str], code: i32) -> serde_json::Value {
    let plugins = format!("{},{}{extra}", fixture("lifecycle-inline"), fixture("lifecycle-worker"));
    let mut cmd = ptrain();
    cmd.args(tiny_gpt(steps)).args(["--plugins", &plugins, "--set", "train.eval_every=5", "--set", "plugins.lifecycle-inline.emit=true"]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    run_expect(cmd.arg("--run-dir").arg(run_dir), code);
    summary(run_dir)
}

#[test]
fn run_start_end_and_state_reach_every_plugin_and_the_rest_only_due_attachments() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first");
    let s = run(12, &first, ",checkpoint", &["plugins.checkpoint.every=6"], 0);
    // Inline: its step hook every 3 steps, `Eval` at each evaluation (5, 10 and the last
    // step), metrics whenever plugins or evaluation emitted (its own steps, the evals),
    // though its `Metrics` attachment is never due; no checkpoint (its `Checkpoint`
    // attachment is never due); the state at both saves (6 and 12); run start and end
    // once, although it declares only `RunEnd`.
    let inline = expected(&[
        ("run_start", &[0]),
        ("step_end", &[3, 6, 9, 12]),
        ("eval", &[5, 10, 12]),
        ("metrics", &[3, 5, 6, 9, 10, 12]),
        ("save_state", &[1, 2]),
        ("run_end", &[12]),
    ]);
    assert_eq!(calls(&s, "lifecycle-inline"), inline);
    // Worker: metrics at its cadence (4, 8, 12) and whenever something was emitted; the
    // state at both saves; run start and end once, although it declares only `RunStart`.
    let worker = expected(&[("run_start", &[0]), ("metrics", &[3, 4, 5, 6, 8, 9, 10, 12]), ("save_state", &[1, 2]), ("run_end", &[12])]);
    assert_eq!(calls(&s, "lifecycle-worker"), worker);

    // Resumed from the last checkpoint (step 12, the second save): `load_state` before
    // `on_run_start`, on both.
    let resumed = dir.path().join("resumed");
    let mut cmd = ptrain();
    let plugins = format!("{},{},checkpoint", fixture("lifecycle-inline"), fixture("lifecycle-worker"));
    cmd.args(tiny_gpt(15)).args(["--plugins", &plugins, "--resume"]).arg(&first).arg("--run-dir").arg(&resumed);
    run_expect(&mut cmd, 0);
    let s = summary(&resumed);
    for plugin in ["lifecycle-inline", "lifecycle-worker"] {
        let calls = calls(&s, plugin);
        assert_eq!((&calls["load_state"], &calls["run_start"], &calls["run_end"]), (&vec![2], &vec![12], &vec![15]), "{plugin}: {calls:?}");
    }
}

#[test]
fn an_emergency_checkpoint_reaches_every_plugin_with_a_checkpoint_attachment() {
    let dir = tempfile::tempdir().unwrap();
    let sets = ["debug.nonfinite_loss_at=[4]", "train.nan_policy=\"stop\"", "train.nonfinite_check_every=1"];
    let s = run(12, &dir.path().join("run"), "", &sets, 1);
    assert_eq!(s["last_step"], 4, "{s}");
    for plugin in ["lifecycle-inline", "lifecycle-worker"] {
        let calls = calls(&s, plugin);
        // Neither `Checkpoint` attachment is ever due: the stop's save reaches them anyway.
        assert_eq!((&calls["checkpoint"], &calls["save_state"], &calls["run_end"]), (&vec![4], &vec![1], &vec![4]), "{plugin}: {calls:?}");
    }
}

#[test]
fn strict_plugins_make_a_completed_run_with_a_plugin_failure_exit_3_with_its_summary() {
    let dir = tempfile::tempdir().unwrap();
    let faults = fixture("inline-faults");
    let out = run_expect(
        ptrain()
            .args(tiny_gpt(8))
            .args(["--plugins", &faults, "--strict-plugins", "--set", "plugins.inline-faults.error_at=3"])
            .arg("--run-dir")
            .arg(dir.path().join("inline")),
        3,
    );
    assert!(stdout(&out).contains("exit 3: a plugin failed or was given up on, and run.strict_plugins is set"), "{}", stdout(&out));
    let s = summary(&dir.path().join("inline"));
    assert_eq!((s["steps"].as_u64(), s["status"].as_str(), s["exit_code"].as_i64()), (Some(8), Some("completed"), Some(3)), "{s}");
    assert_eq!(s["plugin_failures"][0]["plugin"], "inline-faults");

    // A sink's failure, reported from its own thread, counts too; and so does the key.
    let sets = ["--set", "run.strict_plugins=true", "--set", "plugins.worker-faults.panic_at=4"];
    run_expect(
        ptrain().args(tiny_gpt(8)).args(["--plugins", &fixture("worker-faults")]).args(sets).arg("--run-dir").arg(dir.path().join("worker")),
        3,
    );
    assert_eq!(summary(&dir.path().join("worker"))["plugin_failures"][0]["plugin"], "worker-faults");

    // No failure, no change.
    run_expect(ptrain().args(tiny_gpt(4)).args(["--plugins", &faults, "--strict-plugins"]).arg("--run-dir").arg(dir.path().join("fine")), 0);
}
