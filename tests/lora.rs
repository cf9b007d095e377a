//! LoRA (`[lora]`) through the built binary, judged by the real `peft` and
//! `transformers` (tests/support/lora.py, hf.py): the adapters ptrain exports load
//! into `peft` with no missing or unexpected key and give ptrain's logits, as does
//! the merged model in `transformers`; the base is frozen (no gradient, no
//! optimizer state, not in checkpoints); a resumed run repeats the uninterrupted
//! one and refuses another base; two ranks equal one rank accumulating; bad values
//! exit 2 naming the key; rank-8 adapters' optimizer state is under 2% of full
//! fine-tuning's. Nothing is downloaded.

mod common;

use std::path::{Path, PathBuf};

use common::{
    hf::{close, hf, made_dir, made_file, s, support_py},
    *,
};

fn lora_py(args: &[&dyn AsRef<std::ffi::OsStr>]) -> serde_json::Value {
    support_py("lora.py", args)
}

/// `--set` arguments.
fn sets(pairs: &[&str]) -> Vec<String> {
    pairs.iter().flat_map(|p| ["--set".to_string(), p.to_string()]).collect()
}

/// A random Qwen2 (64 wide, 2 layers, tied, GQA 4:2) with a ChatML tokenizer and
/// chat rows (chat.py's), in `dir/model`.
fn qwen2(dir: &Path) -> PathBuf {
    fixture::copy("chat.py", &["make", fixture::OUT, "40", "3"], &dir.join("model"))
}

/// A LoRA run on chat rows of `model` (packed), on the CPU with one thread.
fn qwen2_lora(model: &Path, cache: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["--device", "cpu"].map(String::from).into();
    a.extend(sets(&[
        "run.threads=1",
        &format!("model.init_from={}", s(model)),
        "data.kind=chat",
        &format!("data.path={}", s(&model.join("chat.jsonl"))),
        &format!("data.tokens_cache={}", s(cache)),
        "data.packing=true",
        "data.batch_size=2",
        "train.eval_batches=1",
        "optim.lr=1e-2",
        "lora.rank=4",
        "lora.alpha=8.0",
    ]));
    a.extend(sets(extra));
    a
}

fn run(run_dir: &Path, steps: u64, args: &[String]) {
    let mut cmd = ptrain();
    cmd.args(["run", "--quiet", "--plugins", "checkpoint,jsonl", "--steps", &steps.to_string(), "--run-dir"]).arg(run_dir).args(args);
    run_expect(cmd.args(sets(&["plugins.jsonl.every=1"])), 0);
}

/// The tensor names of a safetensors file.
fn names(path: &Path) -> Vec<String> {
    ranks::tensor_names(&std::fs::read(path).unwrap())
}

fn newest_checkpoint(run_dir: &Path) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(run_dir.join("checkpoints"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("step-"))
        .collect();
    dirs.sort();
    dirs.pop().unwrap()
}

/// `ptrain logits` of the run's newest checkpoint on its first evaluation batch.
fn probe(run_dir: &Path, out: &Path) {
    run_expect(ptrain().args(["logits", "--split", "val", "--checkpoint"]).arg(run_dir).arg("--out").arg(out), 0);
}

/// Loads `adapter` into `peft` over `base`: nothing missing or unexpected, trained
/// (lora_B non-zero), and ptrain's logits.
fn assert_peft_loads(base: &Path, adapter: &Path, probe: &Path, what: &str) {
    let r = lora_py(&[&"peft-load", &base, &adapter, &probe]);
    assert_eq!(r["missing"], serde_json::json!([]), "{what}: {r}");
    assert_eq!(r["unexpected"], serde_json::json!([]), "{what}: {r}");
    assert!(r["adapters"].as_u64().unwrap() >= 4, "{what}: {r}");
    assert!(r["max_lora_b"].as_f64().unwrap() > 1e-4, "{what}: the adapters were trained: {r}");
    assert!(r["max_abs_diff"].as_f64().unwrap() <= 1e-4, "{what}: peft's logits vs ptrain's: {r}");
}

#[test]
fn peft_loads_the_exported_adapters_and_transformers_the_merged_model_with_ptrains_logits() {
    let dir = tempfile::tempdir().unwrap();
    let model = qwen2(dir.path());
    let run_dir = dir.path().join("qwen2");
    // Dropout on the adapters: evaluation (the probe, peft in eval mode) draws none.
    run(&run_dir, 6, &qwen2_lora(&model, &dir.path().join("cache"), &["lora.dropout=0.1"]));
    let checkpoint = newest_checkpoint(&run_dir);
    assert!(names(&checkpoint.join("model.safetensors")).iter().all(|n| n.contains(".lora_")), "only the adapters are checkpointed");
    let probe_file = dir.path().join("probe.safetensors");
    probe(&run_dir, &probe_file);

    let adapter = dir.path().join("adapter");
    let done = run_expect(ptrain().args(["export", "--format", "peft", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&adapter), 0);
    assert!(stdout(&done).contains("PeftModel.from_pretrained"), "{}", stdout(&done));
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(adapter.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!((config["r"].as_i64(), config["lora_alpha"].as_f64()), (Some(4), Some(8.0)), "{config}");
    assert_eq!(config["target_modules"].as_array().unwrap().len(), 7, "every projection by default: {config}");
    assert_peft_loads(&model, &adapter, &probe_file, "qwen2");
    // The run's tokenizer travels with the adapters (as TRL's save_model writes it).
    let r = lora_py(&[&"same-tokenizer", &adapter, &model]);
    assert_eq!((&r["same_template"], &r["same_ids"], &r["same_eos"]), (&true.into(), &true.into(), &true.into()), "{r}");
    run_expect(
        ptrain().args(["export", "--format", "peft", "--no-tokenizer", "--checkpoint"]).arg(&run_dir).arg("--out").arg(dir.path().join("bare")),
        0,
    );
    assert!(!dir.path().join("bare/tokenizer.json").exists() && dir.path().join("bare/adapter_model.safetensors").is_file());

    let merged = dir.path().join("merged");
    run_expect(ptrain().args(["export", "--format", "hf", "--merge", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&merged), 0);
    let r = hf(&[&"load-export", &merged, &probe_file]);
    assert_eq!(r["info"]["missing_keys"], serde_json::json!([]), "{r}");
    assert_eq!(r["info"]["unexpected_keys"], serde_json::json!([]), "{r}");
    assert!(r["max_abs_diff"].as_f64().unwrap() <= 1e-4, "merged: transformers' logits vs ptrain's: {r}");

    // Without --merge there is no base to write; peft of a full fine-tuning run has no adapters.
    let out = run_expect(ptrain().args(["export", "--format", "hf", "--checkpoint"]).arg(&run_dir).arg("--out").arg(dir.path().join("x")), 2);
    assert!(stderr(&out).contains("--merge"), "{}", stderr(&out));
    let full = dir.path().join("full");
    run(&full, 1, &qwen2_lora(&model, &dir.path().join("cache"), &["lora.enabled=false"]));
    let out = run_expect(ptrain().args(["export", "--format", "peft", "--checkpoint"]).arg(&full).arg("--out").arg(dir.path().join("y")), 2);
    assert!(stderr(&out).contains("[lora]"), "{}", stderr(&out));
}

#[test]
fn gpt2_adapters_on_conv1d_layers_load_into_peft_and_merge() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tokens) = (dir.path().join("gpt2"), dir.path().join("tokens.bin"));
    made_dir(&["make-model", fixture::OUT], &model);
    made_file(&["make-tokens", "{out}/tokens.bin", "20000"], &tokens);
    let run_dir = dir.path().join("gpt2-lora");
    let args = [
        ["--device", "cpu"].map(String::from).to_vec(),
        sets(&[
            "run.threads=1",
            &format!("model.init_from={}", s(&model)),
            "data.kind=tokens",
            &format!("data.path={}", s(&tokens)),
            "data.max_seq_len=32",
            "data.batch_size=2",
            "train.eval_batches=1",
            "optim.lr=1e-2",
            "lora.rank=4",
        ]),
    ]
    .concat();
    run(&run_dir, 4, &args);
    let probe_file = dir.path().join("probe.safetensors");
    probe(&run_dir, &probe_file);
    let adapter = dir.path().join("adapter");
    run_expect(ptrain().args(["export", "--format", "peft", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&adapter), 0);
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(adapter.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(config["fan_in_fan_out"], true, "GPT-2's Conv1D: {config}");
    assert_peft_loads(&model, &adapter, &probe_file, "gpt2");
    let merged = dir.path().join("merged");
    run_expect(ptrain().args(["export", "--format", "hf", "--merge", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&merged), 0);
    let r = hf(&[&"load-export", &merged, &probe_file]);
    assert!(r["max_abs_diff"].as_f64().unwrap() <= 1e-4 && r["info"]["missing_keys"] == serde_json::json!([]), "merged gpt2: {r}");
}

#[test]
fn a_resumed_lora_run_repeats_the_uninterrupted_one_and_refuses_another_base() {
    let dir = tempfile::tempdir().unwrap();
    let model = qwen2(dir.path());
    let cache = dir.path().join("cache");
    // Adapter dropout draws random numbers; a constant schedule makes the 3-step run
    // the first part of the 6-step one.
    let args = qwen2_lora(&model, &cache, &["lora.dropout=0.1", "optim.schedule=\"constant\"", "optim.warmup_steps=0"]);
    let (whole, part, resumed) = (dir.path().join("whole"), dir.path().join("part"), dir.path().join("resumed"));
    run(&whole, 6, &args);
    run(&part, 3, &args);
    let mut cmd = ptrain();
    cmd.args(["run", "--quiet", "--plugins", "checkpoint,jsonl", "--steps", "6", "--resume"]).arg(&part).arg("--run-dir").arg(&resumed);
    run_expect(cmd.args(&args).args(sets(&["plugins.jsonl.every=1"])), 0);
    let losses = |d: &Path| -> Vec<(u64, u64)> {
        read_jsonl(&d.join("metrics.jsonl"))
            .iter()
            .filter_map(|r| Some((r["step"].as_u64()?, r["train/loss"].as_f64()?.to_bits())))
            .filter(|(step, _)| *step > 3)
            .collect()
    };
    assert_eq!(losses(&whole).len(), 3);
    assert_eq!(losses(&resumed), losses(&whole), "the resumed run's losses, bit for bit");
    let out = py::cmd().arg("tests/support/compare_checkpoints.py").arg(newest_checkpoint(&whole)).arg(newest_checkpoint(&resumed)).output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert!(report["model_equal"] == true && report["optimizer_equal"] == true, "the final adapters and their state: {report}");

    // Another base of the same shapes: the adapters do not fit it.
    let other = dir.path().join("other");
    lora_py(&[&"perturb", &model, &other, &"model.layers.1.mlp.up_proj.weight"]);
    let mut on_other = qwen2_lora(&other, &cache, &["lora.dropout=0.1", "optim.schedule=\"constant\"", "optim.warmup_steps=0"]);
    on_other.extend(sets(&[&format!("data.path={}", s(&model.join("chat.jsonl")))]));
    let mut cmd = ptrain();
    cmd.args(["run", "--quiet", "--plugins", "checkpoint", "--steps", "6", "--resume"]).arg(&part).arg("--run-dir").arg(dir.path().join("r2"));
    let out = run_expect(cmd.args(&on_other), 2);
    assert!(stderr(&out).contains("not the base these adapters were trained on"), "{}", stderr(&out));
    // Nor does a run without [lora] resume from adapters.
    let mut cmd = ptrain();
    cmd.args(["run", "--quiet", "--steps", "6", "--resume"]).arg(&part).arg("--run-dir").arg(dir.path().join("r3"));
    let out = run_expect(cmd.args(&args).args(sets(&["lora.enabled=false"])), 2);
    assert!(stderr(&out).contains("LoRA adapters only"), "{}", stderr(&out));

    // A checkpoint written before the per-tensor digest records `lora_base_sha256`, one
    // hash of the whole base: it resumes (on the base it names) with a warning that the
    // base is not checked, and goes on as the uninterrupted run.
    let earlier = dir.path().join("earlier");
    let script = "import json, shutil, sys, zlib\nsrc, dst = sys.argv[1:]\nshutil.copytree(src, dst)\n\
                  s = json.load(open(f'{dst}/state.json'))\ns['lora_base_sha256'] = '0' * 64\ndel s['lora_base_digest']\n\
                  data = json.dumps(s).encode()\nopen(f'{dst}/state.json', 'wb').write(data)\nm = json.load(open(f'{dst}/manifest.json'))\n\
                  f = next(f for f in m['files'] if f['path'] == 'state.json')\nf['size'], f['crc32'] = len(data), zlib.crc32(data)\n\
                  json.dump(m, open(f'{dst}/manifest.json', 'w'))\n";
    assert!(py::cmd().args(["-c", script]).arg(newest_checkpoint(&part)).arg(&earlier).status().unwrap().success());
    let from_earlier = dir.path().join("from-earlier");
    let mut cmd = ptrain();
    cmd.args(["run", "--plugins", "jsonl", "--steps", "6", "--resume"]).arg(&earlier).arg("--run-dir").arg(&from_earlier);
    let out = run_expect(cmd.args(&args).args(sets(&["plugins.jsonl.every=1"])), 0);
    assert!(stderr(&out).contains("is not checked against it"), "{}", stderr(&out));
    assert_eq!(losses(&from_earlier), losses(&whole), "resumed from the earlier form");
}

#[test]
fn the_base_is_frozen_and_two_ranks_equal_one_rank_accumulating() {
    let dir = tempfile::tempdir().unwrap();
    let model = qwen2(dir.path());
    let cache = dir.path().join("cache");
    // Two steps: a rank whose update missed the other's gradient drifts in the second.
    let base = ["train.steps=2", "debug.dump_tensors_at=[1]", "debug.dump_params=true", "optim.accum_steps=1"];
    let one = dir.path().join("1x2");
    let args = qwen2_lora(&model, &cache, &[&base[..], &["optim.accum_steps=2"]].concat());
    run_expect(ptrain().args(["run", "--quiet", "--run-dir"]).arg(&one).args(&args), 0);
    let two = dir.path().join("2r");
    let out = ranks::launch(2).args(["run", "--quiet", "--run-dir"]).arg(&two).args(qwen2_lora(&model, &cache, &base)).output().unwrap();
    assert!(out.status.success(), "2 ranks: {}", stderr(&out));

    // Only the adapters have gradients (and so are all-reduced) and optimizer state.
    let dump = |d: &Path, r: u32| d.join(format!("tensors-step1.rank{r}.safetensors"));
    let grads: Vec<String> = names(&dump(&one, 0)).into_iter().filter(|n| n.starts_with("grad/")).collect();
    assert!(!grads.is_empty() && grads.iter().all(|n| n.contains(".lora_A.") || n.contains(".lora_B.")), "{grads:?}");
    let s1 = summary(&one);
    let trainable = s1["trainable_parameters"].as_u64().unwrap();
    // 2 layers x 4 x (64+64 q, 64+32 k, 64+32 v, 64+64 o, 3 x (64+96) mlp).
    assert_eq!(trainable, 2 * 4 * (128 + 96 + 96 + 128 + 3 * 160));
    assert!(s1["parameters"].as_u64().unwrap() > 10 * trainable, "{s1}");
    // AdamW: two float32 moments per trainable parameter, and the step counter.
    assert_eq!(s1["optimizer_state_bytes"][0].as_u64().unwrap(), 8 * trainable + 4);
    // One rank releases them between steps: what backward made.
    assert_eq!(s1["gradient_peak_bytes"][0].as_u64().unwrap(), 4 * trainable);

    close(summary(&two)["first_loss"].as_f64().unwrap(), s1["first_loss"].as_f64().unwrap(), 1e-6, "2 ranks vs 1 x 2 loss");
    let g = support_py("chat.py", &[&"compare-grads", &dump(&one, 0), &dump(&two, 0), &dump(&two, 1)]);
    assert!(g["max_rel"].as_f64().unwrap() <= 1e-6 && g["tensors"].as_u64().unwrap() == grads.len() as u64, "2 ranks (their mean) vs 1 x 2: {g}");
    let params = |d: &Path, r: u32| d.join(format!("params-rank{r}.safetensors"));
    for (what, other) in [("rank 0 of 2", params(&two, 0)), ("rank 1 of 2", params(&two, 1))] {
        let p = lora_py(&[&"compare-params", &params(&one, 0), &other]);
        assert!(p["same_names"] == true && p["max_rel"].as_f64().unwrap() <= 1e-5, "adapters after 2 steps, {what} vs 1 x 2: {p}");
    }
}

#[test]
fn rank_8_adapters_hold_under_2_percent_of_full_fine_tunings_optimizer_state() {
    // 1024 wide: rank 8 is under 1% of a 1024 x 1024 matrix's parameters (at the
    // 64-wide test model, rank 8 is 25% of each matrix's width: no meaningful ratio).
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("wide");
    lora_py(&[&"make-wide", &model]);
    let bytes = |name: &str, lora: &str| {
        let run_dir = dir.path().join(name);
        let extra = [lora, "data.max_seq_len=32", "data.batch_size=1", "data.packing=false"];
        let mut cmd = ptrain();
        cmd.args(["run", "--quiet", "--steps", "1", "--run-dir"]).arg(&run_dir).args(qwen2_lora(&model, &dir.path().join("cache"), &extra));
        run_expect(&mut cmd, 0);
        let s = summary(&run_dir);
        (s["optimizer_state_bytes"][0].as_u64().unwrap(), s["trainable_parameters"].as_u64().unwrap())
    };
    let (lora, lora_params) = bytes("lora", "lora.rank=8");
    let (full, full_params) = bytes("full", "lora.enabled=false");
    assert_eq!(full, 8 * full_params + 4, "full fine-tuning's AdamW state");
    assert!(lora_params > 0 && (lora as f64) < 0.02 * full as f64, "rank 8: {lora} bytes vs full {full} ({:.3}%)", 100.0 * lora as f64 / full as f64);
}

#[test]
fn bad_lora_values_exit_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let model = qwen2(dir.path());
    let cache = dir.path().join("cache");
    for (set, key) in [
        ("lora.rank=0", "lora.rank"),
        ("lora.rank=-2", "lora.rank"),
        ("lora.alpha=-1.0", "lora.alpha"),
        ("lora.alpha=nan", "lora.alpha"),
        ("lora.dropout=1.0", "lora.dropout"),
        ("lora.targets=[\"q_proj\", \"qproj\"]", "lora.targets[1]"),
        ("lora.targets=[\"c_attn\"]", "lora.targets[0]"),
    ] {
        let mut cmd = ptrain();
        cmd.args(["run", "--quiet", "--steps", "1", "--run-dir"]).arg(dir.path().join("bad")).args(qwen2_lora(&model, &cache, &[set]));
        let err = stderr(&run_expect(&mut cmd, 2));
        assert!(err.contains(key), "{set}: {err}");
        assert!(err.contains(&format!("in --set {set}")), "{set}: the error names the --set that gave the value: {err}");
        assert!(!dir.path().join("bad").exists(), "{set}: refused before the run directory");
    }
    let err = stderr(&run_expect(ptrain().args(["run", "--quiet", "--steps", "1", "--set", "model.kind=mlp", "--set", "lora.rank=4"]), 2));
    assert!(err.contains("lora") && err.contains("Mlp"), "{err}");
}

#[test]
fn lora_starts_from_the_base_exactly_in_fp32_and_in_bf16_with_the_base_stored_in_bf16() {
    // B starts at zero: the first loss is the base model's, bit for bit; in bf16 the
    // frozen block matrices are stored in bf16, the values autocast would use anyway.
    let dir = tempfile::tempdir().unwrap();
    let model = qwen2(dir.path());
    let cache = dir.path().join("cache");
    for (name, extra) in
        [("fp32", vec![]), ("bf16", vec!["train.precision=bf16"]), ("bf16-chunks", vec!["train.precision=bf16", "train.loss_chunk=16"])]
    {
        let first = |lora: &str| {
            let run_dir = dir.path().join(format!("{name}-{lora}"));
            let args = qwen2_lora(&model, &cache, &[&extra[..], &[lora]].concat());
            run_expect(ptrain().args(["run", "--quiet", "--steps", "1", "--run-dir"]).arg(&run_dir).args(args), 0);
            summary(&run_dir)["first_loss"].as_f64().unwrap()
        };
        assert_eq!(first("lora.rank=4").to_bits(), first("lora.enabled=false").to_bits(), "{name}: LoRA's first loss vs the base's");
    }
}

#[test]
fn lora_with_activation_checkpointing_gives_the_same_losses_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let model = qwen2(dir.path());
    let cache = dir.path().join("cache");
    let losses = |name: &str, extra: &[&str]| -> Vec<u64> {
        let run_dir = dir.path().join(name);
        run(&run_dir, 3, &qwen2_lora(&model, &cache, extra));
        read_jsonl(&run_dir.join("metrics.jsonl")).iter().filter_map(|r| Some(r["train/loss"].as_f64()?.to_bits())).collect()
    };
    let stored = losses("stored", &[]);
    assert_eq!(stored.len(), 3);
    assert_eq!(losses("recomputed", &["train.activation_checkpointing=\"full\""]), stored, "LoRA with every layer recomputed");
}
