//! The `health` plugin in real runs: its figures against a float64 reference
//! computed in Python from the tensors of the same step (dumped by
//! `[debug] dump_tensors_at`), its spike detector against an injected gradient
//! spike (`[debug] grad_spike_at`) and a normal run, and its option checks.

mod common;

use std::path::Path;

use common::{plugin_path, ptrain, py, read_jsonl, run_expect, stderr, summary, tiny_gpt};

const FIGURES: [&str; 5] = ["grad_norm", "param_norm", "update_ratio", "grad_zero_frac", "grad_nonfinite_frac"];

fn close(got: f64, want: f64) -> bool {
    got == want || (got - want).abs() <= 1e-5 * want.abs()
}

/// The metrics.jsonl row of `step`.
fn row(run: &Path, step: u64) -> serde_json::Value {
    read_jsonl(&run.join("metrics.jsonl")).into_iter().find(|r| r["step"] == step).unwrap_or_else(|| panic!("no metrics at step {step}"))
}

/// Compares a run's health metrics at `steps` with the Python reference from
/// the tensors dumped at those steps.
fn assert_matches_reference(run: &Path, steps: &[u64], depth: u64) {
    let files: Vec<String> = steps.iter().map(|s| run.join(format!("tensors-step{s}.rank0.safetensors")).display().to_string()).collect();
    let out = py::cmd().arg("tests/support/health_reference.py").args(files.iter().map(|f| format!("{f}:{depth}"))).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reference: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let groups = summary(run)["plugins"]["health"]["groups"].clone();
    for (step, file) in steps.iter().zip(&files) {
        let (metrics, want) = (row(run, *step), &reference[file]);
        let ref_groups: Vec<&String> = want["groups"].as_object().unwrap().keys().collect();
        let ours: Vec<&str> = groups.as_array().unwrap().iter().map(|g| g.as_str().unwrap()).collect();
        assert_eq!(ours, ref_groups, "the same groups");
        let mut compared = 0;
        for (prefix, figures) in std::iter::once(("health".to_string(), &want["total"]))
            .chain(want["groups"].as_object().unwrap().iter().map(|(g, f)| (format!("health/{g}"), f)))
        {
            for figure in FIGURES {
                let name = format!("{prefix}/{figure}");
                let got = metrics[&name].as_f64().unwrap_or_else(|| panic!("{name} missing at step {step}"));
                let expected = figures[figure].as_f64().unwrap();
                assert!(close(got, expected), "step {step} {name}: plugin {got}, reference {expected}");
                compared += 1;
            }
        }
        assert!(compared >= 5 * 3, "{compared} figures compared");
        assert!(want["total"]["update_ratio"].as_f64().unwrap() > 0.0, "the step updated the parameters");
    }
}

#[test]
fn figures_equal_a_python_reference_from_the_same_steps_tensors() {
    for name in ["health", "jsonl"] {
        plugin_path(name);
    }
    // A GPT with gradient accumulation (grouped by block), and an MLP whose ReLUs
    // leave some gradients exactly zero.
    let (gpt, mlp) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let common = ["--plugins", "health,jsonl", "--set", "plugins.health.every=5", "--set", "plugins.jsonl.every=5"];
    run_expect(
        ptrain()
            .args(tiny_gpt(10))
            .args(common)
            .args(["--set", "optim.accum_steps=2", "--set", "debug.dump_tensors_at=[5, 10]", "--run-dir"])
            .arg(gpt.path()),
        0,
    );
    run_expect(
        ptrain()
            .args(["run", "--quiet", "--steps", "5", "--device", "cpu", "--config", "configs/mlp-multi.toml", "--set", "run.threads=1"])
            .args(common)
            .args(["--set", "debug.dump_tensors_at=[5]", "--set", "plugins.health.group_depth=0", "--run-dir"])
            .arg(mlp.path()),
        0,
    );
    assert_matches_reference(gpt.path(), &[5, 10], 3);
    assert_matches_reference(mlp.path(), &[5], 0);
    let groups = &summary(gpt.path())["plugins"]["health"]["groups"];
    assert!(groups.as_array().unwrap().iter().any(|g| g == "transformer.h.0"), "{groups}");
    assert!(row(mlp.path(), 5)["health/grad_zero_frac"].as_f64().unwrap() > 0.0, "dead ReLUs leave zero gradients");
}

fn spike_run(dir: &Path, extra: &[&str]) -> std::process::Output {
    run_expect(
        ptrain()
            .args(tiny_gpt(300))
            .args(["--plugins", "health,jsonl", "--set", "plugins.health.every=5", "--set", "plugins.jsonl.every=5"])
            .args(extra)
            .arg("--run-dir")
            .arg(dir),
        0,
    )
}

fn anomaly_steps(run: &Path) -> Vec<u64> {
    read_jsonl(&run.join("metrics.jsonl")).iter().filter(|r| r["health/anomaly"].as_f64() == Some(1.0)).map(|r| r["step"].as_u64().unwrap()).collect()
}

#[test]
fn the_detector_fires_on_an_injected_spike_and_not_on_a_normal_run() {
    plugin_path("health");
    let (normal, spiked) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let out = spike_run(normal.path(), &[]);
    assert!(!stderr(&out).contains("gradient spike"), "{}", stderr(&out));
    assert_eq!(anomaly_steps(normal.path()), Vec::<u64>::new());
    let s = summary(normal.path());
    assert_eq!(s["plugins"]["health"]["checks"], 60, "{s}");
    assert_eq!(s["plugins"]["health"]["anomalies"], 0);

    let out = spike_run(spiked.path(), &["--set", "debug.grad_spike_at=[150]"]);
    let log = stderr(&out);
    let warning = log.lines().find(|l| l.contains("gradient spike")).unwrap_or_else(|| panic!("no warning in {log}"));
    assert!(warning.contains("at step 150") && warning.contains("largest contribution: transformer."), "{warning}");
    assert_eq!(log.matches("gradient spike").count(), 1, "{log}");
    assert_eq!(anomaly_steps(spiked.path()), vec![150]);
    let r = row(spiked.path(), 150);
    assert!(r["health/grad_norm_zscore"].as_f64().unwrap() > 10.0, "{r}");
    assert_eq!(summary(spiked.path())["plugins"]["health"]["anomaly_steps"], serde_json::json!([150]));
}

#[test]
fn option_mistakes_are_usage_errors_naming_the_option() {
    plugin_path("health");
    for (set, named) in [
        ("plugins.health.spike_window=2", "spike_window"),
        ("plugins.health.spike_threshold=-1.0", "spike_threshold"),
        ("plugins.health.spike_min_checks=50", "spike_min_checks"),
        ("plugins.health.group_depht=2", "group_depht"),
        ("plugins.health.per_group=\"yes\"", "per_group"),
        ("debug.grad_spike_factor=0.0", "debug.grad_spike_factor"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = run_expect(ptrain().args(tiny_gpt(5)).args(["--plugins", "health", "--set", set, "--run-dir"]).arg(dir.path()), 2);
        assert!(stderr(&out).contains(named), "{set}: {}", stderr(&out));
        assert!(!dir.path().join("summary.json").exists(), "{set}: nothing trained");
    }
}
