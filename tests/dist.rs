//! Data-parallel training across real processes on 127.0.0.1 (Gloo): ranks stay
//! identical, 2 ranks x B follow 1 rank x 2B, a dead or stalled rank fails the
//! others within the timeout, and both launchers (`ptrain launch`, torchrun) work.

mod common;

use std::{
    path::Path,
    process::{Child, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use common::{ranks::*, *};

/// The dead-rank bound of the spec is `dist.timeout_s` + 10 s.
const TIMEOUT_S: u64 = 5;

/// A tiny GPT run with per-rank batch `batch`, no dropout, every step's metrics in
/// metrics.jsonl and each rank's final parameters dumped.
fn job(steps: u64, batch: u32, run_dir: &Path) -> Vec<String> {
    let mut args = tiny_gpt(steps);
    for set in [
        format!("data.batch_size={batch}"),
        "model.dropout=0.0".into(),
        "plugins.jsonl.every=1".into(),
        "debug.dump_params=true".into(),
        format!("dist.timeout_s={TIMEOUT_S}"),
    ] {
        args.extend(["--set".to_string(), set]);
    }
    args.extend(["--plugins".into(), "jsonl".into(), "--run-dir".into(), run_dir.display().to_string()]);
    args
}

fn params(run_dir: &Path, rank: u32) -> Vec<u8> {
    let path = run_dir.join(format!("params-rank{rank}.safetensors"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Both ranks hold bit-identical parameters (with different data shards, they
/// would not unless gradients were averaged).
fn assert_ranks_identical(run_dir: &Path) {
    let (p0, p1) = (params(run_dir, 0), params(run_dir, 1));
    assert!(tensor_names(&p0).len() > 2, "{:?}", tensor_names(&p0));
    assert!(p0 == p1, "rank 0 and rank 1 ended with different parameters");
}

fn losses(run_dir: &Path, key: &str) -> Vec<(u64, f64)> {
    read_jsonl(&run_dir.join("metrics.jsonl")).iter().filter_map(|row| Some((row["step"].as_u64()?, row[key].as_f64()?))).collect()
}

#[test]
fn ptrain_launch_trains_two_ranks_that_end_identical() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = launch(2);
    cmd.args(job(20, 8, dir.path()));
    let out = run_expect(&mut cmd, 0);
    let s = summary(dir.path());
    assert_eq!(s["status"], "completed");
    assert_eq!(s["world_size"], 2);
    assert_eq!(s["samples"], 20 * 2 * 8, "samples count every rank's");
    assert!(s["collective_s"].as_f64().unwrap() > 0.0, "{s}");
    assert_ranks_identical(dir.path());
    let text = stdout(&out);
    assert!(text.lines().any(|l| l.starts_with("[rank0] completed")) && text.lines().any(|l| l.starts_with("[rank1] completed")), "{text}");
}

#[test]
fn ptrain_launch_holds_its_rendezvous_port_from_before_the_ranks_start() {
    // Without --master-port the launcher listens on a free port itself and rank 0's
    // store serves on that socket: no window in which another program takes it.
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = single();
    cmd.args(["launch", "--nproc", "2", "--"]).args(job(4, 4, dir.path()));
    run_expect(&mut cmd, 0);
    assert_eq!(summary(dir.path())["status"], "completed");
    assert_ranks_identical(dir.path());

    // A port another program listens on is refused before any rank starts.
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let run_dir = dir.path().join("never");
    let mut cmd = single();
    cmd.args(["launch", "--nproc", "2", "--master-port", &port, "--"]).args(job(4, 4, &run_dir));
    let err = stderr(&run_expect(&mut cmd, 2));
    assert!(err.contains("--master-port") && err.contains(&port), "{err}");
    assert!(!run_dir.exists(), "no rank ran");
}

#[test]
fn torchrun_launches_the_binary_as_its_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = torchrun_ptrain(2);
    cmd.args(job(20, 8, dir.path()));
    run_expect(&mut cmd, 0);
    let s = summary(dir.path());
    assert_eq!((s["status"].as_str(), s["world_size"].as_u64()), (Some("completed"), Some(2)));
    assert_ranks_identical(dir.path());
}

#[test]
fn two_ranks_follow_one_rank_with_twice_the_batch() {
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    run_expect(single().args(job(30, 16, one.path())), 0);
    run_expect(launch(2).args(job(30, 8, two.path())), 0);
    let (a, b) = (losses(one.path(), "train/loss"), losses(two.path(), "train/loss"));
    assert_eq!(a.len(), 30);
    assert_eq!(a.iter().map(|r| r.0).collect::<Vec<_>>(), b.iter().map(|r| r.0).collect::<Vec<_>>());
    for ((step, x), (_, y)) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5, "step {step}: 1 rank x 16 {x}, 2 ranks x 8 {y}");
    }
    assert!(a.last().unwrap().1 < a[0].1, "the loss fell");
    // Adam hides a wrong gradient scale from the loss; the norm (taken after the
    // all-reduce) shows it.
    let (ga, gb) = (losses(one.path(), "train/grad_norm"), losses(two.path(), "train/grad_norm"));
    assert_eq!(ga.len(), 30);
    for ((step, x), (_, y)) in ga.iter().zip(&gb) {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "step {step}: gradient norm {x} vs {y}");
    }
    let (ea, eb) = (losses(one.path(), "eval/loss"), losses(two.path(), "eval/loss"));
    assert_eq!(ea.len(), 1);
    assert!((ea[0].1 - eb[0].1).abs() <= 1e-5, "{ea:?} vs {eb:?}");
    let (sa, sb) = (summary(one.path()), summary(two.path()));
    for key in ["first_loss", "final_loss"] {
        let (x, y) = (sa[key].as_f64().unwrap(), sb[key].as_f64().unwrap());
        assert!((x - y).abs() <= 1e-5, "{key}: {x} vs {y} (the summary averages the ranks)");
    }
    assert_eq!(sa["samples"], sb["samples"]);
}

#[test]
fn a_non_finite_loss_on_one_rank_skips_the_step_on_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // Only rank 1 sees a NaN loss, at step 4.
    let rank0 = rank_cmd(0, 2, port).args(job(8, 8, dir.path())).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let rank1 = rank_cmd(1, 2, port).args(job(8, 8, dir.path())).args(["--set", "debug.nonfinite_loss_at=[4]"]).output().unwrap();
    assert_eq!(rank1.status.code(), Some(0), "{}", stderr(&rank1));
    let rank0 = rank0.wait_with_output().unwrap();
    assert_eq!(rank0.status.code(), Some(0), "{}", stderr(&rank0));
    let s = summary(dir.path());
    assert_eq!(s["nonfinite_steps"], 1, "rank 0 learned of rank 1's non-finite loss: {s}");
    assert!(s["final_loss"].as_f64().is_some_and(f64::is_finite), "{s}");
    assert_ranks_identical(dir.path());
}

/// `ptrain launch --nproc 2` on an endless job logging every step, with the
/// ranks' stderr read line by line; returns once rank 0 (the one rank that shows
/// progress) has logged step 3, which it reaches only with every rank in the loop.
fn launch_training(dir: &Path, extra: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut launcher = launch(2)
        .args(job(1_000_000, 8, dir))
        .args(["--set", "run.log_every=1"])
        .args(extra)
        .env("PTRAIN_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines(&mut launcher);
    assert!(wait_for_line(&rx, |l| l.starts_with("[rank0]") && l.contains("step 3/")), "the job did not start training");
    (launcher, rx)
}

/// Starts a long two-rank job and returns (rank 0, its stderr lines, rank 1) once
/// rank 0 reports training progress (so both are inside the step loop).
fn training_pair(dir: &Path) -> (Child, mpsc::Receiver<String>, Child) {
    let port = free_port();
    let args = job(1_000_000, 8, dir);
    let start = |rank, stderr| {
        rank_cmd(rank, 2, port)
            .args(&args)
            .args(["--set", "run.log_every=1"])
            .env("PTRAIN_LOG", "info")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap()
    };
    let mut rank0 = start(0, Stdio::piped());
    let rank1 = start(1, Stdio::null());
    let rx = lines(&mut rank0);
    assert!(wait_for_line(&rx, |l| l.contains("step 3/")), "rank 0 did not start training");
    (rank0, rx, rank1)
}

/// Rank 0 exits 1 within the bound, with one error line naming itself and, in
/// lower case, one of `expect`.
fn assert_fails_within_bound(rank0: Child, rx: mpsc::Receiver<String>, expect: &[&str]) {
    let killed = Instant::now();
    let status = wait_within(rank0, Duration::from_secs(TIMEOUT_S + 10));
    let waited = killed.elapsed();
    let status = status.unwrap_or_else(|| panic!("rank 0 still running {waited:?} after its peer went away"));
    // The reader ends at the pipe's end, so this holds every line rank 0 wrote.
    let log: Vec<String> = rx.iter().collect();
    assert_eq!(status.code(), Some(1), "{log:#?}");
    let error = log.iter().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("no error line: {log:#?}"));
    assert!(error.contains("rank 0 of 2") && expect.iter().any(|e| error.to_lowercase().contains(e)), "{error}");
    // Issue 63, item 8: Gloo's message as it is, without tch's wrapping.
    assert!(!error.contains("Internal torch error"), "{error}");
}

#[test]
fn killing_a_rank_makes_the_other_exit_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (rank0, rx, mut rank1) = training_pair(dir.path());
    rank1.kill().unwrap();
    let _ = rank1.wait();
    assert_fails_within_bound(rank0, rx, &["dist.timeout_s"]);
}

#[test]
fn a_stalled_rank_makes_the_other_exit_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (rank0, rx, mut rank1) = training_pair(dir.path());
    // Stopped, rank 1 keeps its sockets open: only the timeout can notice.
    signal(rank1.id(), "STOP");
    // Gloo words it either way, depending on where the wait was.
    assert_fails_within_bound(rank0, rx, &["timed out", "timeout caused"]);
    rank1.kill().unwrap();
    let _ = rank1.wait();
}

/// Children of `pid` (from /proc) whose environment has `RANK=<rank>`.
fn child_with_rank(pid: u32, rank: u32) -> Option<u32> {
    let want = format!("RANK={rank}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let child: u32 = entry.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        let ppid: u32 = stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()?;
        let environ = std::fs::read(entry.path().join("environ")).ok()?;
        (ppid == pid && environ.split(|&b| b == 0).any(|v| v == want.as_bytes())).then_some(child)
    })
}

#[test]
fn ptrain_launch_fails_when_a_rank_dies_and_leaves_no_rank_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (launcher, rx) = launch_training(dir.path(), &[]);
    let pid = launcher.id();
    let (rank0, rank1) = (child_with_rank(pid, 0).expect("rank 0 process"), child_with_rank(pid, 1).expect("rank 1 process"));
    signal(rank1, "KILL");
    let status = wait_within(launcher, Duration::from_secs(TIMEOUT_S + 10)).expect("launcher still running after a rank died");
    assert!(!status.success());
    let log: Vec<String> = rx.iter().collect();
    assert!(log.iter().any(|l| l.contains("ptrain launch: rank") && l.contains("failed")), "{log:#?}");
    assert!(!Path::new(&format!("/proc/{rank0}")).exists(), "rank 0 outlived the launcher");
}

#[test]
fn a_bad_environment_is_refused_with_exit_2_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let cases: [(&[(&str, &str)], &str); 3] = [
        (&[("WORLD_SIZE", "2"), ("RANK", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")], "RANK"),
        (&[("WORLD_SIZE", "2"), ("RANK", "1"), ("MASTER_PORT", "29500")], "MASTER_ADDR"),
        (&[("WORLD_SIZE", "two"), ("RANK", "0")], "WORLD_SIZE"),
    ];
    for (vars, key) in cases {
        let mut cmd = single();
        cmd.args(tiny_gpt(5)).arg("--run-dir").arg(&run_dir).envs(vars.iter().copied());
        let err = stderr(&run_expect(&mut cmd, 2));
        assert!(err.contains(&format!("`{key}`")) && err.lines().filter(|l| l.starts_with("error")).count() == 1, "{err}");
        assert!(!run_dir.exists(), "nothing is written before the environment is checked");
    }
}

#[test]
fn ptrain_launch_forwards_sigint_to_every_rank_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let (launcher, rx) = launch_training(dir.path(), &[]);
    let pid = launcher.id();
    let ranks = [child_with_rank(pid, 0).expect("rank 0 process"), child_with_rank(pid, 1).expect("rank 1 process")];
    signal(pid, "INT");
    let status = wait_within(launcher, Duration::from_secs(TIMEOUT_S + 10)).expect("launcher still running after SIGINT");
    assert_eq!(status.code(), Some(130));
    let log: Vec<String> = rx.iter().collect();
    for (rank, pid) in ranks.iter().enumerate() {
        assert!(log.iter().any(|l| l.starts_with(&format!("[rank{rank}] received signal 2"))), "rank {rank} got no SIGINT: {log:#?}");
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "rank {rank} outlived the launcher");
    }
    // The command that resumes is the launch of as many ranks, not a single process.
    let resume = format!("[rank0] resume: ptrain launch --nproc 2 run --run-dir {} --auto-resume", dir.path().display());
    assert!(log.iter().any(|l| l == &resume), "{resume:?} missing: {log:#?}");
}

#[test]
fn a_signal_to_one_rank_stops_every_rank_after_the_same_step() {
    let dir = tempfile::tempdir().unwrap();
    let (launcher, rx) = launch_training(dir.path(), &["--plugins", "checkpoint", "--set", "train.nonfinite_check_every=5"]);
    let rank1 = child_with_rank(launcher.id(), 1).expect("rank 1 process");
    signal(rank1, "INT");
    let status = wait_within(launcher, Duration::from_secs(TIMEOUT_S + 30)).expect("the job did not stop");
    let log: Vec<String> = rx.iter().collect();
    // The interrupted rank exits 130 (README: interrupted by SIGINT), the rank it
    // stopped 1 (a stop for a failure); the launcher passes on the code of the
    // rank that ended first, and says which one that was.
    let first = log
        .iter()
        .find_map(|l| l.split_once("ptrain launch: rank ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no failed rank reported: {log:#?}"));
    let expected = match first.split_whitespace().next() {
        Some("1") => 130,
        Some("0") => 1,
        _ => panic!("{first}"),
    };
    assert!(first.contains(&format!("(exit status: {expected})")), "{first}");
    assert_eq!(status.code(), Some(expected), "{log:#?}");
    let stopped_after = |rank: u32| -> u64 {
        let line = log
            .iter()
            .find(|l| l.starts_with(&format!("[rank{rank}]")) && l.contains("stopping after step"))
            .unwrap_or_else(|| panic!("rank {rank} did not stop: {log:#?}"));
        line.split("stopping after step ").nth(1).unwrap().split(':').next().unwrap().trim().parse().unwrap()
    };
    let step = stopped_after(0);
    assert_eq!(stopped_after(1), step, "both ranks stop after the same step");
    let announced = format!("every rank stops after step {step},");
    assert!(log.iter().any(|l| l.starts_with("[rank1]") && l.contains(&announced)), "the signalled rank announced that step: {log:#?}");
    assert_eq!(step % 5, 0, "stops are agreed at the non-finite check");
    let s = summary(dir.path());
    assert_eq!(s["last_step"], step);
    assert!(s["stop_reason"].as_str().unwrap().contains("another rank"), "{s}");
    let manifest = dir.path().join(format!("checkpoints/step-{step:08}/manifest.json"));
    let manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    assert_eq!(manifest["reason"], "interrupted", "rank 0 saved the step every rank stopped after");
}

#[test]
fn a_rank_that_never_shows_up_fails_the_rendezvous_within_the_timeout() {
    // Rank 0 alone (it serves the store and waits for rank 1), then rank 1 alone
    // (nobody serves the store).
    for rank in [0, 1] {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path().join("run");
        let child = rank_cmd(rank, 2, free_port())
            .args(tiny_gpt(3))
            .args(["--set", &format!("dist.timeout_s={TIMEOUT_S}"), "--run-dir"])
            .arg(&run_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let out = {
            let (tx, rx) = mpsc::channel();
            thread::spawn(move || {
                let _ = tx.send(child.wait_with_output());
            });
            rx.recv_timeout(Duration::from_secs(TIMEOUT_S + 30)).unwrap_or_else(|_| {
                signal(pid, "KILL");
                panic!("rank {rank} alone still waits {} s after dist.timeout_s = {TIMEOUT_S}", TIMEOUT_S + 30)
            })
        }
        .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "rank {rank}: {err}");
        assert!(err.contains(&format!("dist.timeout_s = {TIMEOUT_S}")) && err.contains(&format!("rank {rank}")), "rank {rank}: {err}");
    }
}

#[test]
fn ptrain_launch_forwards_sigterm_to_every_rank_and_exits_143() {
    let dir = tempfile::tempdir().unwrap();
    let (launcher, rx) = launch_training(dir.path(), &[]);
    let pid = launcher.id();
    let ranks = [child_with_rank(pid, 0).expect("rank 0 process"), child_with_rank(pid, 1).expect("rank 1 process")];
    signal(pid, "TERM");
    let status = wait_within(launcher, Duration::from_secs(TIMEOUT_S + 10)).expect("launcher still running after SIGTERM");
    assert_eq!(status.code(), Some(143));
    let log: Vec<String> = rx.iter().collect();
    for (rank, pid) in ranks.iter().enumerate() {
        assert!(log.iter().any(|l| l.starts_with(&format!("[rank{rank}] received signal 15"))), "rank {rank} got no SIGTERM: {log:#?}");
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "rank {rank} outlived the launcher");
    }
}

/// Whether `pid` is gone (or a zombie nobody reaped yet: it ran to its end).
fn ended(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_or(true, |stat| stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()) == Some("Z"))
}

#[test]
fn a_killed_launcher_takes_its_ranks_down() {
    let dir = tempfile::tempdir().unwrap();
    let (launcher, _rx) = launch_training(dir.path(), &[]);
    let pid = launcher.id();
    let ranks = [child_with_rank(pid, 0).expect("rank 0 process"), child_with_rank(pid, 1).expect("rank 1 process")];
    signal(pid, "KILL");
    let _ = wait_within(launcher, Duration::from_secs(10));
    // PR_SET_PDEATHSIG sends each rank SIGTERM; they end within the grace a
    // signalled run has (its step, an emergency save, the timeout of a peer).
    let deadline = Instant::now() + Duration::from_secs(TIMEOUT_S + 30);
    while !ranks.iter().all(|&r| ended(r)) {
        assert!(Instant::now() < deadline, "ranks {ranks:?} outlived their killed launcher");
        thread::sleep(Duration::from_millis(50));
    }
}
