//! The llama kind (Llama, Qwen2, Qwen3, Mistral) through the built binary, judged by
//! the real `transformers` (tests/support/hf.py): tiny random models that
//! `transformers` makes and saves itself give the same logits, losses and greedy
//! generations in ptrain; what ptrain exports loads back with nothing missing; the
//! kind trains from scratch, resumes bit for bit, shards across Gloo ranks, counts
//! its FLOPs; and what it cannot compute is refused by name. Nothing is downloaded.

mod common;

use std::path::{Path, PathBuf};

use common::{fixture::OUT, hf::*, *};

const FAMILIES: [&str; 4] = ["llama", "qwen2", "qwen3", "mistral"];

/// A model of `family` made by transformers, and random token data below its vocabulary.
/// Qwen3's is saved as bf16 shards with an index; Llama's `config.json` is rewritten
/// in the transformers 4.x form (top-level `rope_theta`, `rope_scaling`, `torch_dtype`).
fn family_model(dir: &Path, family: &str) -> (PathBuf, Vec<String>) {
    let model = dir.join(family);
    match family {
        "qwen3" => made_dir(&["make-llama", family, OUT, "-", "--bf16-sharded"], &model),
        _ => made_dir(&["make-llama", family, OUT], &model),
    };
    if family == "llama" {
        edit_config(&model, |j| {
            let mut rope = j.remove("rope_parameters").unwrap();
            let theta = rope.as_object_mut().unwrap().remove("rope_theta").unwrap();
            j.insert("rope_theta".into(), theta);
            j.insert("rope_scaling".into(), rope);
            let dtype = j.remove("dtype").unwrap();
            j.insert("torch_dtype".into(), dtype);
        });
    }
    let tokens = dir.join("tokens.bin");
    if !tokens.exists() {
        made_file(&["make-tokens", "{out}/tokens.bin", "20000"], &tokens);
    }
    (model.clone(), vec!["data.kind=tokens".into(), format!("data.path={}", s(&tokens)), format!("model.init_from={}", s(&model))])
}

#[test]
fn each_family_computes_transformers_logits_and_losses_in_fp32_and_bf16() {
    let dir = tempfile::tempdir().unwrap();
    for family in FAMILIES {
        let (model, set) = family_model(dir.path(), family);
        if family == "qwen3" {
            assert!(model.join("model.safetensors.index.json").is_file(), "qwen3 is saved sharded");
        }
        let probe = dir.path().join(format!("{family}.probe"));
        run_expect(ptrain().args(["logits", "--split", "train", "--step", "1", "--out"]).arg(&probe).args(small(&set).into_iter().skip(2)), 0);
        let report = hf(&[&"compare-logits", &model, &probe]);
        let max_diff = report["max_abs_diff"].as_f64().unwrap();
        assert!(max_diff <= 1e-4, "{family}: logits differ from transformers' by {max_diff}: {report}");
        assert!(report["logit_scale"].as_f64().unwrap() > 0.1, "{family}: non-trivial logits: {report}");

        let run_dir = dir.path().join(format!("run-{family}"));
        run_expect(ptrain().args(["run", "--quiet", "--steps", "1", "--run-dir"]).arg(&run_dir).args(small(&set)), 0);
        let first = summary(&run_dir)["first_loss"].as_f64().unwrap();
        close(first, report["hf_loss"].as_f64().unwrap(), 1e-5, &format!("{family}: first training loss vs transformers'"));
        let resolved: toml::Table = std::fs::read_to_string(run_dir.join("config.toml")).unwrap().parse().unwrap();
        assert_eq!(resolved["model"]["kind"].as_str(), Some("llama"), "{family}: the kind comes from config.json");
        assert_eq!(resolved["model"]["llama"]["hf_model_type"].as_str(), Some(family));

        let bf16 = hf(&[&"compare-logits", &model, &probe, &"--bf16"]);
        let run_dir = dir.path().join(format!("bf16-{family}"));
        let mut set16 = set.clone();
        set16.push("train.precision=bf16".into());
        run_expect(ptrain().args(["run", "--quiet", "--steps", "1", "--run-dir"]).arg(&run_dir).args(small(&set16)), 0);
        let first = summary(&run_dir)["first_loss"].as_f64().unwrap();
        close(first, bf16["hf_loss"].as_f64().unwrap(), 1e-2, &format!("{family}: bf16 first loss vs transformers' bf16 autocast"));
    }
}

/// Text, a byte-level BPE tokenizer trained on it, and a `family` model of its vocabulary
/// with the tokenizer beside it.
fn tokenized_family(dir: &Path, family: &str) -> (PathBuf, PathBuf) {
    let (text, tok) = (dir.join("text.txt"), dir.join("tok.json"));
    if !tok.exists() {
        made_file(&["make-text", "{out}/text.txt", "6000", "7"], &text);
        made_file(&["train-tokenizer", &s(&text), "{out}/tok.json", "400"], &tok);
    }
    let model = made_dir(&["make-llama", family, OUT, &s(&tok)], &dir.join(format!("{family}-tok")));
    (model, text)
}

fn tensor_names_of(path: &Path) -> Vec<String> {
    common::ranks::tensor_names(&std::fs::read(path).unwrap())
}

#[test]
fn fine_tuned_models_export_to_what_transformers_loads_with_nothing_missing() {
    let dir = tempfile::tempdir().unwrap();
    // qwen2: tied head (written once); llama: untied, llama3 rope scaling.
    for (family, tied) in [("qwen2", true), ("llama", false)] {
        let (model, text) = tokenized_family(dir.path(), family);
        // data.tokenizer defaults to the tokenizer.json beside model.init_from.
        let set = [format!("model.init_from={}", s(&model)), "data.kind=text".into(), format!("data.path={}", s(&text))];

        // Exported without training (a learning rate too small to move a float32
        // weight): transformers computes what the source model computed.
        let untrained = dir.path().join(format!("{family}-untrained"));
        let mut still = set.to_vec();
        still.extend(["optim.lr=1e-30".into(), "optim.min_lr=0".into()]);
        run_expect(ptrain().args(["run", "--quiet", "--steps", "1", "--plugins", "checkpoint", "--run-dir"]).arg(&untrained).args(small(&still)), 0);
        let source_probe = dir.path().join(format!("{family}-source.probe"));
        run_expect(ptrain().args(["logits", "--split", "val", "--out"]).arg(&source_probe).args(small(&set).into_iter().skip(2)), 0);
        let out = dir.path().join(format!("{family}-exported-untrained"));
        run_expect(ptrain().args(["export", "--checkpoint"]).arg(&untrained).arg("--out").arg(&out), 0);
        let report = hf(&[&"load-export", &out, &source_probe]);
        assert!(report["max_abs_diff"].as_f64().unwrap() <= 1e-4, "{family} untrained export vs the source: {report}");

        // Trained for 30 steps.
        let run_dir = dir.path().join(format!("{family}-ft"));
        run_expect(ptrain().args(["run", "--quiet", "--steps", "30", "--plugins", "checkpoint", "--run-dir"]).arg(&run_dir).args(small(&set)), 0);
        let resolved: toml::Table = std::fs::read_to_string(run_dir.join("config.toml")).unwrap().parse().unwrap();
        assert_eq!(resolved["data"]["tokenizer"].as_str(), Some(s(&model.join("tokenizer.json")).as_str()));
        let probe = dir.path().join(format!("{family}.probe"));
        run_expect(ptrain().args(["logits", "--split", "val", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&probe), 0);
        let out = dir.path().join(format!("{family}-exported"));
        let exported = run_expect(ptrain().args(["export", "--format", "hf", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&out), 0);
        assert!(stdout(&exported).contains("step 30"), "{}", stdout(&exported));
        for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
            assert!(out.join(f).is_file(), "{family}: {f} exported");
        }
        assert_eq!(
            tensor_names_of(&out.join("model.safetensors")).contains(&"lm_head.weight".to_string()),
            !tied,
            "{family}: lm_head written iff untied"
        );

        let report = loaded_export(&out, &probe, &model, family);
        assert_eq!(report["tied"], tied, "{family}: {report}");
        let class = if family == "qwen2" { "Qwen2ForCausalLM" } else { "LlamaForCausalLM" };
        assert_eq!(report["class"], class, "{report}");
        assert_eq!(report["tokenizer_matches"], true, "{report}");
    }
}

/// `ptrain generate --json`'s report.
fn generate(args: &[&dyn AsRef<std::ffi::OsStr>]) -> serde_json::Value {
    let out = run_expect(ptrain().arg("generate").args(args.iter().map(|a| a.as_ref())).args(["--device", "cpu", "--json"]), 0);
    assert!(stderr(&out).contains("tokens/s"), "{}", stderr(&out));
    serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap()
}

#[test]
fn greedy_generation_matches_transformers_generate_for_each_family_and_gpt2() {
    let dir = tempfile::tempdir().unwrap();
    let gpt2 = dir.path().join("gpt2");
    made_dir(&["make-model", OUT], &gpt2);
    let mut models: Vec<(String, PathBuf)> = FAMILIES.iter().map(|f| (f.to_string(), tokenized_family(dir.path(), f).0)).collect();
    models.push(("gpt2".into(), gpt2));
    for (name, model) in &models {
        let prompt = "the model tokenizer";
        let ours = if name == "gpt2" {
            generate(&[&"--checkpoint", model, &"--prompt-ids", &"5,17,3,99", &"--temperature", &"0", &"--max-new-tokens", &"32"])
        } else {
            generate(&[&"--checkpoint", model, &"--prompt", &prompt, &"--temperature", &"0", &"--max-new-tokens", &"32"])
        };
        let ids: Vec<String> = ours["prompt_ids"].as_array().unwrap().iter().map(|v| v.to_string()).collect();
        let theirs = hf(&[&"generate", model, &ids.join(","), &"32"]);
        assert_eq!(ours["ids"], theirs["ids"], "{name}: greedy continuation of {ids:?}");
        let eos = &theirs["eos"];
        let stopped = ours["stopped_at_eos"].as_bool().unwrap();
        assert_eq!(stopped, ours["ids"].as_array().unwrap().last() == Some(eos), "{name}: stops at eos {eos} exactly when it is generated: {ours}");
        assert!(stopped || ours["ids"].as_array().unwrap().len() == 32, "{name}: {ours}");
    }
    // Sampling is seeded: the same seed twice gives the same tokens.
    let model = &models[0].1;
    let sample = |seed: &str| {
        generate(&[&"--checkpoint", model, &"--prompt", &"the", &"--top-k", &"50", &"--top-p", &"0.9", &"--seed", &seed, &"--max-new-tokens", &"16"])
            ["ids"]
            .clone()
    };
    assert_eq!(sample("3"), sample("3"));
}

#[test]
fn a_chat_prompt_is_rendered_with_the_models_template_as_apply_chat_template_does() {
    let dir = tempfile::tempdir().unwrap();
    let (model, _) = tokenized_family(dir.path(), "qwen2");
    hf(&[&"add-chat-template", &model]);
    let ours = generate(&[&"--checkpoint", &model, &"--prompt", &"the café", &"--chat", &"--temperature", &"0", &"--max-new-tokens", &"4"]);
    let theirs = hf(&[&"chat-ids", &model, &"the café"]);
    assert_eq!(ours["prompt_ids"], theirs["ids"], "--chat renders what apply_chat_template(add_generation_prompt=True) tokenizes");
    // --system puts a system message first, in place of the template's default one.
    let ours = generate(&[
        &"--checkpoint",
        &model,
        &"--prompt",
        &"the café",
        &"--chat",
        &"--system",
        &"be brief",
        &"--temperature",
        &"0",
        &"--max-new-tokens",
        &"4",
    ]);
    let theirs = hf(&[&"chat-ids", &model, &"the café", &"be brief"]);
    assert_eq!(ours["prompt_ids"], theirs["ids"], "--system: apply_chat_template([system, user])");
    let default = hf(&[&"chat-ids", &model, &"the café"]);
    assert_ne!(theirs["ids"], default["ids"], "the system message is in the prompt");
    let out = run_expect(ptrain().args(["generate", "--system", "x", "--prompt", "x", "--device", "cpu", "--checkpoint"]).arg(&model), 2);
    assert!(stderr(&out).contains("--chat"), "--system needs --chat: {}", stderr(&out));
    // Without a template, --chat is refused.
    let (plain, _) = tokenized_family(dir.path(), "llama");
    let out = run_expect(ptrain().args(["generate", "--chat", "--prompt", "x", "--device", "cpu", "--checkpoint"]).arg(&plain), 2);
    assert!(stderr(&out).contains("chat_template"), "{}", stderr(&out));
}

/// A from-scratch llama with GQA and q/k/v biases on generated bytes.
fn scratch(steps: u64, run_dir: &Path, extra: &[&str]) -> Vec<String> {
    scratch_with(steps, run_dir, extra, "jsonl,checkpoint")
}

fn scratch_with(steps: u64, run_dir: &Path, extra: &[&str], plugins: &str) -> Vec<String> {
    let mut args = tiny_gpt(steps);
    for set in
        ["model.kind=llama", "model.n_embd=32", "model.n_head=4", "model.llama.n_kv_head=2", "model.llama.qkv_bias=true", "optim.schedule=constant"]
            .iter()
            .chain(extra)
            .chain(plugins.contains("jsonl").then_some(&"plugins.jsonl.every=1"))
    {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args.extend(["--plugins".into(), plugins.into(), "--run-dir".into(), s(run_dir)]);
    args
}

fn losses(run_dir: &Path) -> Vec<(u64, f64)> {
    read_jsonl(&run_dir.join("metrics.jsonl")).iter().filter_map(|row| Some((row["step"].as_u64()?, row["train/loss"].as_f64()?))).collect()
}

#[test]
fn a_scratch_llama_learns_resumes_bit_for_bit_and_shards_like_one_rank() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name);
    run_expect(ptrain().args(scratch(20, &d("full"), &["plugins.checkpoint.every=10"])), 0);
    let full = losses(&d("full"));
    assert_eq!(full.len(), 20);
    assert!(full[19].1 < full[0].1, "the loss falls: {full:?}");
    let step10 = d("full").join("checkpoints/step-00000010");
    run_expect(ptrain().args(scratch(20, &d("resumed"), &[])).arg("--resume").arg(&step10), 0);
    let resumed = losses(&d("resumed"));
    assert_eq!(resumed, full[10..].to_vec(), "steps 11-20 after resuming at 10 are bit for bit the uninterrupted run's");

    // ZeRO-2 on two Gloo ranks of 4 samples each against one rank of 8.
    run_expect(ptrain().args(scratch(10, &d("one"), &[])), 0);
    let two = scratch(10, &d("two"), &["data.batch_size=4", "dist.shard=gradients"]);
    run_expect(common::ranks::launch(2).args(&two), 0);
    assert_eq!(summary(&d("two"))["world_size"], 2);
    for ((step, a), (_, b)) in losses(&d("two")).iter().zip(&losses(&d("one"))) {
        assert!((a - b).abs() <= 1e-6 * b.abs(), "step {step}: 2 sharded ranks {a}, one rank {b}");
    }
}

#[test]
fn the_flops_plugin_counts_rope_gqa_and_swiglu_models_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (d, heads, kv, hd, inner, layers, vocab, t, batch) = (32u64, 4u64, 2u64, 12u64, 80u64, 2u64, 256u64, 32u64, 8u64);
    let args = scratch_with(2, dir.path(), &["model.llama.head_dim=12", "model.llama.intermediate_size=80"], "flops");
    run_expect(ptrain().args(args), 0);
    // Matmul parameters per layer: q, k, v, o, and the three SwiGLU matrices; the head.
    let per_layer = d * heads * hd + 2 * d * kv * hd + heads * hd * d + 3 * d * inner;
    let matmul_params = layers * per_layer + d * vocab;
    // 6 N per token, and attention's QK^T and PV over every query head (12 L T H hd per token).
    let expected = (batch * t) * (6 * matmul_params + 12 * layers * t * heads * hd);
    let s = summary(dir.path());
    let counted = s["plugins"]["flops"]["flops_per_step"].as_f64().unwrap_or_else(|| panic!("{s}"));
    assert!((counted - expected as f64).abs() <= 0.01 * expected as f64, "flops per step {counted}, formula {expected}");
}

/// `model.init_from` on an edited copy of a Qwen2 directory.
fn refused(dir: &Path, edit: impl FnOnce(&Path), needle: &str) {
    let (model, set) = family_model(dir, "qwen2");
    let copy = dir.join(format!("edited-{}", needle.len()));
    std::fs::create_dir_all(&copy).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(model.join(f), copy.join(f)).unwrap();
    }
    edit(&copy);
    let mut set = set.to_vec();
    set.retain(|s| !s.starts_with("model.init_from"));
    set.push(format!("model.init_from={}", s(&copy)));
    let out = run_expect(ptrain().args(["run", "--steps", "1", "--run-dir"]).arg(dir.join("never")).args(small(&set)), 2);
    assert!(stderr(&out).contains(needle), "refusal names `{needle}`:\n{}", stderr(&out));
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = dir.join("config.json");
    let mut json: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(&path, serde_json::to_string(&json).unwrap()).unwrap();
}

#[test]
fn what_the_llama_kind_cannot_compute_is_refused_by_name_before_training() {
    let dir = tempfile::tempdir().unwrap();
    refused(dir.path(), |d| edit_config(d, |j| drop(j.insert("model_type".into(), "gemma".into()))), "model_type = \"gemma\"");
    refused(
        dir.path(),
        |d| edit_config(d, |j| drop(j.insert("architectures".into(), serde_json::json!(["Qwen2ForTokenClassification"])))),
        "Qwen2ForTokenClassification",
    );
    refused(
        dir.path(),
        |d| {
            edit_config(d, |j| {
                j.insert("use_sliding_window".into(), true.into());
                j.insert("sliding_window".into(), 16.into());
            })
        },
        "sliding_window = 16",
    );
    refused(
        dir.path(),
        |d| edit_config(d, |j| drop(j.insert("rope_parameters".into(), serde_json::json!({"rope_type": "yarn", "factor": 4.0})))),
        "\"yarn\"",
    );
    refused(dir.path(), |d| drop(hf(&[&"drop-tensor", &d, &"model.layers.1.mlp.up_proj.weight"])), "model.layers.1.mlp.up_proj.weight");
    refused(dir.path(), |d| drop(hf(&[&"reshape", &d, &"model.layers.0.self_attn.k_proj.weight"])), "model.layers.0.self_attn.k_proj.weight");
}
