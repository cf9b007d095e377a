//! The run directory as the user's record (issue 30, items 1, 2, 3, 8), through the
//! built binary: one run at a time, no silent restart over earlier checkpoints,
//! every part of a resumed run in summary.json, another model size refused first.

mod common;

use std::{
    path::Path,
    process::{Command, Stdio},
};

use common::*;

fn with_checkpoints(steps: u64) -> Vec<String> {
    let mut args = tiny_gpt(steps);
    args.extend(["--plugins", "checkpoint", "--set", "plugins.checkpoint.every=2"].map(String::from));
    args
}

fn run_in(args: &[String], run_dir: &Path) -> Command {
    let mut cmd = ptrain();
    cmd.args(args).arg("--run-dir").arg(run_dir);
    cmd
}

#[test]
fn two_runs_into_one_directory_at_once_the_second_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    // The first run holds the directory for a while: many small steps.
    let mut first = run_in(&with_checkpoints(400), &run_dir).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let lock = run_dir.join("ptrain.lock");
    while !lock.exists() {
        assert!(first.try_wait().unwrap().is_none(), "the first run ended before taking the lock");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let second = run_in(&with_checkpoints(2), &run_dir).arg("--seed").arg("7").output().unwrap();
    let holder = first.id();
    let still_running = first.try_wait().unwrap().is_none();
    let _ = first.kill();
    let _ = first.wait();
    assert!(still_running, "the first run was to hold the lock while the second started");
    assert_eq!(second.status.code(), Some(2), "{}", stderr(&second));
    let err = stderr(&second);
    assert!(err.contains(&format!("in use by pid {holder} on host")) && err.contains("ptrain.lock"), "{err}");
    assert!(!run_dir.join("summary.json").exists() || summary(&run_dir)["steps"] != 2, "the second run wrote nothing");
}

#[test]
fn a_lock_is_released_on_success_failure_and_refusal_and_a_dead_holders_lock_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    run_expect(&mut run_in(&tiny_gpt(2), &run_dir), 0);
    assert!(!run_dir.join("ptrain.lock").exists(), "released after a completed run");
    // A failed run (an injected panic in the data worker) releases it too.
    run_expect(run_in(&tiny_gpt(4), &dir.path().join("failed")).args(["--set", "debug.data_panic_at_step=2"]), 1);
    assert!(!dir.path().join("failed/ptrain.lock").exists(), "released after a failed run");
    // A lock left by a process of this host that no longer exists.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    let stale = dir.path().join("stale");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("ptrain.lock"), format!("pid = 4999999\nhost = \"{host}\"\n")).unwrap();
    let out = run_expect(run_in(&tiny_gpt(2), &stale).env("PTRAIN_LOG", "warn"), 0);
    assert!(stderr(&out).contains("taking over the stale lock") && stderr(&out).contains("4999999"), "{}", stderr(&out));
    assert!(!stale.join("ptrain.lock").exists());
}

#[test]
fn a_run_into_a_directory_with_checkpoints_is_refused_unless_it_resumes_or_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    run_expect(&mut run_in(&with_checkpoints(4), &run_dir), 0);
    let refused = run_expect(&mut run_in(&with_checkpoints(2), &run_dir), 2);
    let err = stderr(&refused);
    assert!(err.contains("holds checkpoints") && err.contains("step 4") && err.contains("--auto-resume") && err.contains("--overwrite"), "{err}");
    assert_eq!(summary(&run_dir)["last_step"], 4, "the refused run touched nothing");

    // --overwrite moves the old run aside and says where.
    let out = run_expect(run_in(&with_checkpoints(2), &run_dir).arg("--overwrite"), 0);
    let aside: Vec<_> = std::fs::read_dir(dir.path()).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p != &run_dir).collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(aside[0].file_name().unwrap().to_str().unwrap().starts_with("run.old-"));
    assert!(stderr(&out).contains(&aside[0].display().to_string()), "{}", stderr(&out));
    assert!(aside[0].join("checkpoints/step-00000004").is_dir() && aside[0].join("summary.json").is_file());
    assert_eq!(summary(&run_dir)["last_step"], 2);

    // One rule for "latest": list, verify, --auto-resume and export agree.
    let list = stdout(&run_expect(ptrain().args(["checkpoints", "list"]).arg(&run_dir), 0));
    let latest_line = list.lines().find(|l| l.contains("<- latest")).unwrap_or_else(|| panic!("{list}"));
    assert!(latest_line.contains("step-00000002"), "{list}");
    let verify = stdout(&run_expect(ptrain().args(["checkpoints", "verify"]).arg(&run_dir), 0));
    assert!(verify.trim().ends_with("step-00000002"), "{verify}");
    assert_eq!(std::fs::read_to_string(run_dir.join("checkpoints/latest")).unwrap().trim(), "step-00000002");
}

#[test]
fn a_resumed_run_keeps_every_part_in_its_summary() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let mut first = with_checkpoints(4);
    first.extend(["--set", "train.eval_every=2"].map(String::from));
    run_expect(&mut run_in(&first, &run_dir), 0);
    let mut second = with_checkpoints(8);
    second.extend(["--set", "train.eval_every=2", "--auto-resume"].map(String::from));
    run_expect(&mut run_in(&second, &run_dir), 0);
    let s = summary(&run_dir);
    let parts = s["parts"].as_array().unwrap_or_else(|| panic!("{s}"));
    assert_eq!(parts.len(), 2, "{s}");
    assert_eq!((parts[0]["start_step"].as_u64(), parts[0]["last_step"].as_u64()), (Some(0), Some(4)));
    assert_eq!((parts[1]["start_step"].as_u64(), parts[1]["last_step"].as_u64()), (Some(4), Some(8)));
    for part in parts {
        assert_eq!(part["status"], "completed");
        assert!(part["wall_s"].as_f64().unwrap() > 0.0 && part["first_loss"].is_number());
    }
    assert_eq!(parts[0]["evals"].as_array().unwrap().len(), 2, "the first part's evaluations are kept");
    assert_eq!(parts[1]["resumed_from"].as_str().map(|p| p.ends_with("step-00000004")), Some(true));
}

#[test]
fn resuming_with_another_model_size_names_the_key_that_differs() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    run_expect(run_in(&with_checkpoints(2), &run_dir).args(["--set", "model.n_layer=2"]), 0);
    for (key, was, now) in [("model.n_layer", "2", "1"), ("model.n_embd", "32", "16")] {
        let mut args = with_checkpoints(4);
        args.extend(["--set".to_string(), format!("{key}={now}"), "--auto-resume".into()]);
        if key != "model.n_layer" {
            args.extend(["--set", "model.n_layer=2"].map(String::from));
        }
        let out = run_expect(&mut run_in(&args, &run_dir), 2);
        let err = stderr(&out);
        assert!(err.contains(&format!("{key}: checkpoint {was}, configuration {now}")), "{err}");
    }
    // A gpt checkpoint resumed as a llama: the kinds are named, not the first size that differs.
    let mut args = with_checkpoints(4);
    args.extend(["--set", "model.kind=\"llama\"", "--set", "model.n_layer=2", "--auto-resume"].map(String::from));
    let err = stderr(&run_expect(&mut run_in(&args, &run_dir), 2));
    assert!(err.contains("model.kind: checkpoint \"gpt\", configuration \"llama\""), "{err}");
}

#[test]
fn ctrl_c_prints_the_checkpoint_and_the_command_that_resumes_each_on_its_own_line() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let mut args = tiny_gpt(100_000);
    args.extend(["--plugins", "checkpoint,jsonl", "--set", "plugins.jsonl.every=1"].map(String::from));
    let child = run_in(&args, &run_dir).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let metrics = run_dir.join("metrics.jsonl");
    while std::fs::read_to_string(&metrics).map_or(0, |t| t.lines().count()) < 3 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(stderr(&out).lines().any(|l| l.starts_with("received signal 2: ")), "{}", stderr(&out));
    let last = summary(&run_dir)["last_step"].as_u64().unwrap();
    let text = stdout(&out);
    let checkpoint = run_dir.join(format!("checkpoints/step-{last:08}"));
    assert!(text.lines().any(|l| l == format!("checkpoint: {}", checkpoint.display())), "{text}");
    let resume = text.lines().find_map(|l| l.strip_prefix("resume: ptrain ")).unwrap_or_else(|| panic!("{text}"));
    assert_eq!(resume, format!("run --run-dir {} --auto-resume", run_dir.display()));
    run_expect(ptrain().args(resume.split(' ')).args(["--quiet", "--steps", &(last + 2).to_string()]), 0);
    assert_eq!((summary(&run_dir)["start_step"].as_u64(), summary(&run_dir)["last_step"].as_u64()), (Some(last), Some(last + 2)));
}

#[test]
fn a_run_directory_or_summary_that_cannot_be_written_is_named_as_a_write() {
    let dir = tempfile::tempdir().unwrap();
    // A run directory under a regular file cannot be created.
    let file = dir.path().join("file");
    std::fs::write(&file, "not a directory").unwrap();
    let out = run_in(&tiny_gpt(1), &file.join("run")).output().unwrap();
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains(&format!("cannot write {}", file.join("run").display())), "{err}");
    // summary.json in the way as a directory: the run trains, then cannot write it.
    let run_dir = dir.path().join("run");
    std::fs::create_dir_all(run_dir.join("summary.json").join("in-the-way")).unwrap();
    let out = run_in(&tiny_gpt(1), &run_dir).output().unwrap();
    let err = stderr(&out);
    assert!(err.contains(&format!("cannot write {}", run_dir.join("summary.json").display())), "{err}");
    assert!(!err.contains("cannot read"), "{err}");
}

#[test]
fn a_second_fresh_run_into_a_directory_with_an_earlier_runs_records_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let mut args = tiny_gpt(4);
    args.extend(["--plugins", "jsonl", "--set", "plugins.jsonl.every=2"].map(String::from));
    run_expect(&mut run_in(&args, &run_dir), 0);
    let rows = read_jsonl(&run_dir.join("metrics.jsonl")).len();
    // No checkpoint, but the first run's metrics and summary: refused, nothing touched.
    let err = stderr(&run_expect(&mut run_in(&args, &run_dir), 2));
    assert!(err.contains("earlier run's records") && err.contains("metrics.jsonl") && err.contains("summary.json"), "{err}");
    assert!(err.contains("--overwrite") && err.contains("--auto-resume"), "{err}");
    assert_eq!(read_jsonl(&run_dir.join("metrics.jsonl")).len(), rows, "the refused run wrote no metrics");
    // --overwrite moves them aside; --auto-resume (no checkpoint) trains beside them.
    run_expect(run_in(&args, &run_dir).arg("--overwrite"), 0);
    assert_eq!(read_jsonl(&run_dir.join("metrics.jsonl")).len(), rows, "a fresh metrics.jsonl");
    run_expect(run_in(&args, &run_dir).arg("--auto-resume"), 0);
}

#[test]
fn resuming_a_finished_run_with_fewer_steps_says_it_is_already_past_them() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    run_expect(&mut run_in(&with_checkpoints(6), &run_dir), 0);
    let mut args = with_checkpoints(2);
    args.push("--auto-resume".into());
    let out = stdout(&run_expect(&mut run_in(&args, &run_dir), 0));
    let line = out.lines().next().unwrap_or_default();
    assert!(line.contains("nothing to train") && line.contains("already at step 6, past train.steps = 2") && line.contains("--steps 8"), "{out}");
}
