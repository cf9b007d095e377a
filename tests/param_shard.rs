//! Parameter sharding (`dist.shard = "parameters"`, ZeRO-3 / FSDP-style) across real
//! Gloo ranks on 127.0.0.1: the same losses as unsharded training, with each rank
//! holding about 1/world of the parameters and of the optimizer state between steps.

mod common;

use std::{
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use common::{fixture::OUT, hf::*, ranks::*, *};

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
/// A llama of 12 blocks, 768 wide (about 330 MiB of float32 weights), a sample a step:
/// a model large beside the process, for the loading peaks.
const BIG_LLAMA: &[&str] = &["model.n_layer=12", "model.n_embd=768", "model.n_head=12", "model.llama.n_kv_head=12", "data.batch_size=1"];
/// Blocks 1 of 0..3 checkpointed, 0 and 2 not: both paths in one run.
const SOME_CHECKPOINTED: &[&str] = &["train.activation_checkpointing=\"every_n\"", "train.activation_checkpointing_every=2"];
const KEPT_FOR_BACKWARD: &[&str] = &["dist.reshard_after_forward=false", "optim.accum_steps=2"];
/// Adapters trained, the base frozen (and sharded), with some blocks checkpointed.
const LORA: &[&str] = &["lora.rank=4", "lora.alpha=8.0", "train.activation_checkpointing=\"every_n\"", "train.activation_checkpointing_every=2"];
/// bf16 autocast and the chunked loss.
const BF16_CHUNKED: &[&str] = &["train.precision=\"bf16\"", "train.loss_chunk=8"];
/// A tied head and the chunked loss in float32 (Qwen2's case: the loss's head gradient
/// becomes the embedding's `.grad`, the lookup's sparse one is added to it), over two
/// micro-batches a step.
const TIED_CHUNKED: &[&str] = &["model.llama.tie_embeddings=true", "train.loss_chunk=8", "optim.accum_steps=2"];

#[test]
fn a_gpt_sharded_over_two_ranks_follows_unsharded_training_holding_half() {
    parameters_follow_unsharded("gpt", 2, 0.55, &[PLAIN, SOME_CHECKPOINTED, LORA]);
}

#[test]
fn a_llama_sharded_over_two_ranks_follows_unsharded_training_holding_half() {
    parameters_follow_unsharded("llama", 2, 0.55, &[PLAIN, SOME_CHECKPOINTED, KEPT_FOR_BACKWARD, BF16_CHUNKED, TIED_CHUNKED, LORA]);
}

#[test]
fn a_gpt_and_a_llama_sharded_over_three_ranks_follow_unsharded_training_holding_a_third() {
    parameters_follow_unsharded("gpt", 3, 0.38, &[PLAIN, KEPT_FOR_BACKWARD]);
    parameters_follow_unsharded("llama", 3, 0.38, &[SOME_CHECKPOINTED]);
}

#[test]
fn what_parameter_sharding_cannot_do_yet_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    for (extra, key) in [(&["debug.dump_params=true"][..], "debug.dump_params"), (&["debug.dump_tensors_at=[1]"][..], "debug.dump_tensors_at")] {
        let args = job("gpt", 2, "parameters", extra, &dir.path().join(key));
        let out = run_expect(launch(2).args(&args), 2);
        let err = stderr(&out);
        assert!(err.contains(key) && err.contains("dist.shard = \"parameters\""), "{err}");
    }
    // A model without numbered blocks: refused by name (it failed, exit 1, cutting a
    // "block -1"); a library model is refused unless it wraps its blocks
    // (tests/examples.rs).
    let out = run_expect(launch(2).args(job("gpt", 2, "parameters", &["model.kind=mlp"], &dir.path().join("mlp"))), 2);
    let err = stderr(&out);
    assert!(err.contains("dist.shard") && err.contains("model.kind = \"mlp\" has no blocks"), "{err}");
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

/// `job` with the checkpoint plugin too, and `extra` arguments after.
fn saving(mut args: Vec<String>, extra: &[&str]) -> Vec<String> {
    let at = args.iter().position(|a| a == "jsonl").unwrap();
    args[at] = "jsonl,checkpoint".into();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Steps `from..=to` of `run`'s losses against `reference`'s, within `tolerance`
/// relative (0: bit for bit).
fn assert_losses_follow(run: &Path, reference: &Path, from: u64, to: u64, tolerance: f64) {
    let pick = |d: &Path| losses(d).into_iter().filter(|(s, _)| (from..=to).contains(s)).collect::<Vec<_>>();
    let (a, b) = (pick(run), pick(reference));
    assert_eq!(a.len() as u64, to - from + 1, "{}: {a:?}", run.display());
    for ((step, x), (other, y)) in a.iter().zip(&b) {
        assert_eq!(step, other);
        assert!((x - y).abs() <= tolerance * y.abs(), "{} step {step}: {x} vs {y} (tolerance {tolerance})", run.display());
    }
}

/// `steps` steps of the llama of `job` on `world` ranks of `batch` samples (global
/// batch 12: 1 x 12, 2 x 6 and 3 x 4 see the same samples), checkpointing; `extra`
/// arguments after. Exits `code`.
fn resumable(world: u32, batch: u32, steps: u64, shard: &str, run_dir: &Path, extra: &[&str], code: i32) -> std::process::Output {
    let batch = format!("data.batch_size={batch}");
    let args = saving(job("llama", steps, shard, &[&batch, "optim.schedule=constant"], run_dir), extra);
    match world {
        1 => run_expect(single().args(&args), code),
        _ => run_expect(launch(world).args(&args), code),
    }
}

/// Each rank saves only its chunks (model.safetensors is empty, the manifest names
/// every parameter); the checkpoint resumes bit for bit on two ranks, and re-cut
/// onto one rank (unsharded) and three (sharded) as the uninterrupted run goes on.
#[test]
fn a_parameter_sharded_checkpoint_resumes_bit_for_bit_and_reshards_onto_one_and_three_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    let run = |world: u32, batch: u32, shard: &str, name: &str, extra: &[&str]| {
        resumable(world, batch, 4, shard, &d(name), extra, 0);
    };
    run(2, 6, "parameters", "full", &["--set", "plugins.checkpoint.every=2"]);
    let step2 = d("full").join("checkpoints/step-00000002");
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(step2.join("manifest.json")).unwrap()).unwrap();
    let (shards, units) = (&manifest["shards"], &manifest["shards"]["params"]["units"]);
    assert_eq!((shards["world_size"].as_u64(), units.as_array().map(Vec::len)), (Some(2), Some(4)), "3 blocks and the rest: {manifest}");
    assert!(units[1]["params"].as_array().unwrap().iter().all(|p| p["name"].as_str().unwrap().starts_with("model.layers.0.")), "{units}");
    assert!(tensor_names(&std::fs::read(step2.join("model.safetensors")).unwrap()).is_empty(), "no rank writes whole weights");
    for part in shards["parts"].as_array().unwrap() {
        let names = tensor_names(&std::fs::read(step2.join(part["path"].as_str().unwrap())).unwrap());
        assert!(["params", "exp_avg", "exp_avg_sq", "step"].iter().all(|n| names.contains(&n.to_string())), "{part}: {names:?}");
    }
    let resume: [&str; 2] = ["--resume", step2.to_str().unwrap()];

    run(2, 6, "parameters", "two", &resume);
    assert_eq!(summary(&d("two"))["start_step"], 2);
    assert_losses_follow(&d("two"), &d("full"), 3, 4, 0.0);

    run(1, 12, "none", "one", &resume);
    assert_losses_follow(&d("one"), &d("full"), 3, 4, 1e-6);
    run(3, 4, "parameters", "three", &resume);
    assert_losses_follow(&d("three"), &d("full"), 3, 4, 1e-6);
}

/// A checkpoint of whole weights resumes under `parameters` on two ranks, each rank
/// reading only its slices of the weights and of the optimizer state: one of `none`
/// on one rank (`optimizer.safetensors`, whole per parameter), one of `gradients` on
/// three (ZeRO-2: the state in one flat slice per rank). Both go on as their
/// uninterrupted runs; one whose weights are not this model's is refused naming the
/// tensor, before training.
#[test]
fn a_checkpoint_of_whole_weights_resumes_parameter_sharded_on_two_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    for (world, batch, shard) in [(1, 12, "none"), (3, 4, "gradients")] {
        let full = d(&format!("{shard}-full"));
        resumable(world, batch, 6, shard, &full, &["--set", "plugins.checkpoint.every=2"], 0);
        let step2 = full.join("checkpoints/step-00000002");
        let resumed = d(&format!("{shard}-resumed"));
        resumable(2, 6, 6, "parameters", &resumed, &["--resume", step2.to_str().unwrap()], 0);
        assert_eq!(summary(&resumed)["start_step"], 2, "{shard}");
        assert_losses_follow(&resumed, &full, 3, 6, 1e-5);
    }

    // The none checkpoint with one matrix narrower than this model's.
    let (original, altered) = (d("none-full").join("checkpoints/step-00000002"), d("altered"));
    let script = "import json, shutil, sys, zlib\nfrom safetensors.torch import load_file, save_file\n\
                  src, dst = sys.argv[1:]\nshutil.copytree(src, dst)\nt = load_file(f'{dst}/model.safetensors')\n\
                  name = 'model.layers.1.mlp.up_proj.weight'\nt[name] = t[name][:, 1:].contiguous()\n\
                  save_file(t, f'{dst}/model.safetensors', metadata={'format': 'pt'})\n\
                  data = open(f'{dst}/model.safetensors', 'rb').read()\nm = json.load(open(f'{dst}/manifest.json'))\n\
                  f = next(f for f in m['files'] if f['path'] == 'model.safetensors')\nf['size'], f['crc32'] = len(data), zlib.crc32(data)\n\
                  json.dump(m, open(f'{dst}/manifest.json', 'w'))\n";
    assert!(py::cmd().args(["-c", script]).arg(&original).arg(&altered).status().unwrap().success());
    let out = resumable(2, 6, 6, "parameters", &d("refused"), &["--resume", altered.to_str().unwrap()], 2);
    let err = stderr(&out);
    assert!(err.contains("model.layers.1.mlp.up_proj.weight") && err.contains("shape"), "{err}");
}

/// A Qwen2 (tied head) fine-tuned on two ranks with `parameters`: `ptrain export`
/// re-assembles its weights from the parts into a directory transformers loads with
/// nothing missing, computing the logits ptrain computes from the checkpoint.
#[test]
fn a_parameter_sharded_run_exports_to_what_transformers_loads_with_equal_logits() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tokens) = (dir.path().join("qwen2"), dir.path().join("tokens.bin"));
    made_dir(&["make-llama", "qwen2", OUT], &model);
    made_file(&["make-tokens", "{out}/tokens.bin", "20000"], &tokens);
    let run_dir = dir.path().join("run");
    let sets =
        ["data.kind=tokens".to_string(), format!("data.path={}", s(&tokens)), format!("model.init_from={}", s(&model)), "dist.timeout_s=30".into()];
    let train = |run_dir: &Path, shard: &str| {
        let mut sets = sets.to_vec();
        sets.push(format!("dist.shard={shard}"));
        run_expect(launch(2).args(["run", "--quiet", "--steps", "6", "--plugins", "checkpoint", "--run-dir"]).arg(run_dir).args(small(&sets)), 0);
    };
    let logits = |run_dir: &Path, probe: &Path| {
        run_expect(single().args(["logits", "--split", "val", "--checkpoint"]).arg(run_dir).arg("--out").arg(probe), 0)
    };
    train(&run_dir, "parameters");
    let probe = dir.path().join("probe");
    logits(&run_dir, &probe);
    let out = dir.path().join("exported");
    let exported = run_expect(single().args(["export", "--format", "hf", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&out), 0);
    assert!(stdout(&exported).contains("step 6"), "{}", stdout(&exported));
    let report = hf(&[&"load-export", &out, &probe]);
    for key in ["missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"] {
        assert_eq!(report["info"][key], serde_json::json!([]), "{key}: {report}");
    }
    let max_diff = report["max_abs_diff"].as_f64().unwrap();
    assert!(max_diff <= 1e-4, "exported logits differ from ptrain's by {max_diff}: {report}");
    // The same training unsharded, whose weights are read from its model.safetensors:
    // its logits too, up to the order of floating-point sums.
    let unsharded = dir.path().join("unsharded");
    train(&unsharded, "none");
    let unsharded_probe = dir.path().join("unsharded-probe");
    logits(&unsharded, &unsharded_probe);
    let report = hf(&[&"load-export", &out, &unsharded_probe]);
    assert!(report["max_abs_diff"].as_f64().unwrap() <= 1e-4, "exported vs unsharded training: {report}");
    // And the trained weights are not the initial ones.
    let source = hf(&[&"load-export", &model, &probe]);
    assert!(source["max_abs_diff"].as_f64().unwrap() > 1e-4, "the probe is of the trained model: {source}");
}

/// `model.init_from` under `parameters`: each rank reads only its slices of the
/// weights into its shards; training then follows the unsharded run (which loads the
/// whole model on every rank) within 1e-5 relative. A GPT-2 (stored transposed), a
/// Qwen2 (tied, biases, GQA) and a llama in bf16 over several files with an index.
#[test]
fn a_parameter_sharded_run_initialised_from_transformers_follows_the_unsharded_one() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.bin");
    made_file(&["make-tokens", "{out}/tokens.bin", "20000"], &tokens);
    let models: [(&str, &[&str]); 3] = [
        ("gpt2", &["make-model", OUT]),
        ("qwen2", &["make-llama", "qwen2", OUT]),
        ("llama-bf16", &["make-llama", "llama", OUT, "-", "--bf16-sharded"]),
    ];
    for (name, make) in models {
        let model = made_dir(make, &dir.path().join(name));
        let train = |shard: &str| {
            let run_dir = dir.path().join(format!("{name}-{shard}"));
            let sets = [
                "data.kind=tokens".to_string(),
                format!("data.path={}", s(&tokens)),
                format!("model.init_from={}", s(&model)),
                "dist.timeout_s=30".into(),
                "plugins.jsonl.every=1".into(),
                format!("dist.shard={shard}"),
            ];
            let run = ["run", "--quiet", "--steps", "4", "--plugins", "jsonl", "--run-dir"];
            run_expect(launch(2).args(run).arg(&run_dir).args(small(&sets)), 0);
            losses(&run_dir)
        };
        let (base, got) = (train("none"), train("parameters"));
        assert_eq!((got.len(), base.len()), (4, 4), "{name}");
        for ((step, x), (_, y)) in got.iter().zip(&base) {
            assert!((x - y).abs() <= 1e-5 * y.abs(), "{name} step {step}: loss {x}, unsharded {y}");
        }
    }
}

/// Loading under `parameters` builds the model block by block, each rank keeping its
/// shard of a block before the next exists: no rank holds the whole model. A llama of
/// 12 blocks on 2 ranks, its weights `W` bytes of float32: an unsharded rank peaks at
/// its own memory + `W` once loaded; a rank that built the whole model and cut it after
/// held `W` + its `W / 2` of chunks (seen: 0.85 W above the unsharded rank); a sharded
/// rank holds its chunks, the embedding and one block (seen: 0.1-0.4 W below it, the
/// spread being the allocator's). It must stay below the unsharded rank's peak + `W / 4`.
#[test]
fn a_parameter_sharded_rank_loads_its_shard_block_by_block_never_the_whole_model() {
    let dir = tempfile::tempdir().unwrap();
    let run = |shard: &str| {
        let run_dir = dir.path().join(shard);
        run_expect(launch(2).args(job("llama", 1, shard, BIG_LLAMA, &run_dir)), 0);
        summary(&run_dir)
    };
    let (none, sharded) = (run("none"), run("parameters"));
    let whole = 4 * none["parameters"].as_u64().unwrap();
    assert!(whole > 300 << 20, "a model large beside the process itself: {whole} B");
    let (loaded, unsharded) = (per_rank(&sharded, "rank_load_peak_memory_bytes"), per_rank(&none, "rank_load_peak_memory_bytes"));
    assert_eq!(loaded.len(), 2);
    for (rank, (&mine, &theirs)) in loaded.iter().zip(&unsharded).enumerate() {
        assert!(
            mine < theirs + whole / 4,
            "rank {rank}: loading peaked at {} MiB sharded, {} MiB unsharded, the model being {} MiB",
            mine >> 20,
            theirs >> 20,
            whole >> 20
        );
    }
}

/// The LoRA base hash a checkpoint records.
fn lora_base(checkpoint: &Path) -> String {
    let state: serde_json::Value = serde_json::from_slice(&std::fs::read(checkpoint.join("state.json")).unwrap()).unwrap();
    state["lora_base_digest"].as_str().unwrap_or_else(|| panic!("no lora_base_digest: {state}")).to_string()
}

/// LoRA on a `model.init_from` base under `parameters` is cut while built too: the
/// frozen base sharded block by block (its matrices in bf16 under bf16), each rank
/// reading only its slices of the weights and hashing the base from the files. A
/// Qwen2 in float32 and a llama in bf16 (several files) follow the unsharded LoRA
/// run (within 1e-5; bf16: 1e-4), record the same base hash, and the unsharded run's
/// checkpoint resumes under `parameters` as that run goes on.
#[test]
fn lora_on_a_pretrained_base_is_sharded_while_built_and_follows_the_unsharded_run() {
    /// A model's name, its `hf.py` arguments, its precision setting and the loss tolerance.
    type Case<'a> = (&'a str, &'a [&'a str], &'a str, f64);
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.bin");
    made_file(&["make-tokens", "{out}/tokens.bin", "20000"], &tokens);
    let models: [Case; 2] = [
        ("qwen2", &["make-llama", "qwen2", OUT], "train.precision=\"fp32\"", 1e-5),
        ("llama-bf16", &["make-llama", "llama", OUT, "-", "--bf16-sharded"], "train.precision=\"bf16\"", 1e-4),
    ];
    for (name, make, precision, tolerance) in models {
        let model = made_dir(make, &dir.path().join(name));
        let train = |shard: &str, steps: &str, extra: &[&str]| {
            let run_dir = dir.path().join(format!("{name}-{shard}-{steps}"));
            let mut sets = vec![
                "data.kind=tokens".to_string(),
                format!("data.path={}", s(&tokens)),
                format!("model.init_from={}", s(&model)),
                "dist.timeout_s=30".into(),
                "plugins.jsonl.every=1".into(),
                "plugins.checkpoint.every=4".into(),
                precision.into(),
                format!("dist.shard={shard}"),
            ];
            sets.extend(LORA.iter().map(|s| s.to_string()));
            let run = ["run", "--quiet", "--steps", steps, "--plugins", "jsonl,checkpoint", "--run-dir"];
            run_expect(launch(2).args(run).arg(&run_dir).args(small(&sets)).args(extra), 0);
            run_dir
        };
        let unsharded = train("none", "6", &[]);
        let sharded = train("parameters", "4", &[]);
        assert_losses_follow(&sharded, &unsharded, 1, 4, tolerance);
        let step4 = |run: &Path| run.join("checkpoints/step-00000004");
        assert_eq!(lora_base(&step4(&sharded)), lora_base(&step4(&unsharded)), "{name}: the base hashed from the files as the whole base is");
        let resumed = train("parameters", "6", &["--resume", step4(&unsharded).to_str().unwrap()]);
        assert_losses_follow(&resumed, &unsharded, 5, 6, tolerance);
    }
}

/// LoRA on a randomly initialised base (no `model.init_from`) is cut while built too:
/// each rank digests every base tensor as it is drawn, before its block is cut. The
/// sharded run records the digest the unsharded run takes from its whole base, and
/// each run's checkpoint resumes in the other mode as the uninterrupted runs go on; a
/// base drawn from another seed is refused. A 12-block llama loads, per sharded rank,
/// `W / 8` below the unsharded rank (built whole and cut after, it peaked above it).
#[test]
fn lora_on_a_drawn_base_is_digested_and_sharded_while_built() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    let train = |shard: &str, name: &str, steps: u64, extra: &[&str], code: i32| {
        let sets = [LORA, &["optim.schedule=constant", "plugins.checkpoint.every=4"]].concat();
        run_expect(launch(2).args(saving(job("llama", steps, shard, &sets, &d(name)), extra)), code)
    };
    train("none", "none", 6, &[], 0);
    train("parameters", "sharded", 6, &[], 0);
    assert_losses_follow(&d("sharded"), &d("none"), 1, 6, 1e-5);
    let step4 = |name: &str| d(name).join("checkpoints/step-00000004");
    assert_eq!(lora_base(&step4("sharded")), lora_base(&step4("none")), "the drawn base digested as drawn as the whole base is");
    for (from, shard, follows) in [("none", "parameters", "none"), ("sharded", "none", "sharded")] {
        let resumed = format!("{from}-resumed-{shard}");
        train(shard, &resumed, 6, &["--resume", step4(from).to_str().unwrap()], 0);
        assert_eq!(summary(&d(&resumed))["start_step"], 4);
        assert_losses_follow(&d(&resumed), &d(follows), 5, 6, 1e-5);
    }
    let out = train("parameters", "other-seed", 6, &["--seed", "7", "--resume", step4("none").to_str().unwrap()], 2);
    assert!(stderr(&out).contains("not the base these adapters were trained on"), "{}", stderr(&out));

    let load = |shard: &str| {
        let run_dir = d(&format!("big-{shard}"));
        let sets = [BIG_LLAMA, LORA, &["dist.timeout_s=60"]].concat();
        run_expect(launch(2).env("MALLOC_MMAP_THRESHOLD_", "65536").args(job("llama", 1, shard, &sets, &run_dir)), 0);
        summary(&run_dir)
    };
    assert_lora_loads_below_unsharded(&load("none"), &load("parameters"));
}

/// LoRA under `parameters` loads its shard of the base block by block: a llama of 12
/// blocks (`W` bytes of float32) from transformers on 2 ranks. The unsharded rank
/// holds the whole base, `W`; a sharded rank its half of it, the embeddings and one
/// block (about 0.6 `W`), where building the whole base and cutting it after held `W`
/// and more (seen: 790 MiB against the unsharded 779, the streamed 602, W = 393). It
/// must stay `W / 8` below the unsharded rank's peak. glibc's heap layout is fixed
/// with a 64 KiB mmap threshold (as tests/activation_checkpointing.rs does): with its
/// default dynamic threshold the freed blocks stay in the heap and the streamed rank's
/// peak RSS was seen above the unsharded one (1,083-1,148 MiB against 817).
#[test]
fn lora_under_parameters_loads_its_shard_of_the_base_never_the_whole_model() {
    let dir = tempfile::tempdir().unwrap();
    // About 400 MB: the shared fixture itself, only read.
    let model = fixture::shared("hf.py", &["make-llama", "llama", OUT, "-", "--large"]);
    let tokens = made_file(&["make-tokens", "{out}/tokens.bin", "20000"], &dir.path().join("tokens.bin"));
    let run = |shard: &str| {
        let run_dir = dir.path().join(shard);
        let mut sets = vec![
            "data.kind=tokens".to_string(),
            format!("data.path={}", s(&tokens)),
            format!("model.init_from={}", s(&model)),
            "dist.timeout_s=60".into(),
        ];
        sets.extend(LORA.iter().map(|s| s.to_string()));
        sets.push(format!("dist.shard={shard}"));
        let mut ranks = launch(2);
        ranks.env("MALLOC_MMAP_THRESHOLD_", "65536");
        run_expect(ranks.args(["run", "--quiet", "--steps", "1", "--run-dir"]).arg(&run_dir).args(small(&sets)), 0);
        summary(&run_dir)
    };
    assert_lora_loads_below_unsharded(&run("none"), &run("parameters"));
}

/// A LoRA base of `W` float32 bytes loaded on 2 ranks: each sharded rank's loading
/// peak (`parameters`' summary) at least `W / 8` below the unsharded rank's (`none`'s).
fn assert_lora_loads_below_unsharded(none: &serde_json::Value, sharded: &serde_json::Value) {
    let whole = 4 * none["parameters"].as_u64().unwrap();
    assert!(whole > 300 << 20, "a model large beside the process itself: {whole} B");
    let (loaded, unsharded) = (per_rank(sharded, "rank_load_peak_memory_bytes"), per_rank(none, "rank_load_peak_memory_bytes"));
    assert_eq!(loaded.len(), 2);
    for (rank, (&mine, &theirs)) in loaded.iter().zip(&unsharded).enumerate() {
        assert!(
            mine + whole / 8 < theirs,
            "rank {rank}: loading peaked at {} MiB sharded, {} MiB unsharded, the model being {} MiB",
            mine >> 20,
            theirs >> 20,
            whole >> 20
        );
    }
}

/// `dist.offload_optimizer`: the optimizer state and the update in host memory give
/// the losses of the run without it, bit for bit (on the CPU the same kernels see the
/// same values), and the same checkpoint; without `parameters` it is refused.
#[test]
fn offloading_the_optimizer_trains_and_saves_exactly_as_without() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    let run = |name: &str, extra: &[&str]| {
        let args = saving(job("gpt", 6, "parameters", extra, &d(name)), &["--set", "plugins.checkpoint.every=3"]);
        run_expect(launch(2).args(&args), 0);
    };
    run("kept", &[]);
    run("offloaded", &["dist.offload_optimizer=true", "optim.grad_clip=0.05"]);
    run("clipped", &["optim.grad_clip=0.05"]);
    assert_losses_follow(&d("offloaded"), &d("clipped"), 1, 6, 0.0);
    // Every rank's part: the same chunks and state after the last update.
    let same = |a: &str, b: &str| {
        let script = "import sys\nfrom safetensors.torch import load_file\nfor r in (0, 1):\n    \
                      f = f'checkpoints/step-00000006/optimizer-rank{r:05}-of-00002.safetensors'\n    \
                      x, y = (load_file(f'{d}/{f}') for d in sys.argv[1:])\n    \
                      assert x.keys() == y.keys() and all(x[k].equal(y[k]) for k in x), f\n";
        py::cmd().args(["-c", script]).arg(d(a)).arg(d(b)).output().unwrap().status.success()
    };
    assert!(same("offloaded", "clipped"), "the same chunks and state saved");
    assert!(!same("kept", "clipped"), "clipping changes the update (the comparison can fail)");

    let out = run_expect(single().args(tiny_gpt(2)).args(["--set", "dist.offload_optimizer=true", "--set", "dist.shard=gradients"]), 2);
    let err = stderr(&out);
    assert!(err.contains("dist.offload_optimizer") && err.contains("parameters"), "{err}");
}

/// `train.precision = "bf16"` gathers the blocks in bf16 (their matrices; their norm
/// weights and biases in float32, as autocast runs them) and reduces and updates in
/// float32: a gpt (layer norms, biases; some blocks checkpointed) and a llama (RMS
/// norms; two micro-batches a step) on two ranks follow `none` in bf16 within 1e-4
/// relative over 30 steps, and each rank's largest block takes about half the bytes
/// gathered (`gathered_block_bytes`) that it takes in float32.
#[test]
fn bf16_gathers_the_blocks_in_bf16_and_follows_unsharded_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let bf16 = "train.precision=\"bf16\"";
    let variants: [(&str, &[&str]); 2] = [("gpt", &[bf16, SOME_CHECKPOINTED[0], SOME_CHECKPOINTED[1]]), ("llama", &[bf16, "optim.accum_steps=2"])];
    for (model, extra) in variants {
        let run = |shard: &str, extra: &[&str]| {
            let run_dir = dir.path().join(format!("{model}-{shard}-{}", extra.len()));
            run_expect(launch(2).args(job(model, 30, shard, extra, &run_dir)), 0);
            (summary(&run_dir), losses(&run_dir))
        };
        let (none, base) = run("none", extra);
        let (sharded, got) = run("parameters", extra);
        let (float, _) = run("parameters", &[]);
        assert_eq!((got.len(), base.len()), (30, 30), "{model}");
        for ((step, x), (_, y)) in got.iter().zip(&base) {
            assert!((x - y).abs() <= 1e-4 * y.abs(), "{model} step {step}: loss {x}, unsharded {y}");
        }
        assert_eq!(per_rank(&none, "gathered_block_bytes"), [0, 0], "{model}: nothing gathered without parameter sharding");
        let (half, whole) = (per_rank(&sharded, "gathered_block_bytes"), per_rank(&float, "gathered_block_bytes"));
        // Half, plus the vectors in float32 and their gather's slots: 3% of a gpt
        // block's elements at this width (0.6x), 0.5% of a llama's (0.51x).
        for (&h, &w) in half.iter().zip(&whole) {
            assert!(w > 0 && 2 * h > w && 10 * h <= 6 * w, "{model}: a block gathered in bf16 takes {h} B, in float32 {w} B");
        }
    }
}

/// A bf16 `parameters` checkpoint holds the float32 chunks (the masters: the bf16
/// gathers are cast from them at every gather, so nothing in bf16 is saved): resumed
/// on two ranks it goes on as the uninterrupted run bit for bit, and on one rank
/// unsharded in bf16 within 1e-4.
#[test]
fn a_bf16_parameter_sharded_checkpoint_holds_float32_masters_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    let bf16 = ["--set", "train.precision=\"bf16\""];
    resumable(2, 6, 4, "parameters", &d("full"), &[bf16[0], bf16[1], "--set", "plugins.checkpoint.every=2"], 0);
    let step2 = d("full").join("checkpoints/step-00000002");
    let script = "import sys, glob\nfrom safetensors import safe_open\n\
                  parts = sorted(glob.glob(sys.argv[1] + '/optimizer-rank*.safetensors'))\nassert len(parts) == 2, parts\n\
                  for p in parts:\n    with safe_open(p, 'pt') as f:\n        \
                  assert f.get_slice('params').get_dtype() == 'F32', p\n";
    let out = py::cmd().args(["-c", script]).arg(&step2).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let resume = ["--resume", step2.to_str().unwrap()];
    resumable(2, 6, 4, "parameters", &d("two"), &[bf16[0], bf16[1], resume[0], resume[1]], 0);
    assert_losses_follow(&d("two"), &d("full"), 3, 4, 0.0);
    resumable(1, 12, 4, "none", &d("one"), &[bf16[0], bf16[1], resume[0], resume[1]], 0);
    assert_losses_follow(&d("one"), &d("full"), 3, 4, 1e-4);
}
