//! What a new user trips on (issue 30), through the built binary: mismatches refused
//! before anything runs, typos answered with the key meant, `launch` without `--`.

use std::path::PathBuf;

mod common;

use common::{
    hf::{chat_model, made_dir, made_file},
    *,
};

#[test]
fn a_sequence_longer_than_the_models_context_is_refused_naming_both_values() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_expect(ptrain().args(tiny_gpt(1)).args(["--set", "data.max_seq_len=64", "--run-dir"]).arg(dir.path().join("r")), 2);
    let err = stderr(&out);
    assert!(err.contains("data.max_seq_len") && err.contains("64 is above the model's context, model.block_size = 32"), "{err}");
    assert!(!dir.path().join("r").exists(), "nothing ran");
    // At the context it runs.
    run_expect(ptrain().args(tiny_gpt(1)).args(["--set", "data.max_seq_len=32", "--run-dir"]).arg(dir.path().join("ok")), 0);
}

#[test]
fn a_misspelt_key_is_answered_with_the_nearest_one() {
    let out = run_expect(ptrain().args(["config", "--set", "optim.minlr=1e-5"]), 2);
    let err = stderr(&out);
    assert!(err.contains("optim.minlr") && err.contains("did you mean `min_lr`?"), "{err}");
}

#[test]
fn launch_takes_the_command_with_or_without_a_double_dash() {
    let dir = tempfile::tempdir().unwrap();
    for (name, dash) in [("plain", false), ("dashed", true)] {
        let run_dir = dir.path().join(name);
        let mut cmd = common::ranks::single();
        cmd.args(["launch", "--nproc", "1"]);
        if dash {
            cmd.arg("--");
        }
        cmd.args(tiny_gpt(2)).arg("--run-dir").arg(&run_dir);
        run_expect(&mut cmd, 0);
        assert_eq!(summary(&run_dir)["steps"], 2, "{name}");
    }
}

#[test]
fn export_refuses_a_run_whose_tokenizer_is_gone_unless_told_to_go_without() {
    let dir = tempfile::tempdir().unwrap();
    let (text, tok_dir) = (dir.path().join("text.txt"), dir.path().join("tok"));
    std::fs::create_dir_all(&tok_dir).unwrap();
    let tok = tok_dir.join("tokenizer.json");
    made_file(&["make-text", "{out}/text.txt", "2000", "3"], &text);
    made_file(&["train-tokenizer", &text.display().to_string(), "{out}/tokenizer.json", "300"], &tok);
    // A chat template the way transformers 5 saves it: its own file beside the tokenizer.
    let template = "{% for m in messages %}{{ m['content'] }}{% endfor %}";
    std::fs::write(tok_dir.join("chat_template.jinja"), template).unwrap();
    let run_dir = dir.path().join("run");
    let mut args = tiny_gpt(2);
    args.extend(["--plugins", "checkpoint", "--set", "data.kind=text"].map(String::from));
    args.extend(["--set".into(), format!("data.path={}", text.display()), "--set".into(), format!("data.tokenizer={}", tok.display())]);
    run_expect(ptrain().args(args).arg("--run-dir").arg(&run_dir), 0);
    std::fs::rename(&tok_dir, dir.path().join("moved")).unwrap();
    // The run kept a copy (issue 30, item 7): the export takes it.
    let out = dir.path().join("from-copy");
    run_expect(ptrain().args(["export", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&out), 0);
    assert_eq!(std::fs::read(out.join("tokenizer.json")).unwrap(), std::fs::read(dir.path().join("moved/tokenizer.json")).unwrap());
    assert_eq!(std::fs::read_to_string(out.join("chat_template.jinja")).unwrap(), template, "the chat template travels with the tokenizer");
    // Without the copy the tokenizer is gone.
    std::fs::remove_dir_all(run_dir.join("tokenizer")).unwrap();

    let out = dir.path().join("exported");
    let refused = run_expect(ptrain().args(["export", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&out), 2);
    let err = stderr(&refused);
    assert!(err.contains(&tok.display().to_string()) && err.contains("--no-tokenizer"), "{err}");
    assert!(!out.join("model.safetensors").exists(), "nothing written before the refusal");
    run_expect(ptrain().args(["export", "--no-tokenizer", "--checkpoint"]).arg(&run_dir).arg("--out").arg(&out), 0);
    assert!(out.join("model.safetensors").is_file() && !out.join("tokenizer.json").exists());
}

#[test]
fn a_misspelt_plugin_table_is_refused_before_any_weight_is_read_and_by_ptrain_config() {
    let refused = run_expect(ptrain().args(["config", "--set", "plugins.chekpoint.every=2"]), 2);
    assert!(stderr(&refused).contains("did you mean `checkpoint`?"), "{}", stderr(&refused));
    run_expect(ptrain().args(["config", "--set", "plugins.checkpoint.every=2"]), 0);

    // Weights that cannot be read: only reading them would fail.
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("gpt2");
    made_dir(&["make-model", fixture::OUT], &model);
    std::fs::write(model.join("model.safetensors"), b"not safetensors").unwrap();
    let init = format!("model.init_from={}", model.display());
    let out = run_expect(
        ptrain()
            .args([
                "run",
                "--quiet",
                "--steps",
                "1",
                "--device",
                "cpu",
                "--set",
                &init,
                "--set",
                "data.tokenizer=bytes",
                "--set",
                "plugins.chekpoint.every=2",
            ])
            .arg("--run-dir")
            .arg(dir.path().join("r")),
        2,
    );
    let err = stderr(&out);
    assert!(err.contains("[plugins.chekpoint]") && !err.contains("model.safetensors"), "{err}");
}

#[test]
fn a_train_on_that_does_not_fit_the_data_kind_names_the_values_as_a_file_spells_them() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture::copy("chat.py", &["make", fixture::OUT, "30", "2"], &dir.path().join("model"));
    let tokenizer = format!("data.tokenizer={}", common::hf::s(&model.join("tokenizer.json")));
    let sets = ["data.kind=\"prompt_completion\"", &tokenizer, "data.path=\"rows.jsonl\"", "data.train_on=\"last_assistant\""];
    let out = run_expect(ptrain().arg("config").args(sets.iter().flat_map(|s| ["--set", s])), 2);
    let err = stderr(&out);
    assert!(err.contains("\"last_assistant\" does not apply to data.kind = \"prompt_completion\""), "{err}");
    assert!(err.contains("use one of \"auto\", \"completion\", \"all\"") && !err.contains("lastassistant"), "{err}");
}

/// Issue 61, item 2: a finished run resumed ("nothing to train") keeps its record:
/// the losses and evaluations of the run it found, and a part saying nothing ran.
#[test]
fn resuming_a_finished_run_keeps_its_losses_and_evaluations() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let run = |extra: &[&str]| run_expect(ptrain().args(tiny_gpt(3)).args(["--plugins", "checkpoint", "--run-dir"]).arg(&run_dir).args(extra), 0);
    run(&[]);
    let before = summary(&run_dir);
    assert!(before["final_eval_loss"].as_f64().is_some() && !before["evals"].as_array().unwrap().is_empty(), "{before}");
    let out = run(&["--auto-resume"]);
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(said.contains("nothing to train"), "{said}");
    let after = summary(&run_dir);
    for key in ["first_loss", "final_loss", "final_eval_loss", "evals"] {
        assert_eq!(after[key], before[key], "{key} after a resume that trained nothing: {after}");
    }
    let parts = after["parts"].as_array().unwrap();
    assert_eq!(parts.len(), 2, "{after}");
    assert_eq!((parts[1]["steps"].as_u64(), parts[1]["first_loss"].as_f64()), (Some(0), None), "the part that ran nothing says so");
}

/// Issue 61, item 12: one held-out sample is "1 held-out sample".
#[test]
fn one_held_out_sample_is_said_in_the_singular() {
    let dir = tempfile::tempdir().unwrap();
    let (train, val) = (dir.path().join("train.txt"), dir.path().join("val.txt"));
    let text: String = (0..100).map(|i| format!("line {i} of the text. ")).collect();
    std::fs::write(&train, &text).unwrap();
    // 34 bytes: one window of 32 + 1 (a split needs a byte more than a window).
    std::fs::write(&val, &text.as_bytes()[..34]).unwrap();
    let mut args = tiny_gpt(1);
    args.extend(["--set".into(), "data.kind=text".into(), "--set".into(), format!("data.path={}", train.display())]);
    args.extend(["--set".into(), format!("data.val_path={}", val.display())]);
    let out = run_expect(ptrain().args(args).env("PTRAIN_LOG", "info").arg("--run-dir").arg(dir.path().join("r")), 0);
    let log = format!("{}{}", stdout(&out), stderr(&out));
    assert!(log.contains("each evaluation covers 1 held-out sample") && !log.contains("1 held-out samples"), "{log}");
}

/// Issue 61, item 10: the shipped SFT and LoRA configs train on every row, as TRL does
/// without an eval_dataset (they held out 10% quietly): no evaluation without
/// `data.val_path`.
#[test]
fn the_shipped_chat_configs_train_on_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let [init, data, cache] = chat_model(dir.path(), 12, 1);
    for config in ["qwen2-chat", "qwen2-lora"] {
        let run_dir = dir.path().join(config);
        let mut cmd = ptrain();
        cmd.args(["run", "--quiet", "--device", "cpu", "--steps", "1", "--config"]).arg(repo().join(format!("configs/{config}.toml")));
        for set in [init.as_str(), &data, &cache, "data.max_seq_len=0", "run.threads=1", "optim.accum_steps=1"] {
            cmd.args(["--set", set]);
        }
        run_expect(cmd.arg("--run-dir").arg(&run_dir), 0);
        let sum = summary(&run_dir);
        assert!(sum["evals"].as_array().unwrap().is_empty() && sum["final_eval_loss"].is_null(), "{config}: nothing held out: {sum}");
    }
}

/// Issue 61, item 11: a `qwen2` folder whose tokenizer.json does not split text with Qwen2's
/// pattern encodes otherwise in transformers' AutoTokenizer (which rebuilds Qwen2's own
/// pre-tokenizer); set-up says so, and says nothing once the tokenizer is re-saved by
/// transformers (then the two agree).
#[test]
fn a_tokenizer_that_splits_otherwise_than_auto_tokenizer_is_named_at_set_up() {
    let dir = tempfile::tempdir().unwrap();
    let sets = chat_model(dir.path(), 8, 1);
    let model = PathBuf::from(sets[0].trim_start_matches("model.init_from="));
    // The suite's tokenizer has no merge of digits, so both split " 42" alike: its last two
    // merges become " 4" and " 42", which the file's GPT-2 pattern reaches and Qwen2's (digits
    // one by one, apart from the space) does not.
    let merge_digits = "import json, sys\n\
                        p = sys.argv[1] + '/tokenizer.json'\n\
                        t = json.load(open(p))\n\
                        m = t['model']\n\
                        old = [a + b for a, b in m['merges'][-2:]]\n\
                        ids = [m['vocab'].pop(o) for o in old]\n\
                        m['merges'][-2:] = [['\\u0120', '4'], ['\\u01204', '2']]\n\
                        m['vocab']['\\u01204'], m['vocab']['\\u012042'] = ids\n\
                        json.dump(t, open(p, 'w'))";
    let out = py::cmd().args(["-c", merge_digits]).arg(&model).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The oracle: does AutoTokenizer encode a text with digits as the file does?
    let agree = || {
        let script = "import sys, tokenizers, transformers\n\
                      t = 'In 2024 it is 42 x1234'\n\
                      a = transformers.AutoTokenizer.from_pretrained(sys.argv[1])(t, add_special_tokens=False)['input_ids']\n\
                      f = tokenizers.Tokenizer.from_file(sys.argv[1] + '/tokenizer.json').encode(t, add_special_tokens=False).ids\n\
                      print(a == f)";
        let out = py::cmd().args(["-c", script]).arg(&model).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim() == "True"
    };
    let tokenize = |cache: &str| {
        let mut cmd = ptrain();
        cmd.args(["tokenize", "--set", "run.threads=1", "--set", "model.kind=llama", "--set", "data.kind=chat"]);
        for set in [&sets[0], &sets[1], &format!("data.tokens_cache={}", dir.path().join(cache).display())] {
            cmd.args(["--set", set]);
        }
        stderr(&run_expect(&mut cmd, 0))
    };
    assert!(!agree(), "the suite's chat tokenizer is byte-level only: AutoTokenizer splits digits apart");
    let err = tokenize("cache1");
    assert!(err.contains("otherwise than Qwen2's") && err.contains("tokenizer.json"), "{err}");
    let resave = "import sys, transformers\nt = transformers.AutoTokenizer.from_pretrained(sys.argv[1])\nt.save_pretrained(sys.argv[1])";
    let out = py::cmd().args(["-c", resave]).arg(&model).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(agree(), "re-saved by transformers, the file splits as AutoTokenizer does");
    let err = tokenize("cache2");
    assert!(!err.contains("otherwise than Qwen2's"), "{err}");
}
