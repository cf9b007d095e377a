//! The gemma kind (Gemma 2, Gemma 3 text) through the built binary, judged by the real
//! `transformers` (tests/support/hf.py): tiny random models it makes and saves itself,
//! whose settings make every feature matter (sliding and full layers mixed with a window
//! of 8 under sequences of 64, soft caps small enough to bite, `query_pre_attn_scalar`
//! 32 for heads of 24, Gemma 3's local RoPE base apart from its global one), give the
//! same logits and losses in ptrain (the chunked loss too), and transformers' logits
//! with any one feature turned off are far from ptrain's; what ptrain exports loads back
//! with nothing missing; greedy generation past the window is transformers'; the kind
//! trains with LoRA, activation checkpointing and parameter sharding, counts its FLOPs;
//! and what it cannot compute is refused by name. Nothing is downloaded.

mod common;

use std::path::{Path, PathBuf};

use common::{hf::*, ranks::launch, *};

/// A `kind` model (`gemma2` or `gemma3`) made by transformers in `dir/name` (`--4x`: its
/// config.json in the 4.x form), with random tokens below its vocabulary, and the
/// settings that train on them from it.
fn gemma_model(dir: &Path, kind: &str, flags: &[&str]) -> (PathBuf, Vec<String>) {
    family_model(dir, "make-gemma", kind, flags)
}

#[test]
fn each_gemma_computes_transformers_logits_and_losses_and_every_feature_matters() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, flags) in [("gemma2", &[][..]), ("gemma3", &[]), ("gemma3", &["--4x"])] {
        let what = format!("{kind} {flags:?}");
        let (model, set) = gemma_model(dir.path(), kind, flags);
        let probe = dir.path().join(format!("{kind}{}.probe", flags.concat()));
        run_expect(ptrain().args(["logits", "--split", "train", "--step", "1", "--out"]).arg(&probe).args(small(&set).into_iter().skip(2)), 0);
        if !flags.is_empty() {
            // The 4.x form: the same model read from another config.json.
            let report = hf(&[&"compare-logits", &model, &probe]);
            assert!(report["max_abs_diff"].as_f64().unwrap() <= 1e-4, "{what}: logits differ from transformers': {report}");
            continue;
        }
        let report = hf(&[&"compare-logits", &model, &probe, &"--features"]);
        let max_diff = report["max_abs_diff"].as_f64().unwrap();
        assert!(max_diff <= 1e-4, "{what}: logits differ from transformers' by {max_diff}: {report}");
        assert!(report["logit_scale"].as_f64().unwrap() > 0.1, "{what}: non-trivial logits: {report}");
        // transformers with any one feature off computes logits far from ptrain's: each
        // is computed, and would fail the comparison above if it were not.
        let features = report["features"].as_object().unwrap();
        assert_eq!(features.len(), if kind == "gemma2" { 5 } else { 4 }, "{what}: {report}");
        for (feature, diff) in features {
            assert!(diff.as_f64().unwrap() > 1e-2, "{what}: without {feature} the logits barely change ({diff}): the test would not see it");
        }

        let hf_loss = report["hf_loss"].as_f64().unwrap();
        close(first_loss(dir.path(), &format!("{what}-run"), &set), hf_loss, 1e-5, &format!("{what}: first training loss vs transformers'"));
        // The chunked loss caps each chunk's logits as the whole logits are capped.
        let chunked = [&set[..], &["train.loss_chunk=16".to_string()]].concat();
        close(first_loss(dir.path(), &format!("{what}-chunked"), &chunked), hf_loss, 1e-5, &format!("{what}: chunked first loss"));
        let resolved: toml::Table = std::fs::read_to_string(dir.path().join(format!("{what}-run/config.toml"))).unwrap().parse().unwrap();
        assert_eq!(resolved["model"]["kind"].as_str(), Some("gemma"), "{what}: the kind comes from config.json");
        let hf_type = if kind == "gemma2" { "gemma2" } else { "gemma3_text" };
        assert_eq!(resolved["model"]["gemma"]["hf_model_type"].as_str(), Some(hf_type));

        let bf16 = hf(&[&"compare-logits", &model, &probe, &"--bf16"]);
        let set16 = [&set[..], &["train.precision=bf16".to_string()]].concat();
        close(first_loss(dir.path(), &format!("{what}-bf16"), &set16), bf16["hf_loss"].as_f64().unwrap(), 1e-2, &format!("{what}: bf16 first loss"));
    }
}

/// Text, a byte-level BPE tokenizer trained on it, and a `kind` model of its vocabulary
/// with the tokenizer beside it.
fn tokenized_gemma(dir: &Path, kind: &str) -> (PathBuf, PathBuf) {
    let (text, tok) = (dir.join("text.txt"), dir.join("tok.json"));
    if !tok.exists() {
        hf(&[&"make-text", &text, &"6000", &"7"]);
        hf(&[&"train-tokenizer", &text, &tok, &"400"]);
    }
    let model = dir.join(format!("{kind}-tok"));
    hf(&[&"make-gemma", &kind, &model, &tok]);
    (model, text)
}

/// `ptrain generate --json`'s report.
fn generate(args: &[&dyn AsRef<std::ffi::OsStr>]) -> serde_json::Value {
    let out = run_expect(ptrain().arg("generate").args(args.iter().map(|a| a.as_ref())).args(["--device", "cpu", "--json"]), 0);
    serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap()
}

#[test]
fn fine_tuned_gemmas_export_to_what_transformers_loads_and_generate_greedily_as_it_does() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, class) in [("gemma2", "Gemma2ForCausalLM"), ("gemma3", "Gemma3ForCausalLM")] {
        let (model, text) = tokenized_gemma(dir.path(), kind);
        let set = [format!("model.init_from={}", s(&model)), "data.kind=text".into(), format!("data.path={}", s(&text))];
        let run_dir = dir.path().join(format!("{kind}-ft"));
        run_expect(ptrain().args(["run", "--quiet", "--steps", "5", "--plugins", "checkpoint", "--run-dir"]).arg(&run_dir).args(small(&set)), 0);
        let probe = dir.path().join(format!("{kind}.probe"));
        run_expect(ptrain().args(["logits", "--split", "val", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&probe), 0);
        let out = dir.path().join(format!("{kind}-exported"));
        run_expect(ptrain().args(["export", "--format", "hf", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&out), 0);
        let report = loaded_export(&out, &probe, &model, kind);
        assert_eq!((report["class"].as_str(), report["tied"].as_bool()), (Some(class), Some(true)), "{report}");
        assert_eq!(report["tokenizer_matches"], true, "{report}");

        // 8 prompt tokens and 40 new ones: decoding crosses the sliding window of 8.
        let ours =
            generate(&[&"--checkpoint", &run_dir, &"--prompt", &"the model tokenizer café", &"--temperature", &"0", &"--max-new-tokens", &"40"]);
        let ids: Vec<String> = ours["prompt_ids"].as_array().unwrap().iter().map(|v| v.to_string()).collect();
        let theirs = hf(&[&"generate", &out, &ids.join(","), &"40"]);
        assert_eq!(ours["ids"], theirs["ids"], "{kind}: greedy continuation of {ids:?}");
        let distinct: std::collections::BTreeSet<String> = ours["ids"].as_array().unwrap().iter().map(|v| v.to_string()).collect();
        assert!(
            distinct.len() >= 4 && ours["ids"].as_array().unwrap().len() + ids.len() > 16,
            "{kind}: a varied continuation past the window: {ours}"
        );
    }
}

/// A from-scratch Gemma 3 shape (q/k norms, local base, sliding and full layers with a
/// window of 8 under 32 positions) on generated bytes, three blocks.
fn scratch(steps: u64, shard: &str, run_dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = tiny_gpt(steps);
    let sets = [
        "model.kind=gemma",
        "model.n_layer=3",
        "model.n_head=4",
        "model.gemma.n_kv_head=2",
        "model.gemma.sliding_window=8",
        "model.gemma.qk_norm=true",
        "model.gemma.rope_local_theta=100.0",
        "model.gemma.attn_softcap=0",
        "data.batch_size=4",
        "dist.timeout_s=30",
        "plugins.jsonl.every=1",
        "optim.schedule=constant",
    ];
    let shard = format!("dist.shard={shard}");
    for set in sets.iter().chain(extra).chain([&shard.as_str()]) {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args.extend(["--plugins".into(), "jsonl,flops".into(), "--run-dir".into(), s(run_dir)]);
    args
}

fn losses(run_dir: &Path) -> Vec<(u64, f64)> {
    read_jsonl(&run_dir.join("metrics.jsonl")).iter().filter_map(|row| Some((row["step"].as_u64()?, row["train/loss"].as_f64()?))).collect()
}

#[test]
fn a_scratch_gemma_learns_recomputes_shards_and_counts_its_flops_as_one_rank_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    run_expect(ptrain().args(scratch(12, "none", &d("plain"), &[])), 0);
    let plain = losses(&d("plain"));
    assert_eq!(plain.len(), 12);
    assert!(plain[11].1 < plain[0].1, "the loss falls: {plain:?}");
    run_expect(ptrain().args(scratch(12, "none", &d("recomputed"), &["train.activation_checkpointing=\"full\""])), 0);
    assert_eq!(losses(&d("recomputed")), plain, "every block recomputed in backward: the same losses bit for bit");

    // Exact FLOPs: q, k, v, o and the three GeGLU matrices per layer, the tied head; 6 N
    // per token and attention's QK^T and PV over every query head.
    let (dm, heads, kv, hd, inner, layers, vocab, t, batch) = (32u64, 4u64, 2u64, 8u64, 128u64, 3u64, 256u64, 32u64, 4u64);
    let matmul_params = layers * (dm * heads * hd + 2 * dm * kv * hd + heads * hd * dm + 3 * dm * inner) + dm * vocab;
    let expected = (batch * t) * (6 * matmul_params + 12 * layers * t * heads * hd);
    let counted = summary(&d("plain"))["plugins"]["flops"]["flops_per_step"].as_f64().unwrap();
    assert!((counted - expected as f64).abs() <= 0.01 * expected as f64, "flops per step {counted}, formula {expected}");

    // Two Gloo ranks, unsharded and with parameters sharded block by block.
    let (none, sharded) = (d("two-none"), d("two-parameters"));
    run_expect(launch(2).args(scratch(8, "none", &none, &[])), 0);
    run_expect(launch(2).args(scratch(8, "parameters", &sharded, &[])), 0);
    assert_eq!(summary(&sharded)["shard"].as_str(), Some("parameters"));
    let (base, got) = (losses(&none), losses(&sharded));
    assert_eq!(got.len(), 8);
    for ((step, x), (_, y)) in got.iter().zip(&base) {
        assert!((x - y).abs() <= 1e-5 * y.abs(), "step {step}: loss {x} with parameters sharded, unsharded {y}");
    }
}

#[test]
fn lora_trains_a_gemma_from_the_base_exactly_and_merges_into_what_transformers_loads() {
    let dir = tempfile::tempdir().unwrap();
    let (model, set) = gemma_model(dir.path(), "gemma2", &[]);
    let probe = dir.path().join("base.probe");
    run_expect(ptrain().args(["logits", "--split", "train", "--step", "1", "--out"]).arg(&probe).args(small(&set).into_iter().skip(2)), 0);
    let hf_loss = hf(&[&"compare-logits", &model, &probe])["hf_loss"].as_f64().unwrap();
    let run_dir = dir.path().join("lora");
    let lora = [&set[..], &["lora.rank=4".into(), "optim.lr=1e-2".into()]].concat();
    run_expect(ptrain().args(["run", "--quiet", "--steps", "4", "--plugins", "checkpoint", "--run-dir"]).arg(&run_dir).args(small(&lora)), 0);
    let s = summary(&run_dir);
    close(s["first_loss"].as_f64().unwrap(), hf_loss, 1e-5, "LoRA's B starts at zero: the first loss is the base model's");
    assert!(s["final_loss"].as_f64().unwrap() != s["first_loss"].as_f64().unwrap(), "{s}");
    let config: toml::Table = std::fs::read_to_string(run_dir.join("config.toml")).unwrap().parse().unwrap();
    assert_eq!(config["model"]["kind"].as_str(), Some("gemma"));

    let tuned = dir.path().join("tuned.probe");
    run_expect(ptrain().args(["logits", "--split", "val", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&tuned), 0);
    let out = dir.path().join("merged");
    run_expect(ptrain().args(["export", "--format", "hf", "--merge", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&out), 0);
    let report = hf(&[&"load-export", &out, &tuned]);
    assert_eq!(report["info"]["missing_keys"], serde_json::json!([]), "{report}");
    assert!(report["max_abs_diff"].as_f64().unwrap() <= 1e-4, "the merged model computes the adapted one: {report}");
}

#[test]
fn what_the_gemma_kind_cannot_compute_is_refused_by_name_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let (model, set) = gemma_model(dir.path(), "gemma3", &[]);
    let edits: [(&str, serde_json::Value, &str); 4] = [
        ("hidden_activation", "gelu".into(), "hidden_activation = \"gelu\""),
        ("rope_parameters", serde_json::json!({"full_attention": {"rope_type": "yarn", "factor": 4.0}}), "rope_type = \"yarn\""),
        ("attn_logit_softcapping", 50.0.into(), "attn_logit_softcapping = 50.0"),
        ("use_bidirectional_attention", true.into(), "use_bidirectional_attention"),
    ];
    for (i, (key, value, needle)) in edits.into_iter().enumerate() {
        let edited = with_config_key(&set, &model, &dir.path().join(format!("edited-{i}")), key, value);
        refused(dir.path(), &edited, needle);
    }
    // From scratch: the family's own checks, and LoRA's modules are the family's.
    for (setting, needle) in [
        ("model.gemma.layer_types=[\"sliding_attention\"]", "model.gemma.layer_types"),
        ("model.gemma.n_kv_head=3", "model.gemma.n_kv_head"),
        ("model.gemma.sliding_pattern=0", "model.gemma.sliding_pattern"),
        ("lora.targets=[\"c_attn\"]", "lora.targets[0]"),
    ] {
        refused(dir.path(), &["model.kind=gemma".into(), "model.n_embd=32".into(), setting.into()], needle);
    }
}
