//! Issue 61, item 7: `model.init_from` names a ptrain run directory (its newest valid
//! checkpoint) or a peft adapter directory, as DPO after SFT needs. A DPO run from an SFT
//! run starts from the model `ptrain export` makes of it: its first step's log
//! probabilities and mean logits (TRL's `logps/*`, `logits/*`, computed from the logits of
//! the starting weights) equal those of a run from the export. LoRA adapters are merged
//! into their base (`model.init_adapters = "merge"`) or trained on (`"continue"`), from the
//! run and from its `ptrain export --format peft` directory alike; their base is checked
//! against the digest the run recorded.

mod common;

use std::path::{Path, PathBuf};

use common::{hf::s, *};

/// The DPO fixture (a random Qwen2 policy with a ChatML tokenizer, preference pairs) in
/// `dir`, with `chat.jsonl`: each pair's prompt and chosen answer as a chat row to SFT on.
fn made(dir: &Path) -> PathBuf {
    let d = fixture::copy("dpo.py", &["make", fixture::OUT, "8", "3"], dir);
    let rows: Vec<String> = read_jsonl(&d.join("conv.jsonl"))
        .into_iter()
        .map(|pair| {
            let mut messages = pair["prompt"].as_array().unwrap().clone();
            messages.extend(pair["chosen"].as_array().unwrap().iter().cloned());
            serde_json::json!({ "messages": messages }).to_string()
        })
        .collect();
    std::fs::write(d.join("chat.jsonl"), rows.join("\n") + "\n").unwrap();
    d
}

fn with_sets(cmd: &mut std::process::Command, sets: &[String]) {
    for set in sets {
        cmd.args(["--set", set]);
    }
}

/// 3 SFT steps on the chat rows from the policy into `d/name`, with `extra` settings.
fn sft(d: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let run_dir = d.join(name);
    let mut cmd = ptrain();
    cmd.args(["run", "--quiet", "--device", "cpu", "--plugins", "checkpoint", "--steps", "3", "--run-dir"]).arg(&run_dir);
    let mut sets = vec![
        "run.threads=1".to_string(),
        format!("model.init_from={}", s(&d.join("policy"))),
        "data.kind=chat".into(),
        format!("data.path={}", s(&d.join("chat.jsonl"))),
        format!("data.tokens_cache={}", s(&d.join("sft-cache"))),
        "data.val_fraction=0".into(),
        "data.batch_size=2".into(),
        // Large steps, so that the starting points differ from the base clearly.
        "optim.lr=5e-2".into(),
        "optim.warmup_steps=0".into(),
    ];
    sets.extend(extra.iter().map(|e| e.to_string()));
    with_sets(&mut cmd, &sets);
    run_expect(&mut cmd, 0);
    run_dir
}

/// A one-step DPO run from `init_from` into `d/name` (`extra` settings), its exit code
/// expected to be `code`; its stderr.
fn dpo(d: &Path, name: &str, init_from: &Path, extra: &[&str], code: i32) -> String {
    let mut cmd = ptrain();
    cmd.args(["run", "--quiet", "--device", "cpu", "--plugins", "jsonl", "--steps", "1", "--run-dir"]).arg(d.join(name));
    let mut sets = vec![
        "run.threads=1".to_string(),
        format!("model.init_from={}", s(init_from)),
        "data.kind=preference".into(),
        format!("data.path={}", s(&d.join("conv.jsonl"))),
        "data.val_fraction=0".into(),
        format!("data.tokens_cache={}", s(&d.join("dpo-cache"))),
        "data.batch_size=8".into(),
    ];
    sets.extend(extra.iter().map(|e| e.to_string()));
    with_sets(&mut cmd, &sets);
    stderr(&run_expect(&mut cmd, code))
}

/// Step 1's DPO figures of `d/name`: TRL's log probabilities and mean logits of the
/// chosen and rejected answers (the policy's, from the starting weights), and the loss.
fn first_step(d: &Path, name: &str) -> [f64; 5] {
    let m = read_jsonl(&d.join(name).join("metrics.jsonl")).into_iter().find(|m| m["step"] == 1).expect("step 1's metrics");
    let keys = ["train/logps/chosen", "train/logps/rejected", "train/logits/chosen", "train/logits/rejected", "train/loss"];
    keys.map(|k| m[k].as_f64().unwrap_or_else(|| panic!("{k} in {m}")))
}

fn export(args: &[&str], checkpoint: &Path, out: &Path) {
    run_expect(ptrain().arg("export").args(args).arg("--checkpoint").arg(checkpoint).arg("--out").arg(out), 0);
}

#[test]
fn dpo_from_a_full_sft_run_directory_starts_from_its_export() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path());
    let run = sft(&d, "sft", &[]);
    export(&["--format", "hf"], &run, &d.join("exported"));
    dpo(&d, "from-export", &d.join("exported"), &[], 0);
    dpo(&d, "from-run", &run, &[], 0);
    let (ours, theirs) = (first_step(&d, "from-run"), first_step(&d, "from-export"));
    assert_eq!(ours, theirs, "the run directory's newest checkpoint is the export's model");
    assert_ne!(ours, {
        dpo(&d, "from-base", &d.join("policy"), &[], 0);
        first_step(&d, "from-base")
    });
    assert_eq!(ours[4], 2f32.ln() as f64, "the reference is the starting model too: ln 2");
    // The run records what it started from, written into its own directory.
    let source: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d.join("from-run/init_from/source.json")).unwrap()).unwrap();
    assert_eq!(source["source"], s(&run), "{source}");
    let recorded = std::fs::read_to_string(d.join("from-run/config.toml")).unwrap();
    assert!(recorded.contains(&s(&d.join("from-run/init_from"))), "{recorded}");
    // "continue" is for adapters, and this run trained every weight.
    let err = dpo(&d, "continue", &run, &["model.init_adapters=\"continue\""], 2);
    assert!(err.contains("model.init_adapters") && err.contains("trained every weight"), "{err}");
}

#[test]
fn dpo_from_a_lora_sft_run_or_its_peft_export_merges_or_continues_its_adapters_on_their_base() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path());
    let run = sft(&d, "sft", &["lora.rank=4", "lora.alpha=32.0"]);
    export(&["--format", "hf", "--merge"], &run, &d.join("merged"));
    export(&["--format", "peft"], &run, &d.join("adapter"));
    dpo(&d, "from-merged", &d.join("merged"), &[], 0);
    let merged = first_step(&d, "from-merged");

    // Unsaid, the adapters' fate is asked for.
    for source in [&run, &d.join("adapter")] {
        let err = dpo(&d, "unsaid", source, &[], 2);
        assert!(err.contains("model.init_adapters") && err.contains("\"merge\"") && err.contains("\"continue\""), "{err}");
    }
    // Merged: the full model of the export, from the run and from the peft directory.
    dpo(&d, "run-merge", &run, &["model.init_adapters=\"merge\""], 0);
    assert_eq!(first_step(&d, "run-merge"), merged, "the run's adapters merged are the merged export");
    dpo(&d, "peft-merge", &d.join("adapter"), &["model.init_adapters=\"merge\""], 0);
    assert_eq!(first_step(&d, "peft-merge"), merged, "the peft directory's adapters merged are the merged export");

    // Continued: LoRA on the base, starting from the trained adapters; the reference is
    // the policy with its adapters off, the base (as TRL's DPOTrainer with a PeftModel).
    dpo(&d, "run-continue", &run, &["model.init_adapters=\"continue\""], 0);
    dpo(&d, "peft-continue", &d.join("adapter"), &["model.init_adapters=\"continue\""], 0);
    let continued = first_step(&d, "run-continue");
    assert_eq!(first_step(&d, "peft-continue"), continued, "the run and its peft export continue alike");
    for (ours, theirs) in continued[..4].iter().zip(&merged[..4]) {
        // The same model computed unmerged (x W^T + s x A^T B^T) and merged: float32
        // rounding in other orders, far under the adapters' effect (asserted below).
        assert!((ours - theirs).abs() <= 1e-4 * theirs.abs().max(1.0), "continued {continued:?}, merged {merged:?}");
    }
    assert_ne!(continued[4], 2f32.ln() as f64, "the reference is the base, not the SFT model: {continued:?}");
    let recorded = std::fs::read_to_string(d.join("run-continue/config.toml")).unwrap();
    assert!(recorded.contains("rank = 4") && recorded.contains(&s(&d.join("run-continue/init_from"))), "{recorded}");
    // Adapters of another shape do not fit.
    let err = dpo(&d, "rank", &run, &["model.init_adapters=\"continue\"", "lora.rank=2"], 2);
    assert!(err.contains("lora.rank"), "{err}");

    // A base that is not the one the adapters were trained on is refused, by its digest.
    let policy = d.join("policy");
    std::fs::rename(&policy, d.join("moved")).unwrap();
    common::hf::support_py("lora.py", &[&"perturb", &d.join("moved"), &policy, &"model.layers.1.mlp.up_proj.weight"]);
    for mode in ["merge", "continue"] {
        let err = dpo(&d, &format!("other-base-{mode}"), &run, &[&format!("model.init_adapters=\"{mode}\"")], 2);
        assert!(err.contains("not the base these adapters were trained on"), "{mode}: {err}");
    }
}
