//! The plugin system through the built binary: discovery, refusal of libraries that
//! are not compatible plugins, isolation of failing plugins, queue policies, and a
//! third-party plugin built from source and loaded by path.

mod common;

use std::path::PathBuf;

use common::*;
use ptrain_plugin_api::API_VERSION;

fn fixture(name: &str) -> PathBuf {
    let path = build_dir().join(format!("libptrain_fixture_{}.so", name.replace('-', "_")));
    assert!(path.exists(), "{} missing: build the workspace first", path.display());
    path
}

fn with_plugins(steps: u64, plugins: &str) -> Vec<String> {
    let mut args = tiny_gpt(steps);
    args.extend(["--plugins".to_string(), plugins.to_string()]);
    args
}

#[test]
fn a_garbage_file_is_refused_before_training_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("libptrain_plugin_garbage.so");
    std::fs::write(&garbage, b"\x7fELF but not really; plugin bytes that are not a library".repeat(20)).unwrap();
    let run = dir.path().join("run");
    let out = run_expect(ptrain().args(with_plugins(5, &garbage.display().to_string())).arg("--run-dir").arg(&run), 2);
    let err = stderr(&out);
    assert!(err.contains(&garbage.display().to_string()) && err.contains("not a loadable shared library"), "{err}");
    assert!(!run.exists(), "nothing may be written before training");
}

#[test]
fn a_foreign_shared_library_is_refused() {
    // torch's library directory, as the venv's Python finds it (whatever its version).
    let torch_lib = py::cmd().args(["-c", "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))"]).output().unwrap();
    assert!(torch_lib.status.success(), "{}", String::from_utf8_lossy(&torch_lib.stderr));
    let gomp = std::fs::read_dir(PathBuf::from(String::from_utf8_lossy(&torch_lib.stdout).trim()))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("libgomp"))
        .expect("torch ships libgomp");
    let out = run_expect(ptrain().args(with_plugins(5, &gomp.display().to_string())), 2);
    assert!(stderr(&out).contains("not a ptrain plugin"), "{}", stderr(&out));
}

/// This plugin-api's minor version (the host loads plugins of the same 0.minor).
fn api_minor() -> u64 {
    API_VERSION.split('.').nth(1).and_then(|m| m.parse().ok()).expect("plugin-api's 0.minor.patch")
}

/// The later patch the fixture announces (tests/fixtures/api-version.rs): this patch + 9.
fn later_patch() -> String {
    let patch: u64 = API_VERSION.split('.').nth(2).and_then(|p| p.parse().ok()).expect("plugin-api's 0.minor.patch");
    format!("0.{}.{}", api_minor(), patch + 9)
}

#[test]
fn a_plugin_built_against_another_plugin_api_is_refused_naming_both_versions() {
    let old = fixture("old-api");
    let out = run_expect(ptrain().args(with_plugins(5, &old.display().to_string())), 2);
    let err = stderr(&out);
    let line = err.lines().find(|l| l.contains("error:")).unwrap_or_default();
    assert!(line.contains(&old.display().to_string()), "{err}");
    let previous = format!("ptrain-plugin-api 0.{}.0", api_minor() - 1);
    assert!(line.contains(&previous) && line.contains(&format!("ptrain-plugin-api {API_VERSION}")), "{line}");
}

#[test]
fn a_plugin_built_against_a_later_patch_of_this_plugin_api_loads_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let patched = fixture("later-patch");
    run_expect(ptrain().args(with_plugins(3, &patched.display().to_string())).arg("--run-dir").arg(dir.path()), 0);
    let s = summary(dir.path());
    assert_eq!(s["plugins"]["later-patch"]["built_against"], later_patch(), "{s}");
    assert_eq!(s["plugins"]["later-patch"]["ended_at"], 3, "{s}");
}

/// The one `error:` line of a refused run.
fn error_line(out: &std::process::Output) -> String {
    let err = stderr(out);
    err.lines().find(|l| l.contains("error:")).unwrap_or_else(|| panic!("no error line in:\n{err}")).to_string()
}

#[test]
fn a_plugin_of_another_plugin_api_version_is_refused_for_the_version_even_with_identical_types() {
    let newer = fixture("newer-api");
    let out = run_expect(ptrain().args(with_plugins(5, &newer.display().to_string())), 2);
    let line = error_line(&out);
    assert!(line.contains(&newer.display().to_string()), "{line}");
    assert!(
        line.contains(&format!("built against ptrain-plugin-api 0.{}.0", api_minor() + 1))
            && line.contains(&format!("this ptrain uses ptrain-plugin-api {API_VERSION}"))
            && line.contains("the versions are incompatible"),
        "{line}"
    );
    assert!(!line.contains("layout"), "a version bump is not a layout change: {line}");
}

#[test]
fn a_plugin_of_this_version_whose_types_changed_is_refused_for_their_layout() {
    let changed = fixture("changed-layout");
    let out = run_expect(ptrain().args(with_plugins(5, &changed.display().to_string())), 2);
    let line = error_line(&out);
    assert!(line.contains(&changed.display().to_string()), "{line}");
    assert!(
        line.contains(&format!("built against ptrain-plugin-api {API_VERSION}, the version this ptrain uses"))
            && line.contains("the layout of its types differs")
            && line.contains("in `HostApi`, reached through create:"),
        "the type that changed, not the root module: {line}"
    );
    assert!(!line.contains("mismatched package"), "compared as plugin-api's own types: {line}");
    assert!(!line.contains("versions are incompatible"), "{line}");
}

#[test]
fn a_table_of_no_installed_plugin_exits_2_naming_the_closest_and_an_installed_ones_table_waits() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = run_expect(ptrain().args(with_plugins(5, "jsonl,perf")).args(["--set", "plugins.jsnol.every=5"]).arg("--run-dir").arg(&run), 2);
    let line = error_line(&out);
    assert!(
        line.contains("[plugins.jsnol] configures a plugin that is neither loaded nor installed") && line.contains("did you mean `jsonl`?"),
        "{line}"
    );
    assert!(!run.exists(), "nothing may be written before training");
    // jsonl and checkpoint are installed: their tables wait for a run that loads them.
    let run = dir.path().join("unloaded");
    run_expect(
        ptrain().args(tiny_gpt(2)).args(["--set", "plugins.jsonl.every=5", "--set", "plugins.checkpoint.every=1"]).arg("--run-dir").arg(&run),
        0,
    );
    assert!(!run.join("metrics.jsonl").exists() && !run.join("checkpoints").exists(), "plugins not loaded do not run");
}

#[test]
fn a_wrong_option_type_names_the_option_by_its_key_path() {
    let out = run_expect(ptrain().args(with_plugins(5, "jsonl")).args(["--set", "plugins.jsonl.detailed=\"oops\""]), 2);
    let line = error_line(&out);
    assert!(line.contains("invalid options: plugins.jsonl.detailed: invalid type: string \"oops\", expected a boolean"), "{line}");
}

#[test]
fn a_panicking_inline_plugin_is_disabled_with_one_line_and_training_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let faults = fixture("inline-faults").display().to_string();
    let out = run_expect(
        ptrain()
            .args(with_plugins(12, &format!("{faults},jsonl")))
            .args(["--set", "plugins.inline-faults.panic_at=5", "--set", "plugins.jsonl.every=1"])
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("inline-faults")).collect();
    assert_eq!(lines.len(), 1, "one error line naming the plugin:\n{err}");
    assert!(lines[0].contains("deliberate panic at step 5") && lines[0].contains("disabled"), "{}", lines[0]);
    let s = summary(dir.path());
    assert_eq!(s["steps"], 12);
    assert_eq!(s["plugin_failures"][0]["plugin"], "inline-faults");
    assert_eq!(s["plugin_failures"][0]["step"], 5);
    assert_eq!(s["plugin_failures"][0]["hook"], "step_end");
    // It emitted until it failed, and never after.
    let alive: Vec<u64> = read_jsonl(&dir.path().join("metrics.jsonl")).iter().filter_map(|r| r["faults/alive"].as_f64()).map(|v| v as u64).collect();
    assert_eq!(alive, vec![1, 2, 3, 4]);
}

#[test]
fn an_erroring_inline_plugin_is_disabled_too() {
    let dir = tempfile::tempdir().unwrap();
    let faults = fixture("inline-faults").display().to_string();
    let out =
        run_expect(ptrain().args(with_plugins(8, &faults)).args(["--set", "plugins.inline-faults.error_at=3"]).arg("--run-dir").arg(dir.path()), 0);
    let s = summary(dir.path());
    assert_eq!(s["plugin_failures"][0]["error"], "deliberate error at step 3");
    // The log line says where, as the summary does.
    let hook = s["plugin_failures"][0]["hook"].as_str().unwrap();
    assert!(stderr(&out).contains(&format!("plugin `inline-faults` failed in {hook} at step 3 and was disabled")), "{}", stderr(&out));
    assert_eq!(s["steps"], 8);
}

#[test]
fn a_plugin_that_detaches_itself_is_called_no_more_and_is_no_failure() {
    let dir = tempfile::tempdir().unwrap();
    let faults = fixture("inline-faults").display().to_string();
    let out = run_expect(
        ptrain()
            .args(with_plugins(12, &format!("{faults},jsonl")))
            .args(["--set", "plugins.inline-faults.detach_at=4", "--set", "plugins.jsonl.every=1"])
            .arg("--run-dir")
            .arg(dir.path())
            .env("PTRAIN_LOG", "info"),
        0,
    );
    let s = summary(dir.path());
    assert_eq!(s["steps"], 12);
    assert_eq!(s["plugin_failures"], serde_json::json!([]));
    assert_eq!(s["detached_plugins"], serde_json::json!({ "inline-faults": "asked to at step 4" }));
    assert_eq!(s["plugins"]["inline-faults"]["calls"], 4, "no call after the step it detached at");
    assert!(stderr(&out).contains("plugin `inline-faults` left the schedule before step 5"), "{}", stderr(&out));
    let alive: Vec<u64> = read_jsonl(&dir.path().join("metrics.jsonl")).iter().filter_map(|r| r["faults/alive"].as_f64()).map(|v| v as u64).collect();
    assert_eq!(alive, vec![1, 2, 3, 4]);
}

#[test]
fn a_panicking_sink_is_disabled_and_other_sinks_keep_receiving() {
    let dir = tempfile::tempdir().unwrap();
    let faults = fixture("worker-faults").display().to_string();
    let out = run_expect(
        ptrain()
            .args(with_plugins(10, &format!("{faults},jsonl")))
            .args(["--set", "plugins.worker-faults.panic_at=4", "--set", "plugins.jsonl.every=1"])
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    assert!(stderr(&out).contains("plugin `worker-faults` failed in metrics at step 4 and was disabled"), "{}", stderr(&out));
    let s = summary(dir.path());
    assert_eq!(s["plugin_failures"][0]["plugin"], "worker-faults");
    assert_eq!(s["plugin_failures"][0]["hook"], "metrics");
    assert_eq!(s["plugin_failures"][0]["step"], 4, "reported at the step whose batch failed");
    assert!(s["plugin_failures"][0]["error"].as_str().unwrap().contains("deliberate panic in a sink at step 4"));
    assert_eq!(read_jsonl(&dir.path().join("metrics.jsonl")).len(), 10, "jsonl got every step");
}

#[test]
fn a_slow_sink_with_a_full_queue_drops_the_oldest_and_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let faults = fixture("worker-faults").display().to_string();
    run_expect(
        ptrain()
            .args(with_plugins(60, &faults))
            .args(["--set", "plugins.worker-faults.queue=2"])
            // The sink holds its first batch until the training thread has written
            // step 60's tensors: steps 2-59 meet a full queue of 2, however fast.
            .args(["--set", "debug.dump_tensors_at=[60]", "--set"])
            .arg(format!("plugins.worker-faults.wait_for={:?}", dir.path().join("tensors-step60.rank0.safetensors").display().to_string()))
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    let s = summary(dir.path());
    let received = s["plugins"]["worker-faults"]["received"].as_u64().unwrap();
    let dropped = s["queue_drops"]["worker-faults"].as_u64().unwrap();
    assert!(dropped >= 60 - 4, "the first batch, two queued and at most one more arrive; the rest is dropped: {s}");
    assert_eq!(received + dropped, 60, "every batch was either delivered or counted as dropped");
    let steps: Vec<u64> = s["plugins"]["worker-faults"]["steps"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(*steps.last().unwrap(), 60, "the newest batch survives");
}

#[test]
fn a_worker_timer_ticks_on_the_worker_thread_between_events_even_while_its_queue_is_full() {
    let dir = tempfile::tempdir().unwrap();
    let faults = fixture("worker-faults").display().to_string();
    run_expect(
        ptrain()
            .args(with_plugins(20, &faults))
            // The sink holds its first batch until step 20's tensors are written, so
            // the other 19 batches and the run's end wait in the queue: it is never
            // empty while they are handled, 2 ms each, with a tick due every 1 ms.
            .args(["--set", "plugins.worker-faults.timer_ms=1", "--set", "plugins.worker-faults.sleep_ms=2"])
            .args(["--set", "debug.dump_tensors_at=[20]", "--set"])
            .arg(format!("plugins.worker-faults.wait_for={:?}", dir.path().join("tensors-step20.rank0.safetensors").display().to_string()))
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    let s = summary(dir.path());
    let faults = &s["plugins"]["worker-faults"];
    assert_eq!(faults["received"], 20, "{s}");
    // Each batch takes longer than the interval, so a tick comes between each batch and
    // the next, though the next is already waiting.
    let tick_after: Vec<u64> = faults["tick_after"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    for received in 1..20 {
        assert!(tick_after.contains(&received), "no tick between batches {received} and {}: a busy queue held the timer back: {s}", received + 1);
    }
    assert_eq!(faults["ticks_outside_run"], 0, "ticks only between on_run_start and on_run_end: {s}");
    // The worker's thread, `ptrain-plugin-worker-faults` as Linux keeps it (15 bytes).
    assert_eq!(faults["tick_threads"], serde_json::json!(["ptrain-plugin-w"]), "{s}");
    assert_eq!(faults["batch_threads"], faults["tick_threads"], "{s}");
}

#[test]
fn a_panicking_timer_disables_the_plugin_naming_the_timer_and_training_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let faults = fixture("worker-faults").display().to_string();
    let out = run_expect(
        ptrain()
            .args(with_plugins(10, &format!("{faults},jsonl")))
            .args(["--set", "plugins.worker-faults.timer_ms=1", "--set", "plugins.worker-faults.timer_panic=true"])
            .args(["--set", "plugins.worker-faults.sleep_ms=5", "--set", "plugins.jsonl.every=1"])
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    let err = stderr(&out);
    assert!(err.contains("plugin `worker-faults` failed in timer at step"), "{err}");
    let s = summary(dir.path());
    assert_eq!(s["plugin_failures"][0]["plugin"], "worker-faults");
    assert_eq!(s["plugin_failures"][0]["hook"], "timer");
    assert!(s["plugin_failures"][0]["error"].as_str().unwrap().contains("deliberate panic in a timer tick"), "{s}");
    assert_eq!(read_jsonl(&dir.path().join("metrics.jsonl")).len(), 10, "jsonl got every step");
}

#[test]
fn an_inline_plugin_asking_for_a_timer_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let inline = fixture("inline-faults").display().to_string();
    let run = dir.path().join("run");
    let out = run_expect(ptrain().args(with_plugins(5, &inline)).args(["--set", "plugins.inline-faults.timer_ms=10"]).arg("--run-dir").arg(&run), 2);
    let line = error_line(&out);
    assert!(line.contains("inline-faults") && line.contains("runs inline: only worker plugins get timer calls"), "{line}");
    assert!(!run.join("summary.json").exists(), "refused before training");
}

#[test]
fn a_blocking_queue_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let faults = fixture("worker-faults").display().to_string();
    run_expect(
        ptrain()
            .args(with_plugins(20, &faults))
            .args([
                "--set",
                "plugins.worker-faults.sleep_ms=10",
                "--set",
                "plugins.worker-faults.queue=1",
                "--set",
                "plugins.worker-faults.on_full=\"block\"",
            ])
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    let s = summary(dir.path());
    assert_eq!(s["plugins"]["worker-faults"]["received"], 20);
    assert_eq!(s["queue_drops"]["worker-faults"], 0);
}

#[test]
fn cadences_are_overridden_from_toml_and_set() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(&config, "[plugins.jsonl]\nevery = 4\nat_end = false\n").unwrap();
    let run = dir.path().join("run");
    run_expect(ptrain().args(with_plugins(13, "jsonl")).arg("--config").arg(&config).arg("--run-dir").arg(&run), 0);
    let steps: Vec<u64> = read_jsonl(&run.join("metrics.jsonl")).iter().map(|r| r["step"].as_u64().unwrap()).collect();
    // Step 13 is still there: eval at the last step reaches every sink.
    assert_eq!(steps, vec![4, 8, 12, 13]);

    let run = dir.path().join("run2");
    run_expect(
        ptrain().args(with_plugins(13, "jsonl")).arg("--config").arg(&config).args(["--set", "plugins.jsonl.every=6"]).arg("--run-dir").arg(&run),
        0,
    );
    let steps: Vec<u64> = read_jsonl(&run.join("metrics.jsonl")).iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![6, 12, 13]);
}

#[test]
fn unknown_plugin_options_exit_2_naming_them() {
    let out = run_expect(ptrain().args(with_plugins(5, "jsonl")).args(["--set", "plugins.jsonl.colour=\"red\""]), 2);
    let err = stderr(&out);
    assert!(err.contains("jsonl") && err.contains("colour"), "{err}");
    let out = run_expect(ptrain().args(with_plugins(5, "jsonl")).args(["--set", "plugins.jsonl.every=\"often\""]), 2);
    assert!(stderr(&out).contains("plugins.jsonl.every"), "{}", stderr(&out));
}

#[test]
fn names_resolve_through_ptrain_plugin_path_first() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin_path("jsonl"), dir.path().join("libptrain_plugin_journal.so")).unwrap();
    let run = dir.path().join("run");
    let out = run_expect(ptrain().env("PTRAIN_PLUGIN_PATH", dir.path()).args(with_plugins(10, "journal")).arg("--run-dir").arg(&run), 0);
    assert!(run.join("metrics.jsonl").exists(), "{}", stderr(&out));
    let path = summary(&run)["plugins_loaded"][0]["path"].as_str().unwrap().to_string();
    assert!(path.starts_with(&dir.path().canonicalize().unwrap().display().to_string()), "{path}");

    let listed = run_expect(ptrain().env("PTRAIN_PLUGIN_PATH", dir.path()).args(["plugins", "list"]), 0);
    assert!(stdout(&listed).contains("libptrain_plugin_journal.so"), "{}", stdout(&listed));
}

#[test]
fn plugins_list_and_info_describe_hooks_and_cadences() {
    let out = run_expect(ptrain().args(["plugins", "list"]), 0);
    let text = stdout(&out);
    for name in ["jsonl", "csv", "tensorboard", "wandb", "mlflow", "flops", "dataset-metrics", "perf", "checkpoint", "health", "early-stop", "trace"]
    {
        assert!(text.lines().any(|l| l.starts_with(&format!("{name} "))), "{name} missing from:\n{text}");
    }
    let out = run_expect(ptrain().args(["plugins", "info", "jsonl"]), 0);
    let text = stdout(&out);
    assert!(text.contains(&format!("jsonl {}", env!("CARGO_PKG_VERSION"))), "{text}");
    assert!(text.contains("hook metrics") && text.contains("every 10 steps, at end"), "{text}");
    assert!(!text.contains("run_start") && !text.contains("run_end"), "no plugin attaches to run start or end any more:\n{text}");
    let out = run_expect(ptrain().args(["plugins", "info", &fixture("lifecycle-worker").display().to_string()]), 0);
    let start = stdout(&out).lines().find(|l| l.contains("hook run_start")).map(str::to_string).unwrap_or_default();
    assert!(start.ends_with("ignored (run start and end reach every plugin)"), "{}", stdout(&out));
    assert!(text.contains("libptrain_plugin_jsonl.so"), "{text}");
    let out = run_expect(ptrain().args(["plugins", "info", "nosuch"]), 2);
    assert!(stderr(&out).contains("unknown plugin"), "{}", stderr(&out));
}

/// A third-party author's path: the example crate, built, loaded by path. Its library
/// is the workspace build's (scripts/test.sh builds examples/plugin-entropy with every
/// member); that its source also builds on its own, outside the workspace (whose other
/// members unify more features into its dependencies), tests/plugin_scaffold.rs checks,
/// in the plugin build cache its other out-of-checkout crates share. (A `cargo build -p`
/// of it here compiled a second set of its dependencies, minutes, and relinked the
/// workspace's library under the other tests.)
#[test]
fn the_example_plugin_builds_and_loads_by_path() {
    let library = plugin_path("entropy");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("libmy_entropy.so");
    std::fs::copy(&library, &copy).unwrap();
    run_expect(
        ptrain()
            .args(with_plugins(30, &format!("{},jsonl", copy.display())))
            .args(["--set", "plugins.entropy.every=10", "--set", "plugins.jsonl.every=1"])
            .arg("--run-dir")
            .arg(dir.path()),
        0,
    );
    let rows = read_jsonl(&dir.path().join("metrics.jsonl"));
    let measured: Vec<u64> = rows.iter().filter(|r| r["entropy/mean"].is_number()).map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(measured, vec![1, 10, 20, 30], "first step, then every 10 as overridden");
    let first = rows[0]["entropy/mean"].as_f64().unwrap();
    assert!(first > 0.0 && first <= (256f64).ln() + 1e-6, "entropy of a 256-way prediction: {first}");
}

#[test]
fn the_same_plugin_loaded_twice_is_refused_by_name_or_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = plugin_path("jsonl").display().to_string();
    for plugins in ["jsonl,jsonl".to_string(), format!("jsonl,{jsonl}")] {
        let run = dir.path().join("run");
        let out = run_expect(ptrain().args(with_plugins(2, &plugins)).arg("--run-dir").arg(&run), 2);
        assert!(stderr(&out).contains("plugin jsonl: requested twice"), "{plugins}: {}", stderr(&out));
        assert!(!run.exists(), "{plugins}: nothing may be written before training");
    }
}

#[test]
fn a_plugin_is_told_the_absolute_run_dir_and_the_hosts_values() {
    let dir = tempfile::tempdir().unwrap();
    let faults = fixture("inline-faults").display().to_string();
    // A relative --run-dir, from the temporary directory.
    let out = ptrain()
        .args(with_plugins(2, &faults))
        .args(["--set", "dist.timeout_s=77", "--run-dir", "relative/run"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let run = dir.path().join("relative/run");
    let told = &summary(&run)["plugins"]["inline-faults"]["run"];
    assert_eq!(told["run_dir"], run.display().to_string(), "absolute: {told}");
    assert_eq!(told["collective_timeout_s"], 77.0, "dist.timeout_s: {told}");
}
