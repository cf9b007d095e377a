//! Hugging Face interop through the built binary, checked by the real
//! `transformers` and `tokenizers` packages (tests/support/hf.py): starting from a
//! GPT-2 directory, tokenizing with a tokenizer.json, exporting for
//! `GPT2LMHeadModel.from_pretrained`, and refusing bad inputs. Nothing is
//! downloaded: every model and tokenizer is made locally.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Output,
};

use common::{fixture::OUT, hf::*, *};

fn tokenize(extra: &[String], log_info: bool) -> Output {
    let mut cmd = ptrain();
    if log_info {
        cmd.env("PTRAIN_LOG", "info");
    }
    run_expect(cmd.arg("tokenize").args(small(extra).into_iter().skip(2)), 0)
}

/// The one cached token file whose name starts with `stem-`.
fn cached(cache: &Path, stem: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(cache)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with(&format!("{stem}-")) && !name.ends_with(".json")
        })
        .collect();
    assert_eq!(found.len(), 1, "one cached file for {stem} in {}: {found:?}", cache.display());
    found[0].clone()
}

#[test]
fn a_gpt2_from_transformers_computes_the_same_logits_and_first_loss() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tokens) = (dir.path().join("gpt2"), dir.path().join("tokens.bin"));
    made_dir(&["make-model", OUT], &model);
    made_file(&["make-tokens", "{out}/tokens.bin", "20000"], &tokens);
    // The same model, as the hub cache stores it: models--org--name/snapshots/<rev>/ of symlinks.
    let repo = dir.path().join("hub/models--local--tiny-gpt2");
    std::fs::create_dir_all(repo.join("snapshots/0123abcd")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd").unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::os::unix::fs::symlink(model.join(f), repo.join("snapshots/0123abcd").join(f)).unwrap();
    }
    let data = ["data.kind=tokens".to_string(), format!("data.path={}", s(&tokens))];

    let probe = dir.path().join("probe.safetensors");
    let mut set = data.to_vec();
    set.push(format!("model.init_from={}", s(&model)));
    run_expect(ptrain().args(["logits", "--split", "train", "--step", "1", "--out"]).arg(&probe).args(small(&set).into_iter().skip(2)), 0);
    let run_dir = dir.path().join("run");
    let mut set = data.to_vec();
    set.push(format!("model.init_from={}", s(&repo)));
    run_expect(ptrain().args(["run", "--quiet", "--steps", "1", "--run-dir"]).arg(&run_dir).args(small(&set)), 0);

    let report = hf(&[&"compare-logits", &model, &probe]);
    let max_diff = report["max_abs_diff"].as_f64().unwrap();
    assert!(max_diff <= 1e-4, "logits differ from transformers' by {max_diff}: {report}");
    assert!(report["logit_scale"].as_f64().unwrap() > 0.1, "non-trivial logits: {report}");
    let hf_loss = report["hf_loss"].as_f64().unwrap();
    let first_loss = summary(&run_dir)["first_loss"].as_f64().unwrap();
    close(first_loss, hf_loss, 1e-5, "ptrain's first training loss vs transformers' loss on that batch");
    close(report["probe_loss"].as_f64().unwrap(), hf_loss, 1e-5, "ptrain logits' loss vs transformers'");

    // The architecture came from config.json (GPT-2's gelu_new is the tanh approximation).
    let resolved: toml::Table = std::fs::read_to_string(run_dir.join("config.toml")).unwrap().parse().unwrap();
    let m = resolved["model"].as_table().unwrap();
    assert_eq!(m["gpt"]["activation"].as_str(), Some("gelu_tanh"));
    assert_eq!((m["vocab_size"].as_integer(), m["block_size"].as_integer(), m["n_embd"].as_integer()), (Some(512), Some(128), Some(64)));
    assert_eq!(m["init_from"].as_str(), Some(s(&repo).as_str()));
}

#[test]
fn a_fine_tuned_gpt2_exports_to_a_model_transformers_loads_without_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let (model, text, tok) = (dir.path().join("gpt2"), dir.path().join("text.txt"), dir.path().join("tok/tokenizer.json"));
    std::fs::create_dir_all(tok.parent().unwrap()).unwrap();
    made_dir(&["make-model", OUT], &model);
    made_file(&["make-text", "{out}/text.txt", "6000", "7"], &text);
    made_file(&["train-tokenizer", &s(&text), "{out}/tokenizer.json", "400"], &tok);
    let run_dir = dir.path().join("runs/ft");
    let set =
        [format!("model.init_from={}", s(&model)), format!("data.tokenizer={}", s(&tok)), "data.kind=text".into(), format!("data.path={}", s(&text))];
    run_expect(ptrain().args(["run", "--quiet", "--steps", "30", "--plugins", "checkpoint", "--run-dir"]).arg(&run_dir).args(small(&set)), 0);
    let probe = dir.path().join("probe.safetensors");
    // The final step's evaluation batch, with the final weights.
    run_expect(ptrain().args(["logits", "--split", "val", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&probe), 0);
    let out = dir.path().join("exported");
    let exported = run_expect(ptrain().args(["export", "--format", "hf", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&out), 0);
    assert!(stdout(&exported).contains("step 30"), "{}", stdout(&exported));
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(out.join(f).is_file(), "{f} exported");
    }

    // The exported tokenizer against the one the run used.
    let report = hf(&[&"load-export", &out, &probe, &tok]);
    for key in ["missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"] {
        assert_eq!(report["info"][key], serde_json::json!([]), "{key}: {report}");
    }
    let messages = report["messages"].as_array().unwrap();
    assert!(messages.is_empty(), "transformers warned loading the export: {report}");
    let max_diff = report["max_abs_diff"].as_f64().unwrap();
    assert!(max_diff <= 1e-4, "exported logits differ from ptrain's by {max_diff}: {report}");
    assert_eq!(report["tied"], true, "the head stays tied: {report}");
    assert_eq!(report["activation"], "gelu_new");
    assert_eq!(report["tokenizer_matches"], true, "{report}");
    // The probe is the batch the run evaluated last: same loss.
    let eval = summary(&run_dir)["final_eval_loss"].as_f64().unwrap();
    let probe_loss = py::cmd()
        .args(["-c", "import sys; from safetensors.torch import load_file; print(load_file(sys.argv[1])['loss'].item())"])
        .arg(&probe)
        .output()
        .unwrap();
    close(String::from_utf8_lossy(&probe_loss.stdout).trim().parse().unwrap(), eval, 1e-5, "probe loss vs the run's final eval loss");
}

#[test]
fn tokenized_ids_equal_the_python_tokenizers_and_the_cache_is_reused() {
    let dir = tempfile::tempdir().unwrap();
    let (text, tok) = (dir.path().join("text.txt"), dir.path().join("tokenizer.json"));
    // ~1.2 MB: several pieces, so the cuts between them are exercised.
    made_file(&["make-text", "{out}/text.txt", "30000", "1"], &text);
    made_file(&["train-tokenizer", &s(&text), "{out}/tokenizer.json", "400"], &tok);
    let set = |run: &str| {
        let mut a = vec!["--quiet".to_string(), "--steps".into(), "2".into(), "--run-dir".into(), s(&dir.path().join(run))];
        a.extend(small(&[format!("data.tokenizer={}", s(&tok)), "data.kind=text".into(), format!("data.path={}", s(&text))]));
        a
    };
    let first = run_expect(ptrain().env("PTRAIN_LOG", "info").arg("run").args(set("run1")), 0);
    assert!(stderr(&first).contains("tokens: tokenizing"), "{}", stderr(&first));
    let cache = dir.path().join("tokens-cache");
    let file = cached(&cache, "text");
    let ids = hf(&[&"check-ids", &tok, &text, &file]);
    assert_eq!(ids["equal"], true, "ptrain's ids differ from Tokenizer.from_file(...).encode(text).ids: {ids}");
    assert!(ids["ptrain"].as_u64().unwrap() > 100_000, "{ids}");
    let written = std::fs::metadata(&file).unwrap().modified().unwrap();

    let second = run_expect(ptrain().env("PTRAIN_LOG", "info").arg("run").args(set("run2")), 0);
    assert!(stderr(&second).contains("tokens: reusing") && !stderr(&second).contains("tokens: tokenizing"), "{}", stderr(&second));
    assert_eq!(std::fs::metadata(&file).unwrap().modified().unwrap(), written, "the cached file was not rewritten");
    assert_eq!(summary(&dir.path().join("run1"))["first_loss"], summary(&dir.path().join("run2"))["first_loss"]);

    // A changed text is a new key.
    std::fs::write(&text, std::fs::read_to_string(&text).unwrap() + "one more line\n").unwrap();
    let third = run_expect(ptrain().env("PTRAIN_LOG", "info").arg("run").args(set("run3")), 0);
    assert!(stderr(&third).contains("tokens: tokenizing"), "{}", stderr(&third));
    let files = std::fs::read_dir(&cache).unwrap().filter(|e| !e.as_ref().unwrap().path().to_string_lossy().ends_with(".json")).count();
    assert_eq!(files, 2);
}

#[test]
fn prefix_space_word_level_and_jsonl_tokenizers_match_python() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cache_key = format!("data.tokens_cache={}", s(&cache));
    let (text, rows) = (dir.path().join("text.txt"), dir.path().join("rows.jsonl"));
    made_file(&["make-text", "{out}/text.txt", "12000", "2"], &text);
    made_file(&["make-jsonl", "{out}/rows.jsonl", "1500", "3"], &rows);

    // A prefix space on every input: cuts would change the ids, so the file is one piece.
    let spaced = dir.path().join("spaced.json");
    made_file(&["train-tokenizer", &s(&text), "{out}/tokenizer.json", "300", "--prefix-space"], &spaced);
    tokenize(&[format!("data.tokenizer={}", s(&spaced)), "data.kind=text".into(), format!("data.path={}", s(&text)), cache_key.clone()], false);
    let ids = hf(&[&"check-ids", &spaced, &text, &cached(&cache, "text")]);
    assert_eq!(ids["equal"], true, "{ids}");

    // JSONL rows, each encoded alone and followed by the end-of-text token.
    let bpe = dir.path().join("bpe.json");
    made_file(&["train-tokenizer", &s(&text), "{out}/tokenizer.json", "300"], &bpe);
    let set = [
        format!("data.tokenizer={}", s(&bpe)),
        "data.kind=jsonl".into(),
        format!("data.path={}", s(&rows)),
        "data.eos_token=<|endoftext|>".into(),
        cache_key.clone(),
    ];
    tokenize(&set, false);
    let ids = hf(&[&"check-ids", &bpe, &rows, &cached(&cache, "rows"), &"--jsonl", &"text", &"<|endoftext|>"]);
    assert_eq!(ids["equal"], true, "{ids}");

    // Over 65536 ids: uint32 tokens, which a run then trains on.
    let (words, wtext) = (dir.path().join("words.json"), dir.path().join("words.txt"));
    made_dir(&["make-wordlevel", "{out}/words.json", "{out}/words.txt", "70000"], dir.path());
    let set = [format!("data.tokenizer={}", s(&words)), "data.kind=text".into(), format!("data.path={}", s(&wtext)), cache_key.clone()];
    tokenize(&set, false);
    let file = cached(&cache, "words");
    assert!(file.to_string_lossy().ends_with(".u32"), "{}", file.display());
    let ids = hf(&[&"check-ids", &words, &wtext, &file]);
    assert_eq!(ids["equal"], true, "{ids}");
    let run_dir = dir.path().join("run");
    let mut extra = set.to_vec();
    extra.extend(["model.n_embd=16".to_string(), "model.n_head=2".into(), "model.n_layer=1".into()]);
    run_expect(ptrain().args(["run", "--quiet", "--steps", "1", "--run-dir"]).arg(&run_dir).args(small(&extra)), 0);
    let resolved: toml::Table = std::fs::read_to_string(run_dir.join("config.toml")).unwrap().parse().unwrap();
    assert_eq!(resolved["model"]["vocab_size"].as_integer(), Some(70000), "vocab_size comes from the tokenizer");
}

#[test]
fn bad_hugging_face_inputs_exit_2_naming_the_path_and_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = d.join("gpt2");
    made_dir(&["make-model", OUT], &model);
    let text = d.join("text.txt");
    let words = d.join("words.json");
    made_dir(&["make-wordlevel", "{out}/words.json", "{out}/text.txt", "1000"], d);
    let refused = |what: &str, sets: &[String], needles: &[&str]| {
        let run_dir = d.join(format!("run-{}", what.replace(' ', "-")));
        let mut cmd = ptrain();
        cmd.args(["run", "--quiet", "--steps", "1", "--run-dir"]).arg(&run_dir).args(small(sets));
        let err = stderr(&run_expect(&mut cmd, 2));
        for needle in needles {
            assert!(err.contains(needle), "{what}: `{needle}` not in:\n{err}");
        }
        assert!(!run_dir.exists(), "{what}: the refused run left {}", run_dir.display());
    };

    let empty = d.join("empty");
    std::fs::create_dir(&empty).unwrap();
    refused("no config.json", &[format!("model.init_from={}", s(&empty))], &[&s(&empty), "no config.json"]);

    let bert = d.join("bert");
    std::fs::create_dir(&bert).unwrap();
    let config = std::fs::read_to_string(model.join("config.json")).unwrap().replace("\"gpt2\"", "\"bert\"");
    std::fs::write(bert.join("config.json"), config).unwrap();
    std::fs::copy(model.join("model.safetensors"), bert.join("model.safetensors")).unwrap();
    refused("model type", &[format!("model.init_from={}", s(&bert))], &[&s(&bert.join("config.json")), "model_type = \"bert\""]);

    let reshaped = d.join("reshaped");
    std::fs::create_dir(&reshaped).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(model.join(f), reshaped.join(f)).unwrap();
    }
    hf(&[&"reshape", &reshaped, &"transformer.h.1.mlp.c_fc.weight"]);
    refused(
        "wrong shape",
        &[format!("model.init_from={}", s(&reshaped)), "data.kind=synthetic".into()],
        &[&s(&reshaped.join("model.safetensors")), "`transformer.h.1.mlp.c_fc.weight` has shape [256, 64], expected [64, 256]"],
    );

    let broken = d.join("broken.json");
    std::fs::write(&broken, "{\"model\": {\"type\": \"BPE\",").unwrap();
    refused(
        "broken tokenizer",
        &[format!("data.tokenizer={}", s(&broken)), "data.kind=text".into(), format!("data.path={}", s(&text))],
        &[&s(&broken), "not a tokenizer.json"],
    );

    // A 1000-id tokenizer for a 512-id model: the text uses ids up to 999 ([UNK]).
    refused(
        "ids beyond the vocabulary",
        &[
            format!("model.init_from={}", s(&model)),
            format!("data.tokenizer={}", s(&words)),
            "data.kind=text".into(),
            format!("data.path={}", s(&text)),
            format!("data.tokens_cache={}", s(&d.join("cache"))),
        ],
        &[&s(&text), "token id 999", "model.vocab_size = 512"],
    );

    refused(
        "a hub name",
        &["model.init_from=openai-community/gpt2".into()],
        &["model.init_from", "downloads nothing", "hf download openai-community/gpt2"],
    );
    refused(
        "a disagreeing key",
        &[format!("model.init_from={}", s(&model)), "model.n_embd=128".into()],
        &["model.n_embd", "128 disagrees with n_embd = 64", &s(&model.join("config.json"))],
    );
}
