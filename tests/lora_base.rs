//! A LoRA run's adapters away from where they were trained: `ptrain generate` reads a
//! peft adapter directory (its base from adapter_config.json, or `--base`), and a LoRA
//! checkpoint whose base directory moved is generated from and merged with `--base`,
//! accepted only when the base's weights hash to what the run recorded.

mod common;

use std::path::{Path, PathBuf};

use common::{
    hf::{s, support_py},
    *,
};

fn sets(pairs: &[&str]) -> Vec<String> {
    pairs.iter().flat_map(|p| ["--set".to_string(), p.to_string()]).collect()
}

/// A random Qwen2 with a ChatML tokenizer and chat rows (chat.py's), trained 8 LoRA
/// steps into `dir/run`; returns (model, run).
fn lora_run(dir: &Path) -> (PathBuf, PathBuf) {
    let model = fixture::copy("chat.py", &["make", fixture::OUT, "40", "3"], &dir.join("model"));
    // The rows apart from the model, which tests move.
    let rows = dir.join("chat.jsonl");
    std::fs::copy(model.join("chat.jsonl"), &rows).unwrap();
    let run_dir = dir.join("run");
    let mut cmd = ptrain();
    cmd.args(["run", "--quiet", "--device", "cpu", "--plugins", "checkpoint", "--steps", "8", "--run-dir"]).arg(&run_dir);
    cmd.args(sets(&[
        "run.threads=1",
        &format!("model.init_from={}", s(&model)),
        "data.kind=chat",
        &format!("data.path={}", s(&rows)),
        &format!("data.tokens_cache={}", s(&dir.join("cache"))),
        "data.batch_size=2",
        "train.eval_batches=1",
        // Large steps, so that the adapters change the greedy continuation.
        "optim.lr=5e-2",
        "optim.warmup_steps=0",
        "lora.rank=4",
        "lora.alpha=32.0",
    ]));
    run_expect(&mut cmd, 0);
    (model, run_dir)
}

/// `ptrain generate`'s greedy continuation of three token ids, or its exit and stderr.
fn generate(checkpoint: &Path, base: Option<&Path>) -> Result<serde_json::Value, (i32, String)> {
    let mut cmd = ptrain();
    cmd.args(["generate", "--device", "cpu", "--json", "--prompt-ids", "5,9,12", "--max-new-tokens", "8", "--temperature", "0", "--checkpoint"]);
    cmd.arg(checkpoint);
    if let Some(base) = base {
        cmd.arg("--base").arg(base);
    }
    let out = cmd.output().unwrap();
    match out.status.code() {
        Some(0) => Ok(serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap()),
        code => Err((code.unwrap_or(-1), stderr(&out))),
    }
}

#[test]
fn generate_reads_a_peft_directory_and_a_moved_base_is_taken_only_with_its_own_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (model, run_dir) = lora_run(dir.path());
    let adapter = dir.path().join("adapter");
    run_expect(ptrain().args(["export", "--format", "peft", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&adapter), 0);
    let from_run = generate(&run_dir, None).unwrap()["ids"].clone();
    assert_eq!(generate(&adapter, None).unwrap()["ids"], from_run, "the peft directory generates what the run's checkpoint does");
    // The adapters matter: the base alone continues otherwise.
    assert_ne!(generate(&model, None).unwrap()["ids"], from_run, "the adapters were trained enough to change the continuation");

    // The base moves: the recorded paths no longer lead to it.
    let moved = dir.path().join("moved");
    std::fs::rename(&model, &moved).unwrap();
    let (code, err) = generate(&adapter, None).unwrap_err();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--base"), "the peft directory's missing base names --base: {err}");
    assert!(generate(&run_dir, None).is_err(), "the run's init_from is gone");
    assert_eq!(generate(&run_dir, Some(&moved)).unwrap()["ids"], from_run, "--base: the checkpoint over the moved base");
    assert_eq!(generate(&adapter, Some(&moved)).unwrap()["ids"], from_run, "--base: the peft directory over the moved base");
    let merged = dir.path().join("merged");
    let mut export = ptrain();
    export.args(["export", "--format", "hf", "--merge", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&merged).arg("--base").arg(&moved);
    run_expect(&mut export, 0);
    assert_eq!(generate(&merged, None).unwrap()["ids"], from_run, "the merged export over the moved base");

    // A base of the same shapes with one weight changed is not the one they were trained on.
    let other = dir.path().join("other");
    support_py("lora.py", &[&"perturb", &moved, &other, &"model.layers.1.mlp.up_proj.weight"]);
    let (code, err) = generate(&run_dir, Some(&other)).unwrap_err();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not the base these adapters were trained on"), "{err}");
    let mut export = ptrain();
    export
        .args(["export", "--format", "hf", "--merge", "--checkpoint"])
        .arg(&run_dir)
        .arg("--out")
        .arg(dir.path().join("m2"))
        .arg("--base")
        .arg(&other);
    let out = run_expect(&mut export, 2);
    assert!(stderr(&out).contains("not the base these adapters were trained on"), "{}", stderr(&out));
    // --base names a LoRA run's base: a whole model takes none.
    let (code, err) = generate(&merged, Some(&moved)).unwrap_err();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("whole model"), "{err}");
}

/// Issue 61, items 8 and 9: a moved base is named where it is now with `--base` (on
/// `run` too), every refusal says so, and a peft export records the base as an
/// absolute path (read from any folder), warning when the recorded one is gone.
#[test]
fn a_moved_base_is_named_with_base_and_a_peft_export_records_it_absolute() {
    let dir = tempfile::tempdir().unwrap();
    let (model, run_dir) = lora_run(dir.path());
    std::fs::rename(&model, dir.path().join("moved")).unwrap();
    let in_dir = |args: &[&str]| {
        let mut cmd = ptrain();
        cmd.current_dir(dir.path()).args(args);
        cmd
    };
    // Without --base: the export warns that the recorded base is gone; the rest refuse, saying what to pass.
    let out = run_expect(&mut in_dir(&["export", "--format", "peft", "--checkpoint", "run", "--out", "stale"]), 0);
    assert!(stderr(&out).contains("is no longer there") && stderr(&out).contains("--base DIR"), "{}", stderr(&out));
    let refusals = [
        vec!["generate", "--device", "cpu", "--prompt-ids", "5,9", "--max-new-tokens", "2", "--checkpoint", "run"],
        vec!["logits", "--checkpoint", "run", "--split", "val", "--out", "l.safetensors"],
        vec!["run", "--quiet", "--device", "cpu", "--run-dir", "run", "--auto-resume", "--steps", "9"],
    ];
    for args in &refusals {
        let out = run_expect(&mut in_dir(args), 2);
        assert!(stderr(&out).contains("--base DIR"), "{}: {}", args[0], stderr(&out));
    }
    // With a relative --base: each takes it.
    for args in &refusals {
        run_expect(in_dir(args).args(["--base", "moved"]), 0);
    }
    assert_eq!(summary(&run_dir)["last_step"], 9, "the resumed run trained its step over the moved base");
    run_expect(&mut in_dir(&["export", "--format", "peft", "--checkpoint", "run", "--out", "adapter", "--base", "moved"]), 0);
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("adapter/adapter_config.json")).unwrap()).unwrap();
    let base = config["base_model_name_or_path"].as_str().unwrap();
    assert_eq!(Path::new(base), dir.path().join("moved"), "absolute: {config}");
    // From another folder, the export's recorded base is found.
    assert!(generate(&dir.path().join("adapter"), None).is_ok(), "generate from another folder reads the absolute base");
}
