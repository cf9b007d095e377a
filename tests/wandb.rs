//! The `wandb` plugin through the built binary, checked by the real `wandb sync`
//! (wandb 0.31 from the venv) uploading to a stand-in backend on 127.0.0.1
//! (tests/support/wandb_server.py). `wandb sync` exits 0 even on a corrupt file, so
//! every test checks what the backend received.

mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::*;
use serde_json::{json, Value};

const KEY: &str = "0123456789abcdef0123456789abcdef01234567";

/// The stand-in backend: a Python child process, killed when dropped.
struct Backend {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Backend {
    fn start(mode: &str) -> Backend {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("requests.jsonl");
        let mut child = python()
            .arg(repo().join("tests/support/wandb_server.py"))
            .arg(&log)
            .arg(mode)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the stand-in backend");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("the backend prints its port");
        let port = line.trim().parse().unwrap_or_else(|_| panic!("not a port: {line:?}"));
        Backend { child, port, log, _dir: dir }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn requests(&self) -> Vec<Value> {
        read_jsonl(&self.log)
    }

    /// What a W&B backend would have stored, rebuilt from the requests.
    fn received(&self) -> Received {
        let requests = self.requests();
        let mut r = Received { requests: requests.clone(), ..Received::default() };
        for req in requests.iter().filter(|r| r["status"] == 200) {
            let body = &req["body"];
            if req["path"] == "/graphql" && body["query"].as_str().is_some_and(|q| q.contains("upsertBucket")) {
                r.upserts.push(body["variables"].clone());
            }
            if !req["path"].as_str().unwrap().ends_with("/file_stream") {
                continue;
            }
            r.stream_paths.insert(req["path"].as_str().unwrap().to_string());
            if let Some(history) = body["files"].get("wandb-history.jsonl") {
                let offset = history["offset"].as_u64().unwrap() as usize;
                assert!(offset <= r.history.len(), "a gap in the history: offset {offset} after {} lines", r.history.len());
                r.history.truncate(offset);
                r.history.extend(history["content"].as_array().unwrap().iter().map(|l| serde_json::from_str::<Value>(l.as_str().unwrap()).unwrap()));
            }
            if let Some(summary) = body["files"].get("wandb-summary.json") {
                r.summary = serde_json::from_str(summary["content"].as_array().unwrap().last().unwrap().as_str().unwrap()).unwrap();
            }
            if body["complete"] == true {
                r.exit_code = body["exitcode"].as_i64();
            }
        }
        r
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Default)]
struct Received {
    requests: Vec<Value>,
    upserts: Vec<Value>,
    stream_paths: BTreeSet<String>,
    history: Vec<Value>,
    summary: Value,
    exit_code: Option<i64>,
}

impl Received {
    fn steps(&self) -> Vec<u64> {
        self.history.iter().map(|row| row["_step"].as_u64().expect("every row has _step")).collect()
    }

    /// The config of the first UpsertBucket, unwrapped from W&B's `{"value": v}`.
    fn config(&self) -> Value {
        let config: Value = serde_json::from_str(self.upserts[0]["config"].as_str().expect("a config")).unwrap();
        config.as_object().unwrap().iter().filter(|(k, _)| !k.starts_with('_')).map(|(k, v)| (k.clone(), v["value"].clone())).collect()
    }

    /// The files PUT to the upload URLs that were taken: path -> JSON.
    fn uploads(&self) -> BTreeMap<String, Value> {
        let puts = self.requests.iter().filter(|r| r["method"] == "PUT" && r["status"] == 200);
        puts.filter_map(|r| Some((r["path"].as_str()?.strip_prefix("/upload/")?.to_string(), r["body"].clone()))).collect()
    }

    /// The files named by `CreateRunFiles` and by the `uploaded` lists of `file_stream`.
    fn files_named(&self) -> (BTreeSet<String>, BTreeSet<String>) {
        let names = |v: &Value| v.as_array().into_iter().flatten().map(|n| n.as_str().unwrap().to_string()).collect::<Vec<_>>();
        let (mut created, mut uploaded) = (BTreeSet::new(), BTreeSet::new());
        for req in self.requests.iter().filter(|r| r["status"] == 200) {
            let body = &req["body"];
            if body["query"].as_str().is_some_and(|q| q.contains("createRunFiles")) {
                created.extend(names(&body["variables"]["files"]));
            }
            if req["path"].as_str().unwrap().ends_with("/file_stream") {
                uploaded.extend(names(&body["uploaded"]));
            }
        }
        (created, uploaded)
    }

    /// The `completions` value of each history row.
    fn tables(&self) -> Vec<Value> {
        self.history.iter().map(|row| row["completions"].clone()).collect()
    }

    fn assert_authenticated(&self) {
        assert!(!self.requests.is_empty());
        for req in self.requests.iter().filter(|r| r["path"] == "/graphql" || r["path"].as_str().unwrap().starts_with("/files/")) {
            assert_eq!(req["auth"], format!("api:{KEY}"), "{}", req["path"]);
        }
    }
}

/// Removes whatever W&B and proxy settings the caller's environment has.
fn hermetic(cmd: &mut Command) -> &mut Command {
    for (key, _) in std::env::vars() {
        let upper = key.to_uppercase();
        if key.starts_with("WANDB_") || upper == "HTTP_PROXY" || upper == "HTTPS_PROXY" || upper == "ALL_PROXY" {
            cmd.env_remove(key);
        }
    }
    cmd
}

fn ptrain_run(steps: u64, run_dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = ptrain();
    hermetic(&mut cmd).args(tiny_gpt(steps)).arg("--run-dir").arg(run_dir).args(extra);
    cmd
}

/// Runs the real `wandb sync` of `dirs` against `backend`.
fn sync(dirs: &[&Path], backend: &Backend, extra: &[&str]) {
    let home = tempfile::tempdir().unwrap();
    let mut cmd = python();
    hermetic(&mut cmd)
        .args(["-m", "wandb", "sync"])
        .args(extra)
        .args(dirs)
        .env("WANDB_BASE_URL", backend.url())
        .env("WANDB_API_KEY", KEY)
        .env("WANDB_CONFIG_DIR", home.path().join("config"))
        .env("WANDB_CACHE_DIR", home.path().join("cache"))
        .env("WANDB_DATA_DIR", home.path().join("data"))
        .env("HOME", home.path())
        // The CLI writes its debug logs under ./wandb: keep them out of the repository.
        .current_dir(home.path());
    let out = cmd.output().expect("run wandb sync");
    assert!(out.status.success(), "wandb sync failed to run:\n{}", String::from_utf8_lossy(&out.stderr));
}

/// The single run directory the plugin made under `<root>/wandb` with `prefix`.
fn run_dir_under(root: &Path, prefix: &str) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(root.join("wandb"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(&format!("{prefix}-")))
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs[0].clone()
}

/// The resolved config as JSON, read by Python's own TOML parser.
fn config_json(run_dir: &Path) -> Value {
    let out = python()
        .args(["-c", "import json, sys, tomllib; print(json.dumps(tomllib.load(open(sys.argv[1], 'rb'))))"])
        .arg(run_dir.join("config.toml"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// JSON equality with numbers compared as numbers (a server may write 25.0 as 25).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => close(x.as_f64().unwrap(), y.as_f64().unwrap()),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
        (Value::Object(x), Value::Object(y)) => x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w))),
        _ => a == b,
    }
}

/// Equal up to float formatting and parsing (shortest forms differ between Go and Rust).
fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

fn evals(run_dir: &Path) -> Vec<u64> {
    summary(run_dir)["evals"].as_array().unwrap().iter().map(|e| e["step"].as_u64().unwrap()).collect()
}

#[test]
fn an_offline_run_syncs_every_row_with_its_config_summary_and_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let steps = 120;
    // Every step for wandb (so the file spans several 32 KiB blocks), detailed
    // metrics every 4; jsonl on the detailed cadence is the reference.
    let out = run_expect(
        ptrain_run(
            steps,
            dir.path(),
            &[
                "--plugins",
                "wandb,jsonl",
                "--set",
                "plugins.wandb.every=1",
                "--set",
                "plugins.wandb.detailed.every=4",
                "--set",
                "plugins.wandb.project=\"ptrain-tests\"",
                "--set",
                "plugins.wandb.tags=[\"tiny\", \"cpu\"]",
                "--set",
                "plugins.jsonl.every=4",
                "--set",
                "train.eval_every=50",
            ],
        )
        .env("WANDB_NAME", "tiny run"),
        0,
    );
    let run = run_dir_under(dir.path(), "offline-run");
    let id = summary(dir.path())["plugins"]["wandb"]["run_id"].as_str().unwrap().to_string();
    let name = run.file_name().unwrap().to_str().unwrap();
    let stamp = name.strip_prefix("offline-run-").and_then(|n| n.strip_suffix(&format!("-{id}"))).expect("offline-run-<stamp>-<id>");
    assert!(stamp.len() == 15 && stamp.as_bytes()[8] == b'_' && stamp.replace('_', "").chars().all(|c| c.is_ascii_digit()), "{stamp}");
    for sub in ["files", "logs", "tmp"] {
        assert!(run.join(sub).is_dir(), "{sub}/");
    }
    let size = std::fs::metadata(run.join(format!("run-{id}.wandb"))).unwrap().len();
    assert!(size > 32 * 1024, "{size} bytes: the records should cross a 32 KiB block boundary");
    assert!(stderr(&out).contains(&format!("wandb sync {}", run.display())), "{}", stderr(&out));

    let backend = Backend::start("ok");
    sync(&[&run], &backend, &[]);
    let got = backend.received();
    got.assert_authenticated();

    let upsert = &got.upserts[0];
    assert_eq!(
        (upsert["name"].as_str(), upsert["project"].as_str(), upsert["displayName"].as_str()),
        (Some(id.as_str()), Some("ptrain-tests"), Some("tiny run"))
    );
    assert_eq!(upsert["tags"], json!(["tiny", "cpu"]));
    assert!(same(&got.config(), &config_json(dir.path())), "config:\n{}\nvs\n{}", got.config(), config_json(dir.path()));

    // Every row, in order, with _step, _timestamp and _runtime.
    assert_eq!(got.steps(), (1..=steps).collect::<Vec<_>>());
    let runtimes: Vec<f64> = got.history.iter().map(|r| r["_runtime"].as_f64().unwrap()).collect();
    assert!(runtimes.windows(2).all(|w| w[0] <= w[1]) && runtimes[0] >= 0.0, "{runtimes:?}");
    assert!(got.history.iter().all(|r| r["_timestamp"].as_f64().unwrap() > 1.6e9));

    // Where jsonl was due, the row holds the same metrics; elsewhere only basic ones.
    let reference = read_jsonl(&dir.path().join("metrics.jsonl"));
    let detailed_steps: BTreeSet<u64> = reference.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    for want in &reference {
        let row = &got.history[want["step"].as_u64().unwrap() as usize - 1];
        for (key, value) in want.as_object().unwrap().iter().filter(|(k, _)| *k != "step") {
            assert!(row.get(key).is_some_and(|v| same(v, value)), "step {}: {key} = {value} vs {:?}", want["step"], row.get(key));
        }
    }
    for row in got.history.iter().filter(|r| !detailed_steps.contains(&r["_step"].as_u64().unwrap())) {
        assert!(row.get("train/loss").is_some() && row.get("train/lr").is_some(), "{row}");
        assert!(row.as_object().unwrap().keys().all(|k| !(k.starts_with("time/") || k.starts_with("memory/") || k == "train/grad_norm")), "{row}");
    }
    let eval_rows: Vec<u64> = got.history.iter().filter(|r| r.get("eval/loss").is_some()).map(|r| r["_step"].as_u64().unwrap()).collect();
    assert_eq!(eval_rows, evals(dir.path()));

    // The summary holds the latest values; the exit record made it complete.
    let s = summary(dir.path());
    assert_eq!(got.summary["_step"], steps);
    assert!(close(got.summary["train/loss"].as_f64().unwrap(), s["final_loss"].as_f64().unwrap()));
    assert!(close(got.summary["eval/loss"].as_f64().unwrap(), s["final_eval_loss"].as_f64().unwrap()));
    assert!(got.summary["_wandb"]["runtime"].is_u64());
    assert_eq!(got.exit_code, Some(0));
}

#[test]
fn online_mode_streams_the_run_and_keeps_a_local_copy_that_syncs_the_same() {
    let backend = Backend::start("ok");
    let dir = tempfile::tempdir().unwrap();
    let steps = 30;
    let out = run_expect(
        ptrain_run(steps, dir.path(), &["--plugins", "wandb", "--set", "plugins.wandb.every=3"])
            .env("WANDB_MODE", "online")
            .env("WANDB_API_KEY", KEY)
            .env("WANDB_BASE_URL", backend.url())
            .env("WANDB_ENTITY", "team")
            .env("WANDB_PROJECT", "online-tests"),
        0,
    );
    let fragment = &summary(dir.path())["plugins"]["wandb"];
    let id = fragment["run_id"].as_str().unwrap();
    assert_eq!(fragment["upload"]["complete"], true, "{fragment}");
    assert!(stderr(&out).contains(&format!("/team/online-tests/runs/{id}")), "{}", stderr(&out));

    let online = backend.received();
    online.assert_authenticated();
    assert_eq!((online.upserts[0]["name"].as_str(), online.upserts[0]["entity"].as_str()), (Some(id), Some("team")));
    assert!(same(&online.config(), &config_json(dir.path())));
    assert_eq!(online.stream_paths, BTreeSet::from([format!("/files/team/online-tests/{id}/file_stream")]));
    let expected: Vec<u64> = (1..=steps).filter(|s| s.is_multiple_of(3) || *s == steps || evals(dir.path()).contains(s)).collect();
    assert_eq!(online.steps(), expected);
    assert_eq!(online.summary["_step"], steps);
    assert_eq!(online.exit_code, Some(0));

    // The local copy of an online run syncs to the same rows.
    let copy = Backend::start("ok");
    sync(&[&run_dir_under(dir.path(), "run")], &copy, &["--include-online"]);
    let synced = copy.received();
    assert_eq!(synced.history.len(), online.history.len());
    for (a, b) in synced.history.iter().zip(&online.history) {
        assert!(same(a, b), "{a}\nvs\n{b}");
    }
    assert_eq!(synced.exit_code, Some(0));
}

#[test]
fn online_mode_retries_failed_requests_without_losing_or_repeating_rows() {
    let flaky = Backend::start("flaky");
    let dir = tempfile::tempdir().unwrap();
    run_expect(
        ptrain_run(20, dir.path(), &["--plugins", "wandb", "--set", "plugins.wandb.every=2"])
            .env("WANDB_MODE", "online")
            .env("WANDB_API_KEY", KEY)
            .env("WANDB_BASE_URL", flaky.url()),
        0,
    );
    let got = flaky.received();
    let refused: BTreeSet<&str> =
        got.requests.iter().filter(|r| r["status"] == 503).map(|r| if r["path"] == "/graphql" { "graphql" } else { "file_stream" }).collect();
    assert_eq!(refused, BTreeSet::from(["graphql", "file_stream"]), "both kinds of request were refused at least once");
    assert_eq!(got.upserts.len(), 1);
    assert_eq!(got.steps(), (2..=20).step_by(2).collect::<Vec<_>>());
    assert_eq!(got.exit_code, Some(0));
    assert_eq!(summary(dir.path())["plugins"]["wandb"]["upload"]["complete"], true);
}

#[test]
fn a_dead_network_neither_stops_the_run_nor_loses_the_local_copy() {
    let dead = Backend::start("hang");
    let dir = tempfile::tempdir().unwrap();
    let out = run_expect(
        ptrain_run(20, dir.path(), &["--plugins", "wandb", "--set", "plugins.wandb.upload_timeout_secs=1"])
            .env("WANDB_MODE", "online")
            .env("WANDB_API_KEY", KEY)
            .env("WANDB_BASE_URL", dead.url()),
        0,
    );
    let s = summary(dir.path());
    assert_eq!((s["status"].as_str(), s["steps"].as_u64()), (Some("completed"), Some(20)));
    assert_eq!(s["plugin_failures"], json!([]));
    assert_eq!(s["plugins"]["wandb"]["upload"]["complete"], false);
    assert!(!dead.requests().is_empty(), "the upload was attempted");
    let local = run_dir_under(dir.path(), "run");
    let err = stderr(&out);
    assert!(err.contains("upload incomplete") && err.contains(&format!("wandb sync --include-online {}", local.display())), "{err}");

    let good = Backend::start("ok");
    sync(&[&local], &good, &["--include-online"]);
    let got = good.received();
    assert_eq!(got.steps(), vec![10, 20]);
    assert_eq!(got.exit_code, Some(0));
}

#[test]
fn an_interrupted_run_still_ends_with_an_exit_record_that_sync_uploads() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    let mut child = ptrain_run(1_000_000, dir.path(), &["--plugins", "wandb,jsonl", "--set", "plugins.jsonl.every=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ptrain");
    // Wait for progress the run itself reports: 25 steps in its metrics file.
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::read_to_string(&metrics).map(|t| t.lines().count()).unwrap_or(0) < 25 {
        assert!(child.try_wait().unwrap().is_none(), "ptrain exited before the interrupt");
        assert!(Instant::now() < deadline, "no progress in 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", String::from_utf8_lossy(&out.stderr));
    let s = summary(dir.path());
    assert_eq!(s["status"], "interrupted");
    let last = s["last_step"].as_u64().unwrap();

    let backend = Backend::start("ok");
    sync(&[&run_dir_under(dir.path(), "offline-run")], &backend, &[]);
    let got = backend.received();
    assert_eq!(got.exit_code, Some(130));
    assert_eq!(got.steps(), (10..=last).step_by(10).collect::<Vec<_>>());
    assert_eq!(got.summary["_step"], last - last % 10);
}

/// `ptrain run` with the wandb and checkpoint plugins, W&B every step: 10 steps,
/// then resumed from their checkpoint to 20. Returns the W&B run id of each part.
fn run_in_two_parts(dir: &Path, env: &[(&str, &str)]) -> [String; 2] {
    let args = ["--plugins", "wandb,checkpoint", "--set", "plugins.wandb.every=1"];
    let mut ids = Vec::new();
    for (steps, resume) in [(10, None), (20, Some("--auto-resume"))] {
        run_expect(ptrain_run(steps, dir, &args).args(resume).envs(env.iter().copied()), 0);
        ids.push(summary(dir)["plugins"]["wandb"]["run_id"].as_str().unwrap().to_string());
    }
    assert_eq!(summary(dir)["last_step"], 20);
    [ids[0].clone(), ids[1].clone()]
}

#[test]
fn a_resumed_offline_run_syncs_as_one_run_continuing_its_history() {
    let dir = tempfile::tempdir().unwrap();
    let [first, second] = run_in_two_parts(dir.path(), &[]);
    assert_eq!(first, second, "the resumed part continues the W&B run");
    // The printed command uploads both parts, in start order.
    let command = summary(dir.path())["plugins"]["wandb"]["sync_command"].as_str().unwrap().to_string();
    let parts: Vec<&Path> = command.strip_prefix("wandb sync ").expect("a wandb sync command").split(' ').map(Path::new).collect();
    assert_eq!(parts.len(), 2, "{command}");
    assert!(parts.iter().all(|p| p.is_dir() && p.to_str().unwrap().ends_with(&format!("-{first}"))), "{command}");

    let backend = Backend::start("ok");
    sync(&parts, &backend, &[]);
    let got = backend.received();
    assert_eq!(got.stream_paths.len(), 1, "one run: {:?}", got.stream_paths);
    assert!(got.upserts.iter().all(|u| u["name"] == first.as_str()));
    assert_eq!(got.steps(), (1..=20).collect::<Vec<_>>(), "the second part appends after the first");
    assert_eq!(got.summary["_step"], 20);
    assert_eq!(got.exit_code, Some(0));
}

#[test]
fn a_resumed_online_run_appends_to_the_same_run() {
    let backend = Backend::start("ok");
    let dir = tempfile::tempdir().unwrap();
    let url = backend.url();
    let [first, second] = run_in_two_parts(dir.path(), &[("WANDB_MODE", "online"), ("WANDB_API_KEY", KEY), ("WANDB_BASE_URL", &url)]);
    assert_eq!(first, second);
    assert_eq!(summary(dir.path())["plugins"]["wandb"]["upload"]["complete"], true);
    let got = backend.received();
    assert_eq!(got.stream_paths.len(), 1, "one run: {:?}", got.stream_paths);
    assert_eq!(got.steps(), (1..=20).collect::<Vec<_>>(), "the second part appends after the first");
    assert_eq!(got.exit_code, Some(0));
}

#[test]
fn an_unknown_option_is_refused_before_training_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_expect(&mut ptrain_run(5, dir.path(), &["--plugins", "wandb", "--set", "plugins.wandb.projekt=\"x\""]), 2);
    assert!(stderr(&out).contains("projekt"), "{}", stderr(&out));
    assert!(!dir.path().join("summary.json").exists(), "nothing trained");
}

#[test]
fn online_mode_without_an_api_key_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_expect(ptrain_run(5, dir.path(), &["--plugins", "wandb"]).env("WANDB_MODE", "online"), 2);
    assert!(stderr(&out).contains("WANDB_API_KEY"), "{}", stderr(&out));
    assert!(!dir.path().join("wandb").exists());
}

#[test]
fn a_failed_run_ends_with_exit_code_1_that_sync_uploads() {
    let dir = tempfile::tempdir().unwrap();
    // A libtorch error in step 15's forward pass: the run fails (exit 1).
    let out = ptrain_run(40, dir.path(), &["--plugins", "wandb", "--set", "debug.fail_at_step=15"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(summary(dir.path())["status"], "failed");
    let backend = Backend::start("ok");
    sync(&[&run_dir_under(dir.path(), "offline-run")], &backend, &[]);
    let got = backend.received();
    assert_eq!(got.exit_code, Some(1), "W&B records the failed run's exit code");
    assert_eq!(got.steps(), vec![10], "the steps before the failure");
}

#[test]
fn a_grpo_runs_completions_record_syncs_as_a_wandb_table() {
    let dir = tempfile::tempdir().unwrap();
    let d = grpo::prompts_fixture(&dir.path().join("made"));
    let run = dir.path().join("run");
    let mut cmd = ptrain();
    hermetic(&mut cmd).args(["run", "--quiet"]).args(grpo::prompts_run(&d, "wandb", &["plugins.wandb.every=1"])).arg("--run-dir").arg(&run);
    run_expect(&mut cmd, 0);
    let backend = Backend::start("ok");
    sync(&[&run_dir_under(&run, "offline-run")], &backend, &[]);
    let got = backend.received();
    assert_eq!(got.steps(), [1, 2]);
    let records = read_jsonl(&run.join("completions.jsonl"));
    for row in &got.history {
        let table = &row["completions"];
        assert_eq!((table["_type"].as_str(), table["nrows"].as_u64(), table["ncols"].as_u64()), (Some("table-file"), Some(8), Some(5)), "{row}");
        // The table's file went up as the SDK uploads a logged table's, its rows the
        // step's completions.
        let path = table["path"].as_str().unwrap();
        let put = got.requests.iter().find(|r| r["method"] == "PUT" && r["path"].as_str().unwrap().ends_with(path)).expect("the table uploaded");
        assert_eq!(put["body"]["columns"], json!(["step", "prompt", "completion", "len", "advantage"]));
        let of_step: Vec<&Value> = records.iter().filter(|r| r["step"] == row["_step"]).collect();
        let expected: Vec<Value> =
            of_step.iter().map(|r| json!([r["step"], r["prompt"], r["completion"], r["rewards"]["len"], r["advantage"]])).collect();
        assert_eq!(put["body"]["data"], json!(expected));
    }
}

/// A GRPO run on prompts (2 steps, the `completions` table at each) streamed to `backend`.
fn grpo_online(dir: &Path, backend: &Backend) -> (PathBuf, std::process::Output) {
    let d = grpo::prompts_fixture(&dir.join("made"));
    let run = dir.join("run");
    let mut cmd = ptrain();
    hermetic(&mut cmd)
        .args(["run", "--quiet"])
        .args(grpo::prompts_run(&d, "wandb", &["plugins.wandb.every=1"]))
        .arg("--run-dir")
        .arg(&run)
        .env("WANDB_MODE", "online")
        .env("WANDB_API_KEY", KEY)
        .env("WANDB_BASE_URL", backend.url());
    let out = run_expect(&mut cmd, 0);
    (run, out)
}

#[test]
fn online_mode_uploads_a_grpo_runs_completions_table_as_sync_does() {
    // Every other API request is refused once with a 503: the file's requests are retried.
    let backend = Backend::start("flaky");
    let dir = tempfile::tempdir().unwrap();
    let (run, _) = grpo_online(dir.path(), &backend);
    let online = backend.received();
    online.assert_authenticated();
    assert_eq!(online.steps(), [1, 2]);
    let local = run_dir_under(&run, "run");
    let uploads = online.uploads();
    let (created, uploaded) = online.files_named();
    for table in online.tables() {
        assert_eq!(
            (table["_type"].as_str(), table["nrows"].as_u64()),
            (Some("table-file"), Some(8)),
            "the row carries the table, not its text: {table}"
        );
        let path = table["path"].as_str().unwrap();
        let file: Value = serde_json::from_slice(&std::fs::read(local.join("files").join(path)).unwrap()).unwrap();
        assert_eq!(uploads.get(path), Some(&file), "{path}: the file PUT is the local copy's");
        assert!(created.contains(path) && uploaded.contains(path), "{path}: asked for with CreateRunFiles and announced uploaded");
    }
    assert!(online.requests.iter().filter(|r| r["method"] == "PUT").all(|r| r["auth"].is_null()), "the key never goes to an upload URL");
    let is_create = |r: &&Value| r["body"]["query"].as_str().is_some_and(|q| q.contains("createRunFiles"));
    assert!(online.requests.iter().filter(is_create).any(|r| r["status"] == 503), "a refused CreateRunFiles was retried");

    // `wandb sync` of the local copy sends the same table values and the same files.
    let copy = Backend::start("ok");
    sync(&[&local], &copy, &["--include-online"]);
    let synced = copy.received();
    assert_eq!(synced.tables().len(), 2);
    for (ours, sdk) in online.tables().iter().zip(&synced.tables()) {
        assert!(same(ours, sdk), "{ours}\nvs what wandb sync sends\n{sdk}");
        let path = sdk["path"].as_str().unwrap();
        assert_eq!(uploads.get(path), synced.uploads().get(path), "{path}");
        assert!(synced.files_named().0.contains(path) && synced.files_named().1.contains(path), "{path}");
    }
    let upload = &summary(&run)["plugins"]["wandb"]["upload"];
    assert_eq!((upload["complete"].as_bool(), upload["files_sent"].as_u64()), (Some(true), Some(2)), "{upload}");
}

#[test]
fn refused_table_uploads_are_counted_and_the_rows_and_local_copy_are_whole() {
    let backend = Backend::start("refuse-uploads");
    let dir = tempfile::tempdir().unwrap();
    let (run, out) = grpo_online(dir.path(), &backend);
    let s = summary(&run);
    assert_eq!((s["status"].as_str(), s["plugin_failures"].clone()), (Some("completed"), json!([])));
    let upload = &s["plugins"]["wandb"]["upload"];
    assert_eq!(
        (upload["complete"].as_bool(), upload["rows_not_sent"].as_u64(), upload["files_sent"].as_u64(), upload["files_not_sent"].as_u64()),
        (Some(false), Some(0), Some(0), Some(2)),
        "{upload}"
    );
    assert!(upload["error"].as_str().unwrap().contains("HTTP 403"), "{upload}");
    let local = run_dir_under(&run, "run");
    assert!(stderr(&out).contains(&format!("wandb sync --include-online {}", local.display())), "{}", stderr(&out));
    let got = backend.received();
    assert_eq!((got.steps(), got.exit_code), (vec![1, 2], Some(0)), "every row, and the run ended");
    assert!(got.files_named().1.is_empty(), "no file announced uploaded");

    // The local copy still uploads both tables.
    let good = Backend::start("ok");
    sync(&[&local], &good, &["--include-online"]);
    let synced = good.received();
    for table in synced.tables() {
        let path = table["path"].as_str().unwrap();
        let file: Value = serde_json::from_slice(&std::fs::read(local.join("files").join(path)).unwrap()).unwrap();
        assert_eq!(synced.uploads().get(path), Some(&file), "{path}");
    }
}
