//! Instruction data (`data.kind = "chat"` / `"prompt_completion"`) through the built
//! binary, judged by the real `transformers` and TRL (tests/support/chat.py): the
//! ids equal `apply_chat_template`'s and the trained tokens TRL's `SFTTrainer`
//! masks; packed rows get exactly the losses they get alone (and a run with the
//! blocking off is caught); a step's loss and gradients do not depend on how it is
//! split into micro-batches or ranks; the first loss equals SFTTrainer's; bad rows
//! exit 2 naming file and line. Nothing is downloaded.

mod common;

use std::path::{Path, PathBuf};

use common::{
    hf::{close, s, support_py},
    *,
};

/// Runs a tests/support/chat.py command; returns its last output line as JSON.
fn chat_py(args: &[&dyn AsRef<std::ffi::OsStr>]) -> serde_json::Value {
    support_py("chat.py", args)
}

/// A tokenizer with a ChatML template, a random Qwen2 of its vocabulary and rows (a
/// copy of the suite's shared fixture).
fn chat_model(dir: &Path, rows: usize) -> PathBuf {
    fixture::copy("chat.py", &["make", fixture::OUT, &rows.to_string(), "1"], &dir.join("model"))
}

/// Settings of a one-thread CPU run of `kind` data from `file` on `model`.
fn sets(model: &Path, kind: &str, file: &Path, cache: &Path) -> Vec<String> {
    let mut a: Vec<String> = ["--device", "cpu"].map(String::from).into();
    for set in [
        "run.threads=1".to_string(),
        "model.kind=llama".into(),
        format!("model.init_from={}", s(model)),
        format!("data.kind={kind}"),
        format!("data.path={}", s(file)),
        format!("data.tokens_cache={}", s(cache)),
        "train.eval_batches=1".into(),
    ] {
        a.extend(["--set".to_string(), set]);
    }
    a
}

fn with(mut base: Vec<String>, extra: &[&str]) -> Vec<String> {
    for e in extra {
        base.extend(["--set".to_string(), e.to_string()]);
    }
    base
}

/// The cache file `ptrain tokenize` encodes `file` into.
fn encoded(model: &Path, kind: &str, file: &Path, cache: &Path, extra: &[&str]) -> PathBuf {
    let out = run_expect(ptrain().arg("tokenize").arg("--json").args(with(sets(model, kind, file, cache), extra).into_iter().skip(2)), 0);
    let first: serde_json::Value = serde_json::from_str(stdout(&out).lines().next().expect("a line per file")).unwrap();
    PathBuf::from(first["file"].as_str().unwrap())
}

#[test]
fn ids_equal_apply_chat_template_and_trained_tokens_equal_trls_masks() {
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), 50);
    let cache = dir.path().join("cache");

    let chat = encoded(&model, "chat", &model.join("chat.jsonl"), &cache, &[]);
    let report = chat_py(&[&"masks", &model, &model.join("chat.jsonl"), &"chat", &chat]);
    assert_eq!(report["rows"], 50, "{report}");
    for key in ["id_mismatches", "template_mismatches", "mask_mismatches"] {
        assert_eq!(report[key], 0, "chat rows: {key}: {report}");
    }
    assert!(report["trained"].as_u64().unwrap() > 500, "assistant turns are trained: {report}");

    // ShareGPT's spelling of the same conversations encodes to the same rows.
    let sharegpt = encoded(&model, "chat", &model.join("sharegpt.jsonl"), &cache, &[]);
    assert_eq!(std::fs::read(&chat).unwrap(), std::fs::read(&sharegpt).unwrap(), "conversations/from/value == messages/role/content");

    let pc = encoded(&model, "prompt_completion", &model.join("pc.jsonl"), &cache, &[]);
    let report = chat_py(&[&"masks", &model, &model.join("pc.jsonl"), &"prompt_completion", &pc]);
    for key in ["id_mismatches", "mask_mismatches"] {
        assert_eq!(report[key], 0, "plain prompt/completion rows (EOS appended and trained): {key}: {report}");
    }

    // Message-list prompts: TRL also trains the newline the template writes after
    // <|im_end|>, which is never generated; ptrain stops at the end-of-turn token.
    let conv = encoded(&model, "prompt_completion", &model.join("conv_pc.jsonl"), &cache, &[]);
    let report = chat_py(&[&"masks", &model, &model.join("conv_pc.jsonl"), &"prompt_completion", &conv, &"--trim-after-end-of-turn"]);
    for key in ["id_mismatches", "mask_mismatches"] {
        assert_eq!(report[key], 0, "conversational prompt/completion rows: {key}: {report}");
    }

    // Only the last assistant turn: fewer trained tokens, each row one trained run.
    let last = encoded(&model, "chat", &model.join("chat.jsonl"), &cache, &["data.train_on=last_assistant"]);
    let rows = chat_py(&[&"runs", &last]);
    assert!(rows["max_runs_per_row"] == 1 && rows["rows"] == 50, "one trained turn per row: {rows}");
    let all = chat_py(&[&"runs", &chat]);
    assert!(all["max_runs_per_row"].as_u64().unwrap() > 1, "multi-turn rows train several turns: {all}");
    assert!(rows["trained"].as_u64().unwrap() < all["trained"].as_u64().unwrap(), "{rows} vs {all}");
}

#[test]
fn packed_rows_get_the_losses_they_get_alone_and_cross_talk_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), 60);
    let cache = dir.path().join("cache");
    let base = sets(&model, "chat", &model.join("chat.jsonl"), &cache);
    let mut diffs = Vec::new();
    for (name, cross_talk) in [("blocked", "false"), ("cross-talk", "true")] {
        let run_dir = dir.path().join(name);
        let extra = ["train.steps=1", "data.batch_size=3", "data.packing=true", "debug.dump_tensors_at=[1]"];
        let args = with(with(base.clone(), &extra), &[&format!("debug.packing_cross_talk={cross_talk}")]);
        run_expect(ptrain().args(["run", "--quiet", "--run-dir"]).arg(&run_dir).args(args), 0);
        let report = chat_py(&[&"row-losses", &model, &run_dir.join("tensors-step1.rank0.safetensors")]);
        assert!(report["packed_sequences"].as_u64().unwrap() >= 2 && report["rows"].as_u64().unwrap() >= 6, "rows are packed: {report}");
        diffs.push(report["max_diff"].as_f64().unwrap());
    }
    assert!(diffs[0] <= 1e-5, "packed rows' losses vs transformers' of each row alone: {}", diffs[0]);
    assert!(diffs[1] > 1e-3, "with the blocking off the rows' losses must differ (else this test cannot see cross-talk): {}", diffs[1]);
}

#[test]
fn a_step_has_the_same_loss_and_gradients_however_it_is_split() {
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), 40);
    let cache = dir.path().join("cache");
    for packing in ["false", "true"] {
        let base = with(
            sets(&model, "chat", &model.join("chat.jsonl"), &cache),
            &["train.steps=1", "debug.dump_tensors_at=[1]", &format!("data.packing={packing}")],
        );
        let run = |name: &str, extra: &[&str]| {
            let run_dir = dir.path().join(format!("{name}-{packing}"));
            run_expect(ptrain().args(["run", "--quiet", "--run-dir"]).arg(&run_dir).args(with(base.clone(), extra)), 0);
            run_dir
        };
        let whole = run("1x8", &["data.batch_size=8"]);
        let split = run("4x2", &["data.batch_size=2", "optim.accum_steps=4"]);
        let ranks_dir = dir.path().join(format!("2rx4-{packing}"));
        let out =
            ranks::launch(2).args(["run", "--quiet", "--run-dir"]).arg(&ranks_dir).args(with(base.clone(), &["data.batch_size=4"])).output().unwrap();
        assert!(out.status.success(), "2 ranks: {}", stderr(&out));

        let loss = |d: &Path| summary(d)["first_loss"].as_f64().unwrap();
        let trained = |d: &Path| summary(d)["trained_tokens"].as_u64().unwrap();
        assert_eq!(trained(&whole), trained(&split), "same rows in the step");
        assert_eq!(trained(&whole), trained(&ranks_dir), "same rows in the step over 2 ranks");
        for (name, other) in [("4 x 2", &split), ("2 ranks x 4", &ranks_dir)] {
            close(loss(other), loss(&whole), 1e-6, &format!("packing={packing}: {name} loss vs 1 x 8"));
        }
        let dump = |d: &Path, r: u32| d.join(format!("tensors-step1.rank{r}.safetensors"));
        let grads = chat_py(&[&"compare-grads", &dump(&whole, 0), &dump(&split, 0)]);
        assert!(grads["max_rel"].as_f64().unwrap() <= 1e-6 && grads["tensors"].as_u64().unwrap() > 10, "4 x 2 vs 1 x 8: {grads}");
        let grads = chat_py(&[&"compare-grads", &dump(&whole, 0), &dump(&ranks_dir, 0), &dump(&ranks_dir, 1)]);
        assert!(grads["max_rel"].as_f64().unwrap() <= 1e-6, "2 ranks x 4 (their mean) vs 1 x 8: {grads}");
    }
}

#[test]
fn first_step_loss_equals_sft_trainers() {
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), 40);
    let cache = dir.path().join("cache");
    for (kind, source) in [("chat", "chat.jsonl"), ("prompt_completion", "pc.jsonl")] {
        // Eight rows, one batch of all of them: the order inside the batch does not
        // change the loss; validation reads the whole file, so none is held out.
        let rows: Vec<String> = std::fs::read_to_string(model.join(source)).unwrap().lines().take(8).map(String::from).collect();
        let eight = dir.path().join(format!("eight-{source}"));
        std::fs::write(&eight, rows.join("\n") + "\n").unwrap();
        let run_dir = dir.path().join(format!("run-{kind}"));
        let val = format!("data.val_path={}", s(&model.join(source)));
        let args = with(sets(&model, kind, &eight, &cache), &["train.steps=1", "data.batch_size=8", &val]);
        run_expect(ptrain().args(["run", "--quiet", "--run-dir"]).arg(&run_dir).args(args), 0);
        let ours = summary(&run_dir);
        let theirs = chat_py(&[&"first-loss", &model, &eight, &kind]);
        assert_eq!(ours["trained_tokens"], theirs["trained"], "{kind}: the same trained tokens");
        close(ours["first_loss"].as_f64().unwrap(), theirs["loss"].as_f64().unwrap(), 1e-5, &format!("{kind}: first loss vs SFTTrainer's"));
    }
}

#[test]
fn bad_instruction_data_exits_2_naming_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), 10);
    let cache = dir.path().join("cache");
    let good = std::fs::read_to_string(model.join("chat.jsonl")).unwrap();
    let first_two: String = good.lines().take(2).map(|l| format!("{l}\n")).collect();
    let cases: [(&str, String, &str); 4] = [
        ("no-messages.jsonl", format!("{first_two}{{\"text\": \"hi\"}}\n"), "line 3: no `messages`"),
        (
            "robot.jsonl",
            format!("{first_two}{{\"messages\": [{{\"role\": \"robot\", \"content\": \"x\"}}]}}\n"),
            "line 3: messages[0] has the unknown role \"robot\"",
        ),
        ("empty.jsonl", "\n\n".into(), "holds no rows"),
        ("not-json.jsonl", format!("{first_two}{{oops\n"), "line 3: not a JSON object"),
    ];
    for (name, text, expected) in cases {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        let out = run_expect(ptrain().args(["run", "--quiet", "--steps", "1"]).args(sets(&model, "chat", &file, &cache)), 2);
        let err = stderr(&out);
        assert!(err.contains(name) && err.contains(expected), "{name}: expected {expected:?} naming the file:\n{err}");
    }

    // A template that refuses a system message fails on the row that has one.
    let strict = dir.path().join("strict");
    std::fs::create_dir(&strict).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(model.join(f), strict.join(f)).unwrap();
    }
    let template = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system messages') }}{% endif %}\
                    {{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}\
                    {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    let config = serde_json::json!({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "chat_template": template});
    std::fs::write(strict.join("tokenizer_config.json"), config.to_string()).unwrap();
    let rows = dir.path().join("system.jsonl");
    let user = r#"{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}"#;
    std::fs::write(&rows, format!("{{\"messages\": [{user}]}}\n{{\"messages\": [{{\"role\": \"system\", \"content\": \"s\"}}, {user}]}}\n")).unwrap();
    let out = run_expect(ptrain().args(["run", "--quiet", "--steps", "1"]).args(sets(&strict, "chat", &rows, &cache)), 2);
    let err = stderr(&out);
    assert!(err.contains("system.jsonl") && err.contains("line 2") && err.contains("no system messages"), "{err}");

    // No chat template at all, with kind = "chat".
    std::fs::write(strict.join("tokenizer_config.json"), r#"{"eos_token": "<|im_end|>"}"#).unwrap();
    let out = run_expect(ptrain().args(["run", "--quiet", "--steps", "1"]).args(sets(&strict, "chat", &rows, &cache)), 2);
    assert!(stderr(&out).contains("needs a chat template"), "{}", stderr(&out));

    // A train_on that does not apply to the kind names the key.
    let args = with(sets(&model, "chat", &model.join("chat.jsonl"), &cache), &["data.train_on=completion"]);
    let out = run_expect(ptrain().args(["run", "--quiet", "--steps", "1"]).args(args), 2);
    assert!(stderr(&out).contains("data.train_on"), "{}", stderr(&out));
}

#[test]
fn epochs_set_the_steps_and_long_rows_are_cut_or_dropped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), 40);
    let cache = dir.path().join("cache");
    let base = sets(&model, "chat", &model.join("chat.jsonl"), &cache);
    let mut counts = Vec::new();
    for overflow in ["truncate", "drop"] {
        let run_dir = dir.path().join(overflow);
        let args = with(base.clone(), &["train.epochs=2", "data.batch_size=4", "data.max_seq_len=72", &format!("data.overflow={overflow}")]);
        run_expect(ptrain().args(["run", "--quiet", "--run-dir"]).arg(&run_dir).args(args), 0);
        let sum = summary(&run_dir);
        let rows = sum["data_rows"].clone();
        assert_eq!(rows["rows"], 40, "{sum}");
        let kept = 40 - rows["dropped_too_long"].as_u64().unwrap() - rows["dropped_untrained"].as_u64().unwrap();
        // A tenth of the kept rows (rounded up) is held out for validation.
        let train = kept - (kept as f64 * 0.1).ceil() as u64;
        assert_eq!(sum["total_steps"].as_u64().unwrap(), (2 * train).div_ceil(4), "epochs = 2 of {train} rows in batches of 4: {sum}");
        assert!(train >= 8, "enough rows fit to count epochs: {sum}");
        let epochs = sum["epochs"].as_f64().unwrap();
        assert!((2.0..2.0 + 4.0 / train as f64).contains(&epochs), "two epochs, the last step filled up: {sum}");
        counts.push(rows);
    }
    let (truncated, dropped) = (&counts[0], &counts[1]);
    assert!(truncated["truncated"].as_u64().unwrap() > 0 && truncated["dropped_too_long"] == 0, "{truncated}");
    assert!(dropped["dropped_too_long"].as_u64().unwrap() > 0 && dropped["truncated"] == 0, "{dropped}");
    assert!(
        dropped["dropped_too_long"].as_u64().unwrap() >= truncated["truncated"].as_u64().unwrap(),
        "every row truncate cuts, drop leaves out: {truncated} {dropped}"
    );
}

#[test]
fn dataset_metrics_reports_the_loss_per_source_of_a_mix() {
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), 40);
    let rows: Vec<String> = std::fs::read_to_string(model.join("chat.jsonl")).unwrap().lines().map(String::from).collect();
    let (a, b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    std::fs::write(&a, rows[..20].join("\n")).unwrap();
    std::fs::write(&b, rows[20..].join("\n")).unwrap();
    let config = dir.path().join("mix.toml");
    let toml = format!(
        "[data]\nkind = \"chat\"\npath = \"\"\npacking = true\nbatch_size = 4\ntokens_cache = \"{}\"\n\
         [[data.datasets]]\nname = \"a\"\npath = \"{}\"\n[[data.datasets]]\nname = \"b\"\npath = \"{}\"\nweight = 2.0\n",
        s(&dir.path().join("cache")),
        s(&a),
        s(&b)
    );
    std::fs::write(&config, toml).unwrap();
    let run_dir = dir.path().join("run");
    let sets = ["run.threads=1", "model.kind=llama", &format!("model.init_from={}", s(&model)), "train.steps=4", "train.eval_batches=1"];
    let mut cmd = ptrain();
    cmd.args(["run", "--quiet", "--device", "cpu", "--plugins", "dataset-metrics,jsonl", "--config"]).arg(&config).arg("--run-dir").arg(&run_dir);
    for set in sets {
        cmd.args(["--set", set]);
    }
    run_expect(&mut cmd, 0);
    let metrics = read_jsonl(&run_dir.join("metrics.jsonl"));
    let row = metrics.iter().rev().find(|r| r.get("dataset/a/tokens").is_some()).expect("a per-source report");
    let tokens: f64 = ["a", "b"].iter().map(|d| row[format!("dataset/{d}/tokens")].as_f64().unwrap()).sum();
    assert_eq!(tokens as u64, summary(&run_dir)["trained_tokens"].as_u64().unwrap(), "every trained token counted once: {row}");
    for d in ["a", "b"] {
        let loss = row[format!("dataset/{d}/loss")].as_f64().unwrap();
        assert!(loss > 1.0 && loss < 10.0, "{d}: {row}");
        assert!(row[format!("dataset/{d}/accuracy")].as_f64().unwrap() <= 1.0, "{row}");
    }
}

#[test]
fn a_small_set_reports_its_positions_epochs_repeats_and_held_out_rows() {
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), 12);
    let cache = dir.path().join("cache");
    let base = sets(&model, "chat", &model.join("chat.jsonl"), &cache);
    let run = |name: &str, extra: &[&str]| {
        let run_dir = dir.path().join(name);
        let out = run_expect(ptrain().env("PTRAIN_LOG", "info").args(["run", "--run-dir"]).arg(&run_dir).args(with(base.clone(), extra)), 0);
        (summary(&run_dir), format!("{}{}", stdout(&out), stderr(&out)))
    };

    // One row a step for an epoch, nothing held out: the positions computed are
    // each row's tokens but its last, not batch_size x max_seq_len (256).
    let (sum, log) = run("rows", &["data.val_fraction=0", "data.batch_size=1", "train.epochs=1", "run.log_every=3"]);
    let source = &sum["data_rows"]["sources"][0];
    let (kept, tokens) = (source["kept"].as_u64().unwrap(), source["tokens"].as_u64().unwrap());
    assert!(kept >= 9, "{sum}");
    assert_eq!(sum["steps"], kept, "one epoch of one row a step: {sum}");
    assert_eq!(sum["tokens"].as_u64().unwrap(), tokens - kept, "each row's positions once: {sum}");
    assert!(sum["evals"].as_array().unwrap().is_empty(), "nothing held out: {sum}");
    let epoch = format!("epoch {:.2}", 3.0 / kept as f64);
    assert!(log.contains(&epoch), "the progress line says which epoch ({epoch}): {log}");

    // A step larger than the training set repeats rows in it: said, with the rows,
    // the step and the epochs. The whole held-out set is evaluated once.
    let (sum, log) = run("repeats", &["data.val_fraction=0.25", "data.batch_size=16", "train.steps=2", "train.eval_batches=0"]);
    let held_out = (kept as f64 * 0.25).ceil() as u64;
    let train = kept - held_out;
    let warning = format!("the training set holds {train} rows, fewer than one step takes (16 = data.batch_size 16");
    assert!(log.contains(&warning), "{warning:?} in:\n{log}");
    assert!(log.contains(&format!("the 2 steps are {:.1} epochs", 32.0 / train as f64)), "{log}");
    assert_eq!(sum["evals"][0]["samples"], held_out, "{sum}");
    assert!(log.contains(&format!("({held_out} held-out samples)")), "{log}");

    // Packed, the samples are sequences: named with the rows they hold.
    let (_, log) = run("packed", &["data.packing=true", "data.batch_size=8", "train.steps=1"]);
    assert!(log.contains("packed sequences (data.packing:"), "{log}");
}
