//! The `flops` plugin against FLOP counts written out by hand, with both of its
//! methods (the layer count and libtorch's profiler) checked against each other.

mod common;

use std::path::Path;

use common::{plugin_path, ptrain, py, read_jsonl, run_expect, stderr, summary, tiny_gpt};

/// An MLP 24 -> 40 -> 16 -> 5 on 12-sample micro-batches, 3 per optimizer step.
const MLP: &[&str] = &[
    "--set",
    "data.synthetic_features=24",
    "--set",
    "model.mlp.hidden=[40, 16]",
    "--set",
    "data.synthetic_classes=5",
    "--set",
    "data.batch_size=12",
    "--set",
    "optim.accum_steps=3",
];

/// Forward 2*in*out per linear per sample, backward twice that, less the first
/// layer's input gradient (its input is data).
fn mlp_by_hand() -> f64 {
    let forward = 2.0 * (24.0 * 40.0 + 40.0 * 16.0 + 16.0 * 5.0);
    let backward = 2.0 * forward - 2.0 * 24.0 * 40.0;
    (forward + backward) * 12.0 * 3.0
}

/// 6 x params x tokens plus 12 x n_layer x n_embd x seq_len per token, params
/// being the matmul weights: 12 d^2 per block and the tied 256-token head.
fn gpt_by_hand(n_layer: f64, d: f64, t: f64, batch: f64) -> f64 {
    let params = n_layer * 12.0 * d * d + d * 256.0;
    let tokens = batch * t;
    6.0 * params * tokens + 12.0 * n_layer * d * t * tokens
}

fn mlp_run(dir: &Path, extra: &[&str]) -> (Vec<serde_json::Value>, serde_json::Value) {
    run_expect(
        ptrain()
            .args(["run", "--quiet", "--steps", "4", "--device", "cpu", "--config", "configs/mlp-multi.toml", "--plugins", "flops,jsonl"])
            .args(MLP)
            .args(["--set", "run.threads=1", "--set", "plugins.jsonl.every=1", "--set", "plugins.flops.every=2"])
            .args(extra)
            .arg("--run-dir")
            .arg(dir),
        0,
    );
    (read_jsonl(&dir.join("metrics.jsonl")), summary(dir))
}

fn flops_per_step(rows: &[serde_json::Value]) -> Vec<f64> {
    rows.iter().filter_map(|r| r["flops/step"].as_f64()).collect()
}

fn within(got: f64, want: f64, tolerance: f64) -> bool {
    (got - want).abs() <= tolerance * want
}

#[test]
fn mlp_flops_match_the_hand_count_by_both_methods() {
    plugin_path("flops");
    let want = mlp_by_hand();
    for method in ["count", "profiler"] {
        let dir = tempfile::tempdir().unwrap();
        let (rows, s) = mlp_run(dir.path(), &["--set", &format!("plugins.flops.method=\"{method}\"")]);
        let reported = flops_per_step(&rows);
        assert_eq!(reported.len(), 3, "first step, step 2 and step 4: {rows:?}");
        for got in reported {
            assert!(within(got, want, 0.02), "{method}: {got} vs {want} by hand");
        }
        assert_eq!(s["plugins"]["flops"]["method"], method);
    }
}

#[test]
fn gpt_flops_match_six_n_d_plus_attention_by_both_methods() {
    plugin_path("flops");
    let want = gpt_by_hand(2.0, 32.0, 32.0, 8.0);
    let mut figures = Vec::new();
    for method in ["count", "profiler"] {
        let dir = tempfile::tempdir().unwrap();
        run_expect(
            ptrain()
                .args(tiny_gpt(2))
                .args(["--set", "model.n_layer=2", "--plugins", "flops"])
                .args(["--set", &format!("plugins.flops.method=\"{method}\"")])
                .arg("--run-dir")
                .arg(dir.path()),
            0,
        );
        let got = summary(dir.path())["plugins"]["flops"]["flops_per_step"].as_f64().unwrap();
        assert!(within(got, want, 0.05), "{method}: {got} vs {want} by hand");
        figures.push(got);
    }
    assert!(within(figures[1], figures[0], 0.02), "the profiler agrees with the count: {figures:?}");
}

/// A scripted MLP 24 -> 40 -> 5 with dropout: TorchScript lists no layers.
const SCRIPTED: &str = r#"
import sys, torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(24, 40)
        self.b = torch.nn.Linear(40, 5)
        self.drop = torch.nn.Dropout(0.1)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.drop(torch.relu(self.a(x))))
torch.jit.script(M()).save(sys.argv[1])
"#;

#[test]
fn a_model_that_cannot_describe_itself_is_profiled() {
    plugin_path("flops");
    let dir = tempfile::tempdir().unwrap();
    let (script, module) = (dir.path().join("make.py"), dir.path().join("m.pt"));
    // TorchScript reads the module's source, so it must come from a file.
    std::fs::write(&script, SCRIPTED).unwrap();
    assert!(py::cmd().arg(&script).arg(&module).status().unwrap().success());
    let run_dir = dir.path().join("run");
    let (rows, s) =
        mlp_run(&run_dir, &["--set", "model.kind=\"torchscript\"", "--set", &format!("model.torchscript.path={:?}", module.display().to_string())]);
    let forward = 2.0 * (24.0 * 40.0 + 40.0 * 5.0);
    let want = (3.0 * forward - 2.0 * 24.0 * 40.0) * 12.0 * 3.0;
    let reported = flops_per_step(&rows);
    assert!(!reported.is_empty());
    for got in reported {
        assert!(within(got, want, 0.02), "{got} vs {want} by hand");
    }
    assert_eq!(s["plugins"]["flops"]["method"], "profiler");
}

#[test]
fn achieved_rate_and_mfu_agree_with_the_peak() {
    plugin_path("flops");
    let dir = tempfile::tempdir().unwrap();
    let (rows, s) = mlp_run(dir.path(), &["--set", "plugins.flops.peak_tflops=0.5"]);
    let f = &s["plugins"]["flops"];
    assert_eq!(f["peak_tflops"], 0.5);
    assert_eq!(f["peak_source"], "option peak_tflops");
    let first = rows.iter().find(|r| r["step"] == 1).unwrap();
    assert!(first.get("perf/mfu").is_none(), "the first step alone gives no rate: {first}");
    let later: Vec<_> = rows.iter().filter(|r| r.get("perf/mfu").is_some()).collect();
    assert_eq!(later.len(), 2, "steps 2 and 4");
    for r in later {
        let (achieved, mfu) = (r["flops/achieved_tflops"].as_f64().unwrap(), r["perf/mfu"].as_f64().unwrap());
        assert!(achieved > 0.0 && within(mfu, achieved / 0.5, 1e-9), "{r}");
    }
    assert!(f["mfu"].as_f64().unwrap() > 0.0, "{f}");
}

#[test]
fn other_ranks_get_the_profiled_count_of_rank_zero() {
    plugin_path("flops");
    let dir = tempfile::tempdir().unwrap();
    let out = run_expect(
        common::ranks::launch(2)
            .args(["run", "--quiet", "--steps", "3", "--device", "cpu", "--config", "configs/mlp-multi.toml", "--plugins", "flops"])
            .args(MLP)
            .args(["--set", "run.threads=1", "--set", "plugins.flops.method=\"profiler\"", "--set", "plugins.flops.every=1"])
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    let all = format!("{}{}", common::stdout(&out), stderr(&out));
    // Rank 1 profiles nothing: without rank 0's broadcast it would have no count and say so.
    assert!(!all.contains("no FLOP count") && !all.contains("failed"), "{all}");
    let s = summary(dir.path());
    assert!(within(s["plugins"]["flops"]["flops_per_step"].as_f64().unwrap(), mlp_by_hand(), 0.02), "{s}");
}

#[test]
fn unknown_options_stop_the_run_naming_the_key() {
    plugin_path("flops");
    let out = run_expect(ptrain().args(tiny_gpt(1)).args(["--plugins", "flops", "--set", "plugins.flops.peak_tflop=9"]), 2);
    assert!(stderr(&out).contains("`peak_tflop`"), "{}", stderr(&out));
}
