//! `train.loss_chunk`: the output projection and the cross-entropy computed a chunk of
//! positions at a time give the loss and gradients of the whole logits (within 1e-6
//! relative, fp32), for text windows and for instruction data, for `gpt` and `llama`.

mod common;

use std::path::Path;

use common::{
    hf::{chat_model, made_dir, made_file, s, support_py},
    *,
};

/// The largest relative difference between two dumps' gradients, and the tensors compared.
fn grad_diff(a: &Path, b: &Path) -> (f64, usize) {
    let v = support_py("chat.py", &[&"compare-grads", &a, &b]);
    (v["max_rel"].as_f64().unwrap(), v["tensors"].as_u64().unwrap() as usize)
}

fn same_with_and_without_chunks(dir: &Path, name: &str, args: &[String]) {
    let run = |chunk: &str| {
        let run_dir = dir.join(format!("{name}-{chunk}"));
        let mut cmd = ptrain();
        cmd.args(["run", "--quiet", "--device", "cpu", "--steps", "2", "--run-dir"]).arg(&run_dir).args(args);
        cmd.args(["--set", &format!("train.loss_chunk={chunk}"), "--set", "debug.dump_tensors_at=[1]", "--set", "run.threads=1"]);
        run_expect(&mut cmd, 0);
        run_dir
    };
    let (whole, chunked) = (run("0"), run("7"));
    let (a, b) = (summary(&whole), summary(&chunked));
    for key in ["first_loss", "final_loss", "final_eval_loss"] {
        let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
        assert!((x - y).abs() <= 1e-6 * x.abs(), "{name}: {key} {x} (whole) vs {y} (chunks of 7)");
    }
    let dump = |d: &Path| d.join("tensors-step1.rank0.safetensors");
    let (rel, tensors) = grad_diff(&dump(&whole), &dump(&chunked));
    assert!(tensors > 5 && rel <= 1e-6, "{name}: gradients differ by {rel} relative over {tensors} tensors");
}

#[test]
fn chunked_loss_equals_the_whole_logits_for_text_and_instruction_data() {
    let dir = tempfile::tempdir().unwrap();
    let sets = |pairs: &[&str]| pairs.iter().flat_map(|p| ["--set".to_string(), p.to_string()]).collect::<Vec<_>>();
    // gpt on byte windows: the mean over every position.
    same_with_and_without_chunks(
        dir.path(),
        "gpt",
        &sets(&["model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.block_size=32", "data.batch_size=3", "optim.accum_steps=2"]),
    );
    // qwen2 on chat rows, packed: the sum over trained tokens over their count.
    let [init, data, cache] = chat_model(dir.path(), 30, 2);
    same_with_and_without_chunks(
        dir.path(),
        "qwen2-chat",
        &sets(&["model.kind=llama", &init, "data.kind=chat", &data, &cache, "data.packing=true", "data.batch_size=2", "train.eval_batches=1"]),
    );
    // llama (untied head) on token windows.
    let llama = made_dir(&["make-llama", "llama", fixture::OUT], &dir.path().join("llama"));
    let tokens = made_file(&["make-tokens", "{out}/tokens.bin", "5000"], &dir.path().join("tokens.bin"));
    let (init, data) = (format!("model.init_from={}", s(&llama)), format!("data.path={}", s(&tokens)));
    same_with_and_without_chunks(
        dir.path(),
        "llama",
        &sets(&[&init, "data.kind=tokens", &data, "data.max_seq_len=32", "data.batch_size=2", "train.eval_batches=1"]),
    );
}

#[test]
fn loss_chunk_needs_a_model_with_an_output_projection() {
    let out = run_expect(ptrain().args(["run", "--quiet", "--steps", "1", "--set", "model.kind=mlp", "--set", "train.loss_chunk=64"]), 2);
    assert!(stderr(&out).contains("train.loss_chunk"), "{}", stderr(&out));
}

/// The tensor names of a safetensors file (its JSON header).
fn tensor_names(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header.as_object().unwrap().keys().filter(|k| *k != "__metadata__").cloned().collect()
}

#[test]
fn a_vocabulary_of_65536_or_more_gets_the_chunked_loss_unless_loss_chunk_is_set() {
    let dir = tempfile::tempdir().unwrap();
    // Whether step 1 ran without the whole logits (the dump's token_loss needs them),
    // and what the run said.
    let run = |name: &str, sets: &[&str]| {
        let run_dir = dir.path().join(name);
        let mut cmd = ptrain();
        cmd.env("PTRAIN_LOG", "info").args(tiny_gpt(1)).arg("--run-dir").arg(&run_dir);
        for set in ["debug.dump_tensors_at=[1]"].iter().chain(sets) {
            cmd.args(["--set", set]);
        }
        let err = stderr(&run_expect(&mut cmd, 0));
        let names = tensor_names(&run_dir.join("tensors-step1.rank0.safetensors"));
        (!names.iter().any(|n| n.contains("token_loss")), err)
    };
    let (chunked, err) = run("large", &["model.vocab_size=65536"]);
    assert!(chunked, "vocabulary 65536, train.loss_chunk unset: the loss is chunked");
    assert!(err.contains("1024 positions at a time") && err.contains("vocabulary 65536"), "{err}");
    let (chunked, err) = run("small", &["model.vocab_size=65535"]);
    assert!(!chunked && !err.contains("positions at a time"), "vocabulary 65535: the whole logits\n{err}");
    let (chunked, _) = run("off", &["model.vocab_size=65536", "train.loss_chunk=0"]);
    assert!(!chunked, "train.loss_chunk = 0 turns it off whatever the vocabulary");
}
