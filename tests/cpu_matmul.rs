//! `run.cpu_matmul`: oneDNN's float32 CPU products (`"auto"`, the default) give the
//! losses and gradients of ATen's (`"aten"`, as PyTorch runs them) to float32 rounding,
//! for a Qwen2 (q/k/v biases, a tied head, the chunked loss; full fine-tuning and LoRA)
//! and for gpt; and a bad value exits 2 naming the key.

mod common;

use std::path::{Path, PathBuf};

use common::{
    hf::{chat_model, support_py},
    *,
};

/// Two steps with `matmul` (`aten` or `auto`), gradients dumped at step 1.
fn run(dir: &Path, name: &str, matmul: &str, sets: &[&str]) -> PathBuf {
    let run_dir = dir.join(format!("{name}-{matmul}"));
    let mut cmd = ptrain();
    cmd.args(["run", "--quiet", "--device", "cpu", "--steps", "2", "--run-dir"]).arg(&run_dir);
    for set in sets.iter().copied().chain([&*format!("run.cpu_matmul={matmul}"), "debug.dump_tensors_at=[1]", "run.threads=1"]) {
        cmd.args(["--set", set]);
    }
    run_expect(&mut cmd, 0);
    run_dir
}

fn same_as_aten(dir: &Path, name: &str, sets: &[&str]) {
    let (aten, onednn) = (run(dir, name, "aten", sets), run(dir, name, "auto", sets));
    let (a, b) = (summary(&aten), summary(&onednn));
    for key in ["first_loss", "final_loss", "final_eval_loss"] {
        let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
        assert!((x - y).abs() <= 1e-6 * x.abs(), "{name}: {key} {x} (aten) vs {y} (oneDNN)");
    }
    let dump = |d: &Path| d.join("tensors-step1.rank0.safetensors");
    let v = support_py("chat.py", &[&"compare-grads", &dump(&aten), &dump(&onednn)]);
    let (rel, abs, tensors) = (v["max_rel"].as_f64().unwrap(), v["max_abs"].as_f64().unwrap(), v["tensors"].as_u64().unwrap());
    assert!(tensors > 3 && rel <= 1e-5, "{name}: gradients differ by {rel} relative over {tensors} tensors");
    // The setting took effect: the sums run in another order, so some last bit differs.
    assert!(abs > 0.0, "{name}: oneDNN's gradients are ATen's bit for bit: were its kernels used?");
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
