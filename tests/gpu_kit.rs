//! The validation kit end to end on the CPU, so it cannot rot before a GPU runs
//! it: scripts/bundle.sh packs the built binaries into a folder the device tool
//! can carry (under 64 MiB), and the bundle's gpu/validate.sh --device cpu runs
//! every step against the venv's torch and prints its table.

mod common;

use std::process::Command;

use common::{build_dir, py, repo};

const MIB: u64 = 1 << 20;

fn folder_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| if e.file_type().unwrap().is_dir() { folder_bytes(&e.path()) } else { e.metadata().unwrap().len() })
        .sum()
}

fn modified(path: &std::path::Path) -> std::time::SystemTime {
    std::fs::metadata(path).unwrap().modified().unwrap()
}

/// The build mode, as a user runs it on a fresh checkout, against the tests' own
/// build: it must build (its cargo command once handed cargo `-p ptrain-plugin-x`
/// as one word) and, being scripts/test.sh's build, compile and relink nothing.
#[test]
fn the_bundle_builds_what_the_tests_built_and_compiles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    let binary = build_dir().join("ptrain");
    let before = modified(&binary);
    let mut bundle_sh = Command::new(repo().join("scripts/bundle.sh"));
    // A user's shell: none of the variables cargo and nextest set for a test (ring's
    // build script tracks OUT_DIR and CARGO_MANIFEST_DIR: it would run again and
    // everything above it would rebuild), and the library path as it was.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let set_for_tests = ["CARGO", "NEXTEST", "__CARGO", "OUT_DIR", "PTRAIN_BUILD_", "RUST_RECURSION_COUNT"].iter().any(|p| key.starts_with(p));
        if set_for_tests && key != "CARGO_HOME" {
            bundle_sh.env_remove(&*key);
        }
    }
    if let Some(path) = std::env::var_os("NEXTEST_LD_LIBRARY_PATH") {
        bundle_sh.env("LD_LIBRARY_PATH", path);
    }
    let packed = bundle_sh.arg(&bundle).env("CARGO_TARGET_DIR", build_dir().parent().unwrap()).env_remove("PTRAIN_RELEASE_DIR").output().unwrap();
    let text = String::from_utf8_lossy(&packed.stdout).to_string() + &String::from_utf8_lossy(&packed.stderr);
    assert!(packed.status.success(), "bundle.sh (build mode) failed:\n{text}");
    assert!(!text.contains("Compiling"), "the bundle's build compiled something the tests' build had built:\n{text}");
    assert_eq!(modified(&binary), before, "the bundle's build relinked the tests' binary:\n{text}");
    assert!(bundle.join("bin/ptrain").exists() && bundle.join("bin/libptrain_plugin_checkpoint.so").exists(), "{text}");
}

#[test]
fn the_bundle_is_small_and_its_validation_passes_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    let packed =
        Command::new(repo().join("scripts/bundle.sh")).arg("--no-build").arg(&bundle).env("PTRAIN_RELEASE_DIR", build_dir()).output().unwrap();
    let text = String::from_utf8_lossy(&packed.stdout).to_string() + &String::from_utf8_lossy(&packed.stderr);
    assert!(packed.status.success(), "bundle.sh failed (build the workspace with --all-targets first):\n{text}");
    let bytes = folder_bytes(&bundle);
    assert!(bytes < 64 * MIB, "the bundle is {:.1} MiB, over the device tool's 64 MiB", bytes as f64 / MIB as f64);
    for file in ["bin/ptrain", "bin/collectives", "bin/bare-tch", "bin/libptrain_plugin_flops.so", "gpu/validate.sh", "configs/tiny-gpt.toml"] {
        assert!(bundle.join(file).exists(), "{file} is missing from the bundle");
    }

    // The venv's Python behind the tests' fork server (tests/common/py.rs): the kit's
    // helpers (transformers, torchrun, its JSON readers) skip importing torch each time.
    let python = py::wrapper(dir.path());
    let out = dir.path().join("out");
    let validated = Command::new(bundle.join("gpu/validate.sh"))
        .args(["--device", "cpu", "--python"])
        .arg(&python)
        .arg("--out")
        .arg(&out)
        // The kit sets LD_LIBRARY_PATH from --python itself.
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("PTRAIN_PLUGIN_PATH")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&validated.stdout).to_string() + &String::from_utf8_lossy(&validated.stderr);
    assert!(validated.status.success(), "validate.sh --device cpu failed:\n{log}");
    let table = std::fs::read_to_string(out.join("summary.txt")).unwrap();
    assert!(log.contains(&table), "the table is printed at the end:\n{log}");
    let rows: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let rows = rows["rows"].as_array().unwrap();
    let steps: Vec<&str> = rows.iter().map(|r| r["step"].as_str().unwrap()).collect();
    for step in [
        "gloo, one rank",
        "fp32 20 steps",
        "bf16 40 steps",
        "checkpoint + resume",
        "torchrun, 1 rank",
        "torchrun, 2 ranks, gradients",
        "torchrun, 2 ranks, parameters",
        "every plugin, defaults",
        "flops: MFU",
        "qwen2 logits vs HF (cpu)",
        "qwen2 fp32 loss vs HF",
        "qwen2 bf16 loss vs HF",
        "chat rows, packed",
        "activation checkpointing",
        "checkpointing, dropout",
        "lora",
        "chunked loss",
        "dpo, lora, packed",
    ] {
        assert!(steps.contains(&step), "no `{step}` row in {steps:?}");
    }
    assert!(rows.iter().all(|r| r["result"] == "ok"), "{table}");
    // What comes back from a device: three files.
    let mut files: Vec<String> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    assert_eq!(files, ["summary.json", "summary.txt", "validate.tar.gz"]);
}

/// gpu/lent.sh is what a lent device runs in its one call: checked here at toy sizes on
/// the CPU (`--smoke`), so a lent device is never spent on a broken script.
#[test]
fn the_lent_device_script_runs_its_steps_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    let packed =
        Command::new(repo().join("scripts/bundle.sh")).arg("--no-build").arg(&bundle).env("PTRAIN_RELEASE_DIR", build_dir()).output().unwrap();
    assert!(packed.status.success(), "bundle.sh failed:\n{}", String::from_utf8_lossy(&packed.stderr));
    let python = py::wrapper(dir.path());
    let out = dir.path().join("out");
    let ran = Command::new("bash")
        .arg(bundle.join("gpu/lent.sh"))
        .arg("--smoke")
        .arg(&out)
        .arg("300")
        .env("PTRAIN_PYTHON", &python)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("PTRAIN_PLUGIN_PATH")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&ran.stdout).to_string() + &String::from_utf8_lossy(&ran.stderr);
    assert!(ran.status.success(), "lent.sh --smoke failed:\n{log}");
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap();
    for line in [
        "ptrain chunked: ",
        "ptrain whole: ",
        "ptrain plugins: ",
        "transformers loop: {\"tokens_per_s\"",
        "trl sft plain: {\"tokens_per_s\"",
        "gpt-small fast: wall",
        "gpt-small checkpoint: wall",
    ] {
        assert!(summary.contains(line), "no `{line}` in the summary:\n{summary}");
    }
    assert!(!summary.contains("no summary"), "a ptrain run failed:\n{summary}");
    // Each step that ran says how it exited (validate, sdpa and bench do not run on the CPU).
    for ran in ["check exited 0", "qwen05b's transformers loop exited 0", "trl plain exited 0"] {
        assert!(summary.contains(ran), "no `{ran}` in the summary:\n{summary}");
    }
    assert!(!summary.contains("validate exited") && !summary.contains("bench exited"), "{summary}");
    assert!(out.join("lent.tar.gz").is_file());
}
