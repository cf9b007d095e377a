//! The end of a distributed run (Gloo ranks on 127.0.0.1): the ranks agree through
//! the rendezvous store within `dist.end_timeout_s`, not a collective's
//! `dist.timeout_s`, so rank 0's slow end (its final save, its plugins' drain) does
//! not fail the run; a rank that dies at the end fails it, with the summary written
//! and the cause named; an interrupted run still exits 130.
//!
//! Rank 0's end is made slow by the `worker-faults` fixture's run end (`end_sleep_ms`;
//! a worker plugin runs on rank 0 alone), and rank 1's fatal by the `inline-faults`
//! fixture's (`kill_at_end_on_rank`).

mod common;

use std::{path::Path, process::Stdio, time::Duration};

use common::{ranks::*, *};

/// The collectives' timeout: rank 0's end takes longer than this.
const TIMEOUT_S: u64 = 3;
/// Rank 0's end: well past `TIMEOUT_S`, well within the drain's own bounds.
const END_SLEEP_MS: u64 = 3 * TIMEOUT_S * 1000;

fn fixture(name: &str) -> String {
    let path = build_dir().join(format!("libptrain_fixture_{}.so", name.replace('-', "_")));
    assert!(path.exists(), "{} missing: build the workspace first", path.display());
    path.display().to_string()
}

/// A tiny GPT run saving checkpoints, with `worker-faults` and `inline-faults` loaded, plus `sets`.
fn job(steps: u64, run_dir: &Path, sets: &[String]) -> Vec<String> {
    let mut args = tiny_gpt(steps);
    args.extend(["--plugins".into(), format!("checkpoint,{},{}", fixture("worker-faults"), fixture("inline-faults"))]);
    let base = [format!("dist.timeout_s={TIMEOUT_S}"), "plugins.checkpoint.every=2".into(), "plugins.worker-faults.every=1".into()];
    for set in base.iter().chain(sets) {
        args.extend(["--set".to_string(), set.clone()]);
    }
    args.extend(["--run-dir".into(), run_dir.display().to_string()]);
    args
}

fn slow_rank0() -> Vec<String> {
    vec![format!("plugins.worker-faults.end_sleep_ms={END_SLEEP_MS}")]
}

/// The end went as planned on rank 0: its plugins ended (the fixture's report is in
/// the summary) and none was given up on.
fn assert_plugins_ended(s: &serde_json::Value) {
    assert!(s["plugins"]["worker-faults"]["received"].as_u64().is_some(), "worker-faults got no run end: {s}");
    assert!(s["abandoned_plugins"].as_object().unwrap().is_empty(), "{s}");
}

#[test]
fn rank_0s_end_slower_than_the_collective_timeout_completes_under_torchrun() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = torchrun_ptrain(2);
    cmd.args(job(6, dir.path(), &slow_rank0()));
    run_expect(&mut cmd, 0);
    let s = summary(dir.path());
    assert_eq!((s["status"].as_str(), s["world_size"].as_u64(), s["last_step"].as_u64()), (Some("completed"), Some(2), Some(6)), "{s}");
    assert_plugins_ended(&s);
    assert!(dir.path().join("checkpoints/step-00000006/manifest.json").exists(), "the final checkpoint is written");
}

#[test]
fn a_rank_that_dies_at_the_end_fails_the_run_with_its_summary_naming_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let sets = ["plugins.inline-faults.kill_at_end_on_rank=1".into(), "dist.end_timeout_s=4".into()];
    let args = job(6, dir.path(), &sets);
    let rank0 = rank_cmd(0, 2, port).args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let rank1 = rank_cmd(1, 2, port).args(&args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let died = wait_within(rank1, Duration::from_secs(120)).expect("rank 1 still running");
    assert_eq!(died.code(), None, "rank 1 was killed at its end");
    let rank0 = wait_within(rank0, Duration::from_secs(60)).expect("rank 0 still running 60 s after rank 1 died");
    assert_eq!(rank0.code(), Some(1));
    let s = summary(dir.path());
    assert_eq!((s["status"].as_str(), s["exit_code"].as_i64(), s["last_step"].as_u64()), (Some("failed"), Some(1), Some(6)), "{s}");
    let message = s["error"]["message"].as_str().unwrap_or_else(|| panic!("no cause: {s}"));
    assert!(message.contains("end-of-run agreement") && message.contains("1 of 2 ranks") && message.contains("dist.end_timeout_s = 4"), "{message}");
    assert_plugins_ended(&s);
}

#[test]
fn an_interrupted_job_whose_rank_0_ends_slowly_exits_130_with_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut sets = slow_rank0();
    sets.push("run.log_every=1".into());
    let mut launcher =
        launch(2).args(job(1_000_000, dir.path(), &sets)).env("PTRAIN_LOG", "info").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let rx = lines(&mut launcher);
    assert!(wait_for_line(&rx, |l| l.starts_with("[rank0]") && l.contains("step 3/")), "the job did not start training");
    signal(launcher.id(), "INT");
    let status = wait_within(launcher, Duration::from_secs(120)).expect("the job did not stop");
    let log: Vec<String> = rx.iter().collect();
    assert_eq!(status.code(), Some(130), "{log:#?}");
    // Rank 1 waited for rank 0's end: no rank's end failed (a collective's timeout would).
    assert!(!log.iter().any(|l| l.contains(" ERROR ")), "{log:#?}");
    let s = summary(dir.path());
    assert_eq!((s["status"].as_str(), s["exit_code"].as_i64()), (Some("interrupted"), Some(130)), "{s}");
    assert!(s["error"].is_null(), "{s}");
    assert_plugins_ended(&s);
}

/// Issue 63, item 8: a rank killed after the end-of-run agreement fails the job (a
/// launcher's exit 1), and rank 0's summary says so too, as rank 0 knows it (it said
/// `completed` and exit 0). The moment is made certain: rank 0's summary write is held
/// (its temporary file a FIFO) until the test has killed rank 1, then let through.
#[test]
fn a_rank_killed_after_the_end_agreement_fails_rank_0s_summary_too() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("summary.json.tmp");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let port = free_port();
    let args = job(4, dir.path(), &["dist.end_timeout_s=4".into()]);
    let rank0 = rank_cmd(0, 2, port).args(&args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let mut rank1 = rank_cmd(1, 2, port).args(&args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    // Rank 0's summary writer, held opening the FIFO: every rank has agreed.
    let tasks = std::path::PathBuf::from(format!("/proc/{}/task", rank0.id()));
    let writing = || {
        let names = std::fs::read_dir(&tasks).into_iter().flatten().flatten();
        names.filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok()).any(|n| n.trim() == "ptrain-summary")
    };
    let patience = std::time::Instant::now() + Duration::from_secs(120);
    while !writing() {
        assert!(std::time::Instant::now() < patience, "rank 0 never wrote its summary");
        std::thread::sleep(Duration::from_millis(20));
    }
    rank1.kill().unwrap();
    let _ = rank1.wait();
    let first = std::fs::read_to_string(&fifo).unwrap();
    assert!(first.contains("\"completed\""), "written before rank 1 died: {first}");
    let rank0 = wait_within(rank0, Duration::from_secs(60)).expect("rank 0 still running 60 s after rank 1 died");
    assert_eq!(rank0.code(), Some(1));
    // The first write renamed the FIFO to summary.json; only a second write replaces it.
    let written = std::fs::metadata(dir.path().join("summary.json")).unwrap();
    assert!(written.file_type().is_file(), "rank 0 kept the summary that says `completed`: it was not written again");
    let s = summary(dir.path());
    assert_eq!((s["status"].as_str(), s["exit_code"].as_i64(), s["error"]["kind"].as_str()), (Some("failed"), Some(1), Some("another_rank")), "{s}");
    let message = s["error"]["message"].as_str().unwrap();
    assert!(message.contains("after rank 0 wrote the summary") && message.contains("dist.end_timeout_s = 4"), "{message}");
    assert_eq!(s["parts"].as_array().unwrap().len(), 1, "{s}");
    assert_eq!(s["parts"][0]["status"], "failed", "{s}");
}
