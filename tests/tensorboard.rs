//! The `tensorboard` plugin through the built binary, read back with tensorboard's
//! own EventAccumulator (tests/support/tb_read.py), which also walks every record
//! and checks its CRCs, since the accumulator stops silently at a bad one.

mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use common::*;
use serde_json::Value;

struct Read {
    records: Vec<Value>,
    scalars: BTreeMap<String, Vec<(u64, f64)>>,
    histograms: BTreeMap<String, Vec<Vec<f64>>>,
    text: BTreeMap<String, Vec<(u64, String)>>,
}

fn tb_read(logdir: &Path) -> Read {
    let out = py::cmd().arg(repo().join("tests/support/tb_read.py")).arg(logdir).output().expect("run python");
    assert!(out.status.success(), "tb_read.py failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("tb_read.py prints JSON");
    let pairs = |v: &Value| v.as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap(), p[1].clone())).collect::<Vec<_>>();
    Read {
        records: v["records"].as_array().unwrap().clone(),
        scalars: v["scalars"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, rows)| (k.clone(), pairs(rows).into_iter().map(|(s, x)| (s, x.as_f64().unwrap())).collect()))
            .collect(),
        histograms: v["histograms"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, rows)| {
                (k.clone(), rows.as_array().unwrap().iter().map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()).collect())
            })
            .collect(),
        text: v["text"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, rows)| (k.clone(), pairs(rows).into_iter().map(|(s, x)| (s, x.as_str().unwrap().to_string())).collect()))
            .collect(),
    }
}

fn tiny_run(steps: u64, dir: &Path, extra: &[&str]) -> std::process::Output {
    run_expect(ptrain().args(tiny_gpt(steps)).arg("--run-dir").arg(dir).args(extra), 0)
}

fn steps_of(rows: &[(u64, f64)]) -> Vec<u64> {
    rows.iter().map(|r| r.0).collect()
}

#[test]
fn every_scalar_histogram_and_the_config_read_back_as_the_run_emitted_them() {
    let dir = tempfile::tempdir().unwrap();
    let steps = 40;
    // jsonl on the same scalar cadence receives the same batches; histograms every
    // 10 fall on scalar steps, so tensorboard gets no batch that jsonl does not.
    tiny_run(
        steps,
        dir.path(),
        &[
            "--plugins",
            "tensorboard,jsonl",
            "--set",
            "plugins.tensorboard.every=5",
            "--set",
            "plugins.tensorboard.histograms.every=10",
            "--set",
            "plugins.jsonl.every=5",
            "--set",
            "train.eval_every=15",
        ],
    );
    let rows = read_jsonl(&dir.path().join("metrics.jsonl"));
    let tb = tb_read(&dir.path().join("tensorboard"));

    // Scalars: the same tags, at the same steps, with the same values. TensorBoard
    // stores f32, and serde_json's float parsing may be one f64 ulp off, so compare as f32.
    let as_f32 = |rows: &[(u64, f64)]| rows.iter().map(|&(s, v)| (s, v as f32)).collect::<Vec<_>>();
    let mut expected: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
    for row in &rows {
        let step = row["step"].as_u64().unwrap();
        for (key, value) in row.as_object().unwrap().iter().filter(|(k, _)| *k != "step") {
            expected.entry(key.clone()).or_default().push((step, value.as_f64().expect("finite metrics")));
        }
    }
    assert!(expected.contains_key("eval/loss") && expected.contains_key("train/grad_norm") && expected.contains_key("time/step_s"));
    assert_eq!(tb.scalars.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>());
    for (tag, want) in &expected {
        assert_eq!(as_f32(&tb.scalars[tag]), as_f32(want), "scalar {tag}");
    }
    // Evaluation (every 15) is delivered off the scalar cadence.
    assert_eq!(steps_of(&tb.scalars["eval/loss"]), vec![15, 30, 40]);

    // Histograms: every parameter and its gradient at each multiple of 10, whole.
    let hist_steps: Vec<f64> = (1..=steps).filter(|s| s.is_multiple_of(10)).map(|s| s as f64).collect();
    let params: BTreeSet<&str> = tb.histograms.keys().filter_map(|t| t.strip_prefix("params/")).collect();
    let grads: BTreeSet<&str> = tb.histograms.keys().filter_map(|t| t.strip_prefix("grads/")).collect();
    assert!(!params.is_empty());
    assert_eq!(params, grads);
    assert_eq!(params.len() * 2, tb.histograms.len());
    for (tag, events) in &tb.histograms {
        assert_eq!(events.iter().map(|e| e[0]).collect::<Vec<_>>(), hist_steps, "histogram {tag}");
        for e in events {
            let (min, max, num, bucket_sum, buckets) = (e[1], e[2], e[3], e[6], e[7]);
            assert!(min <= max && num > 0.0 && buckets > 0.0, "{tag}: {e:?}");
            assert_eq!(bucket_sum, num, "{tag}: bucket counts add up to the element count");
        }
    }
    let s = summary(dir.path());
    let elements: f64 = params.iter().map(|p| tb.histograms[&format!("params/{p}")][0][3]).sum();
    assert_eq!(elements, s["parameters"].as_f64().unwrap(), "the histograms cover every parameter");

    // The resolved config, as a TOML code block.
    let config = std::fs::read_to_string(dir.path().join("config.toml")).unwrap();
    assert_eq!(tb.text["config"].len(), 1);
    let (step, text) = &tb.text["config"][0];
    assert_eq!(*step, 0);
    assert_eq!(text.strip_prefix("```toml\n").and_then(|t| t.strip_suffix("\n```")), Some(config.trim_end()));

    // The raw walk: one file, file_version first, then the config and one record per batch.
    let kinds: Vec<&str> = tb.records.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.len(), 2 + rows.len());
    assert_eq!(kinds[0], "file_version");
    assert!(kinds[1..].iter().all(|k| *k == "summary"));
    let record_steps: Vec<u64> = tb.records[2..].iter().map(|r| r["step"].as_u64().unwrap()).collect();
    let row_steps: Vec<u64> = rows.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(record_steps, row_steps);
    let files: BTreeSet<&str> = tb.records.iter().map(|r| r["file"].as_str().unwrap()).collect();
    assert_eq!(files.len(), 1);
    let name = files.into_iter().next().unwrap();
    assert!(name.starts_with("events.out.tfevents.") && name.ends_with(".0"), "{name}");
    assert_eq!(s["plugins"]["tensorboard"]["records"].as_u64().unwrap() as usize, tb.records.len());
    assert_eq!(s["plugin_failures"], serde_json::json!([]));
}

#[test]
fn default_cadence_is_scalars_every_10_steps_and_at_the_end_and_histograms_can_be_off() {
    let dir = tempfile::tempdir().unwrap();
    let steps = 25;
    tiny_run(steps, dir.path(), &["--plugins", "tensorboard", "--set", "plugins.tensorboard.histograms.every=0"]);
    let tb = tb_read(&dir.path().join("tensorboard"));
    let expected: Vec<u64> = (1..=steps).filter(|s| s.is_multiple_of(10) || *s == steps).collect();
    for tag in ["train/loss", "train/lr", "train/tokens_per_s", "train/grad_norm", "time/forward_s", "memory/peak_bytes"] {
        assert_eq!(steps_of(&tb.scalars[tag]), expected, "{tag}");
    }
    let evals: Vec<u64> = summary(dir.path())["evals"].as_array().unwrap().iter().map(|e| e["step"].as_u64().unwrap()).collect();
    assert_eq!(steps_of(&tb.scalars["eval/loss"]), evals);
    assert!(tb.histograms.is_empty(), "histograms are off: {:?}", tb.histograms.keys());
    // train/loss is the mean step loss since the last emission (steps 21-25 here):
    // the same run with every step's loss logged gives them.
    let each = tempfile::tempdir().unwrap();
    tiny_run(steps, each.path(), &["--plugins", "jsonl", "--set", "plugins.jsonl.every=1"]);
    let losses: Vec<f64> = read_jsonl(&each.path().join("metrics.jsonl")).iter().filter_map(|r| r["train/loss"].as_f64()).collect();
    let mean = losses[20..25].iter().sum::<f64>() / 5.0;
    let logged = tb.scalars["train/loss"].last().unwrap().1;
    assert!((logged - mean).abs() <= 1e-5, "train/loss at step 25: {logged}, the mean of steps 21-25 {mean}");
}

#[test]
fn an_unusable_log_directory_disables_the_plugin_with_one_error_and_training_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tensorboard"), "a file where the log directory should be").unwrap();
    let out = tiny_run(12, dir.path(), &["--plugins", "tensorboard,jsonl", "--set", "plugins.jsonl.every=1"]);
    let s = summary(dir.path());
    assert_eq!(s["status"], "completed");
    assert_eq!(s["steps"], 12);
    let failures = s["plugin_failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0]["plugin"], "tensorboard");
    assert!(failures[0]["error"].as_str().unwrap().contains(&dir.path().join("tensorboard").display().to_string()), "{failures:?}");
    let err = stderr(&out);
    assert_eq!(err.lines().filter(|l| l.contains("tensorboard")).count(), 1, "one error line:\n{err}");
    assert_eq!(read_jsonl(&dir.path().join("metrics.jsonl")).len(), 12, "the other sinks keep going");
}

/// Runs a command with a file-size limit: past it, writes fail with EFBIG (SIGXFSZ,
/// which would kill the process instead, is ignored, and that survives exec).
const WITH_FILE_SIZE_LIMIT: &str = "import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]),) * 2)
os.execv(sys.argv[2], sys.argv[2:])";

#[test]
fn a_write_error_mid_run_disables_the_plugin_with_one_error_and_training_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    // Histograms every step fill the 256 KiB write buffer after a few steps; its first
    // write to the file then hits the limit. Every other file stays far below it.
    let limit: u64 = 160 * 1024;
    let mut cmd = python();
    cmd.args(["-c", WITH_FILE_SIZE_LIMIT, &limit.to_string()])
        .arg(bin())
        .args(tiny_gpt(40))
        .arg("--run-dir")
        .arg(dir.path())
        .args(["--plugins", "tensorboard,jsonl", "--set", "plugins.tensorboard.histograms.every=1", "--set", "plugins.jsonl.every=1"])
        .env_remove("PTRAIN_PLUGIN_PATH")
        .env("PTRAIN_LOG", "warn");
    let out = run_expect(&mut cmd, 0);
    let s = summary(dir.path());
    assert_eq!((s["status"].as_str(), s["steps"].as_u64()), (Some("completed"), Some(40)));
    let failures = s["plugin_failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!((failures[0]["plugin"].as_str(), failures[0]["hook"].as_str()), (Some("tensorboard"), Some("metrics")));
    let failed_at = failures[0]["step"].as_u64().unwrap();
    assert!(failed_at > 1 && failed_at < 40, "failed mid-run, at step {failed_at}");
    assert!(failures[0]["error"].as_str().unwrap().contains("File too large"), "{failures:?}");
    let err = stderr(&out);
    assert_eq!(err.lines().filter(|l| l.contains("tensorboard")).count(), 1, "one error line:\n{err}");
    assert_eq!(read_jsonl(&dir.path().join("metrics.jsonl")).len(), 40, "the other sinks keep going");
}

#[test]
fn an_unknown_option_is_refused_before_training_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_expect(
        ptrain().args(tiny_gpt(5)).arg("--run-dir").arg(dir.path()).args(["--plugins", "tensorboard", "--set", "plugins.tensorboard.flush_sec=5"]),
        2,
    );
    assert!(stderr(&out).contains("flush_sec"), "{}", stderr(&out));
    assert!(!dir.path().join("summary.json").exists(), "nothing trained");
}

#[test]
fn a_resumed_run_writes_a_second_file_and_tensorboard_reads_each_redone_step_once() {
    let dir = tempfile::tempdir().unwrap();
    let logdir = dir.path().join("tb");
    let logdir_set = format!("plugins.tensorboard.logdir={}", serde_json::to_string(&logdir).unwrap());
    let sets = |run: &str| -> Vec<String> {
        [
            "--plugins",
            "tensorboard,jsonl,checkpoint",
            "--set",
            "plugins.tensorboard.every=1",
            "--set",
            "plugins.tensorboard.histograms.every=0",
            "--set",
            "plugins.jsonl.every=1",
            "--set",
            "plugins.checkpoint.every=20",
            "--set",
            &logdir_set,
            "--run-dir",
            run,
        ]
        .map(String::from)
        .to_vec()
    };
    // The first run logs steps 1-25; the second resumes from its step-20
    // checkpoint, in another run directory but the same log directory, and
    // redoes steps 21-25.
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    run_expect(ptrain().args(tiny_gpt(25)).args(sets(first.to_str().unwrap())), 0);
    let checkpoint = first.join("checkpoints/step-00000020");
    run_expect(ptrain().args(tiny_gpt(30)).args(sets(second.to_str().unwrap())).arg("--resume").arg(&checkpoint), 0);
    assert_eq!(summary(&second)["start_step"], 20);

    let tb = tb_read(&logdir);
    let files: BTreeSet<&str> = tb.records.iter().map(|r| r["file"].as_str().unwrap()).collect();
    assert_eq!(files.len(), 2, "one event file per run: {files:?}");
    // The second file says, before anything else it logs, that steps from 21 on are redone.
    let second_file = tb.records.iter().rev().map(|r| r["file"].as_str().unwrap()).next().unwrap();
    let kinds: Vec<(&str, u64)> =
        tb.records.iter().filter(|r| r["file"] == second_file).map(|r| (r["kind"].as_str().unwrap(), r["step"].as_u64().unwrap())).collect();
    assert_eq!(&kinds[..2], &[("file_version", 0), ("session_log", 21)], "{kinds:?}");
    // TensorBoard's reader shows every step once, the redone ones as the second run logged them.
    let loss = &tb.scalars["train/loss"];
    assert_eq!(steps_of(loss), (1..=30).collect::<Vec<_>>(), "train/loss steps");
    let logged: Vec<(u64, f64)> =
        read_jsonl(&second.join("metrics.jsonl")).iter().filter_map(|r| Some((r["step"].as_u64()?, r["train/loss"].as_f64()?))).collect();
    assert_eq!(steps_of(&logged), (21..=30).collect::<Vec<_>>());
    for ((step, tb_value), (_, logged)) in loss[20..].iter().zip(&logged) {
        assert!((tb_value - logged).abs() <= 1e-6 * logged.abs(), "step {step}: {tb_value} in TensorBoard, {logged} logged");
    }
}

#[test]
fn a_grpo_runs_completions_record_reads_back_as_a_markdown_table() {
    let dir = tempfile::tempdir().unwrap();
    let d = grpo::prompts_fixture(&dir.path().join("made"));
    let run_dir = dir.path().join("run");
    let args = grpo::prompts_run(&d, "tensorboard,jsonl", &["plugins.jsonl.every=1"]);
    run_expect(ptrain().args(["run", "--quiet"]).args(args).arg("--run-dir").arg(&run_dir), 0);
    let tb = tb_read(&run_dir.join("tensorboard"));
    let tables = &tb.text["completions"];
    assert_eq!(tables.iter().map(|(step, _)| *step).collect::<Vec<_>>(), [1, 2], "one table a step");
    let records = read_jsonl(&run_dir.join("completions.jsonl"));
    for (step, markdown) in tables {
        let lines: Vec<&str> = markdown.lines().collect();
        assert!(lines.len() > 2, "a markdown table: {markdown}");
        assert_eq!(lines[..2], ["| step | prompt | completion | len | advantage |", "| --- | --- | --- | --- | --- |"], "{markdown}");
        let of_step: Vec<&Value> = records.iter().filter(|r| r["step"] == *step).collect();
        assert_eq!(lines.len(), 2 + of_step.len(), "a row per completion: {markdown}");
        for (line, r) in lines[2..].iter().zip(&of_step) {
            let cell = |v: &Value| {
                let text = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                text.replace('|', "\\|").replace("\r\n", "<br>").replace(['\r', '\n'], "<br>")
            };
            let expected =
                [json_cell(&r["step"]), cell(&r["prompt"]), cell(&r["completion"]), json_cell(&r["rewards"]["len"]), json_cell(&r["advantage"])];
            assert_eq!(*line, format!("| {} |", expected.join(" | ")));
        }
    }
    // The number sinks have no text to write: metrics.jsonl keeps one line a step.
    let metrics = read_jsonl(&run_dir.join("metrics.jsonl"));
    assert_eq!(metrics.len(), 2);
    assert!(metrics.iter().all(|m| m.get("completions").is_none()));
}

/// A number cell as serde_json writes it.
fn json_cell(v: &Value) -> String {
    v.to_string()
}
