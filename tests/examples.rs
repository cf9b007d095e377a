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
