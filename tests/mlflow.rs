//! The `mlflow` plugin and `ptrain sync mlflow` through the built binary, against the
//! real `mlflow server` (mlflow 3.17.2 from the venv), started by each test on a reserved
//! port of 127.0.0.1 with a sqlite backend and an artifact root in a temporary
//! directory, and killed when the test ends (pass or fail). What the server stored is
//! read back with the Python client (tests/support/mlflow_query.py).
//!
//! A server takes 10 to 30 seconds to start on a loaded machine, so each test starts
//! one and walks a whole story on it, and the database schema is made once per build
//! (a template every server starts from) instead of being migrated by each server.

mod common;

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::TcpStream,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use common::*;
use ptrain_mlflow::{Auth, Client, RunRecord, StateDir};
use serde_json::{json, Value};

const ADMIN: (&str, &str) = ("admin", "admin-pass-1234");

/// The schema every test server starts from, made once per build by MLflow's own store.
fn template_db() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let template = dir.join("mlflow-template.db");
    let lock = dir.join("mlflow-template.lock");
    let deadline = Instant::now() + Duration::from_secs(600);
    while !template.exists() {
        if std::fs::create_dir(&lock).is_ok() {
            let tmp = dir.join(format!("mlflow-template-{}.db", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            // `mlflow-artifacts:/` is the root the server gives experiments when it serves artifacts.
            let script = "import sys\nfrom mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore\n\
                          SqlAlchemyStore('sqlite:///' + sys.argv[1], 'mlflow-artifacts:/')";
            let out = python().args(["-c", script]).arg(&tmp).output().expect("run python");
            let _ = std::fs::remove_dir(&lock);
            assert!(out.status.success(), "cannot make the MLflow schema:\n{}", String::from_utf8_lossy(&out.stderr));
            std::fs::rename(&tmp, &template).unwrap();
            break;
        }
        // Another test is making it; a lock left behind by a crashed one is taken over.
        let age = std::fs::metadata(&lock).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
        if age.is_some_and(|a| a > Duration::from_secs(300)) {
            let _ = std::fs::remove_dir(&lock);
        }
        assert!(Instant::now() < deadline, "timed out waiting for {}", template.display());
        std::thread::sleep(Duration::from_millis(200));
    }
    template
}

/// Removes MLflow, proxy and credential settings of the caller's environment.
fn hermetic(cmd: &mut Command) -> &mut Command {
    for (key, _) in std::env::vars() {
        let upper = key.to_uppercase();
        if key.starts_with("MLFLOW_") || upper == "HTTP_PROXY" || upper == "HTTPS_PROXY" || upper == "ALL_PROXY" {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// A real `mlflow server`, in its own process group (it runs uvicorn as a child), killed when dropped.
struct Server {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    basic_auth: bool,
}

impl Server {
    fn start(basic_auth: bool) -> Server {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(template_db(), dir.path().join("mlflow.db")).unwrap();
        if basic_auth {
            let ini = format!(
                "[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{}\nadmin_username = {}\nadmin_password = {}\n\
                 authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n",
                dir.path().join("auth.db").display(),
                ADMIN.0,
                ADMIN.1
            );
            std::fs::write(dir.path().join("auth.ini"), ini).unwrap();
        }
        // Reserved for this test: no other test's server takes it, even while this
        // one is down for a restart.
        let port = ptrain_test_ports::reserve();
        let mut server = Server { child: None, port, dir, basic_auth };
        server.spawn();
        server
    }

    fn uri(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// Starts the server on this backend and port, and waits until it answers.
    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log()).unwrap();
        let d = self.dir.path();
        let mut cmd = python();
        hermetic(&mut cmd)
            .args(["-m", "mlflow", "server", "--host", "127.0.0.1", "--workers", "1", "--port", &self.port.to_string()])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", d.join("mlflow.db").display()))
            .arg("--artifacts-destination")
            .arg(d.join("artifacts"))
            // Job execution spawns more Python processes a tracking test does not need.
            .env("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
            .current_dir(d)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0);
        if self.basic_auth {
            cmd.args(["--app-name", "basic-auth"])
                .env("MLFLOW_AUTH_CONFIG_PATH", d.join("auth.ini"))
                .env("MLFLOW_FLASK_SERVER_SECRET_KEY", "ptrain-tests");
        }
        self.child = Some(cmd.spawn().expect("start mlflow server"));
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("mlflow server exited with {status}:\n{}", std::fs::read_to_string(self.log()).unwrap_or_default());
            }
            if self.healthy() {
                return;
            }
            assert!(Instant::now() < deadline, "mlflow server not up after 300 s:\n{}", std::fs::read_to_string(self.log()).unwrap_or_default());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether the server answers `/health`, and the socket answering is this
    /// test's server's (a process of its process group), not another one's.
    fn healthy(&self) -> bool {
        let Some(child) = &self.child else { return false };
        if !ptrain_test_ports::listener_in_group(self.port, child.id()) {
            return false;
        }
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else { return false };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let mut answer = String::new();
        stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_ok()
            && stream.read_to_string(&mut answer).is_ok()
            && answer.starts_with("HTTP/1.1 200")
    }

    /// SIGKILL to the whole process group: the server is gone at once.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on the process group this test created.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
        }
    }

    fn client(&self, auth: Auth) -> Client {
        Client::new(&self.uri(), auth, Duration::from_secs(30))
    }

    /// The run as the Python client reads it, with the history of `keys`.
    fn query(&self, run_id: &str, keys: &[&str]) -> Value {
        let out = py::cmd().arg(repo().join("tests/support/mlflow_query.py")).arg(self.uri()).arg(run_id).args(keys).output().unwrap();
        assert!(out.status.success(), "mlflow_query.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A tiny GPT run of `steps` with the mlflow plugin (and `plugins`) logging to `uri`.
fn run_cmd(steps: u64, run_dir: &Path, uri: &str, plugins: &str, sets: &[&str]) -> Command {
    let mut cmd = ptrain();
    hermetic(&mut cmd).args(tiny_gpt(steps)).arg("--run-dir").arg(run_dir).args(["--plugins", plugins]);
    // No ~/.mlflow/credentials of whoever runs the tests.
    cmd.env("HOME", run_dir.parent().unwrap());
    cmd.args(["--set", &format!("plugins.mlflow.uri={}", serde_json::to_string(uri).unwrap())]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    cmd
}

fn sync_cmd(run_dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = ptrain();
    hermetic(&mut cmd).args(["sync", "mlflow"]).arg(run_dir).args(extra).env("HOME", run_dir.parent().unwrap());
    cmd
}

fn record(run_dir: &Path) -> RunRecord {
    StateDir::of_run_dir(run_dir).read_record().unwrap().expect("mlflow/run.json")
}

/// Steps and values of `train/loss` in metrics.jsonl, the reference for the server's history.
fn jsonl_losses(run_dir: &Path) -> BTreeMap<u64, f64> {
    read_jsonl(&run_dir.join("metrics.jsonl")).iter().filter_map(|row| Some((row["step"].as_u64()?, row.get("train/loss")?.as_f64()?))).collect()
}

/// Asserts the server's history of `train/loss` is `expected`, each step once.
fn assert_history(history: &Value, expected: &BTreeMap<u64, f64>) {
    let points = history.as_array().expect("a history");
    let mut seen = BTreeMap::new();
    for p in points {
        let (step, value) = (p[0].as_u64().unwrap(), p[1].as_f64().expect("a finite loss"));
        assert!(seen.insert(step, value).is_none(), "step {step} twice in the server's history");
    }
    assert_eq!(seen.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>(), "the server's steps are the emitted ones");
    for (step, v) in expected {
        let got = seen[step];
        assert!(got == *v || (got - v).abs() <= 1e-12 * v.abs(), "step {step}: server {got}, metrics.jsonl {v}");
    }
}

/// Lines of stderr at `level` (`WARN`, `ERROR`) from the mlflow plugin or about it.
fn lines_at(output: &Output, level: &str) -> Vec<String> {
    stderr(output).lines().filter(|l| l.contains(level) && l.contains("mlflow")).map(str::to_string).collect()
}

/// Warnings other than a save finding the plugin mid-upload: a timing matter (its state,
/// the run id, is the one an earlier save kept: host::busy), not a fault of the run.
fn unexpected_warnings(output: &Output) -> Vec<String> {
    lines_at(output, "WARN").into_iter().filter(|l| !l.contains("is busy in a call of its own at the save")).collect()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The largest step of `train/loss` on the server, once the run exists there.
fn server_last_step(client: &Client, run_dir: &Path) -> Option<u64> {
    let id = StateDir::of_run_dir(run_dir).read_record().ok()??.run_id?;
    client.metric_history(&id, "train/loss").ok()?.iter().map(|p| p.step).max()
}

#[test]
fn a_run_its_interruption_and_its_resumption_make_one_complete_mlflow_run() {
    let mut server = Server::start(false);
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let plugins = "mlflow,jsonl,checkpoint";
    let sets = ["plugins.mlflow.experiment=\"ptrain-tests\"", "plugins.mlflow.flush_secs=0", "plugins.checkpoint.every=100"];

    // A 200-step run: every emitted step of train/loss, the config as params, FINISHED, artifacts.
    let out = run_expect(&mut run_cmd(200, &run_dir, &server.uri(), plugins, &sets), 0);
    assert!(unexpected_warnings(&out).is_empty() && lines_at(&out, "ERROR").is_empty(), "{}", stderr(&out));
    let run_id = record(&run_dir).run_id.expect("the run id in run.json");
    let losses = jsonl_losses(&run_dir);
    assert_eq!(losses.len(), 20, "{losses:?}");
    let q = server.query(&run_id, &["train/loss"]);
    assert_history(&q["history"]["train/loss"], &losses);
    let config: toml::Table = toml::from_str(&std::fs::read_to_string(run_dir.join("config.toml")).unwrap()).unwrap();
    let lr = config["optim"]["lr"].as_float().unwrap();
    assert_eq!(q["params"]["optim.lr"].as_str().unwrap().parse::<f64>().unwrap(), lr);
    assert_eq!(q["params"]["train.steps"], "200");
    assert_eq!(q["status"], "FINISHED");
    assert_eq!(q["run_name"].as_str(), run_dir.file_name().unwrap().to_str());
    assert_eq!(q["tags"]["ptrain.version"], env!("CARGO_PKG_VERSION"));
    assert_eq!((q["tags"]["ptrain.device"].as_str(), q["tags"]["ptrain.world_size"].as_str()), (Some("cpu"), Some("1")));
    assert_eq!(q["artifacts"], json!(["config.toml", "summary.json"]));
    let stored = server.dir.path().join("artifacts").join(q["experiment_id"].as_str().unwrap()).join(&run_id).join("artifacts");
    assert_eq!(std::fs::read(stored.join("config.toml")).unwrap(), std::fs::read(run_dir.join("config.toml")).unwrap());
    assert_eq!(std::fs::read(stored.join("summary.json")).unwrap(), std::fs::read(run_dir.join("summary.json")).unwrap(), "this run's summary");
    let s = summary(&run_dir);
    assert_eq!((s["plugins"]["mlflow"]["run_id"].as_str(), s["plugins"]["mlflow"]["pending_items"].as_u64()), (Some(run_id.as_str()), Some(0)));
    assert!(s["plugin_failures"].as_array().unwrap().is_empty());
    assert!(!StateDir::of_run_dir(&run_dir).pending_path().exists());

    // Resumed towards step 600 and stopped by SIGTERM: the same run, KILLED.
    let client = server.client(Auth::None);
    let part =
        run_cmd(600, &run_dir, &server.uri(), plugins, &sets).arg("--auto-resume").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait_for("the resumed run's steps on the server", || server_last_step(&client, &run_dir).is_some_and(|s| s > 200));
    // SAFETY: kill(2) on the child this test started.
    unsafe { libc::kill(part.id() as i32, libc::SIGTERM) };
    let out = part.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert_eq!(record(&run_dir).run_id.as_deref(), Some(run_id.as_str()));
    assert_eq!(client.get_run(&run_id).unwrap().status, "KILLED");
    let stopped = summary(&run_dir)["last_step"].as_u64().unwrap();
    assert!(stopped > 200 && stopped < 600, "stopped at {stopped}");

    // Resumed again to the end: still the same run, FINISHED, every step once.
    let out = run_expect(run_cmd(600, &run_dir, &server.uri(), plugins, &sets).arg("--auto-resume"), 0);
    assert!(unexpected_warnings(&out).is_empty(), "{}", stderr(&out));
    assert_eq!(summary(&run_dir)["start_step"].as_u64(), Some(stopped));
    let q = server.query(&run_id, &["train/loss"]);
    assert_history(&q["history"]["train/loss"], &jsonl_losses(&run_dir));
    assert_eq!(q["status"], "FINISHED");
    assert_eq!(q["runs_in_experiment"], 1, "a resumed run continues the MLflow run");
    assert_eq!(q["params"]["train.steps"], "200", "MLflow keeps a param's first value");

    // A run that fails (a libtorch error at step 15) is FAILED on the server.
    let failed_dir = dir.path().join("failed");
    let out = run_expect(
        &mut run_cmd(40, &failed_dir, &server.uri(), "mlflow", &["plugins.mlflow.experiment=\"ptrain-tests\"", "debug.fail_at_step=15"]),
        1,
    );
    assert_eq!(summary(&failed_dir)["status"], "failed", "{}", stderr(&out));
    let q = server.query(&record(&failed_dir).run_id.expect("the failed run's id"), &["train/loss"]);
    assert_eq!(q["status"], "FAILED");
    server.kill();
}

#[test]
fn when_the_server_dies_midway_the_run_finishes_and_sync_completes_the_history_once() {
    let mut server = Server::start(false);
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let sets =
        ["plugins.mlflow.flush_secs=0", "plugins.mlflow.retry_secs=1", "plugins.mlflow.reconnect_secs=3600", "plugins.mlflow.end_timeout_secs=10"];
    let client = server.client(Auth::None);
    let run = run_cmd(600, &run_dir, &server.uri(), "mlflow,jsonl", &sets).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait_for("the first steps on the server", || server_last_step(&client, &run_dir).is_some());
    server.kill();
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let warnings = lines_at(&out, "WARN");
    assert_eq!(warnings.len(), 1, "one warning when the server goes away: {warnings:?}");
    assert!(warnings[0].contains("pending.jsonl") && warnings[0].contains(&server.uri()), "{}", warnings[0]);
    let s = summary(&run_dir);
    assert!(s["plugin_failures"].as_array().unwrap().is_empty());
    assert!(s["plugins"]["mlflow"]["pending_items"].as_u64().unwrap() > 0);
    assert_eq!(s["plugins"]["mlflow"]["sync_command"], format!("ptrain sync mlflow {}", run_dir.display()));
    let state = StateDir::of_run_dir(&run_dir);
    let last = *jsonl_losses(&run_dir).keys().last().unwrap();
    let pending: Vec<_> = state.pending_from(0).unwrap().into_iter().map(|(item, _)| item).collect();
    assert!(
        pending.iter().any(|i| matches!(i, ptrain_mlflow::Item::Metrics(m) if m.iter().any(|p| p.step == last))),
        "the last step waits in pending.jsonl"
    );

    // A run that never had a server (its URI is not one), for a sync that names the server.
    let offline_dir = dir.path().join("offline");
    run_expect(&mut run_cmd(20, &offline_dir, "file:///tmp/mlruns", "mlflow,jsonl", &[]), 0);

    server.spawn();
    let out = run_expect(&mut sync_cmd(&run_dir, &[]), 0);
    assert!(stdout(&out).contains("sent"), "{}", stdout(&out));
    let run_id = record(&run_dir).run_id.unwrap();
    let q = server.query(&run_id, &["train/loss"]);
    assert_history(&q["history"]["train/loss"], &jsonl_losses(&run_dir));
    assert_eq!(q["status"], "FINISHED");
    assert_eq!(q["artifacts"], json!(["config.toml", "summary.json"]));

    let out = run_expect(&mut sync_cmd(&run_dir, &[]), 0);
    assert!(stdout(&out).contains("nothing to send"), "{}", stdout(&out));
    let again = server.client(Auth::None).metric_history(&run_id, "train/loss").unwrap();
    assert_eq!(again.len(), jsonl_losses(&run_dir).len(), "a second sync sends nothing twice");

    let out = run_expect(&mut sync_cmd(&offline_dir, &["--uri", &server.uri()]), 0);
    assert!(stdout(&out).contains("created now"), "{}", stdout(&out));
    let created = record(&offline_dir);
    assert_eq!(created.tracking_uri, server.uri());
    let run = server.client(Auth::None).get_run(created.run_id.as_deref().unwrap()).unwrap();
    assert_eq!((run.status.as_str(), run.params.contains_key("optim.lr")), ("FINISHED", true));
    let steps: Vec<u64> = server.client(Auth::None).metric_history(&run.run.run_id, "train/loss").unwrap().iter().map(|p| p.step).collect();
    assert_eq!(steps, jsonl_losses(&offline_dir).keys().copied().collect::<Vec<_>>());
}

#[test]
fn refused_credentials_cost_one_error_line_and_the_run_goes_on() {
    let server = Server::start(true);
    let admin = server.client(Auth::Basic { username: ADMIN.0.into(), password: ADMIN.1.into() });
    admin.experiment_id("guarded").unwrap();
    admin.call("POST", "users/create", &[], Some(&json!({ "username": "bob", "password": "bob-pass-1234" }))).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cases = [("wrong-password", ADMIN.0, "not-the-password", "401"), ("no-permission", "bob", "bob-pass-1234", "403")];
    for (name, user, password, code) in cases {
        let run_dir = dir.path().join(name);
        let mut cmd = run_cmd(30, &run_dir, &server.uri(), "mlflow", &["plugins.mlflow.experiment=\"guarded\""]);
        let out = run_expect(cmd.env("MLFLOW_TRACKING_USERNAME", user).env("MLFLOW_TRACKING_PASSWORD", password), 0);
        let errors = lines_at(&out, "ERROR");
        assert_eq!(errors.len(), 1, "{name}: {}", stderr(&out));
        assert!(errors[0].contains(&server.uri()) && errors[0].contains(code), "{name}: {}", errors[0]);
        assert!(lines_at(&out, "WARN").is_empty(), "{name}: {}", stderr(&out));
        let s = summary(&run_dir);
        assert_eq!(s["status"], "completed");
        assert_eq!(s["plugin_failures"][0]["plugin"], "mlflow", "{name}: {s}");
        assert_eq!(StateDir::of_run_dir(&run_dir).unsynced_bytes().unwrap(), 0, "{name}: nothing kept for a server that refuses us");
    }
    // The right credentials reach the same server: the refusals above were the server's.
    let run_dir = dir.path().join("admin");
    let mut cmd = run_cmd(30, &run_dir, &server.uri(), "mlflow", &["plugins.mlflow.experiment=\"guarded\""]);
    let out = run_expect(cmd.env("MLFLOW_TRACKING_USERNAME", ADMIN.0).env("MLFLOW_TRACKING_PASSWORD", ADMIN.1), 0);
    assert!(lines_at(&out, "ERROR").is_empty(), "{}", stderr(&out));
    let run = admin.get_run(&record(&run_dir).run_id.unwrap()).unwrap();
    assert_eq!(run.status, "FINISHED");
    assert!(run.params.contains_key("optim.lr"));
}

#[test]
fn an_unreachable_server_or_a_wrong_scheme_costs_one_warning_and_loses_nothing() {
    let closed = format!("http://127.0.0.1:{}", ptrain_test_ports::reserve());
    let dir = tempfile::tempdir().unwrap();
    for (name, uri) in [("unreachable", closed.as_str()), ("wrong-scheme", "file:///tmp/mlruns")] {
        let run_dir = dir.path().join(name);
        let out = run_expect(&mut run_cmd(30, &run_dir, uri, "mlflow,jsonl", &["plugins.mlflow.retry_secs=0.5"]), 0);
        let warnings = lines_at(&out, "WARN");
        assert_eq!(warnings.len(), 1, "{name}: {warnings:?}");
        assert!(warnings[0].contains("pending.jsonl"), "{name}: {}", warnings[0]);
        assert!(lines_at(&out, "ERROR").is_empty(), "{name}: {}", stderr(&out));
        let pending: Vec<_> = StateDir::of_run_dir(&run_dir).pending_from(0).unwrap().into_iter().map(|(item, _)| item).collect();
        let mut steps: Vec<u64> = pending
            .iter()
            .filter_map(|i| if let ptrain_mlflow::Item::Metrics(m) = i { m.iter().find(|p| p.key == "train/loss").map(|p| p.step) } else { None })
            .collect();
        steps.dedup();
        assert_eq!(steps, jsonl_losses(&run_dir).keys().copied().collect::<Vec<_>>(), "{name}: every emitted step is kept");
        assert!(pending.iter().any(|i| matches!(i, ptrain_mlflow::Item::Params(p) if p.iter().any(|kv| kv.key == "optim.lr"))));
        assert!(pending.contains(&ptrain_mlflow::Item::Artifact { path: "summary.json".into() }));
        assert!(pending.iter().any(|i| matches!(i, ptrain_mlflow::Item::Status { status: ptrain_mlflow::RunStatus::Finished, .. })));
    }
    // The wrong scheme's items need a server named on the command line.
    let out = run_expect(&mut sync_cmd(&dir.path().join("wrong-scheme"), &[]), 2);
    assert!(stderr(&out).contains("--uri"), "{}", stderr(&out));
    // A server still away: the sync says so and sends nothing.
    let out = run_expect(&mut sync_cmd(&dir.path().join("unreachable"), &["--retry-secs", "0.5"]), 1);
    assert!(stderr(&out).contains("unreachable"), "{}", stderr(&out));
    assert_eq!(StateDir::of_run_dir(&dir.path().join("unreachable")).synced_bytes().unwrap(), 0);
    let out = run_expect(&mut sync_cmd(&dir.path().join("no-such-run"), &[]), 2);
    assert!(stderr(&out).contains("no MLflow state"), "{}", stderr(&out));
}

#[test]
fn bad_options_stop_the_run_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let out = run_expect(&mut run_cmd(5, &run_dir, "http://127.0.0.1:1", "mlflow", &["plugins.mlflow.experimnt=\"x\""]), 2);
    assert!(stderr(&out).contains("experimnt"), "{}", stderr(&out));
    let mut cmd = ptrain();
    hermetic(&mut cmd).args(tiny_gpt(5)).arg("--run-dir").arg(&run_dir).args(["--plugins", "mlflow"]);
    let out = run_expect(&mut cmd, 2);
    assert!(stderr(&out).contains("MLFLOW_TRACKING_URI"), "{}", stderr(&out));
    assert!(!run_dir.join("mlflow").exists(), "nothing trained, nothing written");
}
