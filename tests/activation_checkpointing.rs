//! `train.activation_checkpointing`: blocks that keep only their input in forward and
//! are recomputed in backward give the losses, gradients and updated parameters of
//! the run that stores every activation, bit for bit (fp32, CPU), with dropout on and
//! off, for `gpt` and the Qwen2 kind, `full` and `every_n`, with accumulation, chunked
//! loss, packed rows and two data-parallel ranks with ZeRO; and they use less memory.

mod common;

use std::path::{Path, PathBuf};

use common::{hf::chat_model, *};

fn sets(pairs: &[&str]) -> Vec<String> {
    pairs.iter().flat_map(|p| ["--set".to_string(), p.to_string()]).collect()
}

const GPT: &[&str] = &[
    "model.n_layer=3",
    "model.n_embd=32",
    "model.n_head=2",
    "model.block_size=32",
    "data.batch_size=3",
    "optim.accum_steps=2",
    "train.eval_batches=1",
];

/// A 2-step run (dumping step 1's parameters, gradients and update) with `mode`.
fn run(dir: &Path, name: &str, mode: &str, args: &[String]) -> PathBuf {
    let run_dir = dir.join(format!("{name}-{mode}"));
    let mut cmd = ptrain();
    cmd.args(["run", "--quiet", "--device", "cpu", "--steps", "2", "--run-dir"]).arg(&run_dir).args(args);
    cmd.args(sets(&[&format!("train.activation_checkpointing={mode}"), "train.activation_checkpointing_every=2", "debug.dump_tensors_at=[1]"]));
    cmd.args(sets(&["run.threads=1"]));
    run_expect(&mut cmd, 0);
    run_dir
}

fn losses(run_dir: &Path) -> Vec<f64> {
    let s = summary(run_dir);
    ["first_loss", "final_loss", "final_eval_loss"].iter().map(|k| s[k].as_f64().unwrap()).collect()
}

/// Losses and step 1's dump (parameters before and after the update, gradients) of
/// every rank are the same bits.
fn assert_same_bits(stored: &Path, recomputed: &Path, ranks: u32, what: &str) {
    assert_eq!(losses(stored), losses(recomputed), "{what}: losses");
    for rank in 0..ranks {
        let dump = |d: &Path| std::fs::read(d.join(format!("tensors-step1.rank{rank}.safetensors"))).unwrap();
        let (a, b) = (dump(stored), dump(recomputed));
        assert!(ranks::tensor_names(&a).iter().any(|n| n.starts_with("grad/")), "{what}: the dump holds gradients");
        assert!(a == b, "{what}: rank {rank}'s parameters, gradients or update differ");
    }
}

/// For dropout off and on, `full` and `every_n` equal `none`; and dropout was drawn.
fn same_with_and_without(dir: &Path, name: &str, args: &[String], dropout: &str) {
    let mut with_dropout = Vec::new();
    for p in ["0.0", dropout] {
        let args: Vec<String> = args.iter().cloned().chain(sets(&[&format!("model.dropout={p}")])).collect();
        let name = format!("{name}-p{p}");
        let stored = run(dir, &name, "none", &args);
        for mode in ["full", "every_n"] {
            assert_same_bits(&stored, &run(dir, &name, mode, &args), 1, &format!("{name}, {mode}"));
        }
        with_dropout.push(losses(&stored));
    }
    assert_ne!(with_dropout[0], with_dropout[1], "{name}: dropout {dropout} changes the losses (it was on)");
}

#[test]
fn gpt_recomputed_blocks_give_the_stored_losses_and_gradients_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    same_with_and_without(dir.path(), "gpt", &sets(GPT), "0.2");
    // With the chunked loss, which hands its gradient to the last block through a surrogate.
    let chunked: Vec<String> = sets(GPT).into_iter().chain(sets(&["train.loss_chunk=7", "model.dropout=0.2"])).collect();
    let stored = run(dir.path(), "gpt-chunked", "none", &chunked);
    assert_same_bits(&stored, &run(dir.path(), "gpt-chunked", "full", &chunked), 1, "gpt, loss_chunk 7");
}

#[test]
fn qwen2_recomputed_layers_on_packed_chat_rows_give_the_stored_losses_and_gradients_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let [init, data, cache] = chat_model(dir.path(), 30, 2);
    let args = sets(&[
        "model.kind=llama",
        &init,
        "data.kind=chat",
        &data,
        &cache,
        "data.packing=true",
        "data.batch_size=2",
        "optim.accum_steps=2",
        "train.eval_batches=1",
    ]);
    same_with_and_without(dir.path(), "qwen2", &args, "0.3");
}

#[test]
fn two_ranks_with_zero_give_the_stored_losses_and_gradients_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let go = |mode: &str| {
        let run_dir = dir.path().join(format!("ranks-{mode}"));
        let mut cmd = ranks::launch(2);
        cmd.args(["run", "--quiet", "--device", "cpu", "--steps", "2", "--run-dir"]).arg(&run_dir).args(sets(GPT));
        cmd.args(sets(&[
            "model.dropout=0.2",
            "dist.shard=optimizer",
            &format!("train.activation_checkpointing={mode}"),
            "debug.dump_tensors_at=[1]",
            "run.threads=1",
        ]));
        run_expect(&mut cmd, 0);
        run_dir
    };
    assert_same_bits(&go("none"), &go("full"), 2, "2 ranks, dist.shard = optimizer");
}

#[test]
fn bf16_autocast_recomputes_under_autocast() {
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = sets(GPT).into_iter().chain(sets(&["train.precision=bf16", "model.dropout=0.2"])).collect();
    let stored = run(dir.path(), "bf16", "none", &args);
    assert_same_bits(&stored, &run(dir.path(), "bf16", "full", &args), 1, "bf16 autocast");
}

/// Peak resident memory (`summary.json`, VmHWM on the CPU) drops when 8 blocks at 512
/// positions keep only their inputs: their activations are most of what the run adds
/// to libtorch's own footprint.
#[test]
fn checkpointing_lowers_peak_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (none, full) = checkpointing_peaks(dir.path(), &[]);
    // 711 MB against 473 MB when measured: half that gap is the bound.
    assert!(full < none - 119e6, "peak {full} bytes with full checkpointing vs {none} without");
}

#[test]
fn bad_values_exit_2_naming_the_key() {
    for (set, key) in [
        ("train.activation_checkpointing=some", "train.activation_checkpointing"),
        ("train.activation_checkpointing_every=0", "train.activation_checkpointing_every"),
    ] {
        let out = run_expect(ptrain().args(["run", "--quiet", "--steps", "1", "--set", set]), 2);
        assert!(stderr(&out).contains(key), "{set}: {}", stderr(&out));
    }
    let out =
        run_expect(ptrain().args(["run", "--quiet", "--steps", "1", "--set", "model.kind=mlp", "--set", "train.activation_checkpointing=full"]), 2);
    assert!(stderr(&out).contains("train.activation_checkpointing"), "{}", stderr(&out));
    // every_n past the model's depth would checkpoint no block: refused before training, not ignored.
    let deeper = ["--set", "train.activation_checkpointing=every_n", "--set", "train.activation_checkpointing_every=3"];
    let out = run_expect(ptrain().args(["run", "--quiet", "--steps", "1", "--set", "model.kind=gpt", "--set", "model.n_layer=2"]).args(deeper), 2);
    assert!(stderr(&out).contains("train.activation_checkpointing_every") && stderr(&out).contains("2 blocks"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}
