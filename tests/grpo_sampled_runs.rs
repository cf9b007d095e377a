//! GRPO that samples its completions (`data.kind = "prompts"`) under what ptrain already
//! runs, through the built binary: two Gloo ranks (each samples whole groups of its share
//! of the prompts), ZeRO-1/2/3 following the unsharded run, LoRA (sampling with the
//! adapters on, the reference with them off), bf16 (sampling under autocast, its
//! log-probabilities judged by transformers under autocast), and an interrupted run
//! resumed into the same completions, rewards and losses. ZeRO-3 too. The
//! suite's tiny random Qwen2 and six prompts (tests/support/grpo_sampling.py).

mod common;

use std::path::{Path, PathBuf};

use common::{
    hf::{s, support_py},
    ranks::launch,
    *,
};
use serde_json::Value;

fn made(dir: &Path) -> PathBuf {
    fixture::copy("grpo_sampling.py", &["make", fixture::OUT, "5"], dir)
}

/// A one-thread CPU GRPO run's arguments on `d`'s prompts, with `extra`.
fn args(d: &Path, extra: &[&str]) -> Vec<String> {
    args_with_plugins(d, "jsonl", extra)
}

fn args_with_plugins(d: &Path, plugins: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["--device", "cpu", "--plugins", plugins].map(String::from).into();
    let sets = [
        "optim.schedule=constant".to_string(),
        "optim.warmup_steps=0".into(),
        "optim.weight_decay=0.0".into(),
        "optim.lr=0.01".into(),
        "plugins.jsonl.every=1".into(),
        "grpo.log_completions_every=1".into(),
        "grpo.num_generations=4".into(),
        "grpo.max_completion_length=6".into(),
        "grpo.rewards=[{name = \"len\", kind = \"length\", target = 4}, {name = \"a_to_m\", kind = \"regex\", pattern = '^\\s*[a-m]', weight = 0.5}]"
            .into(),
    ];
    for set in grpo::sampling_on(d).iter().chain(&sets).map(String::as_str).chain(extra.iter().copied()) {
        a.extend(["--set".to_string(), set.to_string()]);
    }
    a
}

fn run(d: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let run_dir = d.join(name);
    run_expect(ptrain().args(["run", "--quiet", "--run-dir"]).arg(&run_dir).args(args(d, extra)), 0);
    run_dir
}

fn run_on_two_ranks(d: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let run_dir = d.join(name);
    run_expect(launch(2).args(["run", "--quiet", "--run-dir"]).arg(&run_dir).args(args(d, extra)), 0);
    run_dir
}

fn completions(run_dir: &Path) -> Vec<Value> {
    read_jsonl(&run_dir.join("completions.jsonl"))
}

/// Each step's metric `key`.
fn metric(run_dir: &Path, key: &str) -> Vec<f64> {
    read_jsonl(&run_dir.join("metrics.jsonl")).iter().filter_map(|m| m.get(key).and_then(Value::as_f64)).collect()
}

/// The weighted reward of a record (both rewards above are always given).
fn reward(r: &Value) -> f64 {
    r["rewards"]["len"].as_f64().unwrap() + 0.5 * r["rewards"]["a_to_m"].as_f64().unwrap()
}

/// Asserts that `records` (one step's, one rank's) hold whole groups of `g` completions
/// of each prompt, each advantage its reward's distance from its group's mean over the
/// group's standard deviation (+1e-4), as TRL's `scale_rewards = "group"`; returns how
/// many prompts there were.
fn assert_whole_groups_centred(records: &[&Value], g: usize) -> usize {
    let mut groups: std::collections::BTreeMap<&str, Vec<&Value>> = Default::default();
    for r in records {
        groups.entry(r["prompt"].as_str().unwrap()).or_default().push(r);
    }
    for (prompt, group) in &groups {
        assert_eq!(group.len(), g, "{prompt}: every completion of the group on this rank");
        let rewards: Vec<f64> = group.iter().map(|r| reward(r)).collect();
        let mean = rewards.iter().sum::<f64>() / g as f64;
        let std = (rewards.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (g - 1) as f64).sqrt();
        for (r, x) in group.iter().zip(&rewards) {
            let expected = (x - mean) / (std + 1e-4);
            assert!((r["advantage"].as_f64().unwrap() - expected).abs() < 1e-5, "{prompt}: {r} (expected {expected})");
        }
    }
    groups.len()
}

#[test]
fn two_ranks_sample_whole_groups_of_their_share_and_report_the_whole_batchs_rewards() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path());
    // Six prompts, four completions each: one rank's batch of 24, or two ranks' of 12.
    let one = run(&d, "one", &["data.batch_size=24", "train.steps=2", "grpo.top_k=1"]);
    let two = run_on_two_ranks(&d, "two", &["data.batch_size=12", "train.steps=2", "grpo.top_k=1"]);
    assert_eq!(summary(&two)["world_size"], 2);
    // Greedy: each rank's completions are the one-rank run's for the same prompts, and
    // completions.jsonl holds both ranks' (gathered to rank 0), rank 0's groups first.
    let theirs = completions(&one);
    let ours = completions(&two);
    let at_step_1: Vec<&Value> = ours.iter().filter(|r| r["step"] == 1).collect();
    let ranks: Vec<u64> = at_step_1.iter().map(|r| r["rank"].as_u64().expect("each row's rank")).collect();
    assert_eq!(ranks, [[0; 12], [1; 12]].concat(), "the whole batch, in rank order");
    for r in &at_step_1 {
        let same = theirs.iter().find(|t| t["step"] == 1 && t["prompt"] == r["prompt"]).expect("a prompt of the one-rank run's step");
        assert_eq!((&r["completion_ids"], &r["rewards"], &r["advantage"]), (&same["completion_ids"], &same["rewards"], &same["advantage"]));
    }
    // The step's reward statistics are the whole batch's, both ranks' groups together.
    for key in ["train/reward", "train/completions/mean_length", "train/rewards/len/mean"] {
        let (a, b) = (metric(&one, key), metric(&two, key));
        assert_eq!(a.len(), 2, "{key}");
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-5), "{key}: one rank {a:?}, two {b:?}");
    }
    // Sampled (temperature 1): every completion of the batch recorded, whole groups per
    // rank, advantages centred per group, and the rows' mean reward the step's reward:
    // under dapo, whose loss counts tokens, the reward is still a mean over completions,
    // as TRL's (it was weighted by each rank's tokens: -3.840 against the rows' -3.833).
    let sets = ["data.batch_size=12", "train.steps=2"];
    let sampled = run_on_two_ranks_with(&d, "sampled", "tensorboard,jsonl", &sets);
    let records = completions(&sampled);
    let step_rewards = metric(&sampled, "train/reward");
    for step in [1, 2] {
        let of_step: Vec<&Value> = records.iter().filter(|r| r["step"] == step).collect();
        let mean = of_step.iter().map(|r| reward(r)).sum::<f64>() / of_step.len() as f64;
        let expected = step_rewards[step as usize - 1];
        assert!((mean - expected).abs() < 1e-5, "step {step}: the rows' mean reward {mean}, train/reward {expected}");
        for rank in [0, 1] {
            let of_rank: Vec<&Value> = of_step.iter().copied().filter(|r| r["rank"] == rank).collect();
            assert_eq!(assert_whole_groups_centred(&of_rank, 4), 3, "step {step}, rank {rank}");
        }
        assert_eq!(of_step.len(), 24, "step {step}");
    }
    assert!(records.iter().any(|r| r["advantage"].as_f64().unwrap().abs() > 0.1), "groups whose rewards differ");
    // The sinks' `completions` table holds the same rows: TensorBoard's markdown table,
    // a header, a rule and a line per completion.
    let tables = tb_text(&sampled.join("tensorboard"), "completions");
    let lines: Vec<usize> = tables.iter().map(|t| t.lines().count()).collect();
    assert_eq!(lines, [2 + 24, 2 + 24], "one table a step, a row per completion of the batch");
}

#[test]
fn a_rank_that_fails_before_the_completions_gather_fails_the_run_and_rank_0_writes_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path());
    // Rank 1's reward command (tests/support/reward_cmd.py, as the launcher's RANK says)
    // answers step 1 and dies at step 2, where rank 0 scores and waits in the gather.
    let (python, script) =
        (std::env::var("PTRAIN_PYTHON").unwrap_or_else(|_| s(&repo().join(".venv/bin/python"))), s(&repo().join("tests/support/reward_cmd.py")));
    let shell = format!("if [ $RANK = 1 ]; then exec '{python}' '{script}' die; else exec '{python}' '{script}' length 5; fi");
    let rewards = format!("grpo.rewards=[{{name = \"judge\", kind = \"command\", command = ['sh', '-c', \"{shell}\"], timeout_s = 5}}]");
    let run_dir = d.join("failed");
    let sets = ["data.batch_size=12", "train.steps=3", "dist.timeout_s=10", rewards.as_str()];
    let out = run_expect(launch(2).args(["run", "--quiet", "--run-dir"]).arg(&run_dir).args(args(&d, &sets)), 1);
    let summary = summary(&run_dir);
    assert_eq!(summary["status"], "failed", "{summary}\n{}", stderr(&out));
    assert_eq!(summary["error"]["step"], 2, "{summary}");
    // Rank 0 stopped in the gather: rank 1's end closed the group (or, had it hung, the
    // group's dist.timeout_s would have ended the wait).
    let message = summary["error"]["message"].as_str().unwrap();
    assert!(message.contains("gathering the completions record") && message.contains("dist.timeout_s"), "{message}");
    assert!(stderr(&out).contains("\"judge\"") && stderr(&out).contains("exit status: 3"), "rank 1's cause: {}", stderr(&out));
    let steps: Vec<u64> = completions(&run_dir).iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [1; 24], "step 1's whole batch recorded, nothing of step 2's");
}

fn run_on_two_ranks_with(d: &Path, name: &str, plugins: &str, extra: &[&str]) -> PathBuf {
    let run_dir = d.join(name);
    run_expect(launch(2).args(["run", "--quiet", "--run-dir"]).arg(&run_dir).args(args_with_plugins(d, plugins, extra)), 0);
    run_dir
}

/// The text summaries named `tag` in TensorBoard's `logdir`, by step, as tensorboard's
/// own reader reads them (tests/support/tb_read.py).
fn tb_text(logdir: &Path, tag: &str) -> Vec<String> {
    let out = common::py::cmd().arg(repo().join("tests/support/tb_read.py")).arg(logdir).output().expect("run python");
    assert!(out.status.success(), "tb_read.py failed: {}", String::from_utf8_lossy(&out.stderr));
    let read: Value = serde_json::from_slice(&out.stdout).expect("tb_read.py prints JSON");
    read["text"][tag].as_array().unwrap_or_else(|| panic!("no {tag} in {read}")).iter().map(|p| p[1].as_str().unwrap().to_string()).collect()
}

#[test]
fn zero_1_2_and_3_sample_and_learn_as_the_unsharded_ranks_do() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path());
    let sets = ["data.batch_size=12", "train.steps=3"];
    let none = run_on_two_ranks(&d, "none", &sets);
    let (ids, losses) =
        (|r: &Path| completions(r).iter().map(|c| c["completion_ids"].clone()).collect::<Vec<_>>(), |r: &Path| metric(r, "train/loss"));
    // ZeRO-3 holds the whole model for the rollout stage: no rank's sampler waits on
    // another's gathers, whatever their completions' lengths.
    // The last: each group one sequence (data.packing), its blocks gathered once per forward.
    for (mode, packing) in [("optimizer", false), ("gradients", false), ("parameters", false), ("parameters", true)] {
        let shard = format!("dist.shard={mode}");
        let packed = format!("data.packing={packing}");
        let name = format!("{mode}{}", if packing { "-packed" } else { "" });
        let run_dir = run_on_two_ranks(&d, &name, &[&sets[..], &[shard.as_str(), packed.as_str()]].concat());
        assert_eq!(summary(&run_dir)["shard"], mode);
        assert_eq!(ids(&run_dir), ids(&none), "{name}: the same completions at every step (the same weights sample them)");
        let (a, b) = (losses(&run_dir), losses(&none));
        assert_eq!(a.len(), 3);
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-5 * y.abs().max(1e-3)), "{name}: {a:?} vs unsharded {b:?}");
    }
}

/// The suite's policy and prompts with the policy's EOS made likelier
/// (tests/support/grpo_early_eos.py): transformers' greedy completions of the 2nd, 4th
/// and 6th prompts are their EOS alone, the others' run past 16 tokens.
fn made_with_early_eos(dir: &Path) -> PathBuf {
    fixture::copy("grpo_early_eos.py", &["make", fixture::OUT, "5", "3.5"], dir)
}

#[test]
fn zero_3_ranks_that_decode_different_lengths_sample_and_learn_as_the_unsharded_ranks_do() {
    let dir = tempfile::tempdir().unwrap();
    let d = made_with_early_eos(dir.path());
    // One greedy group a rank a step (`data.batch_size` counts a rank's completions), up to
    // 16 tokens. The sampler reads whether its rows have all ended every 8 tokens
    // (`rollout::sampler::CHECK_EVERY`): a rank whose group ended by then stops after 8
    // forwards, one whose group runs on makes 16. Under ZeRO-3 without the whole model held,
    // the longer rank's per-block gathers would have no partner. Seed 3 deals a prompt that
    // ends at once and one that runs on to the two ranks at step 1, from the fixture's
    // weights.
    let sets = ["data.batch_size=4", "train.steps=3", "grpo.top_k=1", "grpo.max_completion_length=16", "run.seed=3"];
    let none = run_on_two_ranks(&d, "none", &sets);
    let zero_3 = run_on_two_ranks(&d, "zero_3", &[&sets[..], &["dist.shard=parameters"]].concat());
    assert_eq!(summary(&zero_3)["shard"], "parameters");
    // The premise: a step where one rank's group ended within 8 tokens and the other's did
    // not. Greedy, a group's completions are one completion four times; every rank's rows
    // are recorded, and the step's mean length is theirs.
    let records = completions(&zero_3);
    let mean = metric(&zero_3, "train/completions/mean_length");
    let mut lengths = Vec::new();
    for step in 1..=3 {
        let of_rank = |rank: u64| -> Vec<f64> {
            let rows = records.iter().filter(|r| r["step"] == step && r["rank"] == rank);
            rows.map(|r| r["completion_ids"].as_array().unwrap().len() as f64).collect()
        };
        let (rank_0, rank_1) = (of_rank(0), of_rank(1));
        for group in [&rank_0, &rank_1] {
            assert!(group.len() == 4 && group.iter().all(|&n| n == group[0]), "step {step}: greedy, one completion four times: {group:?}");
        }
        let both = (rank_0[0] + rank_1[0]) / 2.0;
        assert!((mean[step as usize - 1] - both).abs() < 1e-4, "step {step}: the mean length over completions: {mean:?} vs {both}");
        lengths.push((rank_0[0], rank_1[0]));
    }
    eprintln!("each step's completion lengths (rank 0, rank 1): {lengths:?}");
    assert!(lengths.iter().any(|&(a, b)| (a <= 8.0) != (b <= 8.0)), "a step where one rank decodes 8 tokens and the other 16: {lengths:?}");
    let ids = |r: &Path| completions(r).iter().map(|c| c["completion_ids"].clone()).collect::<Vec<_>>();
    assert_eq!(ids(&zero_3), ids(&none), "the same completions at every step (the same weights sample them)");
    let (a, b) = (metric(&zero_3, "train/loss"), metric(&none, "train/loss"));
    assert_eq!(a.len(), 3);
    assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-5 * y.abs().max(1e-3)), "{a:?} vs unsharded {b:?}");
}

#[test]
fn lora_samples_with_its_adapters_on_and_its_reference_is_them_off() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path());
    let sets = ["data.batch_size=24", "train.steps=4", "grpo.beta=0.1", "optim.lr=0.05", "lora.rank=4", "lora.alpha=8.0"];
    let run_dir = run(&d, "lora", &sets);
    assert!(summary(&run_dir)["trainable_parameters"].as_u64().unwrap() < 20_000, "only the adapters train");
    // Each sampled token's log-probability (temperature 1, nothing processed: the
    // policy's own) against the base model's, in transformers: equal at step 1 (the
    // adapters start at zero), apart at step 4, after three updates of the adapters.
    let base_diff = |step: u64| {
        let records: Vec<String> = completions(&run_dir).iter().filter(|r| r["step"] == step).map(Value::to_string).collect();
        let file = run_dir.join(format!("step-{step}.jsonl"));
        std::fs::write(&file, records.join("\n") + "\n").unwrap();
        let base = support_py("grpo_sampling.py", &[&"processed", &d.join("policy"), &file, &"{}"]);
        assert!(base["tokens"].as_u64().unwrap() as usize >= records.len(), "{base}");
        base["max_abs_diff"].as_f64().unwrap()
    };
    let (first, last) = (base_diff(1), base_diff(4));
    assert!(first < 1e-4, "step 1 samples from the base: {first}");
    assert!(last > 1e-2, "step 4 samples with the adapters on: {last}");
    let kl = metric(&run_dir, "train/kl");
    assert_eq!(kl[0], 0.0, "step 1: the adapters are zero, the policy is the reference: {kl:?}");
    assert!(kl[3] > 0.0, "the reference is the base, the adapters off: {kl:?}");
}

#[test]
fn bf16_samples_under_autocast_as_transformers_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path());
    let run_dir = run(&d, "bf16", &["data.batch_size=24", "train.steps=1", "train.precision=bf16"]);
    let records = run_dir.join("completions.jsonl");
    let judge = |settings: &str| support_py("grpo_sampling.py", &[&"processed", &d.join("policy"), &records, &settings]);
    let (fp32, bf16) = (judge("{}"), judge(r#"{"bf16": true}"#));
    assert!(bf16["tokens"].as_u64().unwrap() >= 24, "{bf16}");
    // Sampled in bf16: far from float32's log-probabilities (which agree to 1e-4 in fp32
    // runs, tests/grpo_sampling.rs), close to transformers' own under CPU bf16 autocast
    // (bf16 has 8 bits of mantissa; a cached decode and a whole forward round apart).
    let (far, near) = (fp32["max_abs_diff"].as_f64().unwrap(), bf16["max_abs_diff"].as_f64().unwrap());
    eprintln!("bf16 sampling against transformers: float32 {far}, bf16 autocast {near}");
    assert!(far > 1e-3, "bf16 ran: {fp32}");
    assert!(near < 0.05 && near < far, "{bf16} vs float32's {fp32}");
    assert!(metric(&run_dir, "train/loss")[0].is_finite());
}

#[test]
fn a_resumed_sampling_run_repeats_the_uninterrupted_completions_rewards_and_losses_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let d = made(dir.path());
    let sets = ["data.batch_size=8", "train.steps=4"];
    let with_checkpoints = |name: &str, more: &[&str]| {
        let run_dir = d.join(name);
        let mut cmd = ptrain();
        cmd.args(["run", "--quiet", "--run-dir"]).arg(&run_dir).args(args_with_plugins(&d, "checkpoint,jsonl", &sets)).args(more);
        run_expect(&mut cmd, 0);
        run_dir
    };
    let whole = with_checkpoints("whole", &[]);
    let parts = with_checkpoints("parts", &["--steps", "2"]);
    let resumed = with_checkpoints("resumed", &["--resume", &s(&parts)]);
    assert_eq!(summary(&resumed)["start_step"], 2);
    let records = |run_dir: &Path| completions(run_dir).into_iter().filter(|r| r["step"].as_u64().unwrap() > 2).collect::<Vec<_>>();
    assert_eq!(records(&whole).len(), 16, "steps 3 and 4, 8 completions each");
    assert_eq!(records(&resumed), records(&whole), "the same completions, log-probabilities, rewards and advantages");
    let bits = |run_dir: &Path| metric(run_dir, "train/loss").iter().map(|l| l.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&resumed), bits(&whole)[2..]);
    let rewards = |run_dir: &Path| metric(run_dir, "train/reward").iter().map(|l| l.to_bits()).collect::<Vec<_>>();
    assert_eq!(rewards(&resumed), rewards(&whole)[2..]);
}
