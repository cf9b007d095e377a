//! GRPO's rewards beyond the built-in ones, through the built binary on sampled
//! completions (`data.kind = "prompts"`, the tiny Qwen2 and prompts of
//! tests/support/grpo_sampling.py): a `kind = "command"` reward (a Python script,
//! tests/support/reward_cmd.py, kept running for the run) scores as the built-in reward
//! of the same rule on the same completions and gets TRL's columns (and the run's
//! seconds sampling and learning add up in summary.json); a command that
//! cannot start exits 2 before training; one that dies, hangs, or answers a wrong count
//! or a word fails the run (exit 1, summary.json naming the reward and what happened).

mod common;

use std::path::{Path, PathBuf};

use common::{hf::s, *};

/// The fixture's policy and prompts (shared, read only).
fn made() -> PathBuf {
    fixture::shared("grpo_sampling.py", &["make", fixture::OUT, "5"])
}

/// `reward_cmd.py ARGS` as a TOML array, run by the suite's Python.
fn command(args: &[&str]) -> String {
    let python = std::env::var_os("PTRAIN_PYTHON").map(PathBuf::from).unwrap_or_else(|| repo().join(".venv/bin/python"));
    let script = repo().join("tests/support/reward_cmd.py");
    let argv: Vec<String> = [s(&python), s(&script)].into_iter().chain(args.iter().map(|a| a.to_string())).map(|a| format!("'{a}'")).collect();
    format!("[{}]", argv.join(", "))
}

/// A one-thread GRPO run on the fixture's six prompts (each twice, one micro-batch a
/// step) for `steps` steps, scored by `rewards` (a TOML array of tables).
fn run(d: &Path, run_dir: &Path, steps: u32, rewards: &str) -> std::process::Command {
    let mut cmd = ptrain();
    cmd.args(["run", "--quiet", "--device", "cpu", "--plugins", "jsonl", "--run-dir"]).arg(run_dir);
    let sets = [
        "run.threads=1".to_string(),
        "model.kind=llama".into(),
        format!("model.init_from={}", s(&d.join("policy"))),
        "data.kind=prompts".into(),
        format!("data.path={}", s(&d.join("prompts.jsonl"))),
        "data.val_fraction=0".into(),
        "data.batch_size=12".into(),
        "grpo.num_generations=2".into(),
        "grpo.max_completion_length=8".into(),
        "grpo.log_completions_every=1".into(),
        "plugins.jsonl.every=1".into(),
        format!("train.steps={steps}"),
        format!("grpo.rewards={rewards}"),
    ];
    for set in sets {
        cmd.args(["--set", &set]);
    }
    cmd
}

#[test]
fn a_command_reward_scores_as_the_built_in_reward_of_its_rule() {
    let dir = tempfile::tempdir().unwrap();
    let (d, run_dir, log) = (made(), dir.path().join("run"), dir.path().join("requests.jsonl"));
    let rewards = format!(
        "[{{name = \"len\", kind = \"length\", target = 5}}, {{name = \"cmd_len\", kind = \"command\", command = {}}}, \
         {{name = \"answer\", kind = \"exact\"}}, {{name = \"cmd_answer\", kind = \"command\", command = {}, timeout_s = 30}}]",
        command(&["length", "5"]),
        command(&["column", "answer"]),
    );
    let out = run_expect(run(&d, &run_dir, 2, &rewards).env("REWARD_LOG", &log), 0);
    // Each command started once for the run; its stderr is ptrain's.
    assert_eq!(stderr(&out).matches("reward_cmd.py length started").count(), 1, "{}", stderr(&out));
    let records = read_jsonl(&run_dir.join("completions.jsonl"));
    assert_eq!(records.len(), 24, "12 completions at each of 2 steps");
    for r in &records {
        let rewards = &r["rewards"];
        assert!(rewards["len"].is_number(), "{r}");
        assert_eq!(rewards["cmd_len"], rewards["len"], "{r}");
        assert_eq!(rewards["cmd_answer"], rewards["answer"], "{r}");
    }
    let metrics = read_jsonl(&run_dir.join("metrics.jsonl"));
    assert_eq!(metrics.len(), 2);
    for m in &metrics {
        assert_eq!(m["train/rewards/cmd_len/mean"], m["train/rewards/len/mean"], "{m}");
        let (sampling, scoring) = (m["train/timing/sampling_s"].as_f64().unwrap(), m["train/timing/rewards_s"].as_f64().unwrap());
        assert!(scoring >= 0.0 && scoring <= sampling, "the scoring is a part of the rollout stage: {m}");
    }
    // The run's seconds sampling and learning: the steps' metrics summed, and learning
    // the step's core at least (its forward, backward and update).
    let summary = summary(&run_dir);
    let total = |key: &str| metrics.iter().map(|m| m[key].as_f64().unwrap()).sum::<f64>();
    let (sampling, learning) = (summary["sampling_s"].as_f64().unwrap(), summary["learning_s"].as_f64().unwrap());
    assert!((sampling - total("train/timing/sampling_s")).abs() < 1e-3, "{summary}");
    assert!((learning - total("train/timing/learning_s")).abs() < 1e-6, "{summary}");
    let p = &summary["phase_times"];
    let core: f64 = ["forward_s", "backward_s", "optimizer_s"].iter().map(|k| p[k].as_f64().unwrap()).sum();
    assert!(learning >= core - 1e-6 && core > 0.0, "learning {learning} s, the core {core} s: {summary}");
    assert!(sampling > 0.0 && sampling <= p["data_s"].as_f64().unwrap() + 1e-6, "sampling is in the data phase: {summary}");
    let steps: f64 = ["data_s", "forward_s", "backward_s", "optimizer_s", "hooks_s"].iter().map(|k| p[k].as_f64().unwrap()).sum();
    assert!((sampling + learning - steps).abs() < 1e-6, "the steps' seconds, split: {summary}");
    // The requests, one line a micro-batch (both commands log to the same file), as
    // TRL's reward functions get their arguments: one entry per completion.
    let requests = read_jsonl(&log);
    assert_eq!(requests.len(), 4, "2 commands x 2 steps");
    let first = &requests[0];
    assert_eq!(first["step"], 1);
    for key in ["prompts", "completions", "completion_ids"] {
        assert_eq!(first[key].as_array().unwrap().len(), 12, "{key}: {first}");
    }
    assert_eq!(first["columns"]["answer"].as_array().unwrap().len(), 12, "{first}");
    assert!(first["columns"].get("prompt").is_none(), "the prompt is `prompts`, not a column");
    let chat = first["prompts"].as_array().unwrap().iter().position(|p| p.is_array()).expect("a message-list prompt");
    assert_eq!(first["completions"][chat][0]["role"], "assistant", "TRL's conversational completion: {first}");
    let text = first["prompts"].as_array().unwrap().iter().position(|p| p.is_string()).expect("a text prompt");
    assert!(first["completions"][text].is_string());
}

#[test]
fn a_command_that_cannot_start_exits_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let d = made();
    let not_executable = dir.path().join("reward.sh");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    let cases = [
        (format!("['{}']", s(&dir.path().join("missing"))), "does not exist"),
        (format!("['{}']", s(&not_executable)), "is not an executable file"),
        ("['no-such-reward-program-on-path']".to_string(), "is not found on PATH"),
        ("[]".to_string(), "needs its program"),
    ];
    for (i, (argv, says)) in cases.into_iter().enumerate() {
        let run_dir = dir.path().join(format!("never-{i}"));
        let rewards = format!("[{{name = \"judge\", kind = \"command\", command = {argv}}}]");
        let out = run_expect(&mut run(&d, &run_dir, 1, &rewards), 2);
        let err = stderr(&out);
        assert!(err.contains("grpo.rewards.command") && err.contains("judge") && err.contains(says), "{argv}: {err}");
        assert!(!run_dir.exists(), "{argv}: refused with the configuration, before the run directory is claimed");
    }
}

#[test]
fn a_command_that_dies_hangs_or_answers_wrong_fails_the_run_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = made();
    // Each answers step 1's request, then misbehaves on step 2's. The last hangs behind a
    // shell that does not exec it: the hung grandchild holds the output open, so ending
    // the run must stop the command's whole process group, not only the shell.
    let (python, script) =
        (std::env::var("PTRAIN_PYTHON").unwrap_or_else(|_| s(&repo().join(".venv/bin/python"))), s(&repo().join("tests/support/reward_cmd.py")));
    let behind_shell = format!("['sh', '-c', \"'{python}' '{script}' hang; exit 0\"]");
    let cases = [
        ("die", command(&["die"]), "the process ended (exit status: 3)"),
        ("hang", command(&["hang"]), "no answer within timeout_s = 2 s"),
        ("count", command(&["count"]), "13 scores for 12 completions"),
        ("word", command(&["word"]), "score 0 is \"good\", not a number or null"),
        ("hang-behind-a-shell", behind_shell, "no answer within timeout_s = 2 s"),
    ];
    for (mode, argv, says) in cases {
        let run_dir = dir.path().join(mode);
        let rewards = format!("[{{name = \"judge\", kind = \"command\", command = {argv}, timeout_s = 2}}]");
        let out = run_expect(&mut run(&d, &run_dir, 3, &rewards), 1);
        let summary = summary(&run_dir);
        assert_eq!(summary["status"], "failed", "{mode}: {summary}");
        let message = summary["error"]["message"].as_str().unwrap();
        assert!(message.contains("[[grpo.rewards]] \"judge\"") && message.contains(says), "{mode}: {message}");
        assert_eq!(summary["error"]["step"], 2, "{mode}: {summary}");
        assert!(stderr(&out).contains(says), "{mode}: {}", stderr(&out));
    }
}
