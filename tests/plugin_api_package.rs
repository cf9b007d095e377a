//! A plugin author who never clones ptrain: plugin-api packages as a crate of its own
//! (`cargo package`), and `ptrain plugins new --api-version` writes a crate depending on it
//! by version, which builds against the packaged crate unpacked outside the checkout (the
//! registry's place taken by a `[patch]`, as no registry here has it) and loads.

mod common;

use std::{path::Path, process::Command};

use common::*;

/// `cargo <args>` in `dir`, without the variables cargo set for this test.
fn cargo(dir: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if (key.starts_with("CARGO_") && key != "CARGO_HOME") || key.starts_with("__CARGO") || key == "RUSTC" || key == "RUSTFLAGS" {
            cmd.env_remove(&key);
        }
    }
    let out = cmd.args(args).current_dir(dir).output().expect("run cargo");
    assert!(out.status.success(), "cargo {args:?} in {} failed:\n{}", dir.display(), String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn a_crate_by_api_version_builds_against_the_packaged_plugin_api_and_loads() {
    let dir = tempfile::Builder::new().prefix("ptrain-api-package-").tempdir().unwrap();
    let version = ptrain_plugin_api::API_VERSION;
    // The package, as `cargo publish` would upload it, unpacked where nothing else is.
    let packages = dir.path().join("packages");
    cargo(&repo(), &["package", "-p", "ptrain-plugin-api", "--no-verify", "--allow-dirty", "--target-dir", packages.to_str().unwrap()]);
    let crate_file = packages.join(format!("package/ptrain-plugin-api-{version}.crate"));
    let unpacked = dir.path().join("registry");
    std::fs::create_dir_all(&unpacked).unwrap();
    let tar = Command::new("tar").arg("xzf").arg(&crate_file).arg("-C").arg(&unpacked).status().unwrap();
    assert!(tar.success(), "{}", crate_file.display());
    let api = unpacked.join(format!("ptrain-plugin-api-{version}"));
    assert!(api.join("Cargo.toml").is_file() && api.join("README.md").is_file(), "{}", api.display());

    // A version this ptrain does not load is refused; its own is written as a version.
    let plugin = dir.path().join("tally");
    // Cached between runs: the dependencies of a sink compile once (target/tmp).
    let home = repo().join("target/tmp/api-version-home");
    let out =
        run_expect(ptrain().env("PTRAIN_HOME", &home).args(["plugins", "new", "tally", "--sink", "--api-version", "0.4.0", "--dir"]).arg(&plugin), 2);
    assert!(stderr(&out).contains("this ptrain loads only plugins built against ptrain-plugin-api"), "{}", stderr(&out));
    run_expect(ptrain().env("PTRAIN_HOME", &home).args(["plugins", "new", "tally", "--sink", "--api-version", version, "--dir"]).arg(&plugin), 0);
    let manifest = std::fs::read_to_string(plugin.join("Cargo.toml")).unwrap();
    assert!(manifest.contains(&format!("\nptrain-plugin-api = {{ version = \"{version}\" }}\n")), "{manifest}");
    assert!(!manifest.contains(&repo().display().to_string()), "no path into the checkout:\n{manifest}");

    let patch = format!("patch.crates-io.ptrain-plugin-api.path=\"{}\"", api.display());
    cargo(&plugin, &["build", "--release", "--config", &patch]);
    let library = plugin.join("target/release/libptrain_plugin_tally.so");
    let run = dir.path().join("run");
    run_expect(ptrain().args(tiny_gpt(10)).args(["--plugins"]).arg(&library).arg("--run-dir").arg(&run), 0);
    let s = summary(&run);
    assert_eq!(s["plugins_loaded"][0]["name"], "tally", "{s}");
    assert_eq!(s["plugin_failures"].as_array().map(Vec::len), Some(0), "{s}");
}
