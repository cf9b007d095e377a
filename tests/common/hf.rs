//! The Hugging Face side of the tests: tests/support/hf.py (the real `transformers`
//! and `tokenizers`), and the settings of the small runs they compare.

use std::path::Path;

use super::python;

/// Runs a tests/support/hf.py command; returns its last output line as JSON, if any.
pub fn hf(args: &[&dyn AsRef<std::ffi::OsStr>]) -> serde_json::Value {
    support_py("hf.py", args)
}

/// Runs a command of the Python helper `tests/support/<script>`; returns its last
/// output line as JSON (null when it prints nothing).
pub fn support_py(script: &str, args: &[&dyn AsRef<std::ffi::OsStr>]) -> serde_json::Value {
    let out = python().arg(format!("tests/support/{script}")).args(args.iter().map(|a| a.as_ref())).output().expect("spawn python");
    assert!(
        out.status.success(),
        "{script} {:?} failed:\n{}",
        args.iter().map(|a| a.as_ref()).collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().last().map(|l| serde_json::from_str(l).expect("the helper prints JSON")).unwrap_or(serde_json::Value::Null)
}

pub fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Common settings of the small runs: CPU, one thread, batches of 4 x 64 tokens, and
/// `extra` as `--set`s.
pub fn small(extra: &[String]) -> Vec<String> {
    let mut a: Vec<String> =
        ["--device", "cpu", "--set", "run.threads=1", "--set", "data.max_seq_len=64", "--set", "data.batch_size=4", "--set", "train.eval_batches=1"]
            .map(String::from)
            .into();
    for e in extra {
        a.extend(["--set".to_string(), e.clone()]);
    }
    a
}

pub fn close(a: f64, b: f64, tol: f64, what: &str) {
    assert!((a - b).abs() <= tol, "{what}: {a} vs {b} (tolerance {tol})");
}

/// `chat.py make DIR/model ROWS SEED`: a tiny random Qwen2 with ChatML and its chat rows,
/// and the settings that train on them: `model.init_from`, `data.path` and `data.tokens_cache`
/// (under `dir`).
pub fn chat_model(dir: &Path, rows: u32, seed: u32) -> [String; 3] {
    let model = dir.join("model");
    support_py("chat.py", &[&"make", &model, &rows.to_string(), &seed.to_string()]);
    [
        format!("model.init_from={}", s(&model)),
        format!("data.path={}", s(&model.join("chat.jsonl"))),
        format!("data.tokens_cache={}", s(&dir.join("cache"))),
    ]
}
