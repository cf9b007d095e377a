//! The Hugging Face side of the tests: tests/support/hf.py (the real `transformers`
//! and `tokenizers`), and the settings of the small runs they compare.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
};

use super::{fixture, ptrain, py, run_expect, stderr, summary};

/// Runs a tests/support/hf.py command; returns its last output line as JSON, if any.
pub fn hf(args: &[&dyn AsRef<std::ffi::OsStr>]) -> serde_json::Value {
    support_py("hf.py", args)
}

/// Runs a command of the Python helper `tests/support/<script>`; returns its last
/// output line as JSON (null when it prints nothing).
pub fn support_py(script: &str, args: &[&dyn AsRef<std::ffi::OsStr>]) -> serde_json::Value {
    let path = format!("tests/support/{script}");
    let argv: Vec<&OsStr> = std::iter::once(OsStr::new(&path)).chain(args.iter().map(|a| a.as_ref())).collect();
    let out = py::output(&argv);
    assert!(
        out.status.success(),
        "{script} {:?} failed:\n{}",
        args.iter().map(|a| a.as_ref()).collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().last().map(|l| serde_json::from_str(l).expect("the helper prints JSON")).unwrap_or(serde_json::Value::Null)
}

/// `hf.py ARGS` made once for the suite (a shared fixture, tests/common/fixture.rs),
/// `{out}` standing for the directory it writes; a copy of it at `to`.
pub fn made_dir(args: &[&str], to: &Path) -> PathBuf {
    fixture::copy("hf.py", args, to)
}

/// `hf.py ARGS` made once for the suite, writing the one file `{out}/NAME`; a copy of
/// it at `to`.
pub fn made_file(args: &[&str], to: &Path) -> PathBuf {
    fixture::file("hf.py", args, to)
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

/// `chat.py make DIR/model ROWS SEED` (a copy of the shared fixture): a tiny random Qwen2 with ChatML and its chat rows,
/// and the settings that train on them: `model.init_from`, `data.path` and `data.tokens_cache`
/// (under `dir`).
pub fn chat_model(dir: &Path, rows: u32, seed: u32) -> [String; 3] {
    let model = fixture::copy("chat.py", &["make", fixture::OUT, &rows.to_string(), &seed.to_string()], &dir.join("model"));
    [
        format!("model.init_from={}", s(&model)),
        format!("data.path={}", s(&model.join("chat.jsonl"))),
        format!("data.tokens_cache={}", s(&dir.join("cache"))),
    ]
}

/// `set`, the settings of a run from `model.init_from = model`, from a copy of that
/// directory at `to` instead, whose config.json has `key` set to `value`.
pub fn with_config_key(set: &[String], model: &Path, to: &Path, key: &str, value: serde_json::Value) -> Vec<String> {
    std::fs::create_dir_all(to).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(model.join(f), to.join(f)).unwrap();
    }
    let path = to.join("config.json");
    let mut json: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json.insert(key.into(), value);
    std::fs::write(&path, serde_json::to_string(&json).unwrap()).unwrap();
    set.iter().filter(|s| !s.starts_with("model.init_from")).cloned().chain([format!("model.init_from={}", s(to))]).collect()
}

/// `ptrain run` with `set` (under `dir`), refused with exit 2 naming `needle` before a
/// run directory exists.
pub fn refused(dir: &Path, set: &[String], needle: &str) {
    let never = dir.join("never");
    let out = run_expect(ptrain().args(["run", "--steps", "1", "--run-dir"]).arg(&never).args(small(set)), 2);
    assert!(stderr(&out).contains(needle), "refusal names `{needle}`:\n{}", stderr(&out));
    assert!(!never.exists(), "{needle}: refused before the run directory");
}

/// A model made by `tests/support/hf.py MAKER KIND DIR/KIND<flags> - FLAGS...` (`make-gemma`,
/// `make-moe`), random tokens below its vocabulary beside it, and the settings that train
/// on them from it.
pub fn family_model(dir: &Path, maker: &str, kind: &str, flags: &[&str]) -> (PathBuf, Vec<String>) {
    let model = dir.join(format!("{kind}{}", flags.concat()));
    let mut args: Vec<&dyn AsRef<OsStr>> = vec![&maker, &kind, &model, &"-"];
    args.extend(flags.iter().map(|f| f as &dyn AsRef<OsStr>));
    hf(&args);
    let tokens = dir.join("tokens.bin");
    if !tokens.exists() {
        hf(&[&"make-tokens", &tokens, &"20000"]);
    }
    (model.clone(), vec!["data.kind=tokens".into(), format!("data.path={}", s(&tokens)), format!("model.init_from={}", s(&model))])
}

/// The first loss of a one-step run in `dir/name` with the small settings and `set`.
pub fn first_loss(dir: &Path, name: &str, set: &[String]) -> f64 {
    let run_dir = dir.join(name);
    run_expect(ptrain().args(["run", "--quiet", "--steps", "1", "--run-dir"]).arg(&run_dir).args(small(set)), 0);
    summary(&run_dir)["first_loss"].as_f64().unwrap()
}

/// Loads the exported directory `out` in transformers beside ptrain's logits `probe` of
/// it (tests/support/hf.py `load-export`, `model` for its tokenizer), checks that every
/// tensor was taken and the logits are ptrain's within 1e-4, and returns the report for
/// the caller's own checks.
pub fn loaded_export(out: &Path, probe: &Path, model: &Path, what: &str) -> serde_json::Value {
    let report = hf(&[&"load-export", &out, &probe, &model]);
    for key in ["missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"] {
        assert_eq!(report["info"][key], serde_json::json!([]), "{what} {key}: {report}");
    }
    let max_diff = report["max_abs_diff"].as_f64().unwrap();
    assert!(max_diff <= 1e-4, "{what}: exported logits differ from ptrain's by {max_diff}: {report}");
    report
}
