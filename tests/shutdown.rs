//! The end of a run never waits on a plugin for good: a slow or hung worker plugin
//! gets `finish_timeout_s` to drain, then is abandoned and reported; a signal
//! during the drain ends it at once; an inline hook that runs too long is named by
//! a watchdog. The bounds below are generous: they check that the process exits
//! instead of hanging, not how fast.

mod common;

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use common::*;

fn fixture(name: &str) -> String {
    let path = build_dir().join(format!("libptrain_fixture_{}.so", name.replace('-', "_")));
    assert!(path.exists(), "{} missing: build the workspace first", path.display());
    path.display().to_string()
}

/// A 40-step run with the `worker-faults` sink emitting every 10 steps, plus `sets`.
fn sink_run(run_dir: &Path, sets: &[&str]) -> Command {
    let mut cmd = ptrain();
    cmd.args(tiny_gpt(40)).args(["--plugins", &fixture("worker-faults"), "--set", "plugins.worker-faults.every=10"]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    cmd.arg("--run-dir").arg(run_dir).env("PTRAIN_LOG", "info").stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

/// Waits for `child` at most `limit`; kills it and fails if it is still running.
fn wait_at_most(child: &mut Child, limit: Duration) -> i32 {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("the process was still running after {limit:?}: it waits on a plugin");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stderr lines as they come, on a channel (and all of them once the child exits).
fn stderr_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// `cmd` started with its log at info and its stdout dropped: the child, its
/// stderr lines as they come, and a way to send it a signal (`"-INT"`).
fn spawn_logged(cmd: &mut Command) -> (Child, mpsc::Receiver<String>, impl Fn(&str)) {
    let mut child = cmd.env("PTRAIN_LOG", "info").stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let lines = stderr_lines(&mut child);
    let pid = child.id().to_string();
    let kill = move |sig: &str| assert!(Command::new("kill").args([sig, &pid]).status().unwrap().success());
    (child, lines, kill)
}

fn abandoned_after_timeout(sets: &[&str]) -> (serde_json::Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = sink_run(dir.path(), sets).spawn().unwrap();
    let lines = stderr_lines(&mut child);
    // finish_timeout_s = 2: the process must be gone well before the sink would be.
    let code = wait_at_most(&mut child, Duration::from_secs(2 + 30));
    let err: String = lines.iter().collect::<Vec<_>>().join("\n");
    assert_eq!(code, 0, "the training's own exit code\n{err}");
    (summary(dir.path()), err)
}

#[test]
fn a_slow_sink_is_abandoned_after_its_finish_timeout_and_reported() {
    let (s, err) = abandoned_after_timeout(&["plugins.worker-faults.sleep_ms=20000", "plugins.worker-faults.finish_timeout_s=2"]);
    assert_eq!(s["status"], "completed");
    let unhandled = s["abandoned_plugins"]["worker-faults"].as_u64().expect("listed under abandoned_plugins");
    // Four batches and the run's end were queued; the first is still being handled.
    assert!((2..=5).contains(&unhandled), "{unhandled} never handled: {s}");
    let line = err.lines().find(|l| l.contains("abandoned")).unwrap_or_else(|| panic!("no warning line:\n{err}"));
    assert!(line.contains("worker-faults") && line.contains(&format!("{unhandled} event(s) never handled")), "{line}");
    assert!(line.contains("finish_timeout_s = 2"), "{line}");
}

#[test]
fn a_hung_sink_is_abandoned_too_and_the_run_timeout_caps_every_plugin() {
    // Hangs for good at its first batch; the plugin's own timeout is the default
    // 30 s, but run.shutdown_timeout_s caps the whole drain.
    let (s, err) = abandoned_after_timeout(&["plugins.worker-faults.hang_at=10", "run.shutdown_timeout_s=2"]);
    assert!(s["abandoned_plugins"]["worker-faults"].as_u64().unwrap() >= 1, "{s}");
    assert!(err.contains("run.shutdown_timeout_s = 2"), "{err}");
}

#[test]
fn a_sink_hung_in_its_timer_is_abandoned_too() {
    let (s, _) = abandoned_after_timeout(&["plugins.worker-faults.timer_ms=1", "plugins.worker-faults.timer_hang=true", "run.shutdown_timeout_s=2"]);
    assert!(s["abandoned_plugins"]["worker-faults"].as_u64().unwrap() >= 1, "{s}");
}

#[test]
fn a_timer_far_off_does_not_hold_the_end_of_the_run() {
    // An hour between ticks: the worker must end when its queue is drained, not
    // wait for the next tick (then the drain would time out and abandon it).
    let dir = tempfile::tempdir().unwrap();
    let mut child = sink_run(dir.path(), &["plugins.worker-faults.timer_ms=3600000", "plugins.worker-faults.finish_timeout_s=600"]).spawn().unwrap();
    let lines = stderr_lines(&mut child);
    let code = wait_at_most(&mut child, Duration::from_secs(300));
    let err: String = lines.iter().collect::<Vec<_>>().join("\n");
    assert_eq!(code, 0, "{err}");
    let s = summary(dir.path());
    assert!(s["abandoned_plugins"].get("worker-faults").is_none(), "{s}");
    assert_eq!(s["plugins"]["worker-faults"]["received"], 4, "{s}");
    assert_eq!(s["plugins"]["worker-faults"]["ticks"], 0, "{s}");
}

#[test]
fn a_signal_during_the_final_drain_ends_it_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // The default finish timeout (30 s) would hold the process; the signal must not.
    let mut child = sink_run(dir.path(), &["plugins.worker-faults.sleep_ms=20000"]).spawn().unwrap();
    let lines = stderr_lines(&mut child);
    let mut seen = Vec::new();
    loop {
        let line = lines.recv_timeout(Duration::from_secs(60)).expect("the run reaches its final drain");
        let draining = line.contains("waiting for worker plugins to finish");
        seen.push(line);
        if draining {
            break;
        }
    }
    let signalled = Instant::now();
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let code = wait_at_most(&mut child, Duration::from_secs(20));
    let waited = signalled.elapsed();
    seen.extend(lines.iter());
    let err = seen.join("\n");
    assert_eq!(code, 0, "training had completed\n{err}");
    assert!(waited < Duration::from_secs(20), "{waited:?}");
    let s = summary(dir.path());
    assert!(s["abandoned_plugins"]["worker-faults"].as_u64().unwrap() >= 1, "{s}");
    assert!(err.contains("a signal ended the wait"), "{err}");
}

#[test]
fn an_inline_hook_that_runs_too_long_is_named_by_the_watchdog() {
    let dir = tempfile::tempdir().unwrap();
    // The hook at step 3 returns once the test saw the watchdog's warning: the
    // warning is waited for, not raced against a sleep.
    let release = dir.path().join("release");
    let mut child = ptrain()
        .args(tiny_gpt(6))
        .args(["--plugins", &fixture("inline-faults")])
        .args(["--set", "plugins.inline-faults.sleep_at=3", "--set"])
        .arg(format!("plugins.inline-faults.wait_for={:?}", release.display().to_string()))
        .args(["--set", "plugins.inline-faults.hook_warn_s=0.5"])
        .arg("--run-dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.contains("plugin `inline-faults` has been in step_end for") && !release.exists() {
            std::fs::write(&release, "").unwrap();
        }
        lines.push(line);
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{lines:#?}");
    let err = lines.join("\n");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("plugin `inline-faults` has been in step_end for")).collect();
    assert_eq!(warnings.len(), 1, "one warning (the next would come a minute later):\n{err}");
    assert!(warnings[0].contains("at step 3") && warnings[0].contains("hook_warn_s = 0.5"), "{}", warnings[0]);
    let s = summary(dir.path());
    assert!(s["plugin_failures"].as_array().unwrap().is_empty(), "a slow hook is not a failure");
    // It is on the record: in the summary, with the longest stall, and in the closing line.
    let stall = &s["plugin_stalls"]["inline-faults"];
    assert_eq!((&stall["hook"], &stall["step"], &stall["count"]), (&"step_end".into(), &3.into(), &1.into()), "{s}");
    assert!(stall["seconds"].as_f64().unwrap() >= 0.5, "{s}");
    let report = stdout(&out);
    let closing = report.lines().find(|l| l.starts_with("completed:")).unwrap_or_else(|| panic!("no closing line: {report}"));
    assert!(closing.contains("plugin inline-faults stalled 1 time(s)") && closing.contains("in step_end at step 3"), "{closing}");
}

#[test]
fn a_worker_stuck_in_a_call_is_named_while_the_run_goes_on_and_its_stall_recorded() {
    let dir = tempfile::tempdir().unwrap();
    // The sink's first batch (step 10) returns once the test saw the warning about it.
    let release = dir.path().join("release");
    let mut child = sink_run(
        dir.path(),
        &[&format!("plugins.worker-faults.wait_for={:?}", release.display().to_string()), "plugins.worker-faults.hook_warn_s=0.5"],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.contains("plugin `worker-faults` has been in metrics for") && !release.exists() {
            std::fs::write(&release, "").unwrap();
        }
        lines.push(line);
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{lines:#?}");
    let err = lines.join("\n");
    let warning = lines.iter().find(|l| l.contains("plugin `worker-faults` has been in metrics for")).unwrap_or_else(|| panic!("no warning:\n{err}"));
    assert!(warning.contains("at step 10") && warning.contains("training goes on") && warning.contains("hook_warn_s = 0.5"), "{warning}");
    let s = summary(dir.path());
    assert_eq!(s["plugin_stalls"]["worker-faults"]["step"], 10, "{s}");
    assert_eq!(s["plugins"]["worker-faults"]["received"], 4, "nothing lost: {s}");
}

#[test]
fn under_strict_plugins_a_sink_abandoned_at_the_end_fails_the_run_with_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let mut child =
        sink_run(dir.path(), &["plugins.worker-faults.hang_at=10", "run.shutdown_timeout_s=2", "run.strict_plugins=true"]).spawn().unwrap();
    let lines = stderr_lines(&mut child);
    let code = wait_at_most(&mut child, Duration::from_secs(2 + 60));
    let err: String = lines.iter().collect::<Vec<_>>().join("\n");
    assert_eq!(code, 3, "{err}");
    let s = summary(dir.path());
    assert_eq!(s["exit_code"], 3, "{s}");
    assert!(s["abandoned_plugins"]["worker-faults"].as_u64().unwrap() >= 1, "{s}");
}

#[test]
fn timeout_keys_out_of_range_are_refused() {
    for set in ["plugins.worker-faults.finish_timeout_s=0", "plugins.worker-faults.hook_warn_s=-1", "run.shutdown_timeout_s=0"] {
        let dir = tempfile::tempdir().unwrap();
        let out = run_expect(sink_run(dir.path(), &[set]).stdout(Stdio::null()), 2);
        let key = set.split('=').next().unwrap();
        assert!(stderr(&out).contains(key), "{set}: {}", stderr(&out));
    }
}

#[test]
fn a_second_signal_exits_at_once_and_the_last_committed_checkpoint_stays_valid() {
    let dir = tempfile::tempdir().unwrap();
    // The save of step 3 never ends (debug.pause_save_at_step): after a first
    // SIGINT the run cannot finish its step and save, so only a second one ends it.
    let (mut child, lines, kill) = spawn_logged(
        ptrain()
            .args(tiny_gpt(100_000))
            .args(["--plugins", "checkpoint", "--set", "plugins.checkpoint.every=1", "--set", "debug.pause_save_at_step=3", "--run-dir"])
            .arg(dir.path()),
    );
    wait_for_json(&mut child, &dir.path().join("save-paused.rank0.json"));
    kill("-INT");
    let first = lines.iter().find(|l| l.contains("received signal 2")).expect("the first signal is acknowledged");
    assert!(first.contains("again to force"), "{first}");
    kill("-INT");
    assert_eq!(wait_at_most(&mut child, Duration::from_secs(60)), 130);
    let rest: Vec<String> = lines.iter().collect();
    assert!(rest.iter().any(|l| l.contains("second signal: exiting now")), "{rest:#?}");
    let listing = stdout(&run_expect(ptrain().args(["checkpoints", "list"]).arg(dir.path()), 0));
    assert!(listing.contains("step-00000002") && listing.contains("<- latest") && !listing.contains("INVALID"), "{listing}");
    assert!(!dir.path().join("checkpoints/step-00000003").exists());
}

#[test]
fn the_final_wait_lists_only_the_workers_still_running() {
    // The sink panics at its first batch and is disabled: nothing is waited on for it.
    let dir = tempfile::tempdir().unwrap();
    let out = sink_run(dir.path(), &["plugins.worker-faults.panic_at=10"]).args(["--plugins", "jsonl"]).output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let line = err.lines().find(|l| l.contains("waiting for worker plugins to finish")).unwrap_or_else(|| panic!("no wait line:\n{err}"));
    assert!(line.ends_with(": jsonl"), "{line}");
    assert_eq!(summary(dir.path())["plugin_failures"][0]["plugin"], "worker-faults");
}

/// A checkpoint writer stuck in I/O (debug.pause_save_at_step: the save of step 3
/// never ends). Every wait on it is bounded: training warns at the plugin's
/// `hook_warn_s`, gives the save up at its `finish_timeout_s` (the plugin disabled,
/// the save listed as abandoned) and goes on to its end; after a single SIGINT the
/// run ends as interrupted (exit 130, the summary says so), its last committed
/// checkpoint intact.
#[test]
fn a_save_stuck_in_io_is_given_up_at_its_timeout_and_a_first_signal_ends_the_run() {
    let stuck = |steps: u64, dir: &Path| {
        let mut cmd = ptrain();
        cmd.args(tiny_gpt(steps))
            .args(["--plugins", "checkpoint", "--set", "plugins.checkpoint.every=1", "--set", "debug.pause_save_at_step=3"])
            .args(["--set", "plugins.checkpoint.finish_timeout_s=3", "--set", "plugins.checkpoint.hook_warn_s=1", "--run-dir"])
            .arg(dir)
            .env("PTRAIN_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    };
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    let mut child = stuck(8, &done).spawn().unwrap();
    let lines = stderr_lines(&mut child);
    let code = wait_at_most(&mut child, Duration::from_secs(120));
    let err = lines.iter().collect::<Vec<_>>().join("\n");
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("waiting for plugin `checkpoint` to finish writing a checkpoint"), "a warning at hook_warn_s:\n{err}");
    let s = summary(&done);
    assert_eq!((s["status"].as_str(), s["steps"].as_u64()), (Some("completed"), Some(8)), "{s}");
    assert!(s["abandoned_plugins"]["checkpoint"].as_u64().unwrap() >= 1, "the stuck save is listed: {s}");
    assert_eq!(s["plugin_failures"][0]["plugin"], "checkpoint", "{s}");
    assert_eq!(std::fs::read_to_string(done.join("checkpoints/latest")).unwrap().trim(), "step-00000002");

    // Stuck, then a single Ctrl-C: the run ends as interrupted, within the bound.
    let signalled = dir.path().join("signalled");
    let mut child = stuck(100_000, &signalled).spawn().unwrap();
    let lines = stderr_lines(&mut child);
    wait_for_json(&mut child, &signalled.join("save-paused.rank0.json"));
    assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    let code = wait_at_most(&mut child, Duration::from_secs(120));
    let err = lines.iter().collect::<Vec<_>>().join("\n");
    assert_eq!(code, 130, "{err}");
    let s = summary(&signalled);
    assert_eq!((s["status"].as_str(), s["exit_code"].as_i64()), (Some("interrupted"), Some(130)), "{s}");
    assert!(s["abandoned_plugins"]["checkpoint"].as_u64().unwrap() >= 1, "{s}");
    let listing = stdout(&run_expect(ptrain().args(["checkpoints", "list"]).arg(&signalled), 0));
    assert!(listing.contains("step-00000002") && listing.contains("<- latest") && !listing.contains("INVALID"), "{listing}");
}

/// An inline hook that hangs (120 s at step 3): the first SIGINT says which plugin
/// and hook the run waits on; the second exits at once, with `summary.json` saying
/// the run was interrupted and naming the hung hook.
#[test]
fn ctrl_c_during_a_hung_inline_hook_names_it_and_the_second_records_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, lines, kill) = spawn_logged(
        ptrain()
            .args(tiny_gpt(6))
            .args(["--plugins", &fixture("inline-faults")])
            .args(["--set", "plugins.inline-faults.sleep_at=3", "--set", "plugins.inline-faults.sleep_ms=120000"])
            .args(["--set", "plugins.inline-faults.hook_warn_s=0.5", "--run-dir"])
            .arg(dir.path()),
    );
    // The watchdog's warning: the hook is running.
    lines.iter().find(|l| l.contains("plugin `inline-faults` has been in step_end")).expect("the hook hangs");
    kill("-INT");
    let first = lines.iter().find(|l| l.contains("received signal 2")).expect("the first signal is acknowledged");
    assert!(first.contains("plugin `inline-faults`") && first.contains("step_end hook") && first.contains("at step 3"), "{first}");
    kill("-INT");
    assert_eq!(wait_at_most(&mut child, Duration::from_secs(60)), 130, "exited at once, not after the hook's 120 s");
    let rest: Vec<String> = lines.iter().collect();
    assert!(rest.iter().any(|l| l.contains("second signal: exiting now")), "{rest:#?}");
    let s = summary(dir.path());
    assert_eq!((s["status"].as_str(), s["exit_code"].as_i64(), s["last_step"].as_u64()), (Some("interrupted"), Some(130), Some(3)), "{s}");
    let hung = &s["forced_exit"];
    assert_eq!((&hung["plugin"], &hung["hook"], &hung["step"]), (&"inline-faults".into(), &"step_end".into(), &3.into()), "{s}");
    assert!(s["stop_reason"].as_str().unwrap().contains("plugin `inline-faults` was in step_end at step 3"), "{s}");
    assert_eq!(s["plugin_stalls"]["inline-faults"]["step"], 3, "{s}");
}
