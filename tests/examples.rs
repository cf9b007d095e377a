//! The library-user example: a custom Rust model trained through `Trainer::with_model`.

mod common;

use common::*;

#[test]
fn the_custom_model_example_trains() {
    let example = build_dir().join("custom-model");
    assert!(example.exists(), "{} missing: build the workspace first", example.display());
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(&example)
        .current_dir(repo())
        .env("PTRAIN_LOG", "warn")
        .args(["--plugins", "jsonl", "--run-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let line = stdout(&out);
    // "residual-mlp completed: loss A -> B, eval accuracy C"
    let numbers: Vec<f64> = line.split(|c: char| !(c.is_ascii_digit() || c == '.')).filter_map(|t| t.parse().ok()).collect();
    assert!(line.starts_with("residual-mlp completed"), "{line}");
    let (first, last, accuracy) = (numbers[0], numbers[1], numbers[2]);
    assert!(last < first / 2.0, "{line}");
    assert!(accuracy > 0.5, "above the 0.25 of chance on 4 classes: {line}");
    assert!(dir.path().join("metrics.jsonl").exists() && dir.path().join("summary.json").exists());
}

/// A custom model with dropout draws random numbers; the trainer reseeds from
/// (seed, step) because the model says so (`Model::uses_randomness`), so a resumed
/// run repeats the uninterrupted one bit for bit.
#[test]
fn a_custom_model_with_dropout_resumes_exactly() {
    let example = build_dir().join("custom-model");
    let dir = tempfile::tempdir().unwrap();
    let run = |steps: u64, run_dir: &std::path::Path, resume: Option<&std::path::Path>| {
        let mut cmd = std::process::Command::new(&example);
        cmd.current_dir(repo()).env("PTRAIN_LOG", "warn").args(["--plugins", "jsonl,checkpoint", "--dropout", "0.3", "--steps"]);
        cmd.arg(steps.to_string()).arg("--run-dir").arg(run_dir);
        // A constant schedule makes the 20-step run the first half of the 40-step one.
        for set in ["plugins.jsonl.every=1", "optim.schedule=\"constant\"", "optim.warmup_steps=0", "run.threads=1"] {
            cmd.args(["--set", set]);
        }
        if let Some(path) = resume {
            cmd.arg("--resume").arg(path);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        read_jsonl(&run_dir.join("metrics.jsonl"))
            .iter()
            .filter_map(|r| Some((r["step"].as_u64()?, r["train/loss"].as_f64()?.to_bits())))
            .collect::<Vec<_>>()
    };
    let whole = run(40, &dir.path().join("whole"), None);
    let parts = dir.path().join("parts");
    run(20, &parts, None);
    let resumed = run(40, &dir.path().join("resumed"), Some(&parts));
    let expected: Vec<(u64, u64)> = whole.into_iter().filter(|(s, _)| *s > 20).collect();
    assert_eq!(expected.len(), 20);
    assert_eq!(resumed, expected);
}

/// The library model under parameter sharding: two torchrun ranks, each building it
/// whole and keeping half of every block (it runs its blocks through
/// `Model::wrap_blocks`), follow the unsharded two-rank run step by step within 1e-5,
/// each rank holding half the parameters and half the optimizer state.
#[test]
fn the_custom_model_example_shards_its_parameters_over_two_torchrun_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let run = |shard: &str| {
        let run_dir = dir.path().join(shard);
        let mut cmd = common::ranks::torchrun_binary(2, &build_dir().join("custom-model"));
        cmd.args(["--plugins", "jsonl", "--steps", "30", "--set", "plugins.jsonl.every=1", "--set", "run.threads=1"]);
        cmd.args(["--set", &format!("dist.shard=\"{shard}\""), "--run-dir"]).arg(&run_dir);
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{shard}: {}", stderr(&out));
        let losses: Vec<f64> = read_jsonl(&run_dir.join("metrics.jsonl")).iter().filter_map(|r| r["train/loss"].as_f64()).collect();
        (summary(&run_dir), losses)
    };
    let ((none, base), (sharded, got)) = (run("none"), run("parameters"));
    assert_eq!((sharded["shard"].as_str(), sharded["world_size"].as_u64()), (Some("parameters"), Some(2)), "{sharded}");
    assert_eq!((got.len(), base.len()), (30, 30));
    for (step, (x, y)) in got.iter().zip(&base).enumerate() {
        assert!((x - y).abs() <= 1e-5 * y.abs(), "step {}: {x} sharded, {y} unsharded", step + 1);
    }
    for key in ["parameter_bytes", "optimizer_state_bytes"] {
        for (mine, theirs) in common::ranks::per_rank(&sharded, key).into_iter().zip(common::ranks::per_rank(&none, key)) {
            assert!(mine > 0 && mine as f64 <= 0.55 * theirs as f64, "{key}: {mine} B sharded, {theirs} B unsharded");
        }
    }
    assert!(sharded["gathered_block_bytes"][0].as_u64().unwrap() > 0, "its blocks were gathered: {sharded}");
}
