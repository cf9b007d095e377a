//! What a third-party author does, from nothing: `ptrain plugins new` for both kinds into
//! a directory outside the workspace, `cargo build --release` and `cargo test --release`
//! there without ptrain's scripts/env.sh (the scaffold's .cargo/config.toml is all it
//! needs), then one run that loads both by name through PTRAIN_PLUGIN_PATH, the sink
//! writing what the inline plugin emitted.
//!
//! The builds reuse the workspace's compiled dependencies (torch-sys above all; the test
//! checks cargo reports it Fresh), so they take about a minute, not seven.

mod common;

use std::{
    hash::{Hash, Hasher},
    path::{Path, PathBuf},
    process::Command,
};

use common::*;

/// `cargo <args>` in `dir`, in the environment of an author's shell that did not
/// source scripts/env.sh, and without the variables cargo set for this test.
fn cargo(dir: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        let from_env_sh = ["LIBTORCH_USE_PYTORCH", "VIRTUAL_ENV", "LD_LIBRARY_PATH"].contains(&key.as_str()) || key.starts_with("PTRAIN_");
        let from_cargo = (key.starts_with("CARGO_") && key != "CARGO_HOME")
            || key.starts_with("__CARGO")
            || ["RUSTC", "RUSTFLAGS", "RUSTDOCFLAGS", "RUSTC_WORKSPACE_WRAPPER"].contains(&key.as_str());
        if from_env_sh || from_cargo {
            cmd.env_remove(&key);
        }
    }
    let out = cmd.args(args).current_dir(dir).output().expect("run cargo");
    assert!(out.status.success(), "cargo {args:?} in {} failed:\n{}", dir.display(), String::from_utf8_lossy(&out.stderr));
    out
}

fn new_plugin(name: &str, kind: &[&str], dir: &Path) {
    run_expect(ptrain().args(["plugins", "new", name]).args(kind).arg("--dir").arg(dir), 0);
    assert!(dir.join("Cargo.toml").is_file() && dir.join("src/lib.rs").is_file() && dir.join(".cargo/config.toml").is_file());
}

/// A fresh directory under the system's temporary one, the same for every run from this
/// checkout: the crates' artifacts in the workspace's build directory are then replaced by
/// the next run instead of piling up (a new path would be a new package each time).
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new() -> ScratchDir {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        repo().hash(&mut hasher);
        let dir = std::env::temp_dir().join(format!("ptrain-plugin-scaffold-{:016x}", hasher.finish()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        ScratchDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn both_kinds_of_scaffold_build_on_the_workspace_and_run_together() {
    let dir = ScratchDir::new();
    assert!(!dir.path().starts_with(repo()), "the crates must lie outside the workspace");
    let (inline, sink) = (dir.path().join("gradwatch"), dir.path().join("csv-sink"));
    new_plugin("gradwatch", &[], &inline);
    new_plugin("csv-sink", &["--sink"], &sink);
    let out = run_expect(ptrain().args(["plugins", "new", "gradwatch", "--dir"]).arg(&inline), 2);
    assert!(stderr(&out).contains("exists and is not empty"), "{}", stderr(&out));

    let build = cargo(&inline, &["build", "--release", "-v"]);
    let log = String::from_utf8_lossy(&build.stderr);
    assert!(log.contains("Fresh torch-sys"), "libtorch's bindings were not reused from the workspace's build:\n{log}");
    assert!(!log.contains("Compiling torch-sys"), "{log}");
    cargo(&sink, &["build", "--release"]);
    for (crate_dir, tests) in [(&inline, 2), (&sink, 1)] {
        let out = cargo(crate_dir, &["test", "--release"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("test result: ok. {tests} passed")), "{text}");
    }

    // Both by name, through a colon-separated PTRAIN_PLUGIN_PATH.
    let search = format!("{}:{}", inline.join("target/release").display(), sink.join("target/release").display());
    let run = dir.path().join("run");
    run_expect(
        ptrain()
            .env("PTRAIN_PLUGIN_PATH", &search)
            .args(tiny_gpt(20))
            .args(["--plugins", "gradwatch,csv-sink", "--set", "plugins.gradwatch.every=5", "--set", "plugins.csv-sink.every=1"])
            .arg("--run-dir")
            .arg(&run),
        0,
    );
    let csv = std::fs::read_to_string(run.join("csv-sink.csv")).unwrap();
    let rows: Vec<(u64, &str, f64)> = csv
        .lines()
        .skip(1)
        .map(|line| {
            let mut fields = line.splitn(3, ',');
            let mut next = || fields.next().unwrap_or_else(|| panic!("a row of three fields: {line}"));
            (next().parse().unwrap(), next(), next().parse().unwrap())
        })
        .collect();
    assert_eq!(csv.lines().next(), Some("step,name,value"));
    let norms: Vec<(u64, f64)> = rows.iter().filter(|r| r.1 == "gradwatch/grad_norm").map(|r| (r.0, r.2)).collect();
    assert_eq!(norms.iter().map(|n| n.0).collect::<Vec<_>>(), [5, 10, 15, 20], "{csv}");
    assert!(norms.iter().all(|n| n.1.is_finite() && n.1 > 0.0), "{norms:?}");
    let losses = rows.iter().filter(|r| r.1 == "train/loss").count();
    assert_eq!(losses, 20, "the sink got the core metrics at every step:\n{csv}");
    let s = summary(&run);
    assert_eq!(s["plugins"]["csv-sink"]["rows"].as_u64(), Some(rows.len() as u64), "{s}");
    assert_eq!(s["plugin_failures"], serde_json::json!([]));
}
