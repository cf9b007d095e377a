//! The core loop, run through the built binary: training works, is reproducible,
//! and bad input is refused with exit code 2 before anything trains.

mod common;

use common::*;

fn run_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

fn losses(run_dir: &std::path::Path) -> Vec<(u64, f64)> {
    read_jsonl(&run_dir.join("metrics.jsonl")).iter().filter_map(|row| Some((row["step"].as_u64()?, row["train/loss"].as_f64()?))).collect()
}

#[test]
fn loss_falls_on_synthetic_data_within_100_steps() {
    let dir = run_dir();
    run_expect(ptrain().args(tiny_gpt(100)).arg("--run-dir").arg(dir.path()), 0);
    let s = summary(dir.path());
    let (first, last) = (s["first_loss"].as_f64().unwrap(), s["final_loss"].as_f64().unwrap());
    assert!(last < 0.7 * first, "loss did not fall enough: {first} -> {last}");
    assert!(s["final_eval_loss"].as_f64().unwrap() < 0.75 * first);
    assert_eq!(s["status"], "completed");
}

#[test]
fn the_same_seed_gives_bitwise_identical_losses_and_another_seed_does_not() {
    let run = |seed: u64| {
        let dir = run_dir();
        run_expect(
            ptrain()
                .args(tiny_gpt(30))
                .args(["--plugins", "jsonl", "--set", "plugins.jsonl.every=1", "--set", "model.dropout=0.1", "--seed"])
                .arg(seed.to_string())
                .arg("--run-dir")
                .arg(dir.path()),
            0,
        );
        (losses(dir.path()), summary(dir.path()))
    };
    let (a, sa) = run(7);
    let (b, sb) = run(7);
    let (c, _) = run(8);
    assert_eq!(a.len(), 30);
    // Bit for bit: compare the f64 bit patterns, not approximately.
    let bits = |v: &[(u64, f64)]| v.iter().map(|(s, l)| (*s, l.to_bits())).collect::<Vec<_>>();
    assert_eq!(bits(&a), bits(&b));
    assert_eq!(sa["final_eval_loss"], sb["final_eval_loss"]);
    assert_ne!(bits(&a), bits(&c), "a different seed must change the losses");
}

#[test]
fn summary_and_resolved_config_are_written() {
    let dir = run_dir();
    let out = run_expect(
        ptrain().args(tiny_gpt(12)).args(["--set", "optim.accum_steps=2", "--set", "optim.name=\"sgd\""]).arg("--run-dir").arg(dir.path()),
        0,
    );
    assert!(stdout(&out).contains("completed: 12 steps"), "{}", stdout(&out));
    let s = summary(dir.path());
    for key in [
        "steps",
        "samples",
        "tokens",
        "wall_s",
        "steps_per_s",
        "tokens_per_s",
        "first_loss",
        "final_loss",
        "final_eval_loss",
        "phase_times",
        "peak_memory_bytes",
        "device",
        "plugins_loaded",
    ] {
        assert!(!s[key].is_null(), "summary lacks {key}: {s}");
    }
    assert_eq!(s["steps"], 12);
    assert_eq!(s["samples"], 12 * 2 * 8, "accumulation doubles the samples per step");
    assert_eq!(s["tokens"], 12 * 2 * 8 * 32);
    assert_eq!(s["device"], "cpu");
    let phases = &s["phase_times"];
    assert!(["data_s", "forward_s", "backward_s", "optimizer_s"].iter().all(|k| phases[k].as_f64().unwrap() > 0.0), "{phases}");
    assert_eq!(phases["hooks_s"], 0.0, "fast mode calls no hooks: {phases}");
    let resolved: toml::Table = std::fs::read_to_string(dir.path().join("config.toml")).unwrap().parse().unwrap();
    assert_eq!(resolved["optim"]["accum_steps"].as_integer(), Some(2));
    assert_eq!(resolved["optim"]["name"].as_str(), Some("sgd"));
    assert_eq!(resolved["model"]["n_embd"].as_integer(), Some(32));
}

#[test]
fn an_unknown_config_key_exits_2_naming_the_key_and_the_file() {
    let dir = run_dir();
    let config = dir.path().join("typo.toml");
    std::fs::write(&config, "[model]\nn_layers = 3\n").unwrap();
    let runs = dir.path().join("run");
    let out = run_expect(ptrain().args(tiny_gpt(5)).arg("--config").arg(&config).arg("--run-dir").arg(&runs), 2);
    let err = stderr(&out);
    assert!(err.contains("`model.n_layers`") && err.contains(&config.display().to_string()), "{err}");
    assert!(!runs.exists(), "nothing may be written before training starts");

    let out = run_expect(ptrain().args(tiny_gpt(5)).args(["--set", "optim.betas=0.9"]), 2);
    assert!(stderr(&out).contains("`optim.betas` in --set optim.betas=0.9"), "{}", stderr(&out));
}

#[test]
fn missing_files_exit_2_naming_the_path() {
    let out = run_expect(ptrain().args(tiny_gpt(5)).args(["--config", "/no/such/config.toml"]), 2);
    assert!(stderr(&out).contains("/no/such/config.toml"), "{}", stderr(&out));
    let out = run_expect(ptrain().args(tiny_gpt(5)).args(["--set", "data.kind=\"tokens\"", "--set", "data.path=\"/no/such/train.bin\""]), 2);
    assert!(stderr(&out).contains("/no/such/train.bin"), "{}", stderr(&out));
}

#[test]
fn an_unknown_plugin_exits_2_listing_the_available_ones() {
    let out = run_expect(ptrain().args(tiny_gpt(5)).args(["--plugins", "nosuch"]), 2);
    let err = stderr(&out);
    assert!(err.contains("nosuch") && err.contains("available:") && err.contains("jsonl"), "{err}");
}

/// The first training batch for the data settings `sets` (`--set` pairs over
/// the tiny GPT), as `ptrain logits` draws it: each row of inputs followed by
/// its last target, and the loss on it at initialisation.
fn first_batch(dir: &std::path::Path, sets: &[String]) -> (Vec<Vec<i64>>, f64) {
    let probe = dir.join("probe.safetensors");
    let gpt_sets = tiny_gpt(1).into_iter().skip_while(|a| a != "--set");
    run_expect(ptrain().args(["logits", "--split", "train", "--step", "1", "--out"]).arg(&probe).args(gpt_sets).args(sets), 0);
    let script = "import json, sys\nfrom safetensors.torch import load_file\np = load_file(sys.argv[1])\n\
                  rows = [i + [t[-1]] for i, t in zip(p['inputs'].tolist(), p['targets'].tolist())]\n\
                  print(json.dumps({'rows': rows, 'loss': p['loss'].item()}))";
    let out = py::cmd().args(["-c", script]).arg(&probe).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (serde_json::from_value(v["rows"].clone()).unwrap(), v["loss"].as_f64().unwrap())
}

#[test]
fn text_token_and_jsonl_data_train() {
    let dir = run_dir();
    let text = dir.path().join("corpus.txt");
    std::fs::write(&text, "the quick brown fox jumps over the lazy dog. ".repeat(400)).unwrap();
    let out_dir = dir.path().join("text");
    run_expect(
        ptrain()
            .args(tiny_gpt(8))
            .args(["--set", "data.kind=\"text\"", "--set"])
            .arg(format!("data.path={:?}", text.display().to_string()))
            .arg("--run-dir")
            .arg(&out_dir),
        0,
    );
    assert_eq!(summary(&out_dir)["steps"], 8);
    // The run trained on the text: its first batch is windows of the corpus'
    // bytes, and its first loss is the loss on that batch.
    let corpus = std::fs::read(&text).unwrap();
    let (rows, loss) = first_batch(
        dir.path(),
        &["--set".into(), "data.kind=\"text\"".into(), "--set".into(), format!("data.path={:?}", text.display().to_string())],
    );
    assert_eq!(rows.len(), 8);
    for row in &rows {
        let bytes: Vec<u8> = row.iter().map(|&id| u8::try_from(id).expect("a byte id")).collect();
        assert!(corpus.windows(bytes.len()).any(|w| w == bytes.as_slice()), "not a window of the corpus: {:?}", String::from_utf8_lossy(&bytes));
    }
    assert_eq!(summary(&out_dir)["first_loss"].as_f64().unwrap().to_bits(), (loss as f32 as f64).to_bits(), "the run's first loss is on that batch");

    // A nanoGPT-style uint16 file with ids past the byte vocabulary: refused until
    // model.vocab_size covers them.
    let tokens = dir.path().join("train.bin");
    let data: Vec<u8> = (0..20_000u32).flat_map(|i| ((i * 7 % 300) as u16).to_le_bytes()).collect();
    std::fs::write(&tokens, data).unwrap();
    let data_args = |cmd: &mut std::process::Command| {
        cmd.args(tiny_gpt(8)).args(["--set", "data.kind=\"tokens\"", "--set"]).arg(format!("data.path={:?}", tokens.display().to_string()));
    };
    let mut refused = ptrain();
    data_args(&mut refused);
    let out = run_expect(&mut refused, 2);
    assert!(stderr(&out).contains("token id 299") && stderr(&out).contains("model.vocab_size"), "{}", stderr(&out));
    let out_dir = dir.path().join("tokens");
    let mut cmd = ptrain();
    data_args(&mut cmd);
    run_expect(cmd.args(["--set", "model.vocab_size=300", "--run-dir"]).arg(&out_dir), 0);
    assert_eq!(summary(&out_dir)["steps"], 8);
    // Windows of the file: id i is i * 7 % 300, so each id is 7 more than the last.
    let sets = ["data.kind=\"tokens\"".to_string(), format!("data.path={:?}", tokens.display().to_string()), "model.vocab_size=300".into()];
    let (rows, loss) = first_batch(dir.path(), &sets.iter().flat_map(|s| ["--set".to_string(), s.clone()]).collect::<Vec<_>>());
    assert_eq!(rows.len(), 8);
    for row in &rows {
        assert!(row.windows(2).all(|p| p[1] == (p[0] + 7) % 300), "not a window of the token file: {row:?}");
    }
    assert_eq!(summary(&out_dir)["first_loss"].as_f64().unwrap().to_bits(), (loss as f32 as f64).to_bits(), "the run's first loss is on that batch");

    let rows = dir.path().join("rows.jsonl");
    let mut lines = String::new();
    for i in 0..400 {
        let (name, label) = if i % 3 == 0 { ("news", i % 2) } else { ("forum", (i / 2) % 2) };
        let x = if label == 1 { 1.0 } else { -1.0 };
        lines.push_str(&format!("{{\"dataset\": \"{name}\", \"features\": [{x}, {}, 0.5], \"label\": {label}}}\n", i as f64 / 400.0));
    }
    std::fs::write(&rows, lines).unwrap();
    let out_dir = dir.path().join("jsonl");
    run_expect(
        ptrain()
            .args(["run", "--quiet", "--steps", "40", "--device", "cpu", "--set", "model.kind=\"mlp\"", "--set", "data.kind=\"jsonl\"", "--set"])
            .arg(format!("data.path={:?}", rows.display().to_string()))
            .arg("--run-dir")
            .arg(&out_dir),
        0,
    );
    let s = summary(&out_dir);
    assert!(s["evals"][0]["accuracy"].as_f64().unwrap() > 0.9, "a separable problem: {s}");
}

#[test]
fn bad_jsonl_rows_are_refused_with_the_line_number() {
    let dir = run_dir();
    let rows = dir.path().join("rows.jsonl");
    std::fs::write(&rows, "{\"dataset\": \"a\", \"features\": [1, 2], \"label\": 0}\n{\"dataset\": \"a\", \"features\": [1], \"label\": 1}\n")
        .unwrap();
    let out = run_expect(
        ptrain()
            .args(["run", "--steps", "3", "--set", "model.kind=\"mlp\"", "--set", "data.kind=\"jsonl\"", "--set"])
            .arg(format!("data.path={:?}", rows.display().to_string())),
        2,
    );
    assert!(stderr(&out).contains("line 2"), "{}", stderr(&out));
}

#[test]
fn a_torchscript_module_from_python_trains() {
    let dir = run_dir();
    let module = dir.path().join("classifier.pt");
    let status = py::cmd().arg("tests/support/make_torchscript.py").arg(&module).args(["32", "4"]).status().unwrap();
    assert!(status.success());
    let out_dir = dir.path().join("run");
    run_expect(
        ptrain()
            .args([
                "run",
                "--quiet",
                "--steps",
                "60",
                "--device",
                "cpu",
                "--config",
                "configs/mlp-multi.toml",
                "--set",
                "model.kind=\"torchscript\"",
                "--set",
            ])
            .arg(format!("model.torchscript.path={:?}", module.display().to_string()))
            .arg("--run-dir")
            .arg(&out_dir),
        0,
    );
    let s = summary(&out_dir);
    assert_eq!(s["model"], "torchscript");
    assert!(s["parameters"].as_u64().unwrap() == (32 * 64 + 64 + 64 * 4 + 4) as u64, "the module's parameters are trained: {s}");
    assert!(s["final_loss"].as_f64().unwrap() < 0.8 * s["first_loss"].as_f64().unwrap(), "{s}");
}

#[test]
fn the_default_config_is_printed_commented() {
    let out = run_expect(ptrain().args(["config", "--default"]), 0);
    let text = stdout(&out);
    assert!(text.contains("# ") && text.contains("[optim]"));
    let parsed: toml::Table = text.parse().expect("the default parses");
    assert!(parsed.contains_key("train"));
    // It is configs/default.toml, comments and all: the file the docs point to.
    assert_eq!(text, std::fs::read_to_string(repo().join("configs/default.toml")).unwrap());
}

/// bf16 on the CPU trains (autocast, loss in float32) and ends close to fp32.
#[test]
fn a_bf16_cpu_run_ends_within_two_percent_of_fp32() {
    let run = |precision: &str| {
        let dir = run_dir();
        let set = format!("train.precision=\"{precision}\"");
        run_expect(ptrain().args(tiny_gpt(200)).args(["--set", &set]).arg("--run-dir").arg(dir.path()), 0);
        let s = summary(dir.path());
        assert_eq!(s["precision"], precision);
        s["final_loss"].as_f64().unwrap()
    };
    let (fp32, bf16) = (run("fp32"), run("bf16"));
    assert_ne!(fp32, bf16, "bf16 must actually run in bf16");
    assert!((bf16 - fp32).abs() <= 0.02 * fp32, "bf16 {bf16} vs fp32 {fp32}");
}

#[test]
fn an_out_of_range_value_is_refused_naming_key_value_range_and_source() {
    let dir = run_dir();
    let out = run_expect(ptrain().args(tiny_gpt(5)).args(["--set", "optim.lr=-1"]).arg("--run-dir").arg(dir.path().join("r")), 2);
    let err = stderr(&out);
    assert!(err.contains("`optim.lr`") && err.contains("--set optim.lr=-1") && err.contains("-1 is out of range: must be a number > 0"), "{err}");
    assert!(!dir.path().join("r").exists(), "refused before anything is written");
    let out = run_expect(ptrain().args(tiny_gpt(0)), 2);
    assert!(stderr(&out).contains("`train.steps`"), "{}", stderr(&out));
}

#[test]
fn logs_have_no_colour_off_a_terminal_and_quiet_keeps_only_the_summary_line() {
    let dir = run_dir();
    let args: Vec<String> = tiny_gpt(20).into_iter().filter(|a| a != "--quiet").collect();
    let out = run_expect(ptrain().env_remove("PTRAIN_LOG").args(&args).args(["--set", "run.log_every=5"]).arg("--run-dir").arg(dir.path()), 0);
    let err = stderr(&out);
    assert!(err.contains("INFO") && err.contains("step 5/20"), "progress lines at info: {err}");
    assert!(!err.contains('\u{1b}'), "no ANSI escapes when stderr is not a terminal: {err:?}");
    // A second fresh run: its own directory (the first one's records are refused).
    let quiet_dir = run_dir();
    let out = run_expect(
        ptrain().env_remove("PTRAIN_LOG").args(&args).args(["--quiet", "--set", "run.log_every=5"]).arg("--run-dir").arg(quiet_dir.path()),
        0,
    );
    let err = stderr(&out);
    assert!(!err.contains("INFO") && !err.contains("step 5/20") && !err.contains("eval at step"), "--quiet: {err}");
    assert!(stdout(&out).starts_with("completed: 20 steps"), "{}", stdout(&out));
}

/// Stderr of a short run with one warning, on a terminal (a pty from util-linux's
/// `script`), with `NO_COLOR` as given; `None` where `script` is missing.
fn warning_on_a_terminal(run_dir: &std::path::Path, no_color: Option<&str>) -> Option<String> {
    let line = format!("{} run --quiet --steps 2 --device cpu --set dist.shard=gradients --run-dir {}", bin().display(), run_dir.display());
    let mut cmd = std::process::Command::new("script");
    cmd.args(["-qec", &line, "/dev/null"]).current_dir(repo()).env("PTRAIN_LOG", "warn").env_remove("PTRAIN_PLUGIN_PATH").env_remove("NO_COLOR");
    for var in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"] {
        cmd.env_remove(var);
    }
    if let Some(value) = no_color {
        cmd.env("NO_COLOR", value);
    }
    let out = cmd.output().ok()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn log_lines_are_coloured_on_a_terminal_unless_no_color_is_set() {
    let dir = run_dir();
    let Some(coloured) = warning_on_a_terminal(&dir.path().join("a"), None) else {
        skip("log_lines_are_coloured_on_a_terminal_unless_no_color_is_set", "no `script` to run ptrain on a pty");
        return;
    };
    let warning = |text: &str| text.lines().find(|l| l.contains("needs more than one rank")).map(String::from).unwrap_or_else(|| panic!("{text:?}"));
    assert!(warning(&coloured).contains("\u{1b}[33m"), "a yellow WARN on a terminal: {coloured:?}");
    let plain = warning_on_a_terminal(&dir.path().join("b"), Some("1")).unwrap();
    assert!(!warning(&plain).contains('\u{1b}'), "no escapes with NO_COLOR=1: {plain:?}");
    // https://no-color.org: an empty NO_COLOR does not count.
    let empty = warning_on_a_terminal(&dir.path().join("c"), Some("")).unwrap();
    assert!(warning(&empty).contains("\u{1b}[33m"), "{empty:?}");
}

#[test]
fn with_the_bar_on_a_terminal_and_stdout_redirected_progress_lines_go_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    // As `ptrain run > run.log` from a terminal: stderr a pseudo-terminal (the bar is
    // drawn there; a thread drains it), stdout a pipe.
    let script = r#"
import os, pty, subprocess, sys, threading
master, slave = pty.openpty()
drain = threading.Thread(target=lambda: [None for _ in iter(lambda: os.read(master, 4096), b"")], daemon=True)
drain.start()
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=slave)
os.close(slave)
sys.stdout.write(p.stdout.decode())
sys.exit(p.returncode)
"#;
    let mut cmd = python();
    cmd.args(["-c", script]).arg(bin()).args(tiny_gpt(6).into_iter().filter(|a| a != "--quiet"));
    cmd.args(["--set", "run.log_every=2", "--run-dir"]).arg(dir.path().join("run"));
    let out = run_expect(&mut cmd, 0);
    let text = String::from_utf8_lossy(&out.stdout);
    let steps: Vec<&str> = text.lines().filter(|l| l.starts_with("step ")).map(|l| l.split("  ").next().unwrap()).collect();
    assert_eq!(steps, ["step 2/6", "step 4/6", "step 6/6"], "plain progress lines on the redirected stdout:\n{text}");
}

#[test]
fn evaluation_covers_the_held_out_set_once_and_val_fraction_0_trains_on_every_row() {
    let dir = run_dir();
    // 256 synthetic classification rows: the last tenth (26, rounded up) held out.
    let mlp = |name: &str, sets: &[&str]| {
        let out_dir = dir.path().join(name);
        let mut cmd = ptrain();
        cmd.args(["run", "--steps", "3", "--device", "cpu", "--set", "model.kind=\"mlp\"", "--set", "data.synthetic_len=4096"]);
        for set in sets {
            cmd.args(["--set", set]);
        }
        let out = run_expect(cmd.env("PTRAIN_LOG", "info").arg("--run-dir").arg(&out_dir), 0);
        (summary(&out_dir), format!("{}{}", stdout(&out), stderr(&out)))
    };
    let (whole, log) = mlp("whole", &["train.eval_batches=0", "data.batch_size=8"]);
    let eval = &whole["evals"][0];
    assert_eq!(eval["samples"], 26, "every held-out row once, the last batch short: {whole}");
    assert!(log.contains("(26 held-out samples)"), "the eval line says how many: {log}");
    // More batches than the held-out rows fill: the same rows once, never wrapping.
    let (more, _) = mlp("more", &["train.eval_batches=50", "data.batch_size=8"]);
    assert_eq!(more["evals"][0]["samples"], 26, "{more}");
    assert_eq!(more["evals"][0]["loss"], eval["loss"], "the same rows, the same loss");
    // Nothing held out: every row trains, no evaluation, no eval loss.
    let (none, log) = mlp("none", &["data.val_fraction=0"]);
    assert_eq!(none["status"], "completed");
    assert!(none["evals"].as_array().unwrap().is_empty() && none["final_eval_loss"].is_null(), "{none}");
    assert!(log.contains("no evaluation"), "{log}");

    // Text windows: the held-out tenth of the synthetic text, tiled by windows of block_size + 1.
    let out_dir = dir.path().join("text");
    run_expect(ptrain().args(tiny_gpt(2)).args(["--set", "train.eval_batches=0", "--run-dir"]).arg(&out_dir), 0);
    let (held_out_tokens, block) = (200_000 / 10, 32);
    assert_eq!(summary(&out_dir)["evals"][0]["samples"], (held_out_tokens - 1) / block, "{}", summary(&out_dir));
}
