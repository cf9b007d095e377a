//! Instruction data as people have it, through the built binary, judged by the real
//! `datasets`, pandas, `transformers` and TRL (tests/support/forms.py): the same rows as
//! JSON Lines (plain, gzip, zstd, with a byte-order mark), a JSON array, Parquet (a file,
//! a directory of shards, a glob), a `save_to_disk` directory and a `DatasetDict`
//! encode to the same ids and masks, which equal `apply_chat_template`'s and TRL's;
//! ShareGPT and Alpaca rows encode as LLaMA-Factory's conversion of them; tool-calling
//! rows (tools, tool calls, tool results) give transformers' ids, train the tool calls
//! and never a tool result, with Qwen2.5's stock template (ptrain's convention: two
//! newlines a turn fewer than TRL trains) and with TRL's marked training template
//! (TRL's masks exactly); the first loss of a batch of every row equals SFTTrainer's
//! for every form; bad input is named by file, line or row, and column.

mod common;

use std::path::{Path, PathBuf};

use common::{
    hf::{close, s, support_py},
    *,
};

fn forms_py(args: &[&dyn AsRef<std::ffi::OsStr>]) -> serde_json::Value {
    support_py("forms.py", args)
}

/// The settings of a one-thread CPU run of chat data from `data` on `model`.
fn sets(model: &Path, data: &str, cache: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let base = [
        "run.threads=1".to_string(),
        "model.kind=llama".into(),
        format!("model.init_from={}", s(model)),
        "data.kind=chat".into(),
        format!("data.path={data}"),
        format!("data.tokens_cache={}", s(cache)),
        "train.eval_batches=1".into(),
    ];
    for set in base.iter().map(String::as_str).chain(extra.iter().copied()) {
        a.extend(["--set".to_string(), set.to_string()]);
    }
    a
}

/// `ptrain tokenize --json`: the first source's report.
fn tokenize(model: &Path, data: &str, cache: &Path, extra: &[&str]) -> serde_json::Value {
    let out = run_expect(ptrain().arg("tokenize").arg("--json").args(sets(model, data, cache, extra)), 0);
    serde_json::from_str(stdout(&out).lines().next().expect("a line per source")).unwrap()
}

fn rows_file(report: &serde_json::Value) -> PathBuf {
    PathBuf::from(report["file"].as_str().unwrap())
}

/// The first loss of one step over every row of `data` in one batch (validation reads
/// the same rows, so none is held out).
fn first_loss(model: &Path, data: &str, rows: u64, cache: &Path, run_dir: &Path) -> serde_json::Value {
    let batch = format!("data.batch_size={rows}");
    let val = format!("data.val_path={data}");
    let args = sets(model, data, cache, &["train.steps=1", &batch, &val]);
    run_expect(ptrain().args(["run", "--quiet", "--device", "cpu", "--run-dir"]).arg(run_dir).args(args), 0);
    summary(run_dir)
}

#[test]
fn every_form_encodes_to_the_rows_transformers_and_trl_give() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture::copy("chat.py", &["make", fixture::OUT, "12", "3"], &dir.path().join("model"));
    let forms = dir.path().join("forms");
    forms_py(&[&"forms", &model, &"8", &forms]);
    let cache = dir.path().join("cache");
    let f = |name: &str| s(&forms.join(name));

    // Every form of the same 8 rows: byte for byte the rows of the JSON Lines file.
    let reference = rows_file(&tokenize(&model, &f("rows.jsonl"), &cache, &[]));
    let same = std::fs::read(&reference).unwrap();
    let variants = [
        f("rows.jsonl.gz"),
        f("rows.jsonl.zst"),
        f("bom.jsonl"),
        f("array.json"),
        f("lines.json"),
        f("rows.parquet"),
        f("shards"),
        format!("{}/train-*.parquet", f("shards")),
        f("saved"),
        f("dict"),
        f("sharegpt.json"),
    ];
    for data in &variants {
        let report = tokenize(&model, data, &cache, &[]);
        assert_eq!(report["rows"], 8, "{data}: {report}");
        assert!(std::fs::read(rows_file(&report)).unwrap() == same, "{data}: the same ids and masks as rows.jsonl");
    }
    // Alpaca rows encode as LLaMA-Factory's messages of them.
    let alpaca = tokenize(&model, &f("alpaca.json"), &cache, &[]);
    let as_messages = tokenize(&model, &f("alpaca_messages.jsonl"), &cache, &[]);
    assert!(std::fs::read(rows_file(&alpaca)).unwrap() == std::fs::read(rows_file(&as_messages)).unwrap(), "alpaca.json vs its messages");

    // The reference and the columnar forms against transformers and TRL, read by datasets.
    let parquet = rows_file(&tokenize(&model, &f("rows.parquet"), &cache, &[]));
    let saved = rows_file(&tokenize(&model, &f("saved"), &cache, &[]));
    let report = forms_py(&[
        &"check",
        &model,
        &"chat",
        &f("rows.jsonl"),
        &reference,
        &f("rows.parquet"),
        &parquet,
        &f("saved"),
        &saved,
        &f("alpaca_messages.jsonl"),
        &rows_file(&as_messages),
    ]);
    for r in report["reports"].as_array().unwrap() {
        for key in ["id_mismatches", "template_mismatches", "mask_mismatches"] {
            assert_eq!(r[key], 0, "{key}: {r}");
        }
        assert!(r["trained"].as_u64().unwrap() > 20, "{r}");
    }

    // The first loss of a batch of every row, for every form, equals SFTTrainer's.
    let theirs = forms_py(&[&"first-loss", &model, &f("rows.jsonl"), &"chat"]);
    for (i, data) in std::iter::once(f("rows.jsonl")).chain(variants.iter().cloned()).enumerate() {
        let ours = first_loss(&model, &data, 8, &cache, &dir.path().join(format!("run-{i}")));
        assert_eq!(ours["trained_tokens"], theirs["trained"], "{data}: {ours}");
        close(ours["first_loss"].as_f64().unwrap(), theirs["loss"].as_f64().unwrap(), 1e-5, &format!("{data}: first loss vs SFTTrainer's"));
    }
    let theirs = forms_py(&[&"first-loss", &model, &f("alpaca_messages.jsonl"), &"chat"]);
    let ours = first_loss(&model, &f("alpaca.json"), 8, &cache, &dir.path().join("run-alpaca"));
    close(ours["first_loss"].as_f64().unwrap(), theirs["loss"].as_f64().unwrap(), 1e-5, "alpaca.json: first loss vs SFTTrainer's");
}

#[test]
fn tool_rows_render_as_transformers_and_train_calls_never_results() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("qwen");
    let made = forms_py(&[&"tools-model", &model, &"24", &"4"]);
    assert!(made["tool_calls"].as_u64().unwrap() >= 10, "rows with tool calls: {made}");
    let marked = model.join("marked");
    let cache = dir.path().join("cache");
    let m = |name: &str| s(&model.join(name));

    // Qwen2.5's stock template (no marks): ptrain's turns, through <|im_end|>.
    let stock: Vec<PathBuf> =
        ["tools.jsonl", "tools_str.jsonl", "tools.parquet"].iter().map(|d| rows_file(&tokenize(&model, &m(d), &cache, &[]))).collect();
    let report = forms_py(&[
        &"check",
        &model,
        &"chat",
        &"--qwen-newlines",
        &m("tools.jsonl"),
        &stock[0],
        &m("tools_str.jsonl"),
        &stock[1],
        &m("tools.parquet"),
        &stock[2],
    ]);
    for r in report["reports"].as_array().unwrap() {
        for key in ["id_mismatches", "template_mismatches", "mask_mismatches"] {
            assert_eq!(r[key], 0, "stock Qwen2.5 template, TRL's two extra newlines a turn left out: {key}: {r}");
        }
        close(r["trl_extra_per_turn"].as_f64().unwrap(), 2.0, 1e-9, "TRL trains two newlines more per assistant turn");
    }
    // No tool result is trained; every tool call is.
    let spans = forms_py(&[&"tool-spans", &model, &m("tools.jsonl"), &stock[0]]);
    assert_eq!(spans["tool_responses_trained"], 0, "{spans}");
    assert_eq!(spans["tool_calls_trained"], spans["tool_calls"], "{spans}");

    // ShareGPT with function_call / observation turns: the same rows as their OpenAI form.
    let sharegpt = rows_file(&tokenize(&model, &m("sharegpt_tools.json"), &cache, &[]));
    let openai = rows_file(&tokenize(&model, &m("sharegpt_tools_messages.jsonl"), &cache, &[]));
    assert!(std::fs::read(sharegpt).unwrap() == std::fs::read(&openai).unwrap(), "ShareGPT tool turns vs OpenAI tool calls");

    // TRL's training template with {% generation %} marks: TRL's masks exactly, and the
    // first loss of a batch of every row equals SFTTrainer's.
    let with_marks: Vec<PathBuf> = ["tools.jsonl", "tools.parquet"].iter().map(|d| rows_file(&tokenize(&marked, &m(d), &cache, &[]))).collect();
    let report = forms_py(&[&"check", &marked, &"chat", &m("tools.jsonl"), &with_marks[0], &m("tools.parquet"), &with_marks[1]]);
    for r in report["reports"].as_array().unwrap() {
        for key in ["id_mismatches", "template_mismatches", "mask_mismatches"] {
            assert_eq!(r[key], 0, "marked template: {key}: {r}");
        }
    }
    let eight: String = std::fs::read_to_string(model.join("tools.jsonl")).unwrap().lines().take(8).map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.path().join("eight.jsonl"), eight).unwrap();
    let eight = s(&dir.path().join("eight.jsonl"));
    let theirs = forms_py(&[&"first-loss", &marked, &eight, &"chat"]);
    let ours = first_loss(&marked, &eight, 8, &cache, &dir.path().join("run"));
    assert_eq!(ours["trained_tokens"], theirs["trained"], "{ours}");
    close(ours["first_loss"].as_f64().unwrap(), theirs["loss"].as_f64().unwrap(), 1e-5, "tool rows: first loss vs SFTTrainer's");
}

#[test]
fn bad_input_is_named_by_file_row_and_column() {
    let dir = tempfile::tempdir().unwrap();
    // Any chat model: the suite's shared one (tests/lora.rs's).
    let model = fixture::copy("chat.py", &["make", fixture::OUT, "40", "3"], &dir.path().join("model"));
    let cache = dir.path().join("cache");
    let good = r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}"#;
    let refused = |data: &str, extra: &[&str]| -> String {
        let out = run_expect(ptrain().args(["run", "--quiet", "--device", "cpu", "--steps", "1"]).args(sets(&model, data, &cache, extra)), 2);
        stderr(&out)
    };
    let write = |name: &str, bytes: &[u8]| -> String {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        s(&path)
    };
    // Text forms: by line.
    let cases: Vec<(String, &[u8], &str)> = vec![
        ("bad-utf8.jsonl".into(), b"", "line 2: not UTF-8 text: an invalid byte (0xFF) at column 44"),
        ("extra.jsonl".into(), b"", "line 1: column `id` is neither read nor passed to the chat template"),
        ("null.jsonl".into(), b"", "line 1: messages[0] has no `content` (or it is null)"),
        ("array.json".into(), b"", "line 3: messages[1] has the unknown role \"robot\""),
        ("truncated.json".into(), b"", "line 2: the file ends inside a row"),
    ];
    let bodies: Vec<Vec<u8>> = vec![
        [good.as_bytes(), b"\n{\"messages\": [{\"role\": \"user\", \"content\": \"\xFF\"}]}\n"].concat(),
        format!("{{\"id\": 7, {}\n", &good[1..]).into_bytes(),
        br#"{"messages": [{"role": "user", "content": null}, {"role": "assistant", "content": "yo"}]}"#.to_vec(),
        format!("[\n{good},\n{{\"messages\": [{{\"role\": \"user\", \"content\": \"x\"}}, {{\"role\": \"robot\", \"content\": \"y\"}}]}}\n]")
            .into_bytes(),
        format!("[{good},\n{{\"messages\": [").into_bytes(),
    ];
    for ((name, _, expected), body) in cases.iter().zip(&bodies) {
        let err = refused(&write(name, body), &[]);
        assert!(err.contains(name.as_str()) && err.contains(expected), "{name}: expected {expected:?}:\n{err}");
    }
    // Leaving a column out on purpose.
    let extra = s(&dir.path().join("extra.jsonl"));
    run_expect(ptrain().arg("tokenize").args(sets(&model, &extra, &cache, &["data.ignore_columns=[\"id\"]", &format!("data.val_path={extra}")])), 0);

    // Columnar forms: by row index, naming the column and listing the columns.
    let parquet = dir.path().join("bad.parquet");
    let arrow_dir = dir.path().join("saved");
    let report = support_py("forms.py", &[&"bad-columnar", &parquet, &arrow_dir, &dir.path().join("typed.parquet"), &dir.path().join("dict")]);
    assert!(report.is_object());
    let err = refused(&s(&parquet), &[]);
    assert!(err.contains("bad.parquet") && err.contains("row 2: messages[1] has the unknown role \"robot\""), "{err}");
    let err = refused(&s(&arrow_dir), &[]);
    assert!(err.contains("row 0: column `source` is neither read nor passed"), "{err}");
    let err = refused(&s(&dir.path().join("typed.parquet")), &[]);
    assert!(err.contains("column `when` has the Arrow type Timestamp") && err.contains("columns: messages, when"), "{err}");
    let typed = s(&dir.path().join("typed.parquet"));
    run_expect(
        ptrain().arg("tokenize").args(sets(&model, &typed, &cache, &["data.ignore_columns=[\"when\"]", &format!("data.val_path={typed}")])),
        0,
    );
    let err = refused(&s(&dir.path().join("dict")), &[]);
    assert!(err.contains("a DatasetDict without a `train` split (it has: test, validation)"), "{err}");
    let err = refused(&format!("{}/nothing-*.parquet", s(dir.path())), &[]);
    assert!(err.contains("no file matches this pattern"), "{err}");
}
