//! Helpers shared by the integration tests: they run the built `ptrain` binary
//! (and the venv's Python for the upstream readers) and read what it wrote.
#![allow(dead_code)]

pub mod fixture;
pub mod grpo;
pub mod hf;
pub mod py;
pub mod ranks;

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output},
    time::{Duration, Instant},
};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ptrain"))
}

/// The directory the binary and the workspace's plugins are built into.
pub fn build_dir() -> PathBuf {
    bin().parent().expect("binary has a directory").to_path_buf()
}

/// A `ptrain` command that finds only the workspace's plugins and logs quietly.
pub fn ptrain() -> Command {
    let mut cmd = Command::new(bin());
    cmd.env_remove("PTRAIN_PLUGIN_PATH").env("PTRAIN_LOG", "warn").current_dir(repo());
    cmd
}

/// The venv's Python (the upstream readers live there).
pub fn python() -> Command {
    let python = std::env::var_os("PTRAIN_PYTHON").map(PathBuf::from).unwrap_or_else(|| repo().join(".venv/bin/python"));
    assert!(python.exists(), "no Python at {}: run scripts/bootstrap.sh", python.display());
    let mut cmd = Command::new(python);
    cmd.current_dir(repo());
    cmd
}

/// Arguments for a small, fast GPT run (a few seconds on 2 CPU cores).
pub fn tiny_gpt(steps: u64) -> Vec<String> {
    [
        "run".to_string(),
        "--quiet".into(),
        "--steps".into(),
        steps.to_string(),
        "--device".into(),
        "cpu".into(),
        "--set".into(),
        "model.n_embd=32".into(),
        "--set".into(),
        "model.n_head=2".into(),
        "--set".into(),
        "model.block_size=32".into(),
        "--set".into(),
        "data.batch_size=8".into(),
        "--set".into(),
        "train.eval_batches=2".into(),
        "--set".into(),
        "run.threads=1".into(),
    ]
    .into()
}

/// Runs `cmd`, printing its output if the exit code is not `expected`.
pub fn run_expect(cmd: &mut Command, expected: i32) -> Output {
    let output = cmd.output().expect("spawn ptrain");
    let code = output.status.code().unwrap_or(-1);
    assert_eq!(
        code,
        expected,
        "exit code {code}, expected {expected}\n--- stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn summary(run_dir: &Path) -> serde_json::Value {
    let path = run_dir.join("summary.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("summary.json is JSON")
}

pub fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

/// Asserts a plugin library was built (by `cargo build --release --workspace`).
pub fn plugin_path(name: &str) -> PathBuf {
    let path = build_dir().join(format!("libptrain_plugin_{}.so", name.replace('-', "_")));
    assert!(path.exists(), "{} missing: build the workspace first (cargo build --release --workspace)", path.display());
    path
}

/// Waits for the JSON file `path` that `child` writes (through a rename) and
/// returns it; fails if `child` exits first. The bound only turns a hang into a
/// failure: nothing here depends on how fast the machine is.
pub fn wait_for_json(child: &mut Child, path: &Path) -> serde_json::Value {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", path.display()));
        }
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("the process exited ({status}) before writing {}", path.display());
        }
        assert!(start.elapsed() < Duration::from_secs(600), "no {} after 10 minutes", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The point of `test` cannot be checked on this machine (`reason`, e.g. no right
/// to mount): says so on stderr as `SKIP`, and appends it to the file
/// `$PTRAIN_TEST_SKIPS`, which scripts/test.sh counts and lists after the run.
/// Where `PTRAIN_TEST_NO_SKIPS` is set (.ci/run: root on a fresh machine, where
/// every condition can be made) it fails instead.
pub fn skip(test: &str, reason: &str) {
    assert!(std::env::var_os("PTRAIN_TEST_NO_SKIPS").is_none(), "{test} cannot check its point here: {reason} (PTRAIN_TEST_NO_SKIPS is set)");
    eprintln!("SKIP {test}: {reason}");
    if let Some(path) = std::env::var_os("PTRAIN_TEST_SKIPS") {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("PTRAIN_TEST_SKIPS is writable");
        // One short line in one write: appends from tests running at once do not interleave.
        file.write_all(format!("{test}: {reason}\n").as_bytes()).expect("PTRAIN_TEST_SKIPS is writable");
    }
}

/// Peak resident memory (`summary.json`'s `peak_memory_bytes`) of a 2-step run of an
/// 8-block model at 512 positions without and with full activation checkpointing
/// (`(none, full)`), with `more` settings on top (the model kind and its keys).
/// glibc's heap keeps freed activations below its (adaptive) mmap threshold, so the
/// peak RSS follows the heap's layout as much as the live tensors (a 45 MB swing from
/// an unrelated change was seen); a fixed 64 KiB threshold returns them, and the peak
/// is the live memory's.
pub fn checkpointing_peaks(dir: &Path, more: &[&str]) -> (f64, f64) {
    let peak = |mode: &str| {
        let run_dir = dir.join(mode);
        let mut cmd = ptrain();
        cmd.env("MALLOC_MMAP_THRESHOLD_", "65536");
        cmd.args(["run", "--quiet", "--device", "cpu", "--steps", "2", "--run-dir"]).arg(&run_dir);
        let shape = ["model.n_layer=8", "model.n_embd=64", "model.n_head=2", "model.block_size=512", "data.batch_size=16"];
        let checkpointing = format!("train.activation_checkpointing={mode}");
        let run = ["train.eval_every=0", "train.eval_batches=1", "run.threads=1", checkpointing.as_str()];
        for set in shape.iter().chain(more).chain(&run) {
            cmd.args(["--set", set]);
        }
        run_expect(&mut cmd, 0);
        summary(&run_dir)["peak_memory_bytes"].as_u64().unwrap() as f64
    };
    (peak("none"), peak("full"))
}
