//! The `early-stop` plugin in real runs: it stops where Lightning's own
//! `EarlyStopping` stops on the run's own eval losses, ends the run normally (exit 0, final checkpoint,
//! `stopped_by`), stops a diverging run at once, watches a plugin's metric, keeps
//! its state across a resume, stops every rank at the same step, and refuses
//! option mistakes.

mod common;

use std::{
    path::Path,
    process::{Command, Stdio},
};

use common::{plugin_path, ptrain, read_jsonl, run_expect, stderr, summary, tiny_gpt};

/// The run every test here shares: evaluation every 10 steps.
fn run_args(steps: u64) -> Vec<String> {
    let mut args = tiny_gpt(steps);
    args.extend(["--set", "train.eval_every=10"].map(String::from));
    args
}

fn evals(run: &Path) -> Vec<(u64, f64)> {
    summary(run)["evals"].as_array().unwrap().iter().map(|e| (e["step"].as_u64().unwrap(), e["loss"].as_f64().unwrap())).collect()
}

/// Where Lightning's own `EarlyStopping` (min mode, run by a real `Trainer.fit`
/// in tests/support/early_stop.py) stops on `evals`, from the callback state
/// `(best, wait)` when given: `(step, best, wait)` at the check that stopped it.
fn lightning(evals: &[(u64, f64)], patience: u64, min_delta: f64, resumed: Option<(f64, u64)>) -> Option<(u64, f64, u64)> {
    let (evals, patience, min_delta) = (serde_json::to_string(evals).unwrap(), patience.to_string(), min_delta.to_string());
    let mut args: Vec<String> = vec![evals, patience, min_delta];
    if let Some((best, wait)) = resumed {
        args.extend([best.to_string(), wait.to_string()]);
    }
    let args: Vec<&dyn AsRef<std::ffi::OsStr>> = args.iter().map(|a| a as &dyn AsRef<std::ffi::OsStr>).collect();
    let stop = common::hf::support_py("early_stop.py", &args);
    (!stop.is_null()).then(|| (stop["step"].as_u64().unwrap(), stop["best"].as_f64().unwrap(), stop["wait"].as_u64().unwrap()))
}

#[test]
fn a_plateau_stops_the_run_at_the_rules_step_and_a_resume_keeps_the_counter() {
    for name in ["early-stop", "checkpoint"] {
        plugin_path(name);
    }
    let (reference, stopped) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    run_expect(ptrain().args(run_args(300)).arg("--run-dir").arg(reference.path()), 0);
    let all = evals(reference.path());
    assert_eq!(all.len(), 30);
    let (patience, min_delta) = (3, 0.05);
    let (stop, best, wait) = lightning(&all, patience, min_delta, None).expect("the reference run plateaus by min_delta");
    assert!(stop < 300);

    let early_stop = |patience: u64| {
        ["--plugins", "early-stop,checkpoint", "--set", "plugins.checkpoint.every=1000", "--set", "plugins.early-stop.min_delta=0.05", "--set"]
            .map(String::from)
            .into_iter()
            .chain([format!("plugins.early-stop.patience={patience}")])
            .collect::<Vec<_>>()
    };
    run_expect(ptrain().args(run_args(300)).args(early_stop(patience)).arg("--run-dir").arg(stopped.path()), 0);
    let s = summary(stopped.path());
    assert_eq!((s["status"].as_str(), s["exit_code"].as_i64()), (Some("stopped"), Some(0)), "{s}");
    assert_eq!(s["last_step"], stop, "{s}");
    assert_eq!(s["stopped_by"], "early-stop");
    assert!(s["stop_reason"].as_str().unwrap().contains("did not improve by more than 0.05 for 3 check(s)"), "{s}");
    let plugin = &s["plugins"]["early-stop"];
    assert_eq!(plugin["stopped_step"], stop);
    assert_eq!(plugin["best"]["value"].as_f64(), Some(best), "{plugin}");
    assert_eq!(plugin["wait"], wait);
    // The final checkpoint, saved as a normal end of the run.
    let checkpoints = stopped.path().join("checkpoints");
    assert_eq!(std::fs::read_to_string(checkpoints.join("latest")).unwrap().trim(), format!("step-{stop:08}"));

    // Resumed with one more check of patience: the counter goes on from `wait`,
    // so the run stops at its next miss, not after a fresh count.
    let after: Vec<(u64, f64)> = all.iter().copied().filter(|(s, _)| *s > stop).collect();
    let kept = lightning(&after, patience + 1, min_delta, Some((best, wait))).expect("still on the plateau").0;
    let fresh = lightning(&after, patience + 1, min_delta, None).map(|r| r.0);
    assert_ne!(Some(kept), fresh, "the test tells a kept counter from a fresh one");
    run_expect(ptrain().args(run_args(300)).args(early_stop(patience + 1)).arg("--auto-resume").arg("--run-dir").arg(stopped.path()), 0);
    let s = summary(stopped.path());
    assert_eq!(s["start_step"], stop, "{s}");
    assert_eq!(s["last_step"], kept, "{s}");
    assert_eq!(s["plugins"]["early-stop"]["best"]["value"].as_f64(), Some(best), "the best value travelled in the checkpoint");
}

#[test]
fn divergence_stops_a_run_with_a_huge_learning_rate_at_the_first_check() {
    plugin_path("early-stop");
    let dir = tempfile::tempdir().unwrap();
    run_expect(
        ptrain()
            .args(run_args(300))
            .args(["--set", "optim.lr=10.0", "--set", "optim.warmup_steps=0", "--set", "optim.grad_clip=0.0"])
            .args(["--plugins", "early-stop", "--set", "plugins.early-stop.divergence_threshold=20.0", "--run-dir"])
            .arg(dir.path()),
        0,
    );
    let s = summary(dir.path());
    assert_eq!(s["last_step"], 10, "{s}");
    assert!(s["final_eval_loss"].as_f64().unwrap() > 20.0, "{s}");
    assert!(s["stop_reason"].as_str().unwrap().contains("diverged"), "{s}");
}

#[test]
fn a_plugins_metric_can_be_watched() {
    for name in ["early-stop", "health", "jsonl"] {
        plugin_path(name);
    }
    let dir = tempfile::tempdir().unwrap();
    run_expect(
        ptrain()
            .args(run_args(100))
            .args(["--plugins", "health,early-stop,jsonl", "--set", "plugins.health.every=7", "--set", "plugins.jsonl.every=7"])
            .args(["--set", "plugins.early-stop.monitor=\"health/grad_norm\"", "--set", "plugins.early-stop.stopping_threshold=1e9"])
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    let s = summary(dir.path());
    assert_eq!(s["last_step"], 7, "the first health check is below the threshold: {s}");
    assert!(s["stop_reason"].as_str().unwrap().contains("health/grad_norm"), "{s}");
    assert!(read_jsonl(&dir.path().join("metrics.jsonl")).iter().any(|r| r["step"] == 7 && r["health/grad_norm"].is_f64()));
}

fn free_port() -> u16 {
    ptrain_test_ports::reserve()
}

/// Rank `rank` of two on 127.0.0.1, as torchrun would start it.
fn rank(rank: u32, port: u16, dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = ptrain();
    for var in ["SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "LOCAL_WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE"] {
        cmd.env_remove(var);
    }
    cmd.env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .args(run_args(60))
        .args(["--set", "train.eval_every=5", "--set", "dist.timeout_s=20", "--set", "debug.dump_params=true"])
        .args(["--plugins", "early-stop", "--run-dir"])
        .arg(dir)
        .args(extra);
    cmd
}

#[test]
fn one_rank_asking_stops_every_rank_at_the_same_step_with_exit_0() {
    plugin_path("early-stop");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // Only rank 1 has a threshold its first evaluation reaches.
    let rank0 = rank(0, port, dir.path(), &[]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let rank1 = rank(1, port, dir.path(), &["--set", "plugins.early-stop.stopping_threshold=100.0"]).output().unwrap();
    let rank0 = rank0.wait_with_output().unwrap();
    assert_eq!(rank1.status.code(), Some(0), "{}", stderr(&rank1));
    assert_eq!(rank0.status.code(), Some(0), "{}", stderr(&rank0));
    let s = summary(dir.path());
    assert_eq!(s["status"], "stopped", "{s}");
    // Rank 1 asked at step 5; the ranks agree at the next non-finite check (10).
    assert_eq!(s["last_step"], 10, "{s}");
    assert!(s["stop_reason"].as_str().unwrap().contains("another rank"), "{s}");
    let params = |r: u32| std::fs::read(dir.path().join(format!("params-rank{r}.safetensors"))).unwrap();
    assert!(params(0) == params(1), "both ranks stopped after the same step");
}

#[test]
fn option_mistakes_are_usage_errors_naming_the_option() {
    plugin_path("early-stop");
    for (set, named) in [
        ("plugins.early-stop.mode=\"sideways\"", "mode"),
        ("plugins.early-stop.min_delta=-0.1", "min_delta"),
        ("plugins.early-stop.patience=-1", "patience"),
        ("plugins.early-stop.monitor=\"\"", "monitor"),
        ("plugins.early-stop.stopping_threshold=5.0", "divergence_threshold"),
        ("plugins.early-stop.paitence=2", "paitence"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = ptrain();
        cmd.args(run_args(5)).args(["--plugins", "early-stop", "--set", set]);
        if named == "divergence_threshold" {
            cmd.args(["--set", "plugins.early-stop.divergence_threshold=4.0"]);
        }
        let out = run_expect(cmd.arg("--run-dir").arg(dir.path()), 2);
        assert!(stderr(&out).contains(named), "{set}: {}", stderr(&out));
    }
}
