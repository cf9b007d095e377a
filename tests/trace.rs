//! The `trace` plugin in real runs: its files load in `json.load` and in
//! Holistic Trace Analysis (one Python call for every check), hold one
//! `ProfilerStep#N` span per recorded step and the MLP's `aten::addmm`, appear
//! exactly for the scheduled windows, and option mistakes are usage errors.

mod common;

use std::path::Path;

use common::{plugin_path, ptrain, py, run_expect, stderr, summary, tiny_gpt};

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

#[test]
fn windows_become_traces_that_hta_and_json_load_read() {
    plugin_path("trace");
    let dir = tempfile::tempdir().unwrap();
    // Cycles of 6 steps: wait 2, warm up 1, record 3 -> steps 4-6 and 10-12; the
    // run ends inside the third cycle's wait.
    run_expect(
        ptrain()
            .args(["run", "--quiet", "--steps", "14", "--device", "cpu", "--config", "configs/mlp-multi.toml", "--set", "run.threads=1"])
            .args(["--plugins", "trace", "--set", "plugins.trace.wait=2", "--set", "plugins.trace.every=6"])
            .args(["--set", "plugins.trace.record_memory=true", "--run-dir"])
            .arg(dir.path()),
        0,
    );
    let traces = dir.path().join("traces");
    assert_eq!(files(&traces), ["step-10.rank0.pt.trace.json", "step-4.rank0.pt.trace.json"]);
    let paths: Vec<String> = ["step-4", "step-10"].iter().map(|s| traces.join(format!("{s}.rank0.pt.trace.json")).display().to_string()).collect();
    let out = py::cmd().arg("tests/support/trace_check.py").args(&paths).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let checks: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (path, steps) in paths.iter().zip([[4, 5, 6], [10, 11, 12]]) {
        let (json, hta) = (&checks[path]["json"], &checks[path]["hta"]);
        assert_eq!(json["profiler_steps"], serde_json::json!(steps), "{path}: one ProfilerStep span per recorded step");
        assert_eq!(hta["profiler_steps"], serde_json::json!(steps), "{path}");
        assert_eq!(json["distributedInfo"], serde_json::json!({"rank": 0, "world_size": 1}));
        assert_eq!(hta["ranks"], serde_json::json!([0]));
        for ops in [&json["cpu_ops"], &hta["ops"]] {
            let ops: Vec<&str> = ops.as_array().unwrap().iter().map(|o| o.as_str().unwrap()).collect();
            assert!(ops.contains(&"aten::addmm") && ops.contains(&"aten::_fused_adamw_"), "{path}: {ops:?}");
        }
        assert_eq!(json["shapes"], true, "record_shapes is on by default");
        assert!(json["memory_events"].as_u64().unwrap() > 0, "record_memory adds [memory] events");
    }
    let s = summary(dir.path());
    assert_eq!(s["plugins"]["trace"]["windows"], 2, "{s}");
    assert_eq!(s["plugins"]["trace"]["failed"], 0);
}

#[test]
fn a_run_ending_inside_a_window_keeps_what_it_recorded() {
    plugin_path("trace");
    let dir = tempfile::tempdir().unwrap();
    run_expect(
        ptrain()
            .args(tiny_gpt(11))
            .args(["--plugins", "trace", "--set", "plugins.trace.record_shapes=false", "--set", "plugins.trace.active=5", "--run-dir"])
            .arg(dir.path()),
        0,
    );
    assert_eq!(files(&dir.path().join("traces")), ["step-10.rank0.pt.trace.json"]);
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("traces/step-10.rank0.pt.trace.json")).unwrap()).unwrap();
    let steps: Vec<&str> =
        trace["traceEvents"].as_array().unwrap().iter().filter_map(|e| e["name"].as_str().filter(|n| n.starts_with("ProfilerStep#"))).collect();
    assert_eq!(steps, ["ProfilerStep#10", "ProfilerStep#11"]);
    assert_eq!(summary(dir.path())["plugins"]["trace"]["partial_last_window"], true);
}

#[test]
fn option_mistakes_are_usage_errors_naming_the_option() {
    plugin_path("trace");
    for (set, named) in [
        ("plugins.trace.active=0", "active"),
        ("plugins.trace.every=5", "every"),
        ("plugins.trace.wait=-1", "wait"),
        ("plugins.trace.every_secs=60", "every_secs"),
        ("plugins.trace.record_memory=1", "record_memory"),
        ("plugins.trace.actve=2", "actve"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = run_expect(ptrain().args(tiny_gpt(5)).args(["--plugins", "trace", "--set", set, "--run-dir"]).arg(dir.path()), 2);
        assert!(stderr(&out).contains(named), "{set}: {}", stderr(&out));
    }
}
