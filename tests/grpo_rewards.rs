//! GRPO's rewards beyond the built-in ones, through the built binary on sampled
//! completions (`data.kind = "prompts"`, the tiny Qwen2 and prompts of
//! tests/support/grpo_sampling.py): a `kind = "command"` reward (a Python script,
//! tests/support/reward_cmd.py, kept running for the run) scores as the built-in reward
//! of the same rule on the same completions and gets TRL's columns (and the run's
//! seconds sampling and learning add up in summary.json); a command that
//! cannot start exits 2 before training; one that dies, hangs, or answers a wrong count
//! or a word fails the run (exit 1, summary.json naming the reward and what happened).
//! A `kind = "plugin"` reward: the crate `ptrain plugins new NAME --reward` writes, built
//! as generated, scores as the built-in `length` reward; a reward plugin that errs,
//! panics, hangs or answers a wrong count (tests/fixtures/reward-faults) fails the run
//! the same way, critical or not; one naming no reward plugin exits 2.

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
    run_with(d, run_dir, steps, rewards, "jsonl")
}

/// [`run`] with `--plugins plugins`.
fn run_with(d: &Path, run_dir: &Path, steps: u32, rewards: &str, plugins: &str) -> std::process::Command {
    let mut cmd = ptrain();
    cmd.args(["run", "--quiet", "--device", "cpu", "--plugins", plugins, "--run-dir"]).arg(run_dir);
    let sets = [
        "data.batch_size=12".to_string(),
        "grpo.num_generations=2".into(),
        "grpo.max_completion_length=8".into(),
        "grpo.log_completions_every=1".into(),
        "plugins.jsonl.every=1".into(),
        format!("train.steps={steps}"),
        format!("grpo.rewards={rewards}"),
    ];
    for set in grpo::sampling_on(d).into_iter().chain(sets) {
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
        failed_at_step_2(&run_dir, &out, "[[grpo.rewards]] \"judge\"", says, mode);
    }
}

/// The summary of a run that failed at step 2 (`mode`'s), its error naming the reward
/// (`named`) and saying `says`, which stderr says too.
fn failed_at_step_2(run_dir: &Path, out: &std::process::Output, named: &str, says: &str, mode: &str) -> serde_json::Value {
    let summary = summary(run_dir);
    assert_eq!(summary["status"], "failed", "{mode}: {summary}");
    let message = summary["error"]["message"].as_str().unwrap();
    assert!(message.contains(named) && message.contains(says), "{mode}: {message}");
    assert_eq!(summary["error"]["step"], 2, "{mode}: {summary}");
    assert!(stderr(out).contains(says), "{mode}: {}", stderr(out));
    summary
}

/// The reward-faults fixture's library (tests/fixtures/reward-faults).
fn reward_faults() -> String {
    let path = build_dir().join("libptrain_fixture_reward_faults.so");
    assert!(path.exists(), "{} missing: build the workspace first", path.display());
    s(&path)
}

/// `cargo <args>` in `dir` as an author's shell runs it: without the variables cargo
/// set for this test (the scaffold's .cargo/config.toml is all the crate needs).
fn cargo(dir: &Path, args: &[&str]) -> String {
    let mut cmd = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if (key.starts_with("CARGO_") && key != "CARGO_HOME") || key.starts_with("__CARGO") || key.starts_with("RUSTC") || key == "RUSTFLAGS" {
            cmd.env_remove(&key);
        }
    }
    let out = cmd.args(args).current_dir(dir).output().expect("run cargo");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "cargo {args:?} in {} failed:\n{text}", dir.display());
    text
}

/// `ptrain plugins new NAME --reward` as generated, built and unit-tested, then named
/// by a `kind = "plugin"` reward (which loads it: no --plugins) in a GRPO run: it
/// scores every completion as the built-in `length` reward of the same target (TRL's
/// `reward_len`), in completions.jsonl and the step metrics, and its scores move the
/// run's reward (`train/reward` is the two functions' weighted sum).
#[test]
fn a_scaffolded_reward_plugin_scores_as_the_built_in_length_reward() {
    let dir = tempfile::tempdir().unwrap();
    let d = made();
    // A build cache kept between runs of the suite (a reward plugin links no libtorch:
    // its dependencies are compiled there once).
    let home = repo().join("target/tmp/reward-scaffold-home");
    let crate_dir = dir.path().join("len-reward");
    let out = run_expect(ptrain().env("PTRAIN_HOME", &home).args(["plugins", "new", "len-reward", "--reward", "--dir"]).arg(&crate_dir), 0);
    assert!(stdout(&out).contains("a GRPO reward"), "{}", stdout(&out));
    cargo(&crate_dir, &["build", "--release"]);
    let tests = cargo(&crate_dir, &["test", "--release"]);
    assert!(tests.contains("test result: ok. 2 passed"), "{tests}");
    let info = run_expect(ptrain().args(["plugins", "info"]).arg(crate_dir.join("target/release/libptrain_plugin_len_reward.so")), 0);
    assert!(stdout(&info).contains("reward: scores GRPO's completions"), "{}", stdout(&info));

    let run_dir = dir.path().join("run");
    let rewards =
        "[{name = \"len\", kind = \"length\", target = 20}, {name = \"plugin_len\", kind = \"plugin\", plugin = \"len-reward\", weight = 0.5}]";
    run_expect(run(&d, &run_dir, 2, rewards).env("PTRAIN_PLUGIN_PATH", crate_dir.join("target/release")), 0);
    let records = read_jsonl(&run_dir.join("completions.jsonl"));
    assert_eq!(records.len(), 24, "12 completions at each of 2 steps");
    for r in &records {
        assert!(r["rewards"]["len"].as_f64().is_some_and(|l| l <= 0.0), "{r}");
        assert_eq!(r["rewards"]["plugin_len"], r["rewards"]["len"], "{r}");
    }
    let metrics = read_jsonl(&run_dir.join("metrics.jsonl"));
    assert_eq!(metrics.len(), 2);
    for m in &metrics {
        let mean = |name: &str| m[format!("train/rewards/{name}/mean")].as_f64().unwrap();
        assert_eq!(mean("plugin_len"), mean("len"), "{m}");
        let reward = m["train/reward"].as_f64().unwrap();
        assert!(mean("len") < 0.0 && (reward - 1.5 * mean("len")).abs() < 1e-4, "weights 1 and 0.5: {m}");
    }
    let first = summary(&run_dir);
    let loaded: Vec<&str> = first["plugins_loaded"].as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(loaded.contains(&"len-reward"), "the reward loaded its plugin: {first}");
    assert_eq!(first["plugin_failures"], serde_json::json!([]), "{first}");

    // Named by `--plugins` and given by its path in the reward: one library, one plugin.
    let so = crate_dir.join("target/release/libptrain_plugin_len_reward.so");
    let by_path = format!("[{{name = \"plugin_len\", kind = \"plugin\", plugin = '{}'}}]", so.display());
    let both = dir.path().join("by-path");
    run_expect(run_with(&d, &both, 1, &by_path, "jsonl,len-reward").env("PTRAIN_PLUGIN_PATH", crate_dir.join("target/release")), 0);
    let loaded = summary(&both)["plugins_loaded"].as_array().unwrap().iter().filter(|p| p["name"] == "len-reward").count();
    assert_eq!(loaded, 1, "{}", summary(&both));
    assert_eq!(read_jsonl(&both.join("completions.jsonl")).len(), 12);
}

/// A reward plugin that returns an error, panics, hangs past `timeout_s` or answers a
/// wrong count fails the run at the step it fails (exit 1, summary.json naming the
/// reward, its plugin and what happened), critical or not: advantages without it would
/// be wrong. One that answers `None` for every completion is no failure (TRL's `None`).
#[test]
fn a_reward_plugin_that_fails_hangs_or_answers_wrong_fails_the_run_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = made();
    let plugin = reward_faults();
    let cases = [
        ("error", "failed: deliberate error at step 2"),
        ("panic", "failed: panicked at"),
        ("hang", "no answer within timeout_s = 2 s"),
        ("count", "13 scores for 12 completions"),
    ];
    for (mode, says) in cases {
        let run_dir = dir.path().join(mode);
        let rewards = format!("[{{name = \"judge\", kind = \"plugin\", plugin = '{plugin}', timeout_s = 2}}]");
        let sets = [format!("plugins.reward-faults.mode={mode}"), "plugins.reward-faults.finish_timeout_s=1".into()];
        let out = run_expect(run(&d, &run_dir, 3, &rewards).args(sets.iter().flat_map(|s| ["--set", s.as_str()])), 1);
        let summary = failed_at_step_2(&run_dir, &out, "[[grpo.rewards]] \"judge\" (plugin `", says, mode);
        if matches!(mode, "error" | "panic") {
            let failure = &summary["plugin_failures"][0];
            assert_eq!((failure["plugin"].as_str(), failure["hook"].as_str()), (Some("reward-faults"), Some("reward")), "{mode}: {summary}");
        }
    }
    // No reward for any completion: advantages 0, the run goes on.
    let run_dir = dir.path().join("none");
    let rewards = format!("[{{name = \"judge\", kind = \"plugin\", plugin = '{plugin}'}}]");
    run_expect(run(&d, &run_dir, 2, &rewards).args(["--set", "plugins.reward-faults.mode=none"]), 0);
    let records = read_jsonl(&run_dir.join("completions.jsonl"));
    assert!(records.iter().filter(|r| r["step"] == 2).all(|r| r["rewards"]["judge"].is_null()), "{records:?}");
    assert_eq!(summary(&run_dir)["plugins"]["reward-faults"]["batches"], 2);
}

/// `critical = true` on a reward plugin: the run it stops is the one its failure fails
/// already, at the same step (no step runs after it without the reward), recorded as
/// the critical plugin's failure in `plugin_failures`.
#[test]
fn a_critical_reward_plugin_that_fails_fails_the_run_at_that_step() {
    let dir = tempfile::tempdir().unwrap();
    let (d, run_dir, plugin) = (made(), dir.path().join("run"), reward_faults());
    let rewards = format!("[{{name = \"judge\", kind = \"plugin\", plugin = '{plugin}'}}]");
    let sets = ["plugins.reward-faults.mode=error", "plugins.reward-faults.critical=true"];
    run_expect(run(&d, &run_dir, 3, &rewards).args(sets.iter().flat_map(|s| ["--set", *s])), 1);
    let summary = summary(&run_dir);
    assert_eq!((summary["status"].as_str(), summary["exit_code"].as_i64()), (Some("failed"), Some(1)), "{summary}");
    assert_eq!((summary["error"]["step"].as_u64(), summary["last_step"].as_u64()), (Some(2), Some(1)), "{summary}");
    let loaded = summary["plugins_loaded"].as_array().unwrap().iter().find(|p| p["name"] == "reward-faults").cloned();
    assert_eq!(loaded.map(|p| p["critical"].clone()), Some(serde_json::json!(true)), "{summary}");
    let failure = &summary["plugin_failures"][0];
    assert_eq!(
        (failure["plugin"].as_str(), failure["hook"].as_str(), failure["step"].as_u64()),
        (Some("reward-faults"), Some("reward"), Some(2)),
        "{summary}"
    );
}

/// A `kind = "plugin"` reward without its plugin, or naming a plugin that scores no
/// rewards, exits 2 naming `grpo.rewards.plugin` before training.
#[test]
fn a_plugin_reward_without_a_reward_plugin_exits_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let d = made();
    let sink = s(&build_dir().join("libptrain_fixture_worker_faults.so"));
    let cases = [
        ("[{name = \"judge\", kind = \"plugin\"}]".to_string(), "names its plugin"),
        (format!("[{{name = \"judge\", kind = \"plugin\", plugin = '{sink}'}}]"), "scores no rewards"),
    ];
    for (i, (rewards, says)) in cases.into_iter().enumerate() {
        let run_dir = dir.path().join(format!("never-{i}"));
        let out = run_expect(&mut run(&d, &run_dir, 1, &rewards), 2);
        let err = stderr(&out);
        assert!(err.contains("grpo.rewards.plugin") && err.contains("judge") && err.contains(says), "{rewards}: {err}");
        assert!(!run_dir.join("config.toml").exists(), "{rewards}: refused before the run leaves a record");
    }
}
