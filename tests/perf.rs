//! The `perf` plugin in real runs, and the three measuring plugins together at
//! their default cadences: every metric they promise shows up.

mod common;

use common::{plugin_path, ptrain, read_jsonl, run_expect, stderr, summary, tiny_gpt};

fn keys(rows: &[serde_json::Value]) -> std::collections::BTreeSet<String> {
    rows.iter().flat_map(|r| r.as_object().unwrap().keys().cloned()).collect()
}

#[test]
fn the_measuring_plugins_emit_every_metric_on_a_short_mixed_run() {
    for name in ["flops", "dataset-metrics", "perf", "jsonl"] {
        plugin_path(name);
    }
    let dir = tempfile::tempdir().unwrap();
    run_expect(
        ptrain()
            .args(["run", "--quiet", "--steps", "60", "--device", "cpu", "--config", "configs/mlp-multi.toml"])
            .args(["--plugins", "flops,dataset-metrics,perf,jsonl", "--set", "run.threads=1"])
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    let have = keys(&read_jsonl(&dir.path().join("metrics.jsonl")));
    let mut want: Vec<String> = ["flops/step", "flops/achieved_tflops", "perf/mfu"].map(String::from).to_vec();
    for d in ["clean", "noisy", "noisier"] {
        want.extend(["loss", "accuracy", "samples"].map(|m| format!("dataset/{d}/{m}")));
    }
    for m in [
        "data_s",
        "forward_s",
        "backward_s",
        "optimizer_s",
        "step_s",
        "data_ratio",
        "steps_per_s",
        "samples_per_s",
        "tokens_per_s",
        "host_rss_bytes",
        "host_peak_rss_bytes",
    ] {
        want.push(format!("perf/{m}"));
    }
    let missing: Vec<_> = want.iter().filter(|k| !have.contains(*k)).collect();
    assert!(missing.is_empty(), "missing {missing:?}; have {have:?}");

    let s = summary(dir.path());
    assert_eq!(s["plugin_failures"].as_array().unwrap().len(), 0, "{s}");
    let perf = &s["plugins"]["perf"];
    for key in ["per_step_s", "data_ratio", "steps_per_s", "tokens_per_s", "host_peak_rss_bytes"] {
        assert!(!perf[key].is_null(), "summary perf.{key} missing: {perf}");
    }
    assert!(perf["slowdown"].is_null(), "{perf}");

    // The values, against the model: configs/mlp-multi.toml is 32 features ->
    // 128 -> 64 -> 4 classes, 64 samples a step. A training step multiplies each
    // weight matrix three times (forward, weight gradient, input gradient), 2
    // flops a multiply-add, except the input gradient of the first layer, which
    // nothing needs.
    let layers = [(32.0, 128.0), (128.0, 64.0), (64.0, 4.0)];
    let weights: f64 = layers.iter().map(|(i, o)| i * o).sum();
    let biases: f64 = layers.iter().map(|(_, o)| o).sum();
    assert_eq!(s["parameters"].as_f64().unwrap(), weights + biases);
    let per_sample = 6.0 * weights - 2.0 * layers[0].0 * layers[0].1;
    let flops = &s["plugins"]["flops"];
    assert_eq!(flops["flops_per_sample"].as_f64().unwrap(), per_sample, "{flops}");
    assert_eq!(flops["flops_per_step"].as_f64().unwrap(), 64.0 * per_sample, "{flops}");
    let rel = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
    let f = |k: &str| flops[k].as_f64().unwrap_or_else(|| panic!("flops.{k}: {flops}"));
    assert!(rel(f("mfu"), f("achieved_tflops") / f("peak_tflops")), "mfu is achieved over peak: {flops}");
    let p = |k: &str| perf[k].as_f64().unwrap_or_else(|| panic!("perf.{k}: {perf}"));
    assert!(rel(p("samples_per_s"), 64.0 * p("steps_per_s")) && rel(p("tokens_per_s"), p("samples_per_s")), "64 one-token samples a step: {perf}");
    for row in read_jsonl(&dir.path().join("metrics.jsonl")).iter().filter(|r| r.get("flops/step").is_some()) {
        assert_eq!(row["flops/step"].as_f64(), Some(64.0 * per_sample), "{row}");
        if let (Some(mfu), Some(achieved)) = (row["perf/mfu"].as_f64(), row["flops/achieved_tflops"].as_f64()) {
            assert!(rel(mfu, achieved / f("peak_tflops")), "perf/mfu at step {}: {row}", row["step"]);
        }
    }
    // Per-dataset samples: whole evaluation batches of 64.
    let last_eval = read_jsonl(&dir.path().join("metrics.jsonl")).into_iter().rfind(|r| r.get("dataset/clean/samples").is_some()).unwrap();
    let samples: f64 = ["clean", "noisy", "noisier"].iter().map(|d| last_eval[format!("dataset/{d}/samples")].as_f64().unwrap()).sum();
    assert!(samples > 0.0 && samples % 64.0 == 0.0, "{last_eval}");
}

#[test]
fn phases_add_up_to_the_step_and_tokens_follow_the_sequence_length() {
    plugin_path("perf");
    let dir = tempfile::tempdir().unwrap();
    run_expect(
        ptrain()
            .args(tiny_gpt(9))
            .args(["--plugins", "perf,jsonl", "--set", "plugins.perf.every=4", "--set", "plugins.jsonl.every=100"])
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    let rows = read_jsonl(&dir.path().join("metrics.jsonl"));
    let reported: Vec<_> = rows.iter().filter(|r| r.get("perf/step_s").is_some()).collect();
    assert_eq!(reported.iter().map(|r| r["step"].as_u64().unwrap()).collect::<Vec<_>>(), [4, 8, 9], "step 1 anchors, then every 4 and the end");
    for r in reported {
        let f = |k: &str| r[format!("perf/{k}")].as_f64().unwrap();
        let parts = f("data_s") + f("forward_s") + f("backward_s") + f("optimizer_s");
        assert!((parts - f("step_s")).abs() <= 1e-9 * f("step_s").max(1e-12), "{r}");
        assert!((f("tokens_per_s") / f("samples_per_s") - 32.0).abs() < 1e-9, "32-token samples: {r}");
        assert!((f("samples_per_s") / f("steps_per_s") - 8.0).abs() < 1e-9, "8 samples a step: {r}");
    }
}

#[test]
fn unknown_options_stop_the_run_naming_the_key() {
    plugin_path("perf");
    let out = run_expect(ptrain().args(tiny_gpt(1)).args(["--plugins", "perf", "--set", "plugins.perf.slowdown=0.5"]), 2);
    assert!(stderr(&out).contains("`slowdown`"), "{}", stderr(&out));
}
