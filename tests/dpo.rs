//! DPO on preference pairs (`data.kind = "preference"`, `[dpo]`) through the built
//! binary, judged by TRL's real `DPOTrainer` (tests/support/dpo.py), with a tiny
//! random Qwen2 policy and a *different* reference made by `transformers`: the rows
//! of a batch are TRL's collated rows (prompt tokens never trained), the first
//! step's loss and six metrics equal DPOTrainer's for conversational, plain and
//! implicit-prompt pairs and every loss form, the starting model as reference gives
//! exactly ln 2, bad rows exit 2 naming file and line (under `ptrain tokenize` too),
//! and `ptrain tokenize` caches the pairs a run then reuses. Nothing is downloaded.

mod common;

use std::path::{Path, PathBuf};

use common::{
    hf::{close, s, support_py},
    *,
};

const SIX: [&str; 6] = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected"];
const LOGITS: [&str; 2] = ["logits/chosen", "logits/rejected"];

fn dpo_py(args: &[&dyn AsRef<std::ffi::OsStr>]) -> serde_json::Value {
    support_py("dpo.py", args)
}

/// A tokenizer, a policy, a reference and pairs of every form, in `dir` (a copy of the
/// suite's shared fixture).
fn made(dir: &Path, pairs: usize) -> PathBuf {
    fixture::copy("dpo.py", &["make", fixture::OUT, &pairs.to_string(), "3"], dir)
}

/// A one-thread CPU DPO run's arguments on `data` (also its held-out file: nothing
/// is held out of the training pairs), with `extra` settings.
fn args(dir: &Path, data: &str, extra: &[String]) -> Vec<String> {
    let mut a: Vec<String> = ["--device", "cpu"].map(String::from).into();
    let data = dir.join(data);
    let sets = [
        "run.threads=1".to_string(),
        "model.kind=llama".into(),
        format!("model.init_from={}", s(&dir.join("policy"))),
        "data.kind=preference".into(),
        format!("data.path={}", s(&data)),
        format!("data.val_path={}", s(&data)),
        format!("data.tokens_cache={}", s(&dir.join("cache"))),
        "train.eval_batches=1".into(),
    ];
    for set in sets.iter().chain(extra) {
        a.extend(["--set".to_string(), set.clone()]);
    }
    a
}

fn run(dir: &Path, name: &str, data: &str, extra: &[String]) -> PathBuf {
    let run_dir = dir.join(name);
    run_expect(ptrain().args(["run", "--quiet", "--plugins", "jsonl", "--run-dir"]).arg(&run_dir).args(args(dir, data, extra)), 0);
    run_dir
}

/// The metrics the sinks got at `step`.
fn metrics_at(run_dir: &Path, step: u64) -> serde_json::Value {
    read_jsonl(&run_dir.join("metrics.jsonl")).into_iter().find(|m| m["step"] == step).expect("the step's metrics")
}

/// The first step's loss and six metrics of `run_dir` against DPOTrainer's first
/// logged values (loss within 1e-5, metrics within 1e-4), and against `transformers`'
/// own forward of the policy and the reference through DPOTrainer's formulas
/// (`theirs["plain"]`, the same tolerances). DPOTrainer runs in float32 as ptrain does
/// (`bf16=False`: TRL turns bf16 autocast on by default, on the CPU too, and its
/// reference forward then differs from float32's by ~1e-4 relative).
fn check_against_trl(run_dir: &Path, theirs: &serde_json::Value, what: &str) {
    let ours = metrics_at(run_dir, 1);
    let mine = |name: &str| ours[format!("train/{name}")].as_f64().unwrap_or_else(|| panic!("{what}: no train/{name} in {ours}"));
    let loss = summary(run_dir)["first_loss"].as_f64().unwrap();
    let plain = &theirs["plain"];
    close(loss, plain["loss"].as_f64().unwrap(), 1e-5, &format!("{what}: first loss vs transformers' forward through DPOTrainer's loss"));
    close(loss, theirs["loss"].as_f64().unwrap(), 1e-5, &format!("{what}: first loss vs DPOTrainer's"));
    for name in SIX {
        close(mine(name), plain[name].as_f64().unwrap(), 1e-4, &format!("{what}: {name} vs transformers' forward"));
        close(mine(name), theirs[name].as_f64().unwrap(), 1e-4, &format!("{what}: {name} vs DPOTrainer's"));
    }
    // Issue 61, item 6: the logits averaged over the vocabulary and the completion tokens.
    for name in LOGITS {
        close(mine(name), theirs[name].as_f64().unwrap(), 1e-4, &format!("{what}: {name} vs DPOTrainer's"));
    }
    assert_ne!(mine(LOGITS[0]), mine(LOGITS[1]), "{what}: chosen and rejected completions differ");
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).unwrap().lines().filter(|l| !l.trim().is_empty()).count()
}

#[test]
fn a_batchs_rows_are_trls_collated_rows_with_only_completions_trained() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path(), 12);
    for data in ["conv.jsonl", "plain.jsonl", "implicit.jsonl"] {
        let pairs = lines(&d.join(data));
        let extra = ["train.steps=1".to_string(), format!("data.batch_size={pairs}"), "debug.dump_tensors_at=[1]".into()];
        let run_dir = run(&d, &format!("rows-{data}"), data, &extra);
        let report = dpo_py(&[&"batch", &d.join("policy"), &d.join(data), &run_dir.join("tensors-step1.rank0.safetensors")]);
        assert_eq!(report["pairs"], pairs, "{data}: {report}");
        assert!(report["equal"].as_bool().unwrap(), "{data}: ptrain's rows differ from TRL's: {report}");
    }
}

#[test]
fn first_step_loss_and_metrics_equal_dpo_trainers() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path(), 8);
    let reference = d.join("reference");
    let cases =
        [("conv.jsonl", "sigmoid"), ("plain.jsonl", "sigmoid"), ("implicit.jsonl", "sigmoid"), ("conv.jsonl", "ipo"), ("plain.jsonl", "hinge")];
    for (data, loss) in cases {
        let extra = [
            "train.steps=1".to_string(),
            "data.batch_size=8".into(),
            format!("dpo.loss={loss}"),
            "dpo.beta=0.1".into(),
            format!("dpo.reference={}", s(&reference)),
        ];
        let run_dir = run(&d, &format!("first-{loss}-{data}"), data, &extra);
        let theirs = dpo_py(&[&"first-step", &d.join("policy"), &reference, &d.join(data), &loss, &"0.1"]);
        let what = format!("{data}, {loss}");
        check_against_trl(&run_dir, &theirs, &what);
        let margins = metrics_at(&run_dir, 1)["train/rewards/margins"].as_f64().unwrap();
        assert!(margins.abs() > 1e-3, "{what}: a different reference gives margins: {margins}");
    }
}

#[test]
fn the_starting_model_as_reference_starts_at_ln_2_and_evaluates_held_out_pairs() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path(), 8);
    let extra = ["train.steps=2".to_string(), "data.batch_size=4".into(), "train.eval_every=2".into(), "optim.lr=1e-3".into()];
    let run_dir = run(&d, "ln2", "conv.jsonl", &extra);
    let summary = summary(&run_dir);
    assert_eq!(summary["first_loss"].as_f64().unwrap(), (2.0f32.ln()) as f64, "policy = reference: -log sigmoid(0)");
    let at2 = metrics_at(&run_dir, 2);
    for name in ["eval/loss", "eval/rewards/accuracies", "eval/logps/chosen"] {
        assert!(at2[name].as_f64().is_some(), "{name} missing at step 2: {at2}");
    }
}

#[test]
fn bad_preference_rows_exit_2_naming_the_file_and_row() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path(), 2);
    let good = std::fs::read_to_string(d.join("plain.jsonl")).unwrap();
    for (row, says) in [
        (r#"{"prompt": "a", "chosen": " b"}"#, "needs `chosen` and `rejected`"),
        (r#"{"prompt": "a", "chosen": " b", "rejected": " b"}"#, "`chosen` equals `rejected`"),
        (r#"{"prompt": "a", "chosen": "", "rejected": " b"}"#, "the chosen completion is empty"),
        (r#"{"prompt": "a", "chosen": [{"role": "assistant", "content": "b"}], "rejected": " c"}"#, "all strings or all message lists"),
        (r#"{"prompt": "a", "chosen": " b", "rejected": " c", "score": 3}"#, "column `score`"),
    ] {
        let file = d.join("bad.jsonl");
        std::fs::write(&file, format!("{good}{row}\n")).unwrap();
        let run = run_expect(ptrain().args(["run", "--quiet", "--run-dir"]).arg(d.join("bad-run")).args(args(&d, "bad.jsonl", &[])), 2);
        let tokenize = run_expect(ptrain().arg("tokenize").args(args(&d, "bad.jsonl", &[])), 2);
        for (what, out) in [("run", run), ("tokenize", tokenize)] {
            let err = stderr(&out);
            assert!(err.contains("bad.jsonl") && err.contains("line 3") && err.contains(says), "{what}: {row}: {err}");
        }
    }
}

/// `ptrain tokenize --json` with a run's flags: a report per file, then the counts.
fn tokenize(dir: &Path, data: &str, extra: &[String]) -> Vec<serde_json::Value> {
    let out = run_expect(ptrain().args(["tokenize", "--json"]).args(args(dir, data, extra)), 0);
    stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

fn modified(file: &Path) -> std::time::SystemTime {
    std::fs::metadata(file).unwrap().modified().unwrap()
}

#[test]
fn tokenize_caches_the_pairs_a_run_reuses_bit_for_bit_and_a_changed_file_or_setting_encodes_again() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path(), 8);
    std::fs::copy(d.join("conv.jsonl"), d.join("pairs.jsonl")).unwrap();
    let extra = ["train.steps=1".to_string(), "data.batch_size=8".into(), format!("dpo.reference={}", s(&d.join("reference")))];
    // A run alone encodes the pairs itself, into a cache of its own.
    let own_cache = format!("data.tokens_cache={}", s(&d.join("own-cache")));
    let alone = run(&d, "alone", "pairs.jsonl", &[&extra[..], &[own_cache]].concat());

    let reports = tokenize(&d, "pairs.jsonl", &extra);
    let (train, counts) = (&reports[0], &reports.last().unwrap()["counts"]);
    assert_eq!((train["source"].as_str(), train["reused"].as_bool(), train["pairs"].as_u64()), (Some("train"), Some(false), Some(8)), "{train}");
    assert!(["prompt_tokens", "chosen_tokens", "rejected_tokens"].iter().all(|k| train[k].as_u64().unwrap() > 0), "{train}");
    assert_eq!((counts["train"].as_u64(), counts["dropped_prompt_too_long"].as_u64()), (Some(8), Some(0)), "{counts}");
    // data.val_path names the training file here: its pairs are read once, not counted twice.
    assert_eq!(counts["pairs"].as_u64(), Some(8), "{counts}");
    let cached = PathBuf::from(train["file"].as_str().unwrap());
    let written = modified(&cached);

    // The run reads the cache (its log says so) and encodes nothing: the same first
    // loss, bit for bit; the trained tokens counted are TRL's completion tokens.
    let run_dir = d.join("after");
    let mut c = ptrain();
    c.env("PTRAIN_LOG", "info").args(["run", "--quiet", "--plugins", "jsonl", "--run-dir"]).arg(&run_dir);
    let dump = "debug.dump_tensors_at=[1]".to_string();
    let log = stderr(&run_expect(c.args(args(&d, "pairs.jsonl", &[&extra[..], &[dump]].concat())), 0));
    assert!(log.contains(&format!("data: reusing {}", cached.display())) && !log.contains("data: encoded"), "{log}");
    assert_eq!(modified(&cached), written, "the cache file is not written again");
    let loss = |r: &Path| summary(r)["first_loss"].as_f64().unwrap().to_bits();
    assert_eq!(loss(&run_dir), loss(&alone), "tokenize then run = run alone, bit for bit");
    let trl = dpo_py(&[&"batch", &d.join("policy"), &d.join("pairs.jsonl"), &run_dir.join("tensors-step1.rank0.safetensors")]);
    assert!(trl["equal"].as_bool().unwrap(), "{trl}");
    assert_eq!(counts["trained_tokens"], trl["trained"], "the trained tokens tokenize counts are DPOTrainer's completion tokens: {counts}");
    assert_eq!(tokenize(&d, "pairs.jsonl", &extra)[0]["reused"], true, "tokenize again reuses");

    // Another length and truncation mode cut the cached pairs without encoding them again.
    let short = ["data.max_seq_len=24".to_string(), "dpo.truncation_mode=keep_end".into()];
    let short = tokenize(&d, "pairs.jsonl", &[&extra[..], &short].concat());
    let short_counts = &short.last().unwrap()["counts"];
    assert_eq!(short[0]["reused"], true, "{short:?}");
    assert!(short_counts["truncated"].as_u64().unwrap() > 0, "{short_counts}");

    // A setting that changes the encoding, then a changed file: encoded again, elsewhere.
    let other = tokenize(&d, "pairs.jsonl", &[&extra[..], &["data.ignore_columns=[\"id\"]".to_string()]].concat());
    assert_eq!(other[0]["reused"], false, "{other:?}");
    assert_ne!(other[0]["file"], train["file"]);
    let text = std::fs::read_to_string(d.join("pairs.jsonl")).unwrap();
    std::fs::write(d.join("pairs.jsonl"), text.lines().skip(1).map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let changed = tokenize(&d, "pairs.jsonl", &extra);
    assert_eq!((changed[0]["reused"].as_bool(), changed[0]["pairs"].as_u64()), (Some(false), Some(7)), "{changed:?}");
    assert_ne!(changed[0]["file"], train["file"]);
}

#[test]
fn tokenize_show_prints_each_pairs_answers_after_the_prompt_with_only_the_completions_marked() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path(), 3);
    let out = run_expect(ptrain().args(["tokenize", "--show", "2"]).args(args(&d, "conv.jsonl", &[])), 0);
    let text = stdout(&out);
    assert!(text.starts_with("(trained text is between [[ and ]])"), "{text}");
    assert_eq!(text.matches("--- ").count(), 2, "{text}");
    assert!(text.contains(&format!("{} line 1: prompt ", s(&d.join("conv.jsonl")))), "{text}");
    let first: serde_json::Value = serde_json::from_str(std::fs::read_to_string(d.join("conv.jsonl")).unwrap().lines().next().unwrap()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for what in ["chosen", "rejected"] {
        let answer = first[what][0]["content"].as_str().unwrap();
        let at = lines.iter().position(|l| *l == format!("{what}:")).unwrap_or_else(|| panic!("no {what}:\n{text}"));
        let shown =
            lines[at + 1..].iter().take_while(|l| !l.starts_with("rejected:") && !l.starts_with("--- ")).copied().collect::<Vec<_>>().join("\n");
        // The prompt (its messages, the generation prompt) untrained; the answer and
        // its end-of-turn token trained.
        assert!(shown.starts_with("<|im_start|>") && shown.contains(&format!("<|im_start|>assistant\n[[{answer}<|im_end|>")), "{what}:\n{shown}");
        assert_eq!(shown.matches("[[").count(), 1, "{what}: one trained span:\n{shown}");
    }
}

#[test]
fn lora_without_a_reference_starts_at_exactly_ln_2_and_equals_dpo_trainer_with_peft() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path(), 8);
    // The reference is the policy with its adapters off: B = 0 at the start, so the
    // policy is its base exactly, bit for bit.
    let extra = ["train.steps=3".to_string(), "data.batch_size=8".into(), "lora.rank=4".into(), "optim.lr=1e-2".into()];
    let run_dir = run(&d, "lora", "conv.jsonl", &extra);
    let summary = summary(&run_dir);
    assert_eq!(summary["first_loss"].as_f64().unwrap(), (2.0f32.ln()) as f64, "adapters at zero: -log sigmoid(0)");
    assert!(summary["final_loss"].as_f64().unwrap() < summary["first_loss"].as_f64().unwrap(), "the adapters learn: {summary}");
    let at3 = metrics_at(&run_dir, 3);
    assert!(at3["train/rewards/margins"].as_f64().unwrap() > 0.0, "the reference stayed the base: {at3}");
}

#[test]
fn the_prompt_once_per_pair_gives_the_separate_rows_results_and_cross_talk_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path(), 8);
    for data in ["conv.jsonl", "plain.jsonl"] {
        let base = ["train.steps=1".to_string(), "data.batch_size=8".into(), format!("dpo.reference={}", s(&d.join("reference")))];
        let with = |more: &[&str]| -> Vec<String> { base.iter().cloned().chain(more.iter().map(|m| m.to_string())).collect() };
        let separate = run(&d, &format!("separate-{data}"), data, &with(&[]));
        let packed = run(&d, &format!("packed-{data}"), data, &with(&["data.packing=true"]));
        let crossed = run(&d, &format!("crossed-{data}"), data, &with(&["data.packing=true", "debug.packing_cross_talk=true"]));
        let (a, b, c) = (metrics_at(&separate, 1), metrics_at(&packed, 1), metrics_at(&crossed, 1));
        // The log-probabilities within 1e-6 (relative); what is computed from them
        // (float32 differences of sums of ~130) within 1e-5.
        for name in ["loss"].iter().chain(&SIX).map(|n| format!("train/{n}")) {
            let (x, y) = (a[&name].as_f64().unwrap(), b[&name].as_f64().unwrap());
            let tolerance = if name.contains("logps") { 1e-6 * x.abs() } else { 1e-5 };
            assert!((x - y).abs() <= tolerance, "{data}: {name}: separate rows {x}, one sequence per pair {y}");
        }
        let (x, z) = (a["train/logps/rejected"].as_f64().unwrap(), c["train/logps/rejected"].as_f64().unwrap());
        assert!((x - z).abs() > 1e-3, "{data}: rejected answers that see the chosen ones went unnoticed ({x} vs {z})");
    }
}

#[test]
fn a_precomputed_reference_gives_the_live_references_losses_and_dpo_trainers() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path(), 8);
    let reference = d.join("reference");
    let base = ["train.steps=3".to_string(), "data.batch_size=4".into(), "train.eval_every=3".into(), format!("dpo.reference={}", s(&reference))];
    let live = run(&d, "live", "conv.jsonl", &base);
    let pre: Vec<String> = base.iter().cloned().chain(["dpo.precompute_reference=true".to_string()]).collect();
    let precomputed = run(&d, "precomputed", "conv.jsonl", &pre);
    let (a, b) = (metrics_at(&live, 3), metrics_at(&precomputed, 3));
    for name in ["loss", "eval/loss"].iter().map(|n| n.to_string()).chain(SIX.iter().map(|n| format!("train/{n}"))) {
        let name = if name == "loss" { "train/loss".to_string() } else { name };
        let (x, y) = (a[&name].as_f64().unwrap(), b[&name].as_f64().unwrap());
        assert!((x - y).abs() <= 1e-6 * x.abs().max(1.0), "{name}: live reference {x}, precomputed {y}");
    }
    // And against DPOTrainer's precompute_ref_log_probs, one batch of every pair.
    let extra =
        ["train.steps=1".to_string(), "data.batch_size=8".into(), format!("dpo.reference={}", s(&reference)), "dpo.precompute_reference=true".into()];
    let run_dir = run(&d, "precomputed-8", "conv.jsonl", &extra);
    let theirs = dpo_py(&[&"first-step", &d.join("policy"), &reference, &d.join("conv.jsonl"), &"sigmoid", &"0.1", &"--precompute"]);
    check_against_trl(&run_dir, &theirs, "precomputed");
}

#[test]
fn a_step_is_the_mean_over_its_pairs_however_it_is_split_and_resume_is_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path(), 16);
    let reference = format!("dpo.reference={}", s(&d.join("reference")));
    for packing in ["false", "true"] {
        let base = ["train.steps=1".to_string(), reference.clone(), format!("data.packing={packing}")];
        let with = |more: &[&str]| -> Vec<String> { base.iter().cloned().chain(more.iter().map(|m| m.to_string())).collect() };
        let whole = run(&d, &format!("1x8-{packing}"), "conv.jsonl", &with(&["data.batch_size=8"]));
        let split = run(&d, &format!("4x2-{packing}"), "conv.jsonl", &with(&["data.batch_size=2", "optim.accum_steps=4"]));
        let ranks_dir = d.join(format!("2rx4-{packing}"));
        let out = ranks::launch(2)
            .args(["run", "--quiet", "--plugins", "jsonl", "--run-dir"])
            .arg(&ranks_dir)
            .args(args(&d, "conv.jsonl", &with(&["data.batch_size=4"])))
            .output()
            .unwrap();
        assert!(out.status.success(), "2 ranks: {}", stderr(&out));
        let at = |r: &Path, name: &str| metrics_at(r, 1)[name].as_f64().unwrap();
        for name in ["loss"].iter().chain(&SIX).map(|n| format!("train/{n}")) {
            for (what, other) in [("4 x 2", &split), ("2 ranks x 4", &ranks_dir)] {
                let (x, y) = (at(&whole, &name), at(other, &name));
                assert!((x - y).abs() <= 1e-6 * x.abs().max(1.0), "packing={packing}: {name}: 1 x 8 {x}, {what} {y}");
            }
        }
    }
    // Resumed at step 3 of 6, the losses are the uninterrupted run's, bit for bit.
    let extra = ["data.batch_size=4".to_string(), reference.clone(), "optim.schedule=constant".into(), "optim.warmup_steps=0".into()];
    let cmd = |run_dir: &Path, steps: &str, resume: Option<&Path>| {
        let mut c = ptrain();
        c.args(["run", "--quiet", "--plugins", "checkpoint,jsonl", "--steps", steps, "--run-dir"]).arg(run_dir);
        if let Some(r) = resume {
            c.arg("--resume").arg(r);
        }
        c.args(args(&d, "conv.jsonl", &extra)).args(["--set", "plugins.jsonl.every=1"]);
        run_expect(&mut c, 0);
    };
    let (whole, part, resumed) = (d.join("whole"), d.join("part"), d.join("resumed"));
    cmd(&whole, "6", None);
    cmd(&part, "3", None);
    cmd(&resumed, "6", Some(&part));
    let losses = |r: &Path| -> Vec<(u64, u64)> {
        read_jsonl(&r.join("metrics.jsonl"))
            .iter()
            .filter_map(|m| Some((m["step"].as_u64()?, m["train/loss"].as_f64()?.to_bits())))
            .filter(|(step, _)| *step > 3)
            .collect()
    };
    assert_eq!(losses(&whole).len(), 3);
    assert_eq!(losses(&resumed), losses(&whole), "the resumed run's losses, bit for bit");
}

#[test]
fn an_export_after_dpo_loads_in_transformers_and_lora_adapters_in_peft() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path(), 8);
    for (name, extra, format) in [("full", vec![], "hf"), ("lora", vec!["lora.rank=4".to_string(), "optim.lr=1e-2".into()], "peft")] {
        let mut c = ptrain();
        let run_dir = d.join(format!("export-{name}"));
        c.args(["run", "--quiet", "--plugins", "checkpoint", "--steps", "2", "--run-dir"]).arg(&run_dir);
        run_expect(c.args(args(&d, "conv.jsonl", &[&["data.batch_size=4".to_string()][..], &extra].concat())), 0);
        let out = d.join(format!("out-{name}"));
        run_expect(ptrain().args(["export", "--format", format, "--checkpoint"]).arg(&run_dir).arg("--out").arg(&out), 0);
        let report = if format == "peft" { dpo_py(&[&"load", &out, &d.join("policy")]) } else { dpo_py(&[&"load", &out]) };
        assert_eq!(report["missing"], serde_json::json!([]), "{name}: {report}");
        assert_eq!(report["unexpected"], serde_json::json!([]), "{name}: {report}");
        if format == "peft" {
            assert!(report["max_lora_b"].as_f64().unwrap() > 0.0, "{name}: the adapters were trained: {report}");
        }
    }
}

#[test]
fn the_chunked_head_gives_the_whole_logits_log_probabilities_losses_and_updates() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path(), 8);
    let reference = format!("dpo.reference={}", s(&d.join("reference")));
    // Three steps: the third step's values follow two updates, so the chunked
    // gradient is checked too. LoRA: a frozen head and the adapters-off reference.
    const BETA: f64 = 0.1;
    for (name, more) in [("rows", vec![reference.as_str()]), ("packed", vec![reference.as_str(), "data.packing=true"]), ("lora", vec!["lora.rank=4"])]
    {
        let base =
            ["train.steps=3", "data.batch_size=4", "optim.lr=1e-3", "train.eval_every=3", "plugins.jsonl.every=1", "dpo.beta=0.1"].map(String::from);
        let with = |chunk: &str| -> Vec<String> {
            base.iter().cloned().chain(more.iter().map(|m| m.to_string())).chain([format!("train.loss_chunk={chunk}")]).collect()
        };
        let (whole, chunked) =
            (run(&d, &format!("whole-{name}"), "conv.jsonl", &with("0")), run(&d, &format!("chunked-{name}"), "conv.jsonl", &with("5")));
        for step in [1, 3] {
            let (a, b) = (metrics_at(&whole, step), metrics_at(&chunked, step));
            // The tolerances, from float32 rounding: chunks of 5 positions project and
            // reduce in another order than the whole logits, so each token's log-probability
            // moves by a few ulps, and a completion's sum of them (|S| ~ 100: a few dozen
            // tokens of ~-4) by a few ulps of S (seen: up to 2, 1.5e-5 at S = 110). The
            // log-probabilities within 1e-6 of |S| (8 ulps of 2^-23 |S|). Everything else is
            // beta times differences of four such sums (policy and reference, chosen and
            // rejected), and the loss moves by at most as much (|d/dz log sigmoid(z)| <= 1):
            // within beta x 1e-6 x 2 (|logps/chosen| + |logps/rejected|), ~4e-5 here (seen:
            // up to 1.6e-6). A token or chunk computed wrong moves a sum by a whole
            // log-probability (~4), and a wrong gradient the weights by ~lr: both far beyond.
            let sums = a["train/logps/chosen"].as_f64().unwrap().abs() + a["train/logps/rejected"].as_f64().unwrap().abs();
            let names = ["loss"].iter().chain(&SIX).map(|n| format!("train/{n}")).chain((step == 3).then(|| "eval/loss".to_string()));
            for name in names {
                let (x, y) = (a[&name].as_f64().unwrap(), b[&name].as_f64().unwrap());
                let tolerance = if name.contains("logps") { 1e-6 * x.abs() } else { BETA * 1e-6 * 2.0 * sums };
                assert!((x - y).abs() <= tolerance, "{name}: step {step}: whole logits {x}, loss_chunk = 5 {y} (tolerance {tolerance:e})");
            }
        }
    }
}

#[test]
fn the_precomputed_reference_is_stored_beside_the_token_cache_and_reused_without_loading_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path(), 8);
    let reference = d.join("reference");
    let extra = ["train.steps=2", "data.batch_size=4", "train.eval_every=2", "dpo.precompute_reference=true"].map(String::from).to_vec();
    let extra: Vec<String> = extra.into_iter().chain([format!("dpo.reference={}", s(&reference))]).collect();
    let logged = |name: &str| -> (PathBuf, String) {
        let run_dir = d.join(name);
        let mut c = ptrain();
        c.env("PTRAIN_LOG", "info").args(["run", "--quiet", "--plugins", "jsonl", "--run-dir"]).arg(&run_dir).args(args(&d, "conv.jsonl", &extra));
        let out = run_expect(&mut c, 0);
        (run_dir, stderr(&out))
    };
    let (first, log) = logged("store");
    assert!(log.contains("pairs computed") && !log.contains("reused from"), "the first run computes: {log}");
    let stored: Vec<_> =
        std::fs::read_dir(d.join("cache")).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".logps")).collect();
    assert_eq!(stored.len(), 1, "one file of reference log-probabilities beside the token cache");

    let (second, log) = logged("reuse");
    assert!(log.contains("reused from") && !log.contains("pairs computed"), "the second run reuses them: {log}");
    assert!(!log.contains("dpo: reference"), "the second run does not load the reference: {log}");
    for name in ["train/loss", "eval/loss", "train/rewards/margins", "train/logps/chosen"] {
        assert_eq!(metrics_at(&first, 2)[name], metrics_at(&second, 2)[name], "{name}: stored = computed");
    }

    // A changed reference (a file of it rewritten) computes them again.
    let config = reference.join("config.json");
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&config, std::fs::read(&config).unwrap()).unwrap();
    let (_, log) = logged("changed");
    assert!(log.contains("pairs computed") && !log.contains("reused from"), "a changed reference computes: {log}");
}

/// Issue 61, items 3 to 5: `data.val_fraction = 0` without `data.val_path` holds
/// nothing out (no evaluation, as DPOTrainer without an eval_dataset), for a run and
/// for `ptrain tokenize`; a held-out set is read once an evaluation, however many
/// batches are asked for, and `train.eval_batches = 0` is the whole of it.
#[test]
fn no_held_out_pairs_means_no_evaluation_and_held_out_pairs_are_read_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path(), 8);
    let none = ["data.val_path=\"\"", "data.val_fraction=0", "train.steps=2", "data.batch_size=4"].map(String::from);
    let run_dir = run(&d, "no-val", "conv.jsonl", &none);
    let sum = summary(&run_dir);
    assert!(sum["evals"].as_array().unwrap().is_empty() && sum["final_eval_loss"].is_null(), "nothing held out: {sum}");
    assert_eq!(sum["samples"], 8, "every pair trained: {sum}");
    assert!(!tokenize(&d, "conv.jsonl", &none).is_empty(), "ptrain tokenize takes it too");

    let held_out = |name: &str, batches: &str| {
        let extra = ["train.steps=1", "data.batch_size=4", &format!("train.eval_batches={batches}")].map(String::from);
        let point = summary(&run(&d, name, "conv.jsonl", &extra))["evals"][0].clone();
        (point["samples"].as_u64().unwrap(), point["loss"].as_f64().unwrap())
    };
    let (many, whole, one) = (held_out("twenty", "20"), held_out("whole", "0"), held_out("one", "1"));
    assert_eq!(many.0, 8, "20 batches asked of 8 pairs: each pair once");
    assert_eq!(whole, many, "eval_batches = 0 is the whole held-out set, once");
    assert_eq!(one.0, 4, "one batch of 4");
}
