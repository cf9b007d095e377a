//! GRPO that samples its completions in the run (`data.kind = "prompts"`), through the
//! built binary, judged by the real `transformers` (tests/support/grpo_sampling.py):
//! greedy completions equal `generate`'s (each prompt alone, and all in one batch with
//! transformers' left padding, for a Qwen2 and a Gemma 2: ptrain samples a micro-batch's
//! prompts of five lengths in one left-padded batch), each sampled token's
//! log-probability equals the one transformers' logits processors give on the same
//! logits of the prompt and completion alone (no pad seen), the mean reward of a
//! toy task rises, a generation's iterations train on the completions sampled once, and
//! bad prompt rows and settings exit 2 naming what is wrong. A tiny random Qwen2 made
//! by `transformers`; nothing is downloaded.

mod common;

use std::path::{Path, PathBuf};

use common::{
    hf::{s, support_py},
    *,
};

/// A tokenizer, a policy and six prompt rows, in `dir` (a copy of the suite's shared fixture).
fn made(dir: &Path) -> PathBuf {
    fixture::copy("grpo_sampling.py", &["make", fixture::OUT, "5"], dir)
}

/// The same prompts with a Gemma 2 policy (soft caps, a sliding window of 6).
fn made_gemma(dir: &Path) -> PathBuf {
    fixture::copy("grpo_sampling.py", &["make", fixture::OUT, "5", "gemma2"], dir)
}

/// A one-thread CPU GRPO run's arguments on `d`'s prompts, with `extra`.
fn args(d: &Path, data: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["--device", "cpu", "--plugins", "jsonl"].map(String::from).into();
    let sets = [
        "run.threads=1".to_string(),
        "model.kind=llama".into(),
        format!("model.init_from={}", s(&d.join("policy"))),
        "data.kind=prompts".into(),
        format!("data.path={}", s(data)),
        "data.val_fraction=0".into(),
        "optim.schedule=constant".into(),
        "optim.warmup_steps=0".into(),
        "optim.weight_decay=0.0".into(),
        "plugins.jsonl.every=1".into(),
        "grpo.log_completions_every=1".into(),
    ];
    for set in sets.iter().map(String::as_str).chain(extra.iter().copied()) {
        a.extend(["--set".to_string(), set.to_string()]);
    }
    a
}

fn run(d: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let run_dir = d.join(name);
    run_expect(ptrain().args(["run", "--quiet", "--run-dir"]).arg(&run_dir).args(args(d, &d.join("prompts.jsonl"), extra)), 0);
    run_dir
}

/// Six prompts, each twice, in one micro-batch: every prompt at step 1.
const ALL_ONCE: [&str; 5] = [
    "data.batch_size=12",
    "grpo.num_generations=2",
    "train.steps=1",
    "grpo.max_completion_length=8",
    "grpo.rewards=[{name = \"r\", kind = \"length\", target = 5}]",
];

#[test]
fn greedy_completions_equal_transformers_generate() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path());
    // top_k = 1 keeps the most likely token alone: sampling is greedy decoding.
    let run_dir = run(&d, "greedy", &[&ALL_ONCE[..], &["grpo.top_k=1", "grpo.max_completion_length=12"]].concat());
    let theirs = support_py("grpo_sampling.py", &[&"greedy", &d.join("policy"), &d.join("prompts.jsonl"), &"12"]);
    assert_greedy_equal(&run_dir, &theirs, "each prompt alone");
    let records = read_jsonl(&run_dir.join("completions.jsonl"));
    let texts: std::collections::HashSet<&str> = records.iter().map(|r| r["prompt"].as_str().unwrap()).collect();
    assert_eq!(texts.len(), 6, "every prompt, the chat ones rendered with the generation prompt");
}

/// Asserts that each of `run_dir`'s completions equals transformers' greedy one of its
/// prompt in `theirs` (`greedy` or `greedy-padded`'s answer).
fn assert_greedy_equal(run_dir: &Path, theirs: &serde_json::Value, what: &str) {
    let records = read_jsonl(&run_dir.join("completions.jsonl"));
    assert_eq!(records.len(), 12, "{what}: each prompt's two completions");
    let rendered: Vec<&str> = theirs["rendered"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    for r in &records {
        let i = rendered.iter().position(|p| *p == r["prompt"].as_str().unwrap()).expect("the prompt rendered as TRL renders it");
        assert_eq!(r["completion_ids"], theirs["completions"][i], "{what}, prompt {i}: {}", r["prompt"]);
    }
}

#[test]
fn left_padded_batches_equal_transformers_left_padded_generate() {
    // Six prompts of five lengths in one micro-batch: one batch, five of its prompts
    // padded. A Qwen2 (grouped-query attention) and a Gemma 2 (soft-capped scores, a
    // sliding window that the padded columns must not shift).
    for (kind, made) in [("llama", made as fn(&Path) -> PathBuf), ("gemma", made_gemma)] {
        let dir = tempfile::tempdir().unwrap();
        let d = made(dir.path());
        let kind_set = format!("model.kind={kind}");
        let run_dir = run(&d, "greedy", &[&ALL_ONCE[..], &["grpo.top_k=1", "grpo.max_completion_length=12", &kind_set]].concat());
        let theirs = support_py("grpo_sampling.py", &[&"greedy-padded", &d.join("policy"), &d.join("prompts.jsonl"), &"12"]);
        assert_eq!(theirs["padded"], 5, "{kind}: transformers padded all but the longest prompt: {theirs}");
        assert_greedy_equal(&run_dir, &theirs, kind);
    }
}

#[test]
fn a_gemmas_sampled_tokens_log_probs_equal_transformers_processors() {
    let dir = tempfile::tempdir().unwrap();
    let d = made_gemma(dir.path());
    let settings = serde_json::json!({"temperature": 0.7, "top_k": 40, "top_p": 0.9, "repetition_penalty": 1.3});
    let sets: Vec<String> = settings.as_object().unwrap().iter().map(|(k, v)| format!("grpo.{k}={v}")).collect();
    let sets: Vec<&str> = sets.iter().map(String::as_str).chain(["grpo.max_completion_length=10", "model.kind=gemma"]).collect();
    let run_dir = run(&d, "sampled", &[&ALL_ONCE[..], &sets[..]].concat());
    // Each completion's logits in transformers from its prompt alone: a padded row that
    // saw a pad, or a window shifted by its pads, would be off by far more than ulps.
    let theirs = support_py("grpo_sampling.py", &[&"processed", &d.join("policy"), &run_dir.join("completions.jsonl"), &settings.to_string()]);
    assert!(theirs["tokens"].as_u64().unwrap() >= 12, "{theirs}");
    assert!(theirs["max_abs_diff"].as_f64().unwrap() < 1e-4, "{theirs}");
}

#[test]
fn sampled_tokens_log_probs_equal_transformers_processors() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path());
    // Each processor where it removes tokens the others keep: min_p alone, the rest together.
    let cases = [
        serde_json::json!({"temperature": 0.7, "top_k": 40, "top_p": 0.9, "repetition_penalty": 1.3}),
        serde_json::json!({"temperature": 1.5, "min_p": 0.3}),
    ];
    for (i, settings) in cases.iter().enumerate() {
        let sets: Vec<String> = settings.as_object().unwrap().iter().map(|(k, v)| format!("grpo.{k}={v}")).collect();
        let sets: Vec<&str> = sets.iter().map(String::as_str).chain(["grpo.max_completion_length=10"]).collect();
        let run_dir = run(&d, &format!("sampled-{i}"), &[&ALL_ONCE[..], &sets[..]].concat());
        let theirs = support_py("grpo_sampling.py", &[&"processed", &d.join("policy"), &run_dir.join("completions.jsonl"), &settings.to_string()]);
        assert_eq!(theirs["processors"].as_array().unwrap().len(), settings.as_object().unwrap().len(), "{theirs}");
        assert!(theirs["tokens"].as_u64().unwrap() >= 12, "{theirs}");
        // Float32 logits of a cached, batched forward against a whole one: a few ulps.
        assert!(theirs["max_abs_diff"].as_f64().unwrap() < 1e-4, "{settings}: {theirs}");
    }
}

/// The mean reward `reward` at each step.
fn rewards(run_dir: &Path) -> Vec<f64> {
    read_jsonl(&run_dir.join("metrics.jsonl")).iter().filter_map(|m| m.get("train/reward").and_then(|r| r.as_f64())).collect()
}

#[test]
fn the_mean_reward_rises_on_a_toy_task() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path());
    // Start the completion with a word from a to m: about half of them at first.
    let sets = [
        "data.batch_size=32",
        "grpo.num_generations=8",
        "grpo.max_completion_length=3",
        "grpo.rewards=[{name = \"a_to_m\", kind = \"regex\", pattern = '^\\s*[a-m]'}]",
        "optim.lr=0.01",
        "train.steps=24",
        "grpo.log_completions_every=0",
    ];
    let run_dir = run(&d, "toy", &sets);
    let r = rewards(&run_dir);
    assert_eq!(r.len(), 24, "{r:?}");
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (first, last) = (mean(&r[..4]), mean(&r[20..]));
    assert!(last > first + 0.3, "the mean reward rises: {first} -> {last} ({r:?})");
    let metrics = read_jsonl(&run_dir.join("metrics.jsonl"));
    assert!(metrics[0]["train/timing/sampling_s"].as_f64().unwrap() > 0.0, "{}", metrics[0]);
    assert!(metrics[0]["train/rewards/a_to_m/mean"].is_number(), "{}", metrics[0]);
}

#[test]
fn a_generations_iterations_train_on_the_completions_sampled_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path());
    let sets = [&ALL_ONCE[..], &["grpo.num_iterations=2", "train.steps=4", "optim.lr=0.01", "grpo.max_completion_length=6"]].concat();
    let run_dir = run(&d, "iterations", &sets);
    let steps: Vec<u64> = read_jsonl(&run_dir.join("completions.jsonl")).iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps.iter().filter(|&&s| s == 1).count(), 12);
    assert_eq!(steps.iter().filter(|&&s| s == 3).count(), 12);
    assert_eq!(steps.len(), 24, "sampled at steps 1 and 3 only: {steps:?}");
    let m = read_jsonl(&run_dir.join("metrics.jsonl"));
    let at = |step: usize, k: &str| m[step - 1][k].as_f64().unwrap();
    assert_eq!(at(1, "train/reward"), at(2, "train/reward"), "step 2 trains on step 1's completions");
    assert_eq!(at(1, "train/completions/mean_length"), at(2, "train/completions/mean_length"));
    assert!(at(2, "train/clip_ratio/region_mean") >= 0.0 && at(1, "train/clip_ratio/region_mean") == 0.0, "on-policy at step 1");
}

#[test]
fn bad_prompt_rows_and_settings_exit_2_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path());
    let good = std::fs::read_to_string(d.join("prompts.jsonl")).unwrap().lines().next().unwrap().to_string();
    let long = format!(r#"{{"prompt": "{}"}}"#, "the cat sat ".repeat(100));
    for (what, line, says) in
        [("no prompt", r#"{"question": "why"}"#.to_string(), "needs a `prompt`"), ("too long", long, "grpo.max_completion_length")]
    {
        let file = d.join(format!("{}.jsonl", what.replace(' ', "-")));
        std::fs::write(&file, format!("{good}\n{line}\n")).unwrap();
        let out = run_expect(ptrain().args(["run", "--quiet", "--run-dir"]).arg(d.join("never")).args(args(&d, &file, &ALL_ONCE)), 2);
        let err = stderr(&out);
        assert!(err.contains(&*file.to_string_lossy()) && err.contains("line 2") && err.contains(says), "{what}: {err}");
    }
    let refused = [
        ("data.batch_size=7", "multiple of grpo.num_generations"),
        ("grpo.rewards=[{name = \"r\"}]", "needs a kind"),
        ("grpo.rewards=[{name = \"r\", kind = \"regex\", pattern = \"(\"}]", "grpo.rewards.pattern"),
        ("grpo.top_p=0", "grpo.top_p"),
    ];
    for (set, says) in refused {
        let out = run_expect(
            ptrain().args(["run", "--quiet", "--run-dir"]).arg(d.join("never")).args(args(
                &d,
                &d.join("prompts.jsonl"),
                &[&ALL_ONCE[..], &[set]].concat(),
            )),
            2,
        );
        assert!(stderr(&out).contains(says), "{set}: {}", stderr(&out));
    }
}
