//! The `dataset-metrics` plugin in real runs: its per-dataset figures recombine
//! into the trainer's own loss, and data without datasets is left alone.

mod common;

use common::{plugin_path, ptrain, read_jsonl, run_expect, stderr, tiny_gpt};

const DATASETS: [&str; 3] = ["clean", "noisy", "noisier"];

/// With `accum` micro-batches per step, every micro-batch is counted and the
/// per-dataset figures recombine into the step's loss (the mean over all of them).
fn recombines_into_the_step_loss(accum: u64) {
    plugin_path("dataset-metrics");
    let dir = tempfile::tempdir().unwrap();
    run_expect(
        ptrain()
            .args(["run", "--quiet", "--steps", "6", "--device", "cpu", "--config", "configs/mlp-multi.toml", "--plugins", "dataset-metrics,jsonl"])
            .args(["--set", "run.threads=1", "--set", "plugins.jsonl.every=1", "--set", "plugins.dataset-metrics.every=1", "--set"])
            .arg(format!("optim.accum_steps={accum}"))
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    let phases = &common::summary(dir.path())["phase_times"];
    assert!(phases["hooks_s"].as_f64().unwrap() > 0.0, "time in the accumulate hook is its own phase: {phases}");
    let rows = read_jsonl(&dir.path().join("metrics.jsonl"));
    assert_eq!(rows.len(), 6);
    for row in &rows {
        let get = |d: &str, what: &str| row[format!("dataset/{d}/{what}")].as_f64().unwrap_or(0.0);
        let samples: f64 = DATASETS.iter().map(|d| get(d, "samples")).sum();
        assert_eq!(samples, 64.0 * accum as f64, "every sample of the step is counted once: {row}");
        // The count-weighted mean of per-dataset losses is the batch's mean loss.
        let weighted: f64 = DATASETS.iter().map(|d| get(d, "loss") * get(d, "samples")).sum::<f64>() / samples;
        let loss = row["train/loss"].as_f64().unwrap();
        assert!((weighted - loss).abs() <= 1e-5 * loss, "step {}: {weighted} vs train/loss {loss}", row["step"]);
        for d in DATASETS {
            let accuracy = get(d, "accuracy");
            assert!((0.0..=1.0).contains(&accuracy), "{row}");
            // Accuracy is a count of hits over the samples of the dataset.
            let hits = accuracy * get(d, "samples");
            assert!((hits - hits.round()).abs() < 1e-6, "{row}");
        }
    }
}

#[test]
fn per_dataset_losses_recombine_into_the_step_loss() {
    recombines_into_the_step_loss(1);
}

#[test]
fn with_gradient_accumulation_every_micro_batch_is_counted() {
    recombines_into_the_step_loss(3);
}

#[test]
fn datasets_named_in_jsonl_rows_are_reported_by_name() {
    plugin_path("dataset-metrics");
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..120)
        .map(|i| {
            let name = if i % 3 == 0 { "forum" } else { "news" };
            let x = (i % 7) as f32 / 7.0;
            format!("{{\"dataset\": \"{name}\", \"features\": [{x}, {}, 1.0], \"label\": {}}}\n", 1.0 - x, i % 2)
        })
        .collect();
    let data = dir.path().join("rows.jsonl");
    std::fs::write(&data, rows).unwrap();
    let run_dir = dir.path().join("run");
    run_expect(
        ptrain()
            .args(["run", "--quiet", "--steps", "3", "--device", "cpu", "--plugins", "dataset-metrics,jsonl"])
            .args(["--set", "model.kind=\"mlp\"", "--set", "data.kind=\"jsonl\"", "--set", "data.batch_size=16", "--set"])
            .arg(format!("data.path={:?}", data.display().to_string()))
            .args(["--set", "run.threads=1", "--set", "plugins.jsonl.every=1", "--set", "plugins.dataset-metrics.every=1"])
            .arg("--run-dir")
            .arg(&run_dir),
        0,
    );
    for row in read_jsonl(&run_dir.join("metrics.jsonl")) {
        let get = |d: &str, what: &str| row[format!("dataset/{d}/{what}")].as_f64().unwrap_or(0.0);
        let samples = get("forum", "samples") + get("news", "samples");
        assert_eq!(samples, 16.0, "{row}");
        let weighted = (get("forum", "loss") * get("forum", "samples") + get("news", "loss") * get("news", "samples")) / samples;
        let loss = row["train/loss"].as_f64().unwrap();
        assert!((weighted - loss).abs() <= 1e-5 * loss, "{weighted} vs {loss}: {row}");
    }
}

#[test]
fn reports_average_over_the_window_since_the_last_one() {
    plugin_path("dataset-metrics");
    let dir = tempfile::tempdir().unwrap();
    run_expect(
        ptrain()
            .args(["run", "--quiet", "--steps", "8", "--device", "cpu", "--config", "configs/mlp-multi.toml", "--plugins", "dataset-metrics,jsonl"])
            .args(["--set", "run.threads=1", "--set", "plugins.jsonl.every=1", "--set", "plugins.dataset-metrics.every=4"])
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    let rows = read_jsonl(&dir.path().join("metrics.jsonl"));
    let reported: Vec<u64> = rows.iter().filter(|r| r.get("dataset/clean/samples").is_some()).map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(reported, [4, 8]);
    for step in [4, 8] {
        let row = rows.iter().find(|r| r["step"] == step).unwrap();
        let samples: f64 = DATASETS.iter().map(|d| row[format!("dataset/{d}/samples")].as_f64().unwrap()).sum();
        assert_eq!(samples, 4.0 * 64.0, "four steps of 64 samples: {row}");
        let weighted: f64 = DATASETS
            .iter()
            .map(|d| row[format!("dataset/{d}/loss")].as_f64().unwrap() * row[format!("dataset/{d}/samples")].as_f64().unwrap())
            .sum::<f64>()
            / samples;
        let window: Vec<f64> =
            rows.iter().filter(|r| (step - 3..=step).contains(&r["step"].as_u64().unwrap())).map(|r| r["train/loss"].as_f64().unwrap()).collect();
        let mean = window.iter().sum::<f64>() / window.len() as f64;
        assert!((weighted - mean).abs() <= 1e-5 * mean, "step {step}: {weighted} vs mean train/loss {mean}");
    }
}

#[test]
fn two_ranks_report_the_sums_of_both() {
    plugin_path("dataset-metrics");
    let dir = tempfile::tempdir().unwrap();
    run_expect(
        common::ranks::launch(2)
            .args(["run", "--quiet", "--steps", "4", "--device", "cpu", "--config", "configs/mlp-multi.toml"])
            .args([
                "--plugins",
                "dataset-metrics,jsonl",
                "--set",
                "run.threads=1",
                "--set",
                "plugins.jsonl.every=1",
                "--set",
                "plugins.dataset-metrics.every=2",
            ])
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    let rows = read_jsonl(&dir.path().join("metrics.jsonl"));
    for step in [2, 4] {
        let row = rows.iter().find(|r| r["step"] == step).unwrap();
        let get = |d: &str, what: &str| row[format!("dataset/{d}/{what}")].as_f64().unwrap();
        let samples: f64 = DATASETS.iter().map(|d| get(d, "samples")).sum();
        assert_eq!(samples, 2.0 * 2.0 * 64.0, "two steps of 64 samples on each of two ranks: {row}");
        // train/loss is the mean over the ranks, so the window's mean of it is the mean over every sample.
        let weighted: f64 = DATASETS.iter().map(|d| get(d, "loss") * get(d, "samples")).sum::<f64>() / samples;
        let mean =
            rows.iter().filter(|r| (step - 1..=step).contains(&r["step"].as_u64().unwrap())).map(|r| r["train/loss"].as_f64().unwrap()).sum::<f64>()
                / 2.0;
        assert!((weighted - mean).abs() <= 1e-5 * mean, "step {step}: {weighted} vs {mean}");
    }
}

#[test]
fn language_model_data_is_left_alone_with_one_warning_and_off_the_schedule() {
    plugin_path("dataset-metrics");
    let dir = tempfile::tempdir().unwrap();
    let out = run_expect(
        ptrain()
            .args(tiny_gpt(4))
            .args(["--plugins", "dataset-metrics,jsonl", "--set", "plugins.jsonl.every=1", "--set", "plugins.dataset-metrics.every=1"])
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    let err = stderr(&out);
    assert_eq!(err.matches("no per-dataset metrics").count(), 1, "{err}");
    assert!(!err.contains("failed"), "{err}");
    let rows = read_jsonl(&dir.path().join("metrics.jsonl"));
    assert!(rows.iter().all(|r| r.as_object().unwrap().keys().all(|k| !k.starts_with("dataset/"))), "{rows:?}");
    let detached = &common::summary(dir.path())["detached_plugins"]["dataset-metrics"];
    assert!(detached.as_str().is_some_and(|why| why.contains("no named datasets")), "{detached}");
}

#[test]
fn unknown_options_stop_the_run_naming_the_key() {
    plugin_path("dataset-metrics");
    let out = run_expect(
        ptrain().args([
            "run",
            "--steps",
            "1",
            "--device",
            "cpu",
            "--config",
            "configs/mlp-multi.toml",
            "--plugins",
            "dataset-metrics",
            "--set",
            "plugins.dataset-metrics.top_k=5",
        ]),
        2,
    );
    assert!(stderr(&out).contains("`top_k`"), "{}", stderr(&out));
}
