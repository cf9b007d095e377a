//! What a third-party author does, from nothing: `ptrain plugins new` for both kinds into
//! a temporary directory outside the checkout, `cargo build --release` and `cargo test
//! --release` there without ptrain's scripts/env.sh (the scaffold's .cargo/config.toml is
//! all it needs), the same for the two complete examples of docs/plugins.md and for the
//! source of the checkout's example crate (examples/plugin-entropy), then one run that
//! loads the first four by name through PTRAIN_PLUGIN_PATH, the sinks writing what the
//! inline plugins emitted.
//!
//! The crates build in a plugin build cache of their own (`$PTRAIN_HOME/plugin-build`,
//! here a fresh temporary directory), seeded by `ptrain plugins new` from the checkout's
//! build: torch-sys is found Fresh (the test checks cargo says so), and the builds stay
//! out of the checkout's build directory: no rustc command of theirs names it, and no
//! file of theirs appears or changes there (other tests build workspace crates into it
//! meanwhile, so the comparison is of the files named after the four crates).

mod common;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::SystemTime,
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

/// Every file under `dir` whose name contains one of `names`, with its size and time.
fn snapshot(dir: &Path, names: &[String]) -> BTreeMap<PathBuf, (u64, SystemTime)> {
    let mut files = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
            let meta = std::fs::symlink_metadata(entry.path()).unwrap();
            if meta.is_dir() {
                todo.push(entry.path());
            }
            if names.iter().any(|n| entry.file_name().to_string_lossy().contains(n.as_str())) {
                files.insert(entry.path(), (meta.len(), meta.modified().unwrap()));
            }
        }
    }
    files
}

/// A manifest's `[dependencies]`: each name with its version requirement and features
/// (not where a path dependency lies).
fn dependencies(manifest: &Path) -> BTreeMap<String, (Option<String>, Vec<String>)> {
    let text: toml::Table = std::fs::read_to_string(manifest).unwrap().parse().unwrap();
    let deps = text["dependencies"].as_table().unwrap_or_else(|| panic!("{}: no [dependencies]", manifest.display()));
    deps.iter()
        .map(|(name, spec)| {
            let version = spec.as_str().or_else(|| spec.get("version").and_then(|v| v.as_str())).map(String::from);
            let mut features: Vec<String> = spec
                .get("features")
                .and_then(|f| f.as_array())
                .map(|f| f.iter().map(|v| v.as_str().unwrap().to_string()).collect())
                .unwrap_or_default();
            features.sort();
            (name.clone(), (version, features))
        })
        .collect()
}

/// The code block of docs/plugins.md that follows the line `marker`.
fn docs_example(marker: &str) -> String {
    let docs = std::fs::read_to_string(repo().join("docs/plugins.md")).unwrap();
    let after = docs.split_once(marker).unwrap_or_else(|| panic!("docs/plugins.md has no {marker}")).1;
    let block = after.split_once("```rust\n").unwrap().1;
    block.split_once("\n```").unwrap().0.to_string()
}

#[test]
fn both_kinds_and_the_docs_examples_build_outside_the_checkout_and_run_together() {
    let dir = tempfile::Builder::new().prefix("ptrain-plugin-scaffold-").tempdir().unwrap();
    assert!(!dir.path().starts_with(repo()), "the crates must lie outside the checkout");
    let home = dir.path().join("ptrain-home");
    // The checkout's build directory (target/release: the binary, its plugins, and the
    // compiled torch-sys the cache is seeded from), and what a build of the four crates
    // there would leave: units and libraries named after them.
    let checkout_build = build_dir();
    let target = checkout_build.parent().unwrap().display().to_string();
    let crates = ["gradwatch", "csv-sink", "zero-grads", "tsv"];
    let names: Vec<String> = crates.iter().flat_map(|c| [format!("ptrain-plugin-{c}"), format!("ptrain_plugin_{}", c.replace('-', "_"))]).collect();
    let before = snapshot(&checkout_build, &names);

    let new_plugin = |name: &str, kind: &[&str]| -> PathBuf {
        let crate_dir = dir.path().join(name);
        let out = run_expect(ptrain().env("PTRAIN_HOME", &home).args(["plugins", "new", name]).args(kind).arg("--dir").arg(&crate_dir), 0);
        let config = std::fs::read_to_string(crate_dir.join(".cargo/config.toml")).unwrap();
        assert!(config.contains(&format!("build-dir = \"{}\"", home.join("plugin-build").display())), "{config}");
        assert!(!config.contains(&format!("\"{target}")), "nothing may build in the checkout:\n{config}");
        assert!(crate_dir.join("src/lib.rs").is_file(), "{}", stdout(&out));
        crate_dir
    };
    let (inline, sink) = (new_plugin("gradwatch", &[]), new_plugin("csv-sink", &["--sink"]));
    let out = run_expect(ptrain().env("PTRAIN_HOME", &home).args(["plugins", "new", "gradwatch", "--dir"]).arg(&inline), 2);
    assert!(stderr(&out).contains("exists and is not empty"), "{}", stderr(&out));

    // Verbose: every rustc command, with its output and search directories, is in the log.
    let build_verbose = |crate_dir: &Path| -> String {
        let log = String::from_utf8_lossy(&cargo(crate_dir, &["build", "--release", "-v"]).stderr).into_owned();
        assert!(!log.contains(&format!("{target}/")), "the build used the checkout's {target}:\n{log}");
        log
    };
    let log = build_verbose(&inline);
    assert!(log.contains("Fresh torch-sys"), "libtorch's bindings were not reused from the seeded cache:\n{log}");
    assert!(!log.contains("Compiling torch-sys"), "{log}");
    build_verbose(&sink);
    for (crate_dir, tests) in [(&inline, 3), (&sink, 2)] {
        let out = cargo(crate_dir, &["test", "--release"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("test result: ok. {tests} passed")), "{text}");
    }
    // The complete examples of the docs, each in a crate of its kind.
    let (zeros, tsv) = (new_plugin("zero-grads", &[]), new_plugin("tsv", &["--sink"]));
    std::fs::write(zeros.join("src/lib.rs"), docs_example("<!-- complete inline example -->")).unwrap();
    std::fs::write(tsv.join("src/lib.rs"), docs_example("<!-- complete sink example -->")).unwrap();
    build_verbose(&zeros);
    build_verbose(&tsv);
    // The example crate of the checkout (examples/plugin-entropy, which tests/plugins.rs
    // loads from the workspace's build) builds on its own too: its dependencies are an
    // inline crate's, so its source in one is the example built outside the workspace.
    let entropy = new_plugin("entropy", &[]);
    let example = repo().join("examples/plugin-entropy");
    assert_eq!(dependencies(&example.join("Cargo.toml")), dependencies(&entropy.join("Cargo.toml")), "the example's dependencies are a scaffold's");
    std::fs::copy(example.join("src/lib.rs"), entropy.join("src/lib.rs")).unwrap();
    build_verbose(&entropy);
    assert!(entropy.join("target/release/libptrain_plugin_entropy.so").is_file());

    // All four by name, through a colon-separated PTRAIN_PLUGIN_PATH.
    let search: Vec<String> = [&inline, &sink, &zeros, &tsv].iter().map(|c| c.join("target/release").display().to_string()).collect();
    let run = dir.path().join("run");
    let tsv_out = dir.path().join("metrics.tsv");
    // The docs' sink refuses to run without its `path`, before training.
    let refused = run_expect(ptrain().env("PTRAIN_PLUGIN_PATH", search.join(":")).args(tiny_gpt(2)).args(["--plugins", "tsv"]), 2);
    assert!(stderr(&refused).contains("plugin tsv: option `path` is required"), "{}", stderr(&refused));
    run_expect(
        ptrain()
            .env("PTRAIN_PLUGIN_PATH", search.join(":"))
            .args(tiny_gpt(20))
            .args(["--plugins", "gradwatch,csv-sink,zero-grads,tsv", "--set", "plugins.gradwatch.every=5", "--set", "plugins.csv-sink.every=1"])
            .args(["--set", &format!("plugins.tsv.path={}", tsv_out.display())])
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
    // The docs' inline plugin: the fraction of zero gradient entries, every 20 steps.
    let zero: Vec<(u64, f64)> = rows.iter().filter(|r| r.1 == "zero-grads/fraction").map(|r| (r.0, r.2)).collect();
    assert!(zero.len() == 1 && zero[0].0 == 20 && (0.0..=1.0).contains(&zero[0].1), "{csv}");
    // The docs' sink: a header, then one line per batch it received.
    let tsv_text = std::fs::read_to_string(&tsv_out).unwrap();
    assert!(tsv_text.starts_with("step\ttrain/loss\n") && tsv_text.lines().count() > 2, "{tsv_text}");
    let s = summary(&run);
    assert_eq!(s["plugins"]["csv-sink"]["rows"].as_u64(), Some(rows.len() as u64), "{s}");
    assert_eq!(s["plugin_failures"], serde_json::json!([]));

    let after = snapshot(&checkout_build, &names);
    let changed: Vec<_> = before.iter().filter(|(path, meta)| after.get(*path) != Some(*meta)).map(|(p, _)| p).collect();
    let added: Vec<_> = after.keys().filter(|p| !before.contains_key(*p)).collect();
    assert!(changed.is_empty() && added.is_empty(), "the plugins' builds wrote into the checkout's build directory: {changed:?} {added:?}");
}
