//! Runs that fail, through the built binary: an injected libtorch error, an
//! allocation too large for the machine, a TorchScript model that raises, a data
//! worker that panics, a panic on the training thread. Each exits 1 (never 101),
//! writes `summary.json` with `status = "failed"` and the cause, leaves its sinks
//! holding every record up to the failing step and its newest checkpoint intact,
//! and `--auto-resume` continues from that checkpoint. And a closed stdout is a
//! quiet exit 0.

mod common;

use std::{
    path::Path,
    process::{Command, Stdio},
};

use common::*;
use serde_json::Value;

/// A tiny GPT run of `steps` saving every 2 steps, with jsonl and tensorboard at
/// every step.
fn gpt(steps: u64, dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = ptrain();
    cmd.args(tiny_gpt(steps))
        .args(["--plugins", "checkpoint,jsonl,tensorboard", "--set", "plugins.checkpoint.every=2", "--set", "plugins.jsonl.every=1"])
        .args(["--set", "plugins.tensorboard.every=1", "--set", "plugins.tensorboard.histograms.every=0"])
        .arg("--run-dir")
        .arg(dir)
        .args(extra);
    cmd
}

/// Runs `cmd`, expecting a failed run, and returns its summary's `error`.
fn fails(cmd: &mut Command, dir: &Path) -> (Value, String) {
    let out = run_expect(cmd, 1);
    let err = stderr(&out);
    assert!(!err.contains("panicked at"), "the default panic message reached the user:\n{err}");
    let s = summary(dir);
    assert_eq!(s["status"], "failed", "{s}");
    assert_eq!(s["exit_code"], 1, "{s}");
    assert!(stdout(&out).starts_with("failed: "), "{}", stdout(&out));
    (s["error"].clone(), err)
}

/// The steps the jsonl sink wrote, in order.
fn jsonl_steps(dir: &Path) -> Vec<u64> {
    read_jsonl(&dir.join("metrics.jsonl")).iter().filter(|r| r.get("train/loss").is_some()).filter_map(|r| r["step"].as_u64()).collect()
}

/// The newest checkpoint is `step` and valid, and `--auto-resume` (with `extra`,
/// which switches the fault off) trains on from it to the end.
fn resumes_from(step: u64, mut cmd: Command, dir: &Path) {
    let latest = std::fs::read_to_string(dir.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), format!("step-{step:08}"));
    run_expect(ptrain().args(["checkpoints", "verify"]).arg(dir), 0);
    run_expect(cmd.arg("--auto-resume"), 0);
    let s = summary(dir);
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["start_step"], step, "{s}");
}

#[test]
fn an_injected_libtorch_error_fails_the_run_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (error, _) = fails(&mut gpt(8, &run, &["--set", "debug.fail_at_step=5"]), &run);
    assert_eq!(error["kind"], "error", "{error}");
    assert_eq!(error["step"], 5, "{error}");
    assert!(error["message"].as_str().unwrap().contains("is invalid for input of size 2"), "{error}");
    assert!(!error["message"].as_str().unwrap().contains("frame #"), "libtorch's backtrace is cut: {error}");
    assert!(!error["message"].as_str().unwrap().contains("Internal torch error"), "libtorch's message as it is: {error}");
    let s = summary(&run);
    assert_eq!(s["last_step"], 4, "{s}");
    assert!(s["phase_times"]["forward_s"].as_f64().unwrap() > 0.0, "the phases so far: {s}");
    assert_eq!(s["plugins"]["jsonl"]["lines"], 4, "the sinks ended (RunEnd) and drained: {s}");
    assert_eq!(jsonl_steps(&run), vec![1, 2, 3, 4]);
    let tb = py::cmd().arg("tests/support/tb_read.py").arg(run.join("tensorboard")).output().unwrap();
    assert!(tb.status.success(), "{}", String::from_utf8_lossy(&tb.stderr));
    let tb: Value = serde_json::from_slice(&tb.stdout).unwrap();
    let tb_steps: Vec<u64> = tb["scalars"]["train/loss"].as_array().unwrap().iter().map(|p| p[0].as_u64().unwrap()).collect();
    assert_eq!(tb_steps, vec![1, 2, 3, 4], "tensorboard holds every record up to the failing step");
    resumes_from(4, gpt(8, &run, &[]), &run);
    assert_eq!(jsonl_steps(&run), (1..=8).collect::<Vec<_>>());
}

#[test]
fn out_of_memory_names_the_size_the_peak_and_the_knobs() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (error, err) = fails(&mut gpt(8, &run, &["--set", "debug.alloc_at_step=3"]), &run);
    assert_eq!(error["kind"], "out_of_memory", "{error}");
    let message = error["message"].as_str().unwrap();
    for part in ["tried to allocate 1048576.00 GiB (1125899906842624 bytes)", "peak", "data.batch_size", "optim.accum_steps", "train.precision"] {
        assert!(message.contains(part), "`{part}` missing: {message}");
    }
    assert!(err.contains("out of memory"), "the log says so: {err}");
    assert_eq!(jsonl_steps(&run), vec![1, 2]);
    resumes_from(2, gpt(8, &run, &[]), &run);
}

#[test]
fn a_torchscript_model_that_raises_fails_the_run_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("raising.pt");
    let status = py::cmd().arg("tests/support/make_torchscript.py").arg(&module).args(["32", "4", "5"]).status().unwrap();
    assert!(status.success());
    let run = dir.path().join("run");
    let cmd = |steps: &str| {
        let mut cmd = ptrain();
        cmd.args(["run", "--quiet", "--steps", steps, "--device", "cpu", "--config", "configs/mlp-multi.toml"])
            .args(["--set", "model.kind=\"torchscript\"", "--set", "run.threads=1", "--set", "train.eval_every=0"])
            .args(["--plugins", "checkpoint,jsonl,tensorboard", "--set", "plugins.checkpoint.every=2", "--set", "plugins.jsonl.every=1"])
            .args(["--set", "plugins.tensorboard.every=1", "--set"])
            .arg(format!("model.torchscript.path={:?}", module.display().to_string()))
            .arg("--run-dir")
            .arg(&run);
        cmd
    };
    let (error, _) = fails(&mut cmd("8"), &run);
    assert_eq!(error["step"], 5, "{error}");
    assert!(error["message"].as_str().unwrap().contains("the module raises in training forward pass 5"), "{error}");
    assert_eq!(jsonl_steps(&run), vec![1, 2, 3, 4]);
    let tb = py::cmd().arg("tests/support/tb_read.py").arg(run.join("tensorboard")).output().unwrap();
    let tb: Value = serde_json::from_slice(&tb.stdout).unwrap();
    assert_eq!(tb["scalars"]["train/loss"].as_array().unwrap().len(), 4, "{tb}");
    // The resumed run's module counts from 1 again: steps 5 to 8 are its calls 1 to 4.
    resumes_from(4, cmd("8"), &run);
}

#[test]
fn a_data_worker_that_panics_fails_the_run_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (error, err) = fails(&mut gpt(8, &run, &["--set", "data.num_workers=2", "--set", "debug.data_panic_at_step=5"]), &run);
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("data worker") && message.contains("step 5"), "{error}");
    assert!(message.contains("data_panic_at_step") && message.contains("debug.rs:"), "the panic's message and location: {error}");
    assert!(err.contains("debug.rs:"), "the panic's location is logged: {err}");
    assert_eq!(jsonl_steps(&run), vec![1, 2, 3, 4]);
    resumes_from(4, gpt(8, &run, &["--set", "data.num_workers=2"]), &run);
}

#[test]
fn a_panic_on_the_training_thread_fails_the_run_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // Without workers the loop draws its batches itself: the panic is its own.
    let (error, _) = fails(&mut gpt(6, &run, &["--set", "data.num_workers=0", "--set", "debug.data_panic_at_step=3"]), &run);
    assert_eq!(error["kind"], "panic", "{error}");
    assert_eq!(error["step"], 3, "{error}");
    assert!(error["location"].as_str().unwrap().contains("debug.rs:"), "{error}");
    assert_eq!(jsonl_steps(&run), vec![1, 2]);
    resumes_from(2, gpt(6, &run, &["--set", "data.num_workers=0"]), &run);
}

/// `ptrain plugins list | head -1`: the reader is gone before ptrain writes
/// (its end of the pipe is closed at once), so every write meets a broken pipe.
#[test]
fn a_closed_stdout_is_a_quiet_exit_0() {
    for args in [&["plugins", "list"][..], &["config", "--default"]] {
        let mut child = ptrain().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).is_empty(), "{args:?}: {}", stderr(&out));
    }
}

/// A checkpoint that does not fit the run is one mistake with one exit code (2,
/// refused before training), whether a tensor is missing or has the wrong shape.
#[test]
fn every_unusable_checkpoint_given_to_resume_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    run_expect(&mut gpt(2, &run, &[]), 0);
    let ckpt = run.join("checkpoints/step-00000002");
    // The saved configuration is compared first, naming the key (issue 30, item 8).
    for (change, says) in
        [("model.n_embd=64", "model.n_embd: checkpoint 32, configuration 64"), ("model.n_layer=5", "model.n_layer: checkpoint 2, configuration 5")]
    {
        let out =
            run_expect(ptrain().args(tiny_gpt(4)).args(["--set", change, "--resume"]).arg(&ckpt).arg("--run-dir").arg(dir.path().join(change)), 2);
        let err = stderr(&out);
        assert!(err.contains("checkpoint") && err.contains(says), "{change}: {err}");
    }
}

/// A data file truncated under a running job: the next batch that reads past its
/// new end is an error naming the file (a memory mapping would have been a SIGBUS).
#[test]
fn a_data_file_that_becomes_unreadable_fails_the_run_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("text.txt");
    let text = "the cat sees the ball. a dog follows the long road. ".repeat(4000);
    std::fs::write(&data, &text).unwrap();
    let run = dir.path().join("run");
    let data_set = format!("data.path={:?}", data.display().to_string());
    let job = |steps: u64| {
        let mut cmd = gpt(steps, &run, &["--set", "data.kind=\"text\"", "--set", &data_set]);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd
    };
    let child = job(1_000_000).spawn().unwrap();
    // Training is under way once the sink has written a few steps.
    let jsonl = run.join("metrics.jsonl");
    while std::fs::read_to_string(&jsonl).map_or(0, |t| t.lines().count()) < 3 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::fs::File::create(&data).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked at"), "{}", stderr(&out));
    let s = summary(&run);
    assert_eq!(s["status"], "failed", "{s}");
    assert!(s["error"]["message"].as_str().unwrap().contains(&data.display().to_string()), "names the file: {s}");
    let last = s["last_step"].as_u64().unwrap();
    assert_eq!(jsonl_steps(&run), (1..=last).collect::<Vec<_>>(), "every record up to the failing step");
    // With the file back, the job resumes from its newest checkpoint.
    std::fs::write(&data, &text).unwrap();
    let newest = last - last % 2;
    resumes_from(newest, job(newest + 2), &run);
}

/// A libtorch call after the last step that panics (an allocation failing where
/// the last losses are read): the run fails with its record, never exit 101.
#[test]
fn a_libtorch_failure_after_the_last_step_fails_the_run_with_its_summary_not_exit_101() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (error, _) = fails(&mut gpt(4, &run, &["--set", "debug.alloc_at_finish=true"]), &run);
    assert_eq!(error["kind"], "out_of_memory", "{error}");
    assert!(error["message"].as_str().unwrap().contains("at the end of the run, after step 4"), "{error}");
    let s = summary(&run);
    assert_eq!((s["steps"].as_u64(), s["last_step"].as_u64()), (Some(4), Some(4)), "every step ran: {s}");
    assert_eq!(s["plugins"]["jsonl"]["lines"], 4, "the plugins got their run end: {s}");
    assert_eq!(jsonl_steps(&run), vec![1, 2, 3, 4]);
}

/// A full disk at the end: `summary.json`'s temporary file is /dev/full. The
/// closing line and the summary's essentials reach stderr, the error says
/// "write" and gives the OS error once, and no temporary file is left.
#[test]
fn a_summary_that_cannot_be_written_is_told_on_stderr_and_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let tmp = run.join("summary.json.tmp");
    std::os::unix::fs::symlink("/dev/full", &tmp).unwrap();
    let out = run_expect(&mut gpt(4, &run, &[]), 1);
    let err = stderr(&out);
    assert!(err.contains("cannot write") && err.contains("summary.json"), "{err}");
    assert_eq!(err.matches("No space left on device").count(), 1, "the OS error once: {err}");
    assert!(err.contains("completed: 4 steps"), "the closing line, on stderr: {err}");
    let essentials = err.lines().find_map(|l| l.strip_prefix("summary: ")).unwrap_or_else(|| panic!("the essentials: {err}"));
    let essentials: Value = serde_json::from_str(essentials).unwrap();
    assert_eq!(essentials["last_step"], 4, "{essentials}");
    assert_eq!(essentials["checkpoint"]["latest"], "step-00000004", "the newest checkpoint: {essentials}");
    assert!(std::fs::symlink_metadata(&tmp).is_err(), "the temporary file is cleaned up");
    assert!(!run.join("summary.json").exists());
}

/// Resuming with another global batch (batch_size x accum_steps x ranks: a 2-rank
/// run resumed by a single process halves it) changes what a step trains on: refused
/// with exit 2 naming both, unless --allow-batch-change.
#[test]
fn a_resume_with_another_global_batch_is_refused_naming_both_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    run_expect(&mut gpt(4, &run, &[]), 0);
    let out = run_expect(&mut gpt(6, &run, &["--auto-resume", "--set", "data.batch_size=4"]), 2);
    let err = stderr(&out);
    let both = "its global batch is 8 (data.batch_size 8 x optim.accum_steps 1 x 1 rank(s)), this run's 4 (data.batch_size 4 x";
    assert!(err.contains(both) && err.contains("--allow-batch-change"), "{err}");
    run_expect(&mut gpt(6, &run, &["--auto-resume", "--set", "data.batch_size=4", "--allow-batch-change"]), 0);
    let s = summary(&run);
    assert_eq!((s["start_step"].as_u64(), s["last_step"].as_u64()), (Some(4), Some(6)), "{s}");
}
