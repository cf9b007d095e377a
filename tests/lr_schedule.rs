//! A recipe moved from transformers keeps its learning rates: `optim.schedule =
//! "linear"` with `optim.warmup_ratio` gives, step by step, the rate `Trainer` gives
//! (transformers' own scheduler in the venv, compared to the last bit); the floor is a
//! ratio of the peak, so `--set optim.lr=2e-5` alone is a valid configuration; and the
//! shipped fine-tuning configurations carry `TrainingArguments`' defaults.

mod common;

use common::{hf::hf, *};

/// `train/lr` of every step of a run, from the jsonl plugin's `metrics.jsonl`.
fn lrs_of(run_dir: &std::path::Path) -> Vec<f64> {
    read_jsonl(&run_dir.join("metrics.jsonl")).iter().filter_map(|row| row["train/lr"].as_f64()).collect()
}

#[test]
fn the_linear_schedule_equals_transformers_trainer_at_every_step() {
    let dir = tempfile::tempdir().unwrap();
    // transformers' warmup_steps: a ratio of the steps below 1 (ceil(0.15 * 23) = 4
    // warmup steps, the first at lr 0), a count of steps from 1.
    for (lr, warmup, steps) in [("2e-5", "0.15", 23u64), ("3e-4", "3", 9)] {
        let run_dir = dir.path().join(format!("run-{lr}"));
        let mut cmd = ptrain();
        cmd.args(tiny_gpt(steps)).arg("--run-dir").arg(&run_dir).args(["--plugins", "jsonl"]);
        for set in ["plugins.jsonl.every=1", "optim.schedule=\"linear\"", "optim.min_lr_ratio=0"] {
            cmd.args(["--set", set]);
        }
        let warmup_key = if warmup.contains('.') { "warmup_ratio" } else { "warmup_steps" };
        cmd.args(["--set", &format!("optim.lr={lr}"), "--set", &format!("optim.{warmup_key}={warmup}")]);
        run_expect(&mut cmd, 0);
        let ours = lrs_of(&run_dir);
        let theirs: Vec<f64> =
            hf(&[&"lr-schedule", &lr, &warmup, &steps.to_string()])["lrs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert_eq!(ours.len(), steps as usize, "one train/lr per step");
        for (step, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "lr {lr}, {warmup_key} {warmup}: step {}: ptrain {a}, transformers {b}", step + 1);
        }
    }
}

#[test]
fn a_lower_peak_alone_is_valid_and_the_floor_follows_it() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let mut cmd = ptrain();
    cmd.args(tiny_gpt(6)).arg("--run-dir").arg(&run_dir).args(["--plugins", "jsonl", "--set", "plugins.jsonl.every=1"]);
    cmd.args(["--set", "optim.lr=2e-5", "--set", "optim.warmup_steps=0"]);
    run_expect(&mut cmd, 0);
    // The default cosine ends at the default floor, min_lr_ratio = 0.1 of the peak.
    let last = *lrs_of(&run_dir).last().unwrap();
    assert!((last - 2e-6).abs() < 1e-18, "the last step's lr {last}, expected 0.1 x 2e-5");

    // An absolute min_lr above lr is still refused, naming the way out.
    let mut cmd = ptrain();
    cmd.args(tiny_gpt(2)).args(["--set", "optim.lr=2e-5", "--set", "optim.min_lr=1e-4"]);
    let err = stderr(&run_expect(&mut cmd, 2));
    assert!(err.contains("optim.min_lr") && err.contains("min_lr_ratio"), "{err}");
}

#[test]
fn the_shipped_fine_tuning_configs_carry_transformers_defaults() {
    let defaults = hf(&[&"training-defaults"]);
    let table = |path: &str| -> toml::Table { std::fs::read_to_string(repo().join(path)).unwrap().parse().unwrap() };
    let base = table("configs/default.toml")["optim"].as_table().unwrap().clone();
    for file in ["configs/qwen2-chat.toml", "configs/qwen2-finetune.toml", "configs/qwen2-lora.toml", "configs/gpt2-finetune.toml"] {
        let mut optim = base.clone();
        optim.extend(table(file)["optim"].as_table().unwrap().clone());
        let number = |key: &str| optim[key].as_float().or_else(|| optim[key].as_integer().map(|i| i as f64)).unwrap();
        assert_eq!(optim["schedule"].as_str(), defaults["schedule"].as_str(), "{file}: optim.schedule");
        assert!(!optim.contains_key("min_lr") && number("min_lr_ratio") == 0.0, "{file}: transformers decays to 0");
        assert_eq!(number("warmup_steps") + number("warmup_ratio"), defaults["warmup_steps"].as_f64().unwrap(), "{file}: warmup");
        for (ours, theirs) in [("weight_decay", "weight_decay"), ("beta1", "beta1"), ("beta2", "beta2"), ("eps", "eps"), ("grad_clip", "grad_clip")] {
            assert_eq!(number(ours), defaults[theirs].as_f64().unwrap(), "{file}: optim.{ours}");
        }
    }
}
