//! The `csv` plugin through the built binary, its file read back by `pandas.read_csv`
//! with no options, as Lightning's CSVLogger files are.

mod common;

use common::*;
use serde_json::Value;

/// `path` as pandas reads it: column names, dtypes, and every column with NaN as null.
fn read_with_pandas(path: &std::path::Path) -> Value {
    let script = "import json, sys\nimport pandas as pd\ndf = pd.read_csv(sys.argv[1])\n\
                  print(json.dumps({'columns': list(df.columns), 'dtypes': {c: str(t) for c, t in df.dtypes.items()},\n\
                  'values': {c: [None if pd.isna(v) else float(v) for v in df[c]] for c in df.columns}}))";
    let out = py::cmd().args(["-c", script]).arg(path).output().unwrap();
    assert!(out.status.success(), "pandas.read_csv failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_metric_that_first_appears_at_step_100_is_nan_before_it_in_pandas() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    // eval/loss first appears at step 100 (the first evaluation), then at 200; the
    // other metrics every 10 steps (jsonl asks for the detailed ones as often).
    let mut cmd = ptrain();
    cmd.args(tiny_gpt(200)).arg("--run-dir").arg(&run_dir).args(["--plugins", "csv,jsonl", "--set", "train.eval_every=100"]);
    run_expect(&mut cmd, 0);
    let csv = run_dir.join("metrics.csv");
    let df = read_with_pandas(&csv);
    let columns: Vec<&str> = df["columns"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    assert_eq!(columns[0], "step");
    let mut sorted = columns[1..].to_vec();
    sorted.sort();
    assert_eq!(columns[1..], sorted[..], "metric columns in sorted order, like Lightning's");
    for name in ["train/loss", "train/lr", "eval/loss", "time/step_s", "memory/peak_bytes"] {
        assert!(columns.contains(&name), "{name} missing from {columns:?}");
    }
    assert_eq!(df["dtypes"]["step"], "int64");
    assert_eq!(df["dtypes"]["train/loss"], "float64");

    // One row per emitted step, the same steps and losses as metrics.jsonl.
    let rows = read_jsonl(&run_dir.join("metrics.jsonl"));
    let steps: Vec<u64> = df["values"]["step"].as_array().unwrap().iter().map(|s| s.as_f64().unwrap() as u64).collect();
    assert_eq!(steps, rows.iter().map(|r| r["step"].as_u64().unwrap()).collect::<Vec<_>>());
    let loss = df["values"]["train/loss"].as_array().unwrap();
    for (row, got) in rows.iter().zip(loss) {
        match (row.get("train/loss").and_then(Value::as_f64), got.as_f64()) {
            (Some(want), Some(got)) => assert!((want - got).abs() <= 1e-12 * want.abs(), "step {}: {got} vs {want}", row["step"]),
            (want, got) => assert_eq!(want, got, "step {}", row["step"]),
        }
    }
    assert_eq!(steps, (1..=20).map(|i| i * 10).collect::<Vec<u64>>());

    // NaN wherever eval/loss was not emitted: every step but 100 and 200.
    let eval = df["values"]["eval/loss"].as_array().unwrap();
    for ((step, value), row) in steps.iter().zip(eval).zip(&rows) {
        assert_eq!(value.is_null(), step % 100 != 0, "eval/loss at step {step}: {value}");
        if let Some(v) = value.as_f64() {
            assert!((v - row["eval/loss"].as_f64().unwrap()).abs() <= 1e-12 * v.abs(), "step {step}");
        }
    }
    assert!(!run_dir.join("metrics.csv.tmp").exists());
    let s = summary(&run_dir);
    assert_eq!(s["plugins"]["csv"]["rows"].as_u64(), Some(steps.len() as u64));
    assert!(s["plugins"]["csv"]["rewrites"].as_u64().unwrap() >= 2, "the header widened at step 100");
}
