//! Parameter sharding (`dist.shard = "parameters"`, ZeRO-3 / FSDP-style) across real
//! Gloo ranks on 127.0.0.1: the same losses as unsharded training, with each rank
//! holding about 1/world of the parameters and of the optimizer state between steps.

mod common;

use std::{
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use common::{ranks::*, *};

/// A tiny gpt or llama of three blocks, `steps` steps, every step's loss in
/// metrics.jsonl; `extra` settings on top.
fn job(model: &str, steps: u64, shard: &str, extra: &[&str], run_dir: &Path) -> Vec<String> {
    let mut args = tiny_gpt(steps);
    let llama = ["model.kind=llama", "model.n_head=4", "model.llama.n_kv_head=2"];
    let sets = ["data.batch_size=4", "model.n_layer=3", "model.dropout=0.0", "dist.timeout_s=30", "plugins.jsonl.every=1"];
    let shard = format!("dist.shard={shard}");
    let model_sets: &[&str] = if model == "llama" { &llama } else { &[] };
    for set in sets.iter().chain(model_sets).chain(extra).chain([&shard.as_str()]) {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args.extend(["--plugins".into(), "jsonl".into(), "--run-dir".into(), run_dir.display().to_string()]);
    args
}

fn losses(run_dir: &Path) -> Vec<(u64, f64)> {
    read_jsonl(&run_dir.join("metrics.jsonl")).iter().filter_map(|row| Some((row["step"].as_u64()?, row["train/loss"].as_f64()?))).collect()
}

fn per_rank(summary: &serde_json::Value, key: &str) -> Vec<u64> {
    serde_json::from_value(summary[key].clone()).unwrap_or_else(|e| panic!("{key}: {e}: {summary}"))
}

/// `none` and `parameters` on `world` ranks for 30 steps of `model`, for each of
/// `variants` (extra settings): losses within 1e-5 relative, and per rank at most
/// `ratio` of the unsharded run's parameter and optimizer-state bytes.
fn parameters_follow_unsharded(model: &str, world: u32, ratio: f64, variants: &[&[&str]]) {
    let dir = tempfile::tempdir().unwrap();
    for (v, extra) in variants.iter().enumerate() {
        let run = |shard: &str| {
            let run_dir = dir.path().join(format!("{shard}-{v}"));
            run_expect(launch(world).args(job(model, 30, shard, extra, &run_dir)), 0);
            (summary(&run_dir), losses(&run_dir))
        };
        let (none, base) = run("none");
        let (sharded, got) = run("parameters");
        assert_eq!((sharded["status"].as_str(), sharded["shard"].as_str()), (Some("completed"), Some("parameters")), "{extra:?}");
        assert_eq!(got.len(), 30, "{model} {extra:?}");
        assert_eq!(base.len(), 30);
        // bf16 rounds the forward of both runs; their float32 gradients are reduced
        // in another order, and after some steps a parameter rounds the other way.
        let tolerance = if extra.iter().any(|s| s.contains("bf16")) { 1e-4 } else { 1e-5 };
        for ((step, x), (_, y)) in got.iter().zip(&base) {
            assert!((x - y).abs() <= tolerance * y.abs(), "{model} {world} ranks {extra:?} step {step}: loss {x}, unsharded {y}");
        }
        for key in ["parameter_bytes", "optimizer_state_bytes"] {
            let (mine, theirs) = (per_rank(&sharded, key), per_rank(&none, key));
            assert_eq!(mine.len(), world as usize);
            for (rank, (&b, &n)) in mine.iter().zip(&theirs).enumerate() {
                assert!(b > 0 && b as f64 <= ratio * n as f64, "{model} {extra:?} rank {rank}: {key} {b} B vs unsharded {n} B");
            }
        }
        let (grads, params) = (per_rank(&sharded, "gradient_bytes"), per_rank(&none, "parameter_bytes"));
        assert!(grads.iter().zip(&params).all(|(&g, &p)| g as f64 <= ratio * p as f64), "gradient chunks only: {grads:?} vs {params:?}");
    }
}

const PLAIN: &[&str] = &[];
/// Blocks 1 of 0..3 checkpointed, 0 and 2 not: both paths in one run.
const SOME_CHECKPOINTED: &[&str] = &["train.activation_checkpointing=\"every_n\"", "train.activation_checkpointing_every=2"];
const KEPT_FOR_BACKWARD: &[&str] = &["dist.reshard_after_forward=false", "optim.accum_steps=2"];
/// Adapters trained, the base frozen (and sharded), with some blocks checkpointed.
const LORA: &[&str] = &["lora.rank=4", "lora.alpha=8.0", "train.activation_checkpointing=\"every_n\"", "train.activation_checkpointing_every=2"];
/// bf16 autocast and the chunked loss.
const BF16_CHUNKED: &[&str] = &["train.precision=\"bf16\"", "train.loss_chunk=8"];

#[test]
fn a_gpt_sharded_over_two_ranks_follows_unsharded_training_holding_half() {
    parameters_follow_unsharded("gpt", 2, 0.55, &[PLAIN, SOME_CHECKPOINTED, LORA]);
}

#[test]
fn a_llama_sharded_over_two_ranks_follows_unsharded_training_holding_half() {
    parameters_follow_unsharded("llama", 2, 0.55, &[PLAIN, SOME_CHECKPOINTED, KEPT_FOR_BACKWARD, BF16_CHUNKED, LORA]);
}

#[test]
fn a_gpt_and_a_llama_sharded_over_three_ranks_follow_unsharded_training_holding_a_third() {
    parameters_follow_unsharded("gpt", 3, 0.38, &[PLAIN, KEPT_FOR_BACKWARD]);
    parameters_follow_unsharded("llama", 3, 0.38, &[SOME_CHECKPOINTED]);
}

#[test]
fn what_parameter_sharding_cannot_do_yet_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    for (extra, plugins, key) in [(&["debug.dump_params=true"][..], "jsonl", "debug.dump_params"), (&[][..], "jsonl,checkpoint", "run.plugins")] {
        let mut args = job("gpt", 2, "parameters", extra, &dir.path().join(key));
        let at = args.iter().position(|a| a == "jsonl").unwrap();
        args[at] = plugins.into();
        let out = run_expect(launch(2).args(&args), 2);
        let err = stderr(&out);
        assert!(err.contains(key) && err.contains("dist.shard = \"parameters\""), "{err}");
    }
}

/// A rank killed while the others gather and reduce blocks: rank 0 exits 1 within
/// `dist.timeout_s` + 10 s with one error line naming itself and the timeout.
#[test]
fn a_rank_killed_mid_training_makes_the_other_exit_naming_it_not_hang() {
    const TIMEOUT_S: u64 = 5;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let timeout = format!("dist.timeout_s={TIMEOUT_S}");
    let args = job("llama", 1_000_000, "parameters", &[&timeout, "run.log_every=1"], dir.path());
    let start = |rank, stderr| rank_cmd(rank, 2, port).args(&args).env("PTRAIN_LOG", "info").stdout(Stdio::null()).stderr(stderr).spawn().unwrap();
    let mut rank0 = start(0, Stdio::piped());
    let mut rank1 = start(1, Stdio::null());
    let rx = lines(&mut rank0);
    assert!(wait_for_line(&rx, |l| l.contains("step 3/")), "rank 0 did not start training");
    rank1.kill().unwrap();
    let _ = rank1.wait();
    let killed = Instant::now();
    let status = wait_within(rank0, Duration::from_secs(TIMEOUT_S + 10));
    let status = status.unwrap_or_else(|| panic!("rank 0 still running {:?} after its peer died", killed.elapsed()));
    let log: Vec<String> = rx.iter().collect();
    assert_eq!(status.code(), Some(1), "{log:#?}");
    let errors: Vec<&String> = log.iter().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{log:#?}");
    assert!(errors[0].contains("rank 0 of 2") && errors[0].contains("dist.timeout_s"), "{}", errors[0]);
}
