//! Checkpointing through the built binary: retention, exact resume, files Python
//! reads, and surviving kill -9, signals, unwritable or full disks and NaN losses.

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::*;

fn args(steps: u64) -> Vec<String> {
    let mut a = tiny_gpt(steps);
    a.extend(["--plugins".into(), "checkpoint,jsonl".into(), "--set".into(), "plugins.jsonl.every=1".into()]);
    a
}

fn ckpt_dir(run: &Path) -> PathBuf {
    run.join("checkpoints")
}

fn steps_on_disk(run: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> =
        std::fs::read_dir(ckpt_dir(run)).unwrap().filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("step-")?.parse().ok()).collect();
    steps.sort();
    steps
}

fn losses(run: &Path) -> Vec<(u64, Option<f64>)> {
    read_jsonl(&run.join("metrics.jsonl")).iter().filter_map(|r| Some((r["step"].as_u64()?, r["train/loss"].as_f64()))).collect()
}

fn python_report(dirs: &[&Path]) -> serde_json::Value {
    let out = py::cmd().arg("tests/support/compare_checkpoints.py").args(dirs).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Asserts every committed checkpoint validates and `latest` names one of them.
fn assert_all_valid(run: &Path) -> u64 {
    let verify = run_expect(ptrain().args(["checkpoints", "verify"]).arg(run), 0);
    assert!(!stderr(&verify).contains("skipping"), "an invalid committed checkpoint:\n{}", stderr(&verify));
    let listing = stdout(&run_expect(ptrain().args(["checkpoints", "list"]).arg(run), 0));
    assert!(!listing.contains("INVALID"), "{listing}");
    let latest = std::fs::read_to_string(ckpt_dir(run).join("latest")).unwrap();
    assert!(ckpt_dir(run).join(latest.trim()).join("manifest.json").exists(), "latest -> {latest}");
    *steps_on_disk(run).last().unwrap()
}

#[test]
fn retention_keeps_the_newest_and_the_best() {
    let dir = tempfile::tempdir().unwrap();
    run_expect(
        ptrain()
            .args(args(30))
            .args([
                "--set",
                "plugins.checkpoint.every=5",
                "--set",
                "train.eval_every=10",
                "--set",
                "plugins.checkpoint.keep_last=2",
                "--set",
                "plugins.checkpoint.keep_best=1",
            ])
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    let s = summary(dir.path());
    let evals: Vec<(u64, f64)> = s["evals"].as_array().unwrap().iter().map(|e| (e["step"].as_u64().unwrap(), e["loss"].as_f64().unwrap())).collect();
    assert_eq!(evals.iter().map(|e| e.0).collect::<Vec<_>>(), vec![10, 20, 30]);
    let best = evals.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap().0;
    let mut expected = vec![25, 30, best];
    expected.sort();
    expected.dedup();
    assert_eq!(steps_on_disk(dir.path()), expected);
    let c = &s["plugins"]["checkpoint"];
    assert_eq!((c["saved"].as_u64(), c["failed"].as_u64()), (Some(6), Some(0)));
    assert_eq!(c["deleted"].as_u64().unwrap() as usize, 6 - expected.len());
    assert_eq!(c["best"]["step"], best);
    assert_eq!(std::fs::read_to_string(ckpt_dir(dir.path()).join("latest")).unwrap().trim(), "step-00000030");
}

#[test]
fn a_resumed_run_repeats_the_uninterrupted_losses_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    // Dropout draws random numbers; a constant schedule makes the 20-step run the
    // first half of the 40-step one.
    let extra = ["--set", "model.dropout=0.1", "--set", "optim.schedule=\"constant\"", "--set", "optim.warmup_steps=0"];
    let whole = dir.path().join("whole");
    run_expect(ptrain().args(args(40)).args(extra).arg("--run-dir").arg(&whole), 0);
    let parts = dir.path().join("parts");
    run_expect(ptrain().args(args(20)).args(extra).arg("--run-dir").arg(&parts), 0);
    let resumed = dir.path().join("resumed");
    run_expect(ptrain().args(args(40)).args(extra).arg("--resume").arg(&parts).arg("--run-dir").arg(&resumed), 0);
    let expected: Vec<(u64, u64)> = losses(&whole).into_iter().filter(|(s, _)| *s > 20).map(|(s, l)| (s, l.unwrap().to_bits())).collect();
    let got: Vec<(u64, u64)> = losses(&resumed).into_iter().map(|(s, l)| (s, l.unwrap().to_bits())).collect();
    assert_eq!(expected.len(), 20);
    assert_eq!(got, expected);
    let s = summary(&resumed);
    assert_eq!((s["start_step"].as_u64(), s["steps"].as_u64()), (Some(20), Some(20)));
    assert!(s["resumed_from"].as_str().unwrap().ends_with("step-00000020"));
    // And the final weights match too.
    let report = python_report(&[&ckpt_dir(&whole).join("step-00000040"), &ckpt_dir(&resumed).join("step-00000040")]);
    assert_eq!(report["model_equal"], true, "{report}");
    assert_eq!(report["optimizer_equal"], true, "{report}");
}

#[test]
fn checkpoints_are_read_by_python_safetensors() {
    let dir = tempfile::tempdir().unwrap();
    run_expect(ptrain().args(args(6)).arg("--run-dir").arg(dir.path()), 0);
    let report = python_report(&[&ckpt_dir(dir.path()).join("step-00000006")]);
    assert_eq!(report["model"]["transformer.wte.weight"], serde_json::json!([256, 32]));
    assert_eq!(report["model"]["transformer.h.0.attn.c_attn.weight"], serde_json::json!([96, 32]));
    assert_eq!(report["numel"], summary(dir.path())["parameters"]);
    assert_eq!(report["finite"], true);
    let keys: Vec<String> = serde_json::from_value(report["optimizer_keys"].clone()).unwrap();
    assert!(keys.contains(&"step".to_string()) && keys.contains(&"exp_avg_sq.transformer.wte.weight".to_string()), "{keys:?}");
}

fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn(args: &[String], run: &Path) -> std::process::Child {
    ptrain().args(args).arg("--run-dir").arg(run).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()
}

fn jsonl_lines(run: &Path) -> usize {
    std::fs::read_to_string(run.join("metrics.jsonl")).map(|t| t.lines().count()).unwrap_or(0)
}

/// `--set` pairs for a wider model: its files take longer to write.
const WIDE: [&str; 4] = ["--set", "model.n_embd=128", "--set", "model.n_head=4"];

#[test]
fn kill_9_inside_saves_never_leaves_an_invalid_checkpoint_and_every_resume_progresses() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    let mut a = args(100_000);
    a.extend(WIDE.into_iter().chain(["--set", "plugins.checkpoint.every=1", "--set", "plugins.checkpoint.keep_last=2"]).map(String::from));
    let ready = run.join("save-paused.rank0.json");
    let mut newest = Vec::new();
    let mut stale: Option<PathBuf> = None;
    for round in 0..8u64 {
        // Each round pauses a later save (a resumed run saves two more steps
        // first), after another of its files: the optimizer state, the weights,
        // state.json, config.toml.
        let (step, files) = (3 + 2 * round, 1 + round % 4);
        let mut cmd = a.clone();
        cmd.extend(["--set".into(), format!("debug.pause_save_at_step={step}"), "--set".into(), format!("debug.pause_save_after_files={files}")]);
        if round > 0 {
            cmd.push("--auto-resume".into());
        }
        let mut child = spawn(&cmd, run);
        let paused = wait_for_json(&mut child, &ready);
        child.kill().unwrap(); // SIGKILL, while the save is paused inside
        child.wait().unwrap();
        std::fs::remove_file(&ready).unwrap();

        // The kill landed inside the save of `step`: its staging directory holds
        // the files written so far, and the step was never committed.
        let staging = ckpt_dir(run).join(format!(".tmp-step-{step:08}-{}", child.id()));
        assert_eq!((paused["pid"].as_u64(), paused["step"].as_u64()), (Some(child.id().into()), Some(step)), "{paused}");
        let file = PathBuf::from(paused["file"].as_str().unwrap());
        assert_eq!(file.parent(), Some(staging.as_path()), "{paused}");
        assert!(file.exists(), "{}", file.display());
        let written = std::fs::read_dir(&staging).unwrap().filter(|e| e.as_ref().unwrap().path().is_file()).count() as u64;
        assert_eq!(written, files, "files in {}", staging.display());
        assert!(!ckpt_dir(run).join(format!("step-{step:08}")).exists(), "step {step} was committed: the kill came after the save");
        // A resumed run removed the leftovers of the save killed before.
        if let Some(stale) = stale.replace(staging) {
            assert!(!stale.exists(), "{} was not cleaned", stale.display());
        }
        newest.push(assert_all_valid(run));
        assert_eq!(std::fs::read_to_string(ckpt_dir(run).join("latest")).unwrap().trim(), format!("step-{:08}", step - 1));
    }
    assert!(newest.windows(2).all(|w| w[1] > w[0]), "every resumed run saved a newer checkpoint: {newest:?}");
    let last = *newest.last().unwrap();
    let mut tail = args(last + 3);
    tail.extend(WIDE.into_iter().chain(["--auto-resume"]).map(String::from));
    run_expect(ptrain().args(&tail).arg("--run-dir").arg(run), 0);
    assert_eq!(summary(run)["start_step"], last);
    assert!(!stale.unwrap().exists(), "the last killed save's staging directory was not cleaned");
}

fn interrupt(signal: &str, expected_exit: i32) {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    let mut child = spawn(&args(100_000), run);
    wait_for("five steps", Duration::from_secs(60), || jsonl_lines(run) >= 5);
    Command::new("kill").args([signal, &child.id().to_string()]).status().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(expected_exit));
    let s = summary(run);
    assert_eq!(s["status"], "interrupted");
    let last = s["last_step"].as_u64().unwrap();
    // The emergency checkpoint is the step the run stopped after, and the sinks
    // were flushed up to it.
    assert_eq!(steps_on_disk(run), vec![last]);
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt_dir(run).join(format!("step-{last:08}/manifest.json"))).unwrap()).unwrap();
    assert_eq!(manifest["reason"], "interrupted");
    assert_eq!(losses(run).last().unwrap().0, last);
    run_expect(ptrain().args(args(last + 4)).arg("--auto-resume").arg("--run-dir").arg(run), 0);
    assert_eq!(summary(run)["start_step"], last);
}

#[test]
fn sigint_saves_an_emergency_checkpoint_and_exits_130() {
    interrupt("-INT", 130);
}

#[test]
fn sigterm_saves_an_emergency_checkpoint_and_exits_143() {
    interrupt("-TERM", 143);
}

/// A directory the checkpoint plugin cannot write to: a read-only mount when we
/// may mount (root), else a directory without write permission.
struct Unwritable {
    path: PathBuf,
    mounted: bool,
}

impl Unwritable {
    fn new(path: PathBuf, size: Option<u64>) -> Option<Unwritable> {
        std::fs::create_dir_all(&path).unwrap();
        let options = match size {
            Some(bytes) => format!("size={bytes}"),
            None => "ro,size=1m".to_string(),
        };
        let mounted =
            Command::new("mount").args(["-t", "tmpfs", "-o", &options, "tmpfs"]).arg(&path).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
        if !mounted {
            if size.is_some() {
                return None;
            }
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o555)).unwrap();
        }
        Some(Unwritable { path, mounted })
    }
}

impl Drop for Unwritable {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.path).status();
        }
    }
}

#[test]
fn an_unwritable_checkpoint_directory_gives_one_error_and_training_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let Some(ro) = Unwritable::new(dir.path().join("ro"), None) else { unreachable!() };
    // Root ignores permission bits: without a read-only mount this can only be checked as a normal user.
    let root_without_mount = !ro.mounted && Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0")).unwrap_or(false);
    let run = dir.path().join("run");
    let out = run_expect(
        ptrain()
            .args(args(12))
            .args(["--set", "plugins.checkpoint.every=3", "--set"])
            .arg(format!("plugins.checkpoint.dir={:?}", ro.path.display().to_string()))
            .arg("--run-dir")
            .arg(&run)
            .env("PTRAIN_LOG", "error"),
        0,
    );
    if root_without_mount {
        skip("an_unwritable_checkpoint_directory_gives_one_error_and_training_goes_on", "root may not mount a read-only tmpfs here");
        return;
    }
    let errors: Vec<String> = stderr(&out).lines().filter(|l| l.contains("checkpoint")).map(String::from).collect();
    assert_eq!(errors.len(), 1, "one error line for the same problem: {errors:?}");
    assert!(errors[0].contains("saving step 3 failed"), "{}", errors[0]);
    let s = summary(&run);
    assert_eq!(s["steps"], 12);
    assert_eq!(s["plugins"]["checkpoint"]["failed"], 4);
    assert!(s["plugin_failures"].as_array().unwrap().is_empty(), "the plugin stays enabled to retry");
}

#[test]
fn a_full_disk_keeps_the_older_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("probe");
    run_expect(ptrain().args(args(2)).args(["--set", "plugins.checkpoint.every=2"]).arg("--run-dir").arg(&probe), 0);
    let one: u64 = std::fs::read_dir(ckpt_dir(&probe).join("step-00000002")).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
    // Room for two checkpoints and a half: the third save runs out of space.
    let Some(full) = Unwritable::new(dir.path().join("full"), Some(one * 5 / 2 + 64 * 1024)) else {
        skip("a_full_disk_keeps_the_older_checkpoints", "cannot mount a small tmpfs here (needs root with mount rights)");
        return;
    };
    let run = dir.path().join("run");
    let out = run_expect(
        ptrain()
            .args(args(12))
            .args(["--set", "plugins.checkpoint.every=3", "--set", "plugins.checkpoint.keep_last=5", "--set"])
            .arg(format!("plugins.checkpoint.dir={:?}", full.path.display().to_string()))
            .arg("--run-dir")
            .arg(&run),
        0,
    );
    assert!(stderr(&out).contains("No space left on device"), "{}", stderr(&out));
    let kept: Vec<String> = std::fs::read_dir(&full.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    let mut kept = kept;
    kept.sort();
    assert_eq!(kept, vec!["step-00000003", "step-00000006"], "the older checkpoints survive, no partial one is left");
    assert_eq!(std::fs::read_to_string(full.path.join("latest")).unwrap().trim(), "step-00000006");
    assert_eq!(summary(&run)["steps"], 12);
}

#[test]
fn on_save_error_stop_ends_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, "").unwrap();
    let run = dir.path().join("run");
    run_expect(
        ptrain()
            .args(args(20))
            .args(["--set", "plugins.checkpoint.every=4", "--set", "plugins.checkpoint.on_save_error=\"stop\"", "--set"])
            .arg(format!("plugins.checkpoint.dir={:?}", file.join("ckpt").display().to_string()))
            .arg("--run-dir")
            .arg(&run),
        1,
    );
    let s = summary(&run);
    // A stop asked for because of a failure is a failure (issue 62, item 1): named with
    // the hook and step it asked in.
    assert_eq!((s["status"].as_str(), s["exit_code"].as_i64(), s.get("stopped_by")), (Some("failed"), Some(1), None), "{s}");
    assert_eq!(s["failed_by"], serde_json::json!({"plugin": "checkpoint", "hook": "checkpoint", "step": 4}), "{s}");
    assert!(s["stop_reason"].as_str().unwrap().contains("plugin `checkpoint` stopped the run as failed: saving step 4 failed"), "{s}");
    assert!(s["last_step"].as_u64().unwrap() < 20);
}

#[test]
fn non_finite_losses_are_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    run_expect(ptrain().args(args(15)).args(["--set", "debug.nonfinite_loss_at=[5, 6]"]).arg("--run-dir").arg(dir.path()), 0);
    let s = summary(dir.path());
    assert_eq!(s["nonfinite_steps"], 2);
    assert!(s["final_loss"].as_f64().unwrap().is_finite());
    let nan_steps: Vec<u64> = losses(dir.path()).into_iter().filter(|(_, l)| l.is_none()).map(|(s, _)| s).collect();
    assert_eq!(nan_steps, vec![5, 6]);
}

#[test]
fn too_many_non_finite_losses_stop_with_the_last_good_state_saved() {
    let dir = tempfile::tempdir().unwrap();
    let bad: Vec<String> = (10..=25).map(|s| s.to_string()).collect();
    run_expect(
        ptrain()
            .args(args(40))
            .args([
                "--set",
                "plugins.checkpoint.every=9",
                "--set",
                "train.nonfinite_check_every=5",
                "--set",
                "train.max_nonfinite_in_row=10",
                "--set",
            ])
            .arg(format!("debug.nonfinite_loss_at=[{}]", bad.join(",")))
            .arg("--run-dir")
            .arg(dir.path()),
        1,
    );
    let s = summary(dir.path());
    assert_eq!(s["status"], "nonfinite");
    let stopped = s["last_step"].as_u64().unwrap();
    assert_eq!(stopped, 20, "10 in a row are seen at the check after step 19");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt_dir(dir.path()).join("step-00000020/manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["reason"], "nonfinite");
    // Steps 10..20 were skipped on the device: the saved state is step 9's.
    let report = python_report(&[&ckpt_dir(dir.path()).join("step-00000009"), &ckpt_dir(dir.path()).join("step-00000020")]);
    assert_eq!((report["model_equal"].as_bool(), report["optimizer_equal"].as_bool()), (Some(true), Some(true)), "{report}");
}

/// Rewrites a run's or a checkpoint's `config.toml` as versions before the model kinds'
/// tables wrote it: `[model.gpt]`, `[model.mlp]` and `[model.torchscript]`'s keys flat
/// in `[model]` (and, in a checkpoint, the manifest's size and CRC of the file).
fn flatten_model_tables(dir: &Path) {
    let path = dir.join("config.toml");
    let mut config: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
    let model = config["model"].as_table_mut().unwrap();
    for kind in ["gpt", "mlp", "torchscript"] {
        let toml::Value::Table(keys) = model.remove(kind).unwrap() else { panic!("[model.{kind}] is a table") };
        model.extend(keys);
    }
    let text = toml::to_string(&config).unwrap();
    assert!(text.contains("\nbias = true\n") && !text.contains("[model.gpt]"), "{text}");
    std::fs::write(&path, &text).unwrap();
    let manifest_path = dir.join("manifest.json");
    let Ok(manifest) = std::fs::read_to_string(&manifest_path) else { return };
    let mut manifest: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    for entry in manifest["files"].as_array_mut().unwrap().iter_mut().filter(|e| e["path"] == "config.toml") {
        entry["size"] = text.len().into();
        entry["crc32"] = crc32fast::hash(text.as_bytes()).into();
    }
    std::fs::write(&manifest_path, serde_json::to_string_pretty(&manifest).unwrap()).unwrap();
}

#[test]
fn a_run_and_checkpoint_from_before_the_model_tables_resume_and_are_compared_key_for_key() {
    let dir = tempfile::tempdir().unwrap();
    let extra = ["--set", "optim.schedule=\"constant\"", "--set", "optim.warmup_steps=0"];
    let whole = dir.path().join("whole");
    run_expect(ptrain().args(args(4)).args(extra).arg("--run-dir").arg(&whole), 0);
    let run = dir.path().join("run");
    run_expect(ptrain().args(args(2)).args(extra).arg("--run-dir").arg(&run), 0);
    let ckpt = ckpt_dir(&run).join("step-00000002");
    flatten_model_tables(&run);
    flatten_model_tables(&ckpt);
    // A flat key that differs is named by its path now (the checkpoint's was bias = true).
    let out = run_expect(
        ptrain()
            .args(args(4))
            .args(extra)
            .args(["--set", "model.gpt.bias=false", "--resume"])
            .arg(&ckpt)
            .arg("--run-dir")
            .arg(dir.path().join("other")),
        2,
    );
    assert!(stderr(&out).contains("model.gpt.bias: checkpoint true, configuration false"), "{}", stderr(&out));
    // The flat name itself, in a user's --set, is refused naming its name now.
    let out = run_expect(ptrain().args(args(4)).args(["--set", "model.bias=false", "--run-dir"]).arg(dir.path().join("flat")), 2);
    assert!(stderr(&out).contains("`model.bias`") && stderr(&out).contains("model.gpt.bias"), "{}", stderr(&out));
    // `ptrain logits --checkpoint` reads the checkpoint's own (flat) config.toml.
    run_expect(ptrain().args(["logits", "--split", "val", "--checkpoint"]).arg(&ckpt).arg("--out").arg(dir.path().join("probe.safetensors")), 0);
    // Without --config, --auto-resume reads the run's own (flat) config.toml.
    run_expect(ptrain().args(args(4)).args(extra).arg("--auto-resume").arg("--run-dir").arg(&run), 0);
    let (s, w) = (summary(&run), summary(&whole));
    assert_eq!(s["start_step"], 2);
    assert_eq!(s["final_loss"].as_f64().map(f64::to_bits), w["final_loss"].as_f64().map(f64::to_bits), "as the uninterrupted run");
}

#[test]
fn resume_errors_are_usage_errors() {
    let out = run_expect(ptrain().args(tiny_gpt(3)).args(["--resume", "/no/such/checkpoint"]), 2);
    assert!(stderr(&out).contains("/no/such/checkpoint"), "{}", stderr(&out));
    let out = run_expect(ptrain().args(tiny_gpt(3)).arg("--auto-resume"), 2);
    assert!(stderr(&out).contains("--run-dir"), "{}", stderr(&out));
}

#[test]
fn auto_resume_skips_a_corrupt_newest_checkpoint_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    run_expect(ptrain().args(args(10)).args(["--set", "plugins.checkpoint.every=5"]).arg("--run-dir").arg(dir.path()), 0);
    let newest = ckpt_dir(dir.path()).join("step-00000010/model.safetensors");
    let mut bytes = std::fs::read(&newest).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 0x55;
    std::fs::write(&newest, bytes).unwrap();
    let out = run_expect(ptrain().args(args(12)).arg("--auto-resume").arg("--run-dir").arg(dir.path()).env("PTRAIN_LOG", "warn"), 0);
    assert!(stderr(&out).contains("skipping invalid checkpoint") && stderr(&out).contains("step-00000010"), "{}", stderr(&out));
    assert_eq!(summary(dir.path())["start_step"], 5);
}

#[test]
fn a_corrupt_checkpoint_is_refused_by_resume_and_named_by_verify_and_list() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    run_expect(ptrain().args(args(10)).args(["--set", "plugins.checkpoint.every=5"]).arg("--run-dir").arg(&run), 0);
    let step10 = ckpt_dir(&run).join("step-00000010");
    let model = step10.join("model.safetensors");
    let mut bytes = std::fs::read(&model).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 0x55;
    std::fs::write(&model, bytes).unwrap();

    // --resume names it: a usage error before anything is written.
    let resumed = dir.path().join("resumed");
    let out = run_expect(ptrain().args(args(12)).arg("--resume").arg(&step10).arg("--run-dir").arg(&resumed), 2);
    assert!(stderr(&out).contains("step-00000010") && stderr(&out).contains("model.safetensors is corrupt"), "{}", stderr(&out));
    assert!(!resumed.exists(), "nothing is written for a refused resume");
    // list marks it, verify of the run skips it for the older one, verify of it fails.
    let listing = stdout(&run_expect(ptrain().args(["checkpoints", "list"]).arg(&run), 0));
    let line = listing.lines().find(|l| l.contains("step-00000010")).unwrap_or_else(|| panic!("{listing}"));
    assert!(line.contains("INVALID") && line.contains("corrupt"), "{listing}");
    assert!(listing.lines().any(|l| l.contains("step-00000005") && l.contains("valid")), "{listing}");
    let verify = run_expect(ptrain().args(["checkpoints", "verify"]).arg(&run), 0);
    assert_eq!(stdout(&verify).trim(), ckpt_dir(&run).join("step-00000005").display().to_string(), "what --auto-resume would use");
    assert!(stderr(&verify).contains("skipping invalid checkpoint") && stderr(&verify).contains("step-00000010"), "{}", stderr(&verify));
    let verify = run_expect(ptrain().args(["checkpoints", "verify"]).arg(&step10), 1);
    assert!(stderr(&verify).contains("no valid checkpoint"), "{}", stderr(&verify));
}
