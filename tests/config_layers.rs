//! Several `--config` files, layered in order over the embedded default, through the
//! built binary: a later file's keys win, tables merge key by key, and an error names
//! the file it is in.

mod common;

use std::path::{Path, PathBuf};

use common::*;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Two files: `a.toml` sets a run name, a learning rate and jsonl's cadence; `b.toml`
/// overrides the learning rate and jsonl's table.
fn two_files(dir: &Path) -> (PathBuf, PathBuf) {
    let a = write(dir, "a.toml", "[run]\nname = \"from-a\"\n[optim]\nlr = 0.01\n[plugins.jsonl]\nevery = 2\n");
    let b = write(dir, "b.toml", "[optim]\nlr = 0.02\n[plugins.jsonl]\nevery = 3\nat_end = false\n");
    (a, b)
}

#[test]
fn the_second_files_keys_win_and_its_plugin_table_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_files(dir.path());
    let run = dir.path().join("run");
    run_expect(ptrain().args(tiny_gpt(7)).args(["--plugins", "jsonl", "--config"]).arg(&a).arg("--config").arg(&b).arg("--run-dir").arg(&run), 0);
    let steps: Vec<u64> = read_jsonl(&run.join("metrics.jsonl")).iter().map(|r| r["step"].as_u64().unwrap()).collect();
    // b's every = 3 (not a's 2); step 7 is there because the last step evaluates.
    assert_eq!(steps, [3, 6, 7]);
    let resolved: toml::Table = std::fs::read_to_string(run.join("config.toml")).unwrap().parse().unwrap();
    assert_eq!(resolved["optim"]["lr"].as_float(), Some(0.02), "b's value wins");
    assert_eq!(resolved["run"]["name"].as_str(), Some("from-a"), "a key only a sets stays");
    assert_eq!(resolved["plugins"]["jsonl"]["every"].as_integer(), Some(3));
}

#[test]
fn ptrain_config_layers_the_same_files_in_the_order_given() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_files(dir.path());
    let resolved = |first: &Path, second: &Path| -> toml::Table {
        let out = run_expect(ptrain().arg("config").arg("--config").arg(first).arg("-c").arg(second), 0);
        stdout(&out).parse().unwrap()
    };
    let ab = resolved(&a, &b);
    assert_eq!((ab["optim"]["lr"].as_float(), ab["run"]["name"].as_str()), (Some(0.02), Some("from-a")));
    assert_eq!(ab["plugins"]["jsonl"]["at_end"].as_bool(), Some(false));
    let ba = resolved(&b, &a);
    assert_eq!(ba["optim"]["lr"].as_float(), Some(0.01), "reversed, a's value wins");
    assert_eq!(ba["plugins"]["jsonl"]["every"].as_integer(), Some(2));
    assert_eq!(ba["plugins"]["jsonl"]["at_end"].as_bool(), Some(false), "tables merge key by key");
}

#[test]
fn an_error_in_the_second_file_names_that_file() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = two_files(dir.path());
    let bad = write(dir.path(), "bad.toml", "[optim]\nlrr = 0.1\n");
    let out = run_expect(ptrain().args(tiny_gpt(3)).arg("--config").arg(&a).arg("--config").arg(&bad), 2);
    let err = stderr(&out);
    assert!(err.contains(&format!("unknown configuration key `optim.lrr` in {}", bad.display())), "{err}");
    let missing = dir.path().join("missing.toml");
    let out = run_expect(ptrain().arg("config").arg("--config").arg(&a).arg("--config").arg(&missing), 2);
    assert!(stderr(&out).contains(&format!("config file not found: {}", missing.display())), "{}", stderr(&out));
}

#[test]
fn run_help_tells_which_plugin_request_exits_0_and_which_1() {
    let help = stdout(&run_expect(ptrain().args(["run", "--help"]), 0));
    // Each code's text, up to the next code.
    let code = |c: &str| -> String {
        let from = help.lines().skip_while(|l| !l.trim_start().starts_with(c));
        from.take_while(|l| !l.trim_start().starts_with(char::is_numeric) || l.trim_start().starts_with(c)).collect::<Vec<_>>().join(" ")
    };
    assert!(code("0 ").contains("request_stop") && !code("0 ").contains("request_failure_stop"), "{help}");
    assert!(code("1 ").contains("request_failure_stop"), "{help}");
    assert!(help.contains("Repeat to layer several"), "{help}");
}

#[test]
fn scripts_env_sh_puts_this_checkouts_ptrain_on_path() {
    let out = std::process::Command::new("bash")
        .args(["-c", ". scripts/env.sh && command -v ptrain"])
        .current_dir(repo())
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(PathBuf::from(stdout(&out).trim()), repo().join("target/release/ptrain"));
}
