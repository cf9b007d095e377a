//! Sharded data parallelism (`dist.shard`: ZeRO-1 `optimizer`, ZeRO-2 `gradients`)
//! across real Gloo ranks on 127.0.0.1: the same losses as unsharded training with
//! a fraction of the memory, checkpoints that resume bit for bit and reshard onto
//! other world sizes, a rank killed while saving, and two simulated machines.

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{ranks::*, *};

/// Dead ranks must fail the others within `dist.timeout_s` + 10 s.
const TIMEOUT_S: u64 = 5;

/// The tiny GPT with per-rank batch `batch`, no dropout, every step's metrics in
/// metrics.jsonl and each rank's final parameters dumped.
fn job(steps: u64, batch: u32, shard: &str, run_dir: &Path) -> Vec<String> {
    let mut args = tiny_gpt(steps);
    for set in [
        format!("data.batch_size={batch}"),
        format!("dist.shard={shard}"),
        format!("dist.timeout_s={TIMEOUT_S}"),
        "model.dropout=0.0".into(),
        "plugins.jsonl.every=1".into(),
        "debug.dump_params=true".into(),
    ] {
        args.extend(["--set".to_string(), set]);
    }
    args.extend(["--plugins".into(), "jsonl,checkpoint".into(), "--run-dir".into(), run_dir.display().to_string()]);
    args
}

/// `ptrain launch --nproc N -- ARGS`, which must succeed.
fn launch(nproc: u32, args: &[String]) {
    run_expect(common::ranks::launch(nproc).args(args), 0);
}

fn metric(run_dir: &Path, key: &str) -> Vec<(u64, f64)> {
    read_jsonl(&run_dir.join("metrics.jsonl")).iter().filter_map(|row| Some((row["step"].as_u64()?, row[key].as_f64()?))).collect()
}

fn assert_ranks_identical(run_dir: &Path, world: u32) {
    let read = |rank: u32| std::fs::read(run_dir.join(format!("params-rank{rank}.safetensors"))).expect("dumped parameters");
    let first = read(0);
    assert!(tensor_names(&first).len() > 2);
    for rank in 1..world {
        assert!(read(rank) == first, "{}: rank {rank} ended with other parameters than rank 0", run_dir.display());
    }
}

/// Steps `from..=to` of `run` against the same steps of `reference`, within `tolerance`
/// (absolute; 0 means bit for bit).
fn assert_losses_follow(run: &Path, reference: &Path, from: u64, to: u64, tolerance: f64) {
    let (a, b) = (metric(run, "train/loss"), metric(reference, "train/loss"));
    let pick = |v: &[(u64, f64)]| v.iter().filter(|(s, _)| (from..=to).contains(s)).copied().collect::<Vec<_>>();
    let (a, b) = (pick(&a), pick(&b));
    assert_eq!(a.len() as u64, to - from + 1, "{}: {a:?}", run.display());
    assert_eq!(a.iter().map(|r| r.0).collect::<Vec<_>>(), b.iter().map(|r| r.0).collect::<Vec<_>>());
    for ((step, x), (_, y)) in a.iter().zip(&b) {
        assert!((x - y).abs() <= tolerance, "{} step {step}: {x} vs {y} (tolerance {tolerance})", run.display());
    }
}

/// none / optimizer / gradients on `world` ranks for 50 steps: the same losses
/// within 1e-6 relative, identical ranks, and per-rank memory at most `ratio` of
/// the unsharded run's.
fn sharding_matches_unsharded(world: u32, ratio: f64) {
    let dir = tempfile::tempdir().unwrap();
    let run = |mode: &str| {
        let run_dir = dir.path().join(mode);
        launch(world, &job(50, 8, mode, &run_dir));
        assert_ranks_identical(&run_dir, world);
        (summary(&run_dir), metric(&run_dir, "train/loss"), metric(&run_dir, "train/grad_norm"), run_dir)
    };
    let (none, base_losses, base_norms, _) = run("none");
    assert_eq!(none["shard"], "none");
    assert_eq!(base_losses.len(), 50);
    let full_gradient = none["parameters"].as_u64().unwrap() * 4;
    let none_state = per_rank(&none, "optimizer_state_bytes");
    let none_grads = per_rank(&none, "gradient_bytes");
    assert_eq!(none_state.len(), world as usize);
    assert!(none_state.iter().all(|&b| b >= 2 * full_gradient), "AdamW keeps two states per parameter: {none_state:?}");
    for mode in ["optimizer", "gradients"] {
        let (s, losses, norms, _) = run(mode);
        assert_eq!((s["status"].as_str(), s["shard"].as_str(), s["world_size"].as_u64()), (Some("completed"), Some(mode), Some(world as u64)));
        assert_eq!(losses.len(), 50);
        for ((step, x), (_, y)) in losses.iter().zip(&base_losses) {
            assert!((x - y).abs() <= 1e-6 * y.abs(), "{mode} step {step}: loss {x}, unsharded {y}");
        }
        // Adam hides a wrong gradient scale from the loss; the norm (all-reduced
        // partial sums of squares when sharded) shows it.
        for ((step, x), (_, y)) in norms.iter().zip(&base_norms) {
            assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "{mode} step {step}: gradient norm {x}, unsharded {y}");
        }
        let state = per_rank(&s, "optimizer_state_bytes");
        for (rank, (&b, &n)) in state.iter().zip(&none_state).enumerate() {
            assert!(b as f64 <= ratio * n as f64, "{mode} rank {rank}: optimizer state {b} B vs unsharded {n} B");
        }
        let grads = per_rank(&s, "gradient_bytes");
        let peak = per_rank(&s, "gradient_peak_bytes");
        for rank in 0..world as usize {
            if mode == "gradients" {
                // Held between steps: this rank's slice only, against both the
                // unsharded run's gradient memory and one full gradient.
                assert!(grads[rank] as f64 <= ratio * none_grads[rank] as f64, "rank {rank}: {grads:?} vs {none_grads:?}");
                assert!(grads[rank] as f64 <= ratio * full_gradient as f64, "rank {rank}: {grads:?} vs one gradient of {full_gradient} B");
            } else {
                assert!(grads[rank] >= full_gradient, "optimizer sharding keeps the whole gradient: {grads:?}");
            }
            // During backward the full-size gradient exists in every mode.
            assert!(peak[rank] >= full_gradient, "{mode}: {peak:?}");
        }
    }
}

#[test]
fn two_sharded_ranks_follow_unsharded_training_with_half_the_optimizer_memory() {
    sharding_matches_unsharded(2, 0.55);
}

#[test]
fn three_sharded_ranks_follow_unsharded_training_with_a_third_of_the_optimizer_memory() {
    sharding_matches_unsharded(3, 0.38);
}

/// Python's safetensors reads every part; the parts tile the flat parameter space.
fn assert_python_reads_the_parts(checkpoint: &Path) {
    let script = r#"
import json, sys
from safetensors.torch import load_file
d = sys.argv[1]
m = json.load(open(f"{d}/manifest.json"))
numel = sum(t.numel() for t in load_file(f"{d}/model.safetensors").values())
parts = m["shards"]["parts"]
lengths = []
for p in parts:
    t = load_file(f"{d}/{p['path']}")
    assert t["exp_avg"].numel() == t["exp_avg_sq"].numel() == p["end"] - p["start"], p
    assert bool(t["exp_avg_sq"].ge(0).all()), p
    lengths.append(t["exp_avg"].numel())
print(json.dumps({"numel": numel, "total": sum(lengths), "parts": len(parts), "format": m["format"]}))
"#;
    let out = py::cmd().args(["-c", script]).arg(checkpoint).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["numel"], report["total"], "{report}");
    assert_eq!((report["parts"].as_u64(), report["format"].as_u64()), (Some(2), Some(2)), "{report}");
}

#[test]
fn a_sharded_checkpoint_resumes_bit_for_bit_and_reshards_onto_other_world_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    let with = |mut args: Vec<String>, extra: &[&str]| {
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    // Global batch 12 everywhere: 2 ranks x 6, 1 x 12, 3 x 4 see the same samples.
    // A constant learning rate after warmup, so runs of other lengths follow it.
    let job = |steps: u64, batch: u32, shard: &str, name: &str| with(job(steps, batch, shard, &d(name)), &["--set", "optim.schedule=constant"]);
    launch(2, &with(job(40, 6, "gradients", "full"), &["--set", "plugins.checkpoint.every=20"]));
    let step20 = d("full").join("checkpoints/step-00000020");
    assert_python_reads_the_parts(&step20);
    let resume20: [&str; 2] = ["--resume", step20.to_str().unwrap()];

    // Same world size: bit for bit.
    launch(2, &with(job(40, 6, "gradients", "two"), &resume20));
    assert_eq!(summary(&d("two"))["start_step"], 20);
    assert_losses_follow(&d("two"), &d("full"), 21, 40, 0.0);

    // One rank (unsharded) and three ranks, for the next 10 steps: the slices are re-cut.
    run_expect(single().args(with(job(30, 12, "none", "one"), &resume20)), 0);
    assert_losses_follow(&d("one"), &d("full"), 21, 30, 1e-5);
    launch(3, &with(job(30, 4, "gradients", "three"), &resume20));
    assert_losses_follow(&d("three"), &d("full"), 21, 30, 1e-5);
    assert_ranks_identical(&d("three"), 3);

    // And back: the one-rank run's unsharded checkpoint into two sharded ranks.
    let step30 = d("one").join("checkpoints/step-00000030");
    launch(2, &with(job(40, 6, "optimizer", "back"), &["--resume", step30.to_str().unwrap()]));
    assert_losses_follow(&d("back"), &d("full"), 31, 40, 1e-5);
}

#[test]
fn a_rank_killed_during_a_sharded_save_fails_the_others_and_auto_resume_takes_the_last_complete_checkpoint() {
    killed_during_a_save("gradients");
}

/// The same with parameter sharding, whose parts hold the weights too.
#[test]
fn a_rank_killed_during_a_parameter_sharded_save_leaves_the_last_complete_checkpoint_to_resume() {
    killed_during_a_save("parameters");
}

/// Rank 1 of 2 killed inside its part of a save of `shard`: rank 0 fails, nothing
/// incomplete is committed, and auto-resume continues from the newest checkpoint.
fn killed_during_a_save(shard: &str) {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("checkpoints");
    let port = free_port();
    let mut args = job(1_000_000, 8, shard, dir.path());
    // A wider model, saved at every step (parameter sharding cannot dump parameters).
    let wider = ["--set", "model.n_embd=128", "--set", "model.n_head=4", "--set", "debug.dump_params=false"].map(String::from);
    args.extend(wider.iter().cloned().chain(["--set", "plugins.checkpoint.every=1"].map(String::from)));
    // Rank 1's save of step 3 stops once its optimizer part is written, before
    // the marker that declares the part complete.
    let pause = ["--set", "debug.pause_save_at_step=3"].map(String::from);
    let start =
        |rank: u32, extra: &[String]| rank_cmd(rank, 2, port).args(&args).args(extra).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let (rank0, mut rank1) = (start(0, &[]), start(1, &pause));
    let paused = wait_for_json(&mut rank1, &dir.path().join("save-paused.rank1.json"));
    rank1.kill().unwrap(); // SIGKILL, inside rank 1's part of the save of step 3
    let _ = rank1.wait();
    let killed = Instant::now();
    let status = wait_within(rank0, Duration::from_secs(TIMEOUT_S + 10))
        .unwrap_or_else(|| panic!("rank 0 still running {:?} after rank 1 died", killed.elapsed()));
    assert!(!status.success(), "rank 0 must fail when its peer dies: {status:?}");

    // The kill landed inside the save: rank 1's part was in the staging directory,
    // unmarked, and step 3 was never committed.
    assert_eq!(paused["step"], 3, "{paused}");
    let part = PathBuf::from(paused["file"].as_str().unwrap());
    let staging = part.parent().unwrap();
    assert!(part.file_name().unwrap().to_str().unwrap().starts_with("optimizer-rank00001-of-00002"), "{paused}");
    assert!(staging.file_name().unwrap().to_str().unwrap().starts_with(".tmp-step-00000003-"), "{paused}");
    assert_eq!(staging.parent(), Some(checkpoints.as_path()), "{paused}");
    assert!(!checkpoints.join("step-00000003").exists(), "step 3 was committed without rank 1's part");

    // Every committed checkpoint is complete; auto-resume takes the newest.
    let verify = run_expect(ptrain().args(["checkpoints", "verify"]).arg(dir.path()), 0);
    assert!(!stderr(&verify).contains("skipping"), "an invalid committed checkpoint:\n{}", stderr(&verify));
    let newest = committed_steps(&checkpoints).into_iter().max().expect("a committed checkpoint");
    assert!(newest >= 2, "steps 1 and 2 were saved before the kill: {:?}", committed_steps(&checkpoints));
    let mut resume = job(newest + 2, 8, shard, dir.path());
    resume.extend(wider.into_iter().chain(["--auto-resume".to_string()]));
    launch(2, &resume);
    let s = summary(dir.path());
    assert_eq!((s["start_step"].as_u64(), s["status"].as_str()), (Some(newest), Some("completed")), "{s}");
}

/// Steps of the committed checkpoint directories.
fn committed_steps(checkpoints: &Path) -> Vec<u64> {
    std::fs::read_dir(checkpoints).unwrap().filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("step-")?.parse().ok()).collect()
}

#[test]
fn two_torchrun_agents_as_two_machines_train_like_one_node() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (dir.path().join("one-node"), dir.path().join("two-nodes"));
    launch(2, &job(20, 8, "gradients", &one));
    let port = free_port().to_string();
    let agent = |node: &str| {
        let mut cmd = Command::new(torchrun());
        for var in PLACEMENT_VARS {
            cmd.env_remove(var);
        }
        cmd.env_remove("PTRAIN_PLUGIN_PATH").env("PTRAIN_LOG", "warn").current_dir(repo());
        cmd.args(["--no-python", "--nnodes", "2", "--node-rank", node, "--nproc-per-node", "1", "--rdzv-backend", "static"])
            .args(["--master-addr", "127.0.0.1", "--master-port", &port])
            .arg(bin())
            .args(job(20, 8, "gradients", &two))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let agents = [agent("0"), agent("1")];
    for (node, agent) in agents.into_iter().enumerate() {
        let out = agent.wait_with_output().unwrap();
        assert!(out.status.success(), "node {node}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let s = summary(&two);
    assert_eq!((s["world_size"].as_u64(), s["shard"].as_str()), (Some(2), Some("gradients")));
    assert_losses_follow(&two, &one, 1, 20, 0.0);
    assert_ranks_identical(&two, 2);
}

#[test]
fn sharding_without_peers_warns_once_and_a_bad_value_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_expect(single().args(tiny_gpt(3)).args(["--set", "dist.shard=gradients", "--run-dir"]).arg(dir.path()), 0);
    let err = stderr(&out);
    let warnings: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(warnings.len() == 1 && warnings[0].contains("dist.shard"), "one warning line: {err}");
    assert_eq!(summary(dir.path())["shard"], "none");

    let run_dir = dir.path().join("bad");
    let out = run_expect(single().args(tiny_gpt(3)).args(["--set", "dist.shard=zero3", "--run-dir"]).arg(&run_dir), 2);
    let err = stderr(&out);
    assert!(err.contains("`dist.shard`") && err.contains("zero3"), "{err}");
    assert!(!run_dir.exists(), "nothing is written for a refused configuration");
}
