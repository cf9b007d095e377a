//! The moe kind (Qwen3-MoE, Qwen2-MoE with its shared expert, Mixtral; dense blocks,
//! routing noise) through the built binary, judged by the real `transformers` and
//! `peft` (tests/support/hf.py, lora.py): tiny random models it makes and saves itself
//! (4 experts, top 2, the routers perturbed so tokens spread) give the same logits, the same router load-balancing loss (`output_router_logits=True`) and
//! the same first training loss with the router term in ptrain; what ptrain exports
//! loads back with nothing missing and decodes greedily as transformers does; LoRA's
//! adapters (on attention, the router and the stacked experts) load into peft, and
//! peft's into ptrain; a run resumes bit for bit, recomputes its blocks with the router
//! losses on (using less memory) and shards; and what the kind cannot compute is refused
//! by name. Nothing is downloaded.

mod common;

use std::path::{Path, PathBuf};

use common::{hf::*, ranks, ranks::launch, *};

/// A `kind` model (`qwen3_moe`, `qwen2_moe` or `mixtral`) made by transformers in `dir`
/// (`--fused`: its experts stacked on disk; `--mlp-only`, `--sparse-step`: dense blocks;
/// `--jitter`: routing noise; tests/support/hf.py's `MOE_FLAGS`), random tokens below its vocabulary, and the settings
/// that train on them from it.
fn moe_model(dir: &Path, kind: &str, flags: &[&str]) -> (PathBuf, Vec<String>) {
    family_model(dir, "make-moe", kind, flags)
}

fn with(set: &[String], more: &[&str]) -> Vec<String> {
    set.iter().cloned().chain(more.iter().map(|m| m.to_string())).collect()
}

#[test]
fn each_moe_computes_transformers_logits_router_loss_and_first_loss() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("qwen3_moe", &[][..]),
        ("mixtral", &[]),
        ("qwen2_moe", &[]),
        ("qwen3_moe", &["--fused"]),
        ("qwen3_moe", &["--mlp-only"]),
        ("qwen2_moe", &["--sparse-step"]),
        ("mixtral", &["--jitter"]),
    ];
    for (kind, flags) in cases {
        let what = format!("{kind} {flags:?}");
        let (model, set) = moe_model(dir.path(), kind, flags);
        let probe = dir.path().join(format!("{kind}{}.probe", flags.concat()));
        let out =
            run_expect(ptrain().args(["logits", "--split", "train", "--step", "1", "--out"]).arg(&probe).args(small(&set).into_iter().skip(2)), 0);
        assert!(stdout(&out).contains("aux_loss"), "ptrain logits prints the router loss: {}", stdout(&out));
        let report = hf(&[&"compare-logits", &model, &probe, &"--router"]);
        let max_diff = report["max_abs_diff"].as_f64().unwrap();
        assert!(max_diff <= 1e-4, "{what}: logits differ from transformers' by {max_diff}: {report}");
        assert!(report["logit_scale"].as_f64().unwrap() > 0.1, "{what}: non-trivial logits: {report}");
        let aux = report["hf_aux_loss"].as_f64().unwrap();
        close(report["probe_aux_loss"].as_f64().unwrap(), aux, 1e-5, &format!("{what}: aux_loss vs transformers'"));
        assert!(aux > 2.0, "{what}: with 2 of 4 experts the balanced loss is 2, a skewed one more: {report}");
        let with_aux = report["hf_loss_with_aux"].as_f64().unwrap();
        match flags {
            ["--fused"] => continue,
            ["--jitter"] => {
                jitter_takes_effect_in_training_only(dir.path(), &set, with_aux);
                continue;
            }
            _ => {}
        }
        // The first training loss is transformers' with output_router_logits: the
        // cross-entropy plus router_aux_loss_coef (0.02 here) times aux_loss (over the
        // blocks with experts).
        close(first_loss(dir.path(), &format!("{what}-run"), &set), with_aux, 1e-5, &format!("{what}: first loss with the router term"));
        let resolved: toml::Table = std::fs::read_to_string(dir.path().join(format!("{what}-run/config.toml"))).unwrap().parse().unwrap();
        assert_eq!(resolved["model"]["kind"].as_str(), Some("moe"), "{what}: the kind comes from config.json");
        assert_eq!(resolved["model"]["moe"]["hf_model_type"].as_str(), Some(kind));
        assert_eq!(resolved["model"]["moe"]["router_aux_loss_coef"].as_float(), Some(0.02), "{what}: the coefficient from config.json");
        if !flags.is_empty() || kind == "qwen2_moe" {
            continue;
        }
        // Overridden: without the term the first loss is transformers' plain one.
        let plain = with(&set, &["model.moe.router_aux_loss_coef=0"]);
        close(first_loss(dir.path(), &format!("{what}-plain"), &plain), report["hf_loss"].as_f64().unwrap(), 1e-5, &format!("{what}: coef 0"));
        // The chunked loss adds the same router term.
        let chunked = with(&set, &["train.loss_chunk=16"]);
        close(first_loss(dir.path(), &format!("{what}-chunked"), &chunked), with_aux, 1e-5, &format!("{what}: chunked first loss"));
        let bf16 = with(&set, &["train.precision=bf16"]);
        close(first_loss(dir.path(), &format!("{what}-bf16"), &bf16), with_aux, 2e-2, &format!("{what}: bf16 first loss"));
    }
}

/// Mixtral's `router_jitter_noise` (0.2 in `set`'s model): evaluation's logits were
/// transformers' (the caller's check: no noise there), training's first loss is not
/// the noiseless `with_aux` but the same for the same seed, and with the noise set to 0
/// it is `with_aux` again.
fn jitter_takes_effect_in_training_only(dir: &Path, set: &[String], with_aux: f64) {
    let noisy = first_loss(dir, "jitter-a", set);
    assert!((noisy - with_aux).abs() > 1e-4, "the noise changed the training forward: {noisy} vs {with_aux}");
    assert_eq!(first_loss(dir, "jitter-b", set), noisy, "the noise is drawn from the run's seed");
    let resolved: toml::Table = std::fs::read_to_string(dir.join("jitter-a/config.toml")).unwrap().parse().unwrap();
    assert_eq!(resolved["model"]["moe"]["router_jitter_noise"].as_float(), Some(0.2), "from config.json");
    let off = first_loss(dir, "jitter-off", &with(set, &["model.moe.router_jitter_noise=0"]));
    close(off, with_aux, 1e-5, "without the noise: transformers' first loss");
}

/// Text, a byte-level BPE tokenizer trained on it, and a `kind` model of its vocabulary
/// with the tokenizer beside it.
fn tokenized_moe(dir: &Path, kind: &str, flags: &[&str]) -> (PathBuf, PathBuf) {
    let (text, tok) = (dir.join("text.txt"), dir.join("tok.json"));
    if !tok.exists() {
        hf(&[&"make-text", &text, &"6000", &"7"]);
        hf(&[&"train-tokenizer", &text, &tok, &"400"]);
    }
    let model = dir.join(format!("{kind}{}-tok", flags.concat()));
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"make-moe", &kind, &model, &tok];
    args.extend(flags.iter().map(|f| f as &dyn AsRef<std::ffi::OsStr>));
    hf(&args);
    (model, text)
}

#[test]
fn fine_tuned_moes_export_to_what_transformers_loads_and_generate_greedily_as_it_does() {
    let dir = tempfile::tempdir().unwrap();
    // Qwen2-MoE with dense blocks: its shared expert and the dense MLPs exported too.
    let cases = [
        ("qwen3_moe", "Qwen3MoeForCausalLM", &[][..]),
        ("mixtral", "MixtralForCausalLM", &[]),
        ("qwen2_moe", "Qwen2MoeForCausalLM", &["--sparse-step"]),
    ];
    for (kind, class, flags) in cases {
        let (model, text) = tokenized_moe(dir.path(), kind, flags);
        let set = [format!("model.init_from={}", s(&model)), "data.kind=text".into(), format!("data.path={}", s(&text)), "optim.lr=1e-2".into()];
        let run_dir = dir.path().join(format!("{kind}-ft"));
        run_expect(ptrain().args(["run", "--quiet", "--steps", "4", "--plugins", "checkpoint", "--run-dir"]).arg(&run_dir).args(small(&set)), 0);
        let probe = dir.path().join(format!("{kind}.probe"));
        run_expect(ptrain().args(["logits", "--split", "val", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&probe), 0);
        let out = dir.path().join(format!("{kind}-exported"));
        run_expect(ptrain().args(["export", "--format", "hf", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&out), 0);
        let report = loaded_export(&out, &probe, &model, kind);
        assert_eq!(report["class"].as_str(), Some(class), "{report}");

        let args = ["generate", "--device", "cpu", "--json", "--prompt", "the model tokenizer", "--temperature", "0", "--max-new-tokens", "24"];
        let ours = run_expect(ptrain().args(args).arg("--checkpoint").arg(&run_dir), 0);
        let ours: serde_json::Value = serde_json::from_str(stdout(&ours).lines().last().unwrap()).unwrap();
        let ids: Vec<String> = ours["prompt_ids"].as_array().unwrap().iter().map(|v| v.to_string()).collect();
        let theirs = hf(&[&"generate", &out, &ids.join(","), &"24"]);
        assert_eq!(ours["ids"], theirs["ids"], "{kind}: greedy continuation of {ids:?}");
    }
}

fn losses(run_dir: &Path) -> Vec<(u64, f64)> {
    read_jsonl(&run_dir.join("metrics.jsonl")).iter().filter_map(|row| Some((row["step"].as_u64()?, row["train/loss"].as_f64()?))).collect()
}

#[test]
fn lora_on_a_moe_loads_into_peft_and_a_moe_resumes_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let (model, set) = moe_model(dir.path(), "qwen3_moe", &[]);
    let run_dir = dir.path().join("lora");
    let lora = with(&set, &["lora.rank=4", "optim.lr=1e-2"]);
    run_expect(ptrain().args(["run", "--quiet", "--steps", "3", "--plugins", "checkpoint", "--run-dir"]).arg(&run_dir).args(small(&lora)), 0);
    let probe = dir.path().join("lora.probe");
    run_expect(ptrain().args(["logits", "--split", "val", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&probe), 0);
    let adapter = dir.path().join("adapter");
    run_expect(ptrain().args(["export", "--format", "peft", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&adapter), 0);
    let r = support_py("lora.py", &[&"peft-load", &model, &adapter, &probe]);
    assert_eq!((&r["missing"], &r["unexpected"]), (&serde_json::json!([]), &serde_json::json!([])), "{r}");
    assert!(r["max_lora_b"].as_f64().unwrap() > 1e-4, "the adapters were trained: {r}");
    assert!(r["max_abs_diff"].as_f64().unwrap() <= 1e-4, "peft's logits vs ptrain's: {r}");

    // Full fine-tuning, the experts' optimizer state included, resumed at step 3 of 6.
    let d = |name: &str| dir.path().join(name);
    let run = |name: &str, more: &[&str]| {
        let mut args = vec!["run".to_string(), "--quiet".into(), "--steps".into(), "6".into(), "--plugins".into(), "jsonl,checkpoint".into()];
        args.extend(small(&with(&set, &[&["plugins.jsonl.every=1", "plugins.checkpoint.every=3"][..], more].concat())));
        args.extend(["--run-dir".into(), s(&d(name))]);
        args
    };
    run_expect(ptrain().args(run("full", &[])), 0);
    let full = losses(&d("full"));
    assert_eq!(full.len(), 6);
    run_expect(ptrain().args(run("resumed", &[])).arg("--resume").arg(d("full").join("checkpoints/step-00000003")), 0);
    assert_eq!(losses(&d("resumed")), full[3..].to_vec(), "steps 4-6 after resuming at 3 are the uninterrupted run's bit for bit");
}

/// LoRA on the router and both stacked experts (beside q_proj), as peft 0.21 adapts them
/// (`target_parameters`): trained, resumed bit for bit, exported so peft loads every
/// adapter with its logits, merged into an export transformers loads with the same
/// logits; and peft's own adapter of that shape, continued from in ptrain, gives peft's
/// logits.
#[test]
fn lora_on_the_router_and_experts_resumes_and_round_trips_through_peft() {
    let dir = tempfile::tempdir().unwrap();
    for kind in ["qwen3_moe", "mixtral"] {
        let d = |name: &str| dir.path().join(format!("{kind}-{name}"));
        let (model, set) = moe_model(dir.path(), kind, &[]);
        let targets = r#"lora.targets=["q_proj", "gate", "experts.gate_up_proj", "experts.down_proj"]"#;
        let lora = with(&set, &["lora.rank=4", targets, "optim.lr=1e-2", "plugins.jsonl.every=1", "plugins.checkpoint.every=2"]);
        let run = |name: &str| {
            let mut args: Vec<String> = ["run", "--quiet", "--steps", "4", "--plugins", "jsonl,checkpoint"].map(String::from).into();
            args.extend(small(&lora));
            args.extend(["--run-dir".into(), s(&d(name))]);
            args
        };
        run_expect(ptrain().args(run("full")), 0);
        run_expect(ptrain().args(run("resumed")).arg("--resume").arg(d("full").join("checkpoints/step-00000002")), 0);
        assert_eq!(losses(&d("resumed")), losses(&d("full"))[2..].to_vec(), "{kind}: resumed at 2 of 4, bit for bit");
        // Under bf16 autocast with the chunked loss, the adapted experts' products run (B is 0
        // at the first step: the base's loss, within bf16's precision).
        let first = losses(&d("full"))[0].1;
        let bf16 = first_loss(dir.path(), &format!("{kind}-bf16"), &with(&lora, &["train.precision=bf16", "train.loss_chunk=16"]));
        close(bf16, first, 2e-2, &format!("{kind}: bf16 and the chunked loss with LoRA on the experts"));

        let probe = d("probe");
        run_expect(ptrain().args(["logits", "--split", "val", "--checkpoint"]).arg(d("full")).arg("--out").arg(&probe), 0);
        let adapter = d("adapter");
        run_expect(ptrain().args(["export", "--format", "peft", "--checkpoint"]).arg(d("full")).arg("--out").arg(&adapter), 0);
        let r = support_py("lora.py", &[&"peft-load", &model, &adapter, &probe]);
        assert_eq!((&r["missing"], &r["unexpected"]), (&serde_json::json!([]), &serde_json::json!([])), "{kind}: {r}");
        let warned = r["warnings"].as_array().unwrap().iter().filter(|w| !w.as_str().unwrap().contains("deprecated")).count();
        assert_eq!(warned, 0, "{kind}: peft loads it without a warning (but transformers' deprecations): {r}");
        // Both stacked weights adapted: peft nests gate_up_proj's wrapper inside down_proj's.
        for module in ["self_attn.q_proj", "mlp.gate", "mlp.experts.base_layer", "mlp.experts"] {
            assert!(r["max_lora_b_by_module"][module].as_f64().is_some_and(|b| b > 1e-4), "{kind}: {module}'s adapter was trained: {r}");
        }
        assert!(r["max_abs_diff"].as_f64().unwrap() <= 1e-4, "{kind}: peft's logits vs ptrain's: {r}");
        // Merged (each expert's W_e + scaling B_e A_e): transformers' logits are ptrain's.
        let merged = d("merged");
        run_expect(ptrain().args(["export", "--format", "hf", "--merge", "--checkpoint"]).arg(d("full")).arg("--out").arg(&merged), 0);
        loaded_export(&merged, &probe, &model, kind);

        // peft's own adapter (drawn B), continued from: ptrain's logits are peft's.
        let own = d("own");
        support_py("lora.py", &[&"make-peft", &model, &own]);
        let from_own = [format!("model.init_from={}", s(&own)), "model.init_adapters=\"continue\"".into(), set[0].clone(), set[1].clone()];
        let own_probe = d("own-probe");
        run_expect(ptrain().args(["logits", "--split", "val", "--step", "1", "--out"]).arg(&own_probe).args(small(&from_own).into_iter().skip(2)), 0);
        let r = support_py("lora.py", &[&"peft-load", &model, &own, &own_probe]);
        assert!(r["logit_scale"].as_f64().unwrap() > 0.1 && r["max_abs_diff"].as_f64().unwrap() <= 1e-4, "{kind}: peft's own adapter in ptrain: {r}");
    }
}

/// A from-scratch Qwen3-MoE shape on generated bytes: 3 blocks of 4 experts, top 2.
fn scratch(steps: u64, run_dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = tiny_gpt(steps);
    let sets = ["model.kind=moe", "model.n_layer=3", "model.n_head=4", "model.llama.n_kv_head=2", "model.llama.qk_norm=true", "model.moe.experts=4"];
    let common =
        ["model.moe.expert_intermediate_size=16", "data.batch_size=4", "dist.timeout_s=30", "plugins.jsonl.every=1", "optim.schedule=constant"];
    for set in sets.iter().chain(&common).chain(extra) {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args.extend(["--plugins".into(), "jsonl".into(), "--run-dir".into(), s(run_dir)]);
    args
}

#[test]
fn a_scratch_moe_learns_recomputes_and_shards_as_one_rank_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    run_expect(ptrain().args(scratch(10, &d("plain"), &["model.moe.router_z_loss_coef=0.001"])), 0);
    let plain = losses(&d("plain"));
    assert_eq!(plain.len(), 10);
    assert!(plain[9].1 < plain[0].1, "the loss falls: {plain:?}");
    let rows = read_jsonl(&d("plain").join("metrics.jsonl"));
    for key in ["train/aux_loss", "train/z_loss", "train/expert_load_max/2", "train/expert_load_min/0"] {
        assert!(rows[0][key].as_f64().is_some_and(f64::is_finite), "{key} logged: {}", rows[0]);
    }

    // With the router losses on, every block recomputed in backward (its router logits
    // come out of its checkpoint with its output): the losses, the router's metrics and
    // step 1's gradients and update are the stored run's, bit for bit.
    let on = ["model.moe.router_aux_loss_coef=0.01", "model.moe.router_z_loss_coef=0.001", "debug.dump_tensors_at=[1]"];
    run_expect(ptrain().args(scratch(4, &d("kept"), &on)), 0);
    run_expect(ptrain().args(scratch(4, &d("recomputed"), &[&on[..], &["train.activation_checkpointing=\"full\""]].concat())), 0);
    let (kept, recomputed) = (read_jsonl(&d("kept").join("metrics.jsonl")), read_jsonl(&d("recomputed").join("metrics.jsonl")));
    for key in ["train/loss", "train/aux_loss", "train/z_loss", "train/expert_load_max/1"] {
        let values = |rows: &[serde_json::Value]| rows.iter().filter_map(|r| r[key].as_f64()).collect::<Vec<_>>();
        assert_eq!(values(&recomputed), values(&kept), "{key}: every block recomputed, the same bits");
        assert_eq!(values(&kept).len(), 4, "{key} logged each step");
    }
    let dump = |name: &str| std::fs::read(d(name).join("tensors-step1.rank0.safetensors")).unwrap();
    assert!(
        ranks::tensor_names(&dump("kept")).iter().any(|n| n.starts_with("grad/") && n.contains("mlp.gate")),
        "the dump holds the router's gradient"
    );
    assert!(dump("kept") == dump("recomputed"), "step 1's parameters, gradients and update are the same bits");

    // Two Gloo ranks, unsharded, with the optimizer's state sharded, with gradients too,
    // and with parameters (the experts too) sharded block by block; and LoRA on the
    // router and the experts, unsharded and with parameters sharded.
    let none = d("two-none");
    run_expect(launch(2).args(scratch(6, &none, &["dist.shard=none"])), 0);
    let lora = ["lora.rank=2", r#"lora.targets=["q_proj", "gate", "experts.gate_up_proj", "experts.down_proj"]"#, "optim.lr=1e-2"];
    run_expect(launch(2).args(scratch(6, &d("two-lora-none"), &[&lora[..], &["dist.shard=none"]].concat())), 0);
    let cases = [
        ("optimizer", &["dist.shard=optimizer"][..], &none),
        ("gradients", &["dist.shard=gradients"], &none),
        ("parameters", &["dist.shard=parameters"], &none),
    ];
    let lora_sharded = [&lora[..], &["dist.shard=parameters"]].concat();
    for (name, set, base) in cases.into_iter().chain([("lora-parameters", &lora_sharded[..], &d("two-lora-none"))]) {
        run_expect(launch(2).args(scratch(6, &d(&format!("two-{name}")), set)), 0);
        let (base, got) = (losses(base), losses(&d(&format!("two-{name}"))));
        assert_eq!(got.len(), 6);
        for ((step, x), (_, y)) in got.iter().zip(&base) {
            assert!((x - y).abs() <= 1e-5 * y.abs(), "{name}: step {step}: loss {x} sharded, unsharded {y}");
        }
    }
}

#[test]
fn checkpointing_a_moe_with_its_router_losses_lowers_peak_memory() {
    let dir = tempfile::tempdir().unwrap();
    let moe = ["model.kind=moe", "model.moe.experts=4", "model.moe.expert_intermediate_size=64", "model.moe.router_aux_loss_coef=0.01"];
    let (none, full) = checkpointing_peaks(dir.path(), &moe);
    // 815 MB against 508 MB when measured: half that gap is the bound.
    assert!(full < none - 150e6, "peak {full} bytes with full checkpointing vs {none} without");
}

#[test]
fn what_the_moe_kind_cannot_compute_is_refused_by_name_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let (model, set) = moe_model(dir.path(), "qwen3_moe", &[]);
    let edits: [(&str, serde_json::Value, &str); 3] = [
        ("num_experts_per_tok", 5.into(), "num_experts_per_tok = 5"),
        ("mlp_only_layers", serde_json::json!([-1]), "mlp_only_layers holds -1"),
        ("decoder_sparse_step", 0.into(), "decoder_sparse_step = 0"),
    ];
    for (i, (key, value, needle)) in edits.into_iter().enumerate() {
        let edited = with_config_key(&set, &model, &dir.path().join(format!("edited-{i}")), key, value);
        refused(dir.path(), &edited, needle);
    }
    let dropout = ["lora.targets=[\"experts.down_proj\"]", "lora.dropout=0.1"];
    refused(dir.path(), &with(&set, &dropout), "lora.dropout");
    for (setting, needle) in [("model.moe.top_k=9", "model.moe.top_k"), ("lora.targets=[\"experts\"]", "lora.targets[0]")] {
        refused(dir.path(), &["model.kind=moe".into(), "model.n_embd=32".into(), setting.into()], needle);
    }
}
