//! `run.cpu_matmul`: oneDNN's float32 CPU products (`"auto"`, the default) give the
//! losses and gradients of ATen's (`"aten"`, as PyTorch runs them) to float32 rounding,
//! for a Qwen2 (q/k/v biases, a tied head, the chunked loss; full fine-tuning and LoRA)
//! and for gpt, with oneDNN's primitives executed only under `"auto"`; and a bad value
//! exits 2 naming the key.

mod common;

use std::path::{Path, PathBuf};

use common::{
    hf::{chat_model, support_py},
    *,
};

/// Two steps with `matmul` (`aten` or `auto`), gradients dumped at step 1, under
/// `ONEDNN_VERBOSE=1` (libtorch's oneDNN prints a line per primitive it executes);
/// returns the run directory and the oneDNN products executed: the inner-product and
/// matmul primitives.
fn run(dir: &Path, name: &str, matmul: &str, sets: &[&str]) -> (PathBuf, usize) {
    let run_dir = dir.join(format!("{name}-{matmul}"));
    let mut cmd = ptrain();
    cmd.env("ONEDNN_VERBOSE", "1").args(["run", "--quiet", "--device", "cpu", "--steps", "2", "--run-dir"]).arg(&run_dir);
    for set in sets.iter().copied().chain([&*format!("run.cpu_matmul={matmul}"), "debug.dump_tensors_at=[1]", "run.threads=1"]) {
        cmd.args(["--set", set]);
    }
    let out = run_expect(&mut cmd, 0);
    // `onednn_verbose,v1,primitive,exec,cpu,inner_product,...` (oneDNN 3; 2 wrote
    // `onednn_verbose,exec,cpu,...`).
    let products = stdout(&out)
        .lines()
        .filter(|l| l.starts_with("onednn_verbose,") && l.contains(",exec,") && (l.contains(",inner_product,") || l.contains(",matmul,")))
        .count();
    (run_dir, products)
}

fn same_as_aten(dir: &Path, name: &str, sets: &[&str]) {
    let ((aten, aten_products), (onednn, onednn_products)) = (run(dir, name, "aten", sets), run(dir, name, "auto", sets));
    // The setting took effect, seen in what ran: `auto` computes its products with
    // oneDNN's primitives, `aten` with none (MKL's sgemm behind at::linear, as PyTorch).
    // Not in the last bits of the results: on some CPUs (AVX-512) oneDNN's jit gemm
    // sums in MKL's order, and the two agree bit for bit.
    assert_eq!(aten_products, 0, "{name}: run.cpu_matmul = \"aten\" executed {aten_products} oneDNN products");
    assert!(onednn_products > 0, "{name}: run.cpu_matmul = \"auto\" executed no oneDNN product: were its kernels used?");
    let (a, b) = (summary(&aten), summary(&onednn));
    for key in ["first_loss", "final_loss", "final_eval_loss"] {
        let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
        assert!((x - y).abs() <= 1e-6 * x.abs(), "{name}: {key} {x} (aten) vs {y} (oneDNN)");
    }
    let dump = |d: &Path| d.join("tensors-step1.rank0.safetensors");
    let v = support_py("chat.py", &[&"compare-grads", &dump(&aten), &dump(&onednn)]);
    let (rel, tensors) = (v["max_rel"].as_f64().unwrap(), v["tensors"].as_u64().unwrap());
    // The same sums in another order. A float32 sum of n terms reordered moves by about
    // sqrt(n) x 2^-24 of its terms' magnitude (random-walk rounding; n x 2^-24 at worst);
    // the largest sums here (a weight gradient over a batch's positions) have n of a few
    // hundred: ~1e-6 of a gradient's largest entry, and 1e-5 leaves a factor 10 for the
    // two layers they pass back through (seen on an AVX-512 AMD EPYC: 5e-7 for qwen2, 0 for
    // gpt, whose orders agree there). A wrong product (a transposed or missing term) is
    // off by far more.
    assert!(tensors > 3 && rel <= 1e-5, "{name}: gradients differ by {rel} relative over {tensors} tensors");
}

#[test]
fn onednn_products_give_atens_losses_and_gradients() {
    let dir = tempfile::tempdir().unwrap();
    let [init, data, cache] = chat_model(dir.path(), 30, 2);
    let qwen2 = ["model.kind=llama", &init, "data.kind=chat", &data, &cache, "data.batch_size=2", "train.eval_batches=1", "train.loss_chunk=7"];
    same_as_aten(dir.path(), "qwen2", &qwen2);
    let lora: Vec<&str> = qwen2.iter().copied().chain(["lora.rank=4", "lora.alpha=8"]).collect();
    same_as_aten(dir.path(), "qwen2-lora", &lora);
    same_as_aten(dir.path(), "gpt", &["model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.block_size=32", "data.batch_size=3"]);
}

#[test]
fn a_bad_value_exits_2_naming_the_key() {
    let out = run_expect(ptrain().args(["run", "--quiet", "--steps", "1", "--set", "run.cpu_matmul=mkl"]), 2);
    assert!(stderr(&out).contains("run.cpu_matmul"), "{}", stderr(&out));
}
