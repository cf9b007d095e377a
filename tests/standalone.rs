//! Checkpoints that stand alone, and inputs that must not be mistaken (issue 30,
//! items 4, 6, 7, 9), through the built binary with real Hugging Face files.

mod common;

use std::path::Path;

use common::{hf::*, *};

/// A GPT-2 made by transformers (vocabulary 512) with a tokenizer trained by
/// tokenizers beside it, and text to train on.
fn model_with_tokenizer(root: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (model, text) = (root.join("init/gpt2"), root.join("text.txt"));
    made_dir(&["make-model", fixture::OUT], &model);
    made_file(&["make-text", "{out}/text.txt", "3000", "5"], &text);
    made_file(&["train-tokenizer", &s(&text), "{out}/tokenizer.json", "300"], &model.join("tokenizer.json"));
    (model, text)
}

fn fine_tune(model: &Path, text: &Path, steps: u64) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--quiet", "--steps", &steps.to_string(), "--plugins", "checkpoint"].map(String::from).into();
    args.extend(small(&[
        format!("model.init_from={}", s(model)),
        "data.kind=text".into(),
        format!("data.path={}", s(text)),
        "plugins.checkpoint.every=2".into(),
    ]));
    args
}

#[test]
fn a_checkpoint_needs_no_init_from_folder_for_logits_export_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (model, text) = model_with_tokenizer(dir.path());
    let run_dir = dir.path().join("run");
    run_expect(ptrain().args(fine_tune(&model, &text, 2)).arg("--run-dir").arg(&run_dir), 0);
    std::fs::rename(dir.path().join("init"), dir.path().join("moved")).unwrap();

    let probe = dir.path().join("probe.safetensors");
    run_expect(ptrain().args(["logits", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&probe), 0);
    assert!(probe.is_file());
    let out = dir.path().join("exported");
    run_expect(ptrain().args(["export", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&out), 0);
    assert!(out.join("tokenizer.json").is_file(), "the tokenizer the run kept is exported");
    assert_eq!(std::fs::read(out.join("tokenizer.json")).unwrap(), std::fs::read(dir.path().join("moved/gpt2/tokenizer.json")).unwrap());

    // With the run's config.toml, and without any --config (the run's own).
    run_expect(
        ptrain()
            .args(["run", "--quiet", "--steps", "4", "--auto-resume", "--config"])
            .arg(run_dir.join("config.toml"))
            .arg("--run-dir")
            .arg(&run_dir),
        0,
    );
    assert_eq!(summary(&run_dir)["last_step"], 4);
    run_expect(ptrain().args(["run", "--quiet", "--steps", "6", "--auto-resume", "--run-dir"]).arg(&run_dir), 0);
    let s = summary(&run_dir);
    assert_eq!((s["start_step"].as_u64(), s["last_step"].as_u64(), s["parts"].as_array().map(Vec::len)), (Some(4), Some(6), Some(3)));
}

#[test]
fn init_from_without_a_tokenizer_is_refused_unless_the_data_is_said_to_be_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (model, text) = (dir.path().join("gpt2"), dir.path().join("text.txt"));
    made_dir(&["make-model", fixture::OUT], &model);
    made_file(&["make-text", "{out}/text.txt", "2000", "3"], &text);
    let mut args = fine_tune(&model, &text, 2);
    args.retain(|a| a != "checkpoint" && a != "--plugins");
    let refused = run_expect(ptrain().args(&args).arg("--run-dir").arg(dir.path().join("refused")), 2);
    let err = stderr(&refused);
    assert!(err.contains("data.tokenizer") && err.contains("512") && err.contains("data.tokenizer = \"bytes\""), "{err}");
    assert!(!dir.path().join("refused").exists());
    run_expect(ptrain().args(&args).args(["--set", "data.tokenizer=bytes", "--run-dir"]).arg(dir.path().join("bytes")), 0);
}

#[test]
fn export_takes_the_best_checkpoint_or_a_step_of_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let mut args = tiny_gpt(6);
    args.extend(
        ["--plugins", "checkpoint", "--set", "plugins.checkpoint.every=2", "--set", "train.eval_every=2", "--set", "plugins.checkpoint.keep_last=1"]
            .map(String::from),
    );
    // The best by the highest evaluation loss: an early step, not the latest.
    args.extend(["--set", "plugins.checkpoint.mode=max"].map(String::from));
    run_expect(ptrain().args(args).arg("--run-dir").arg(&run_dir), 0);
    let best = summary(&run_dir)["plugins"]["checkpoint"]["best"]["step"].as_u64().expect("a best checkpoint");
    assert_ne!(best, 6, "{}", summary(&run_dir));
    let out = dir.path().join("best");
    let done = run_expect(ptrain().args(["export", "--no-tokenizer", "--checkpoint", "best", "--run-dir"]).arg(&run_dir).arg("--out").arg(&out), 0);
    assert!(stdout(&done).contains(&format!("exported step {best} ")), "{}", stdout(&done));
    let done = run_expect(ptrain().args(["export", "--no-tokenizer", "--checkpoint", "6", "--run-dir"]).arg(&run_dir).arg("--out").arg(&out), 0);
    assert!(stdout(&done).contains("exported step 6 "), "{}", stdout(&done));
    let list = stdout(&run_expect(ptrain().args(["checkpoints", "list"]).arg(&run_dir), 0));
    assert!(list.lines().any(|l| l.contains(&format!("step-{best:08}")) && l.contains("<- best")), "{list}");
    let refused = run_expect(ptrain().args(["export", "--checkpoint", "best", "--out"]).arg(&out), 2);
    assert!(stderr(&refused).contains("--run-dir"), "{}", stderr(&refused));
    run_expect(ptrain().args(["export", "--no-tokenizer", "--checkpoint", "3", "--run-dir"]).arg(&run_dir).arg("--out").arg(&out), 2);
}

#[test]
fn relative_paths_in_a_config_file_are_relative_to_its_folder() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("project");
    std::fs::create_dir_all(folder.join("data")).unwrap();
    made_file(&["make-text", "{out}/text.txt", "2000", "3"], &folder.join("data/text.txt"));
    std::fs::write(folder.join("run.toml"), "[data]\nkind = \"text\"\npath = \"data/text.txt\"\n[run]\nrun_dir = \"runs/one\"\n").unwrap();
    // Run from the repository, not from the file's folder.
    run_expect(ptrain().args(tiny_gpt(2)).arg("--config").arg(folder.join("run.toml")), 0);
    let recorded = std::fs::read_to_string(folder.join("runs/one/config.toml")).unwrap();
    assert!(recorded.contains(&s(&folder.join("data/text.txt"))), "recorded with absolute paths:\n{recorded}");
    // --set paths are relative to the working directory.
    let out = run_expect(ptrain().args(tiny_gpt(2)).args(["--set", "data.kind=text", "--set", "data.path=data/text.txt"]).current_dir(&folder), 0);
    drop(out);
    // A local path that is not there is not mistaken for a hub id.
    std::fs::write(folder.join("hub.toml"), "[model]\ninit_from = \"../models/gpt2-tiny\"\n").unwrap();
    let err = stderr(&run_expect(ptrain().args(tiny_gpt(1)).arg("--config").arg(folder.join("hub.toml")), 2));
    assert!(err.contains("models/gpt2-tiny") && !err.contains("hf download"), "{err}");
    let err = stderr(&run_expect(ptrain().args(tiny_gpt(1)).args(["--set", "model.init_from=no-such-org/gpt2-tiny"]), 2));
    assert!(err.contains("hf download no-such-org/gpt2-tiny"), "{err}");
}
