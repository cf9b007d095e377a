//! `mlflow`: logs the run to an MLflow tracking server over its REST API, without
//! the Python client.
//!
//! At the start: the resolved configuration as params (`optim.lr`, ...), tags (ptrain's
//! version, the device, world size, git commit) and `config.toml` as an artifact. Then
//! metrics in `log-batch` calls, from a thread of its own (see `uploader.rs`): a slow or
//! dead server never holds up training. At the end: the run's status (FINISHED; KILLED
//! after SIGINT/SIGTERM; FAILED) and `summary.json` as an artifact. What the server
//! could not take is in `<run-dir>/mlflow/pending.jsonl` for `ptrain sync mlflow`.
//!
//! Cadence: basic metrics every 10 steps and at the end, detailed ones (grad norm,
//! phase times, memory) every 50. Options and environment: `settings.rs` and
//! docs/plugins/mlflow.md.

mod settings;
mod uploader;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use ptrain_mlflow::{
    client::{Client, ErrorKind},
    item::{params_from_toml, sanitize_key, Item, KeyValue, MetricPoint, RunStatus},
    send::send,
    state::{RunRecord, StateDir},
    Auth,
};
use ptrain_plugin_api::{
    export_plugin, parse_options, Attachment, Cadence, Descriptor, Hook, HostApi, LogLevel, MetricBatch, Needs, Plugin, PluginError, PluginResult,
    RunEnd, RunInfo, Threading,
};
use serde_json::json;

use crate::{
    settings::Settings,
    uploader::{tick_interval, Context, Timing, Uploader},
};

const ATTACHMENTS: &[Attachment] = &[
    Attachment::new("metrics", Hook::Metrics, Cadence::every(10).with_end()).needs(Needs::BASIC_METRICS),
    Attachment::new("detailed", Hook::Metrics, Cadence::every(50)).needs(Needs::DETAILED_METRICS),
];

pub struct Mlflow {
    settings: Settings,
    host: HostApi,
    /// The MLflow run id saved in the checkpoint being resumed.
    resumed_run_id: Option<String>,
    active: Option<Active>,
    /// After `on_run_end`: what uploading summary.json needs once the host wrote it.
    ended: Option<Ended>,
    /// Metric names as MLflow accepts them, computed once per name.
    keys: HashMap<String, String>,
}

struct Active {
    uploader: Uploader,
    state: StateDir,
    run_dir: PathBuf,
    start_time: f64,
}

struct Ended {
    state: StateDir,
    run_dir: PathBuf,
    start_time: f64,
    online: bool,
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The commit of the git repository ptrain runs in, as the Python client tags runs.
fn git_commit() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .env("GIT_OPTIONAL_LOCKS", "0")
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let commit = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && commit.len() >= 40 && commit.chars().all(|c| c.is_ascii_hexdigit())).then_some(commit)
}

fn tags(run: &RunInfo<'_>, run_dir: &Path) -> Vec<KeyValue> {
    let mut tags = vec![
        KeyValue::new("mlflow.source.name", "ptrain"),
        KeyValue::new("mlflow.source.type", "LOCAL"),
        KeyValue::new("ptrain.version", env!("CARGO_PKG_VERSION")),
        KeyValue::new("ptrain.device", run.device.name.as_str()),
        KeyValue::new("ptrain.world_size", run.world_size.to_string()),
        KeyValue::new("ptrain.model", run.model.kind.as_str()),
        KeyValue::new("ptrain.parameters", run.model.n_params.to_string()),
        KeyValue::new("ptrain.precision", run.precision.as_str()),
        KeyValue::new("ptrain.run_dir", std::fs::canonicalize(run_dir).unwrap_or_else(|_| run_dir.to_path_buf()).display().to_string()),
    ];
    if let Some(user) = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).ok().filter(|u| !u.is_empty()) {
        tags.push(KeyValue::new("mlflow.user", user));
    }
    if let Some(commit) = git_commit() {
        tags.push(KeyValue::new("mlflow.source.git.commit", commit));
    }
    if run.start_step > 0 {
        tags.push(KeyValue::new("ptrain.resumed_from_step", run.start_step.to_string()));
    }
    tags
}

impl Mlflow {
    fn log(&self, level: LogLevel, message: &str) {
        self.host.log(level, "mlflow", message);
    }

    /// `run.json` for this run: the MLflow run it continues, if any. The state of another
    /// MLflow run left in the run directory is cleared, or moved aside when it still has
    /// items to sync.
    fn record(&self, run: &RunInfo<'_>, state: &StateDir) -> Result<RunRecord, String> {
        let io = |e: std::io::Error| format!("{}: {e}", state.dir().display());
        state.create().map_err(io)?;
        let existing = state.read_record().unwrap_or_else(|e| {
            self.log(LogLevel::Warn, &format!("ignoring {}/run.json: {e}", state.dir().display()));
            None
        });
        let resumed = run.start_step > 0;
        let saved = self.resumed_run_id.clone();
        // A resumed training run continues the MLflow run of the checkpoint; its earlier
        // part may never have reached the server (no id yet), which is still this run.
        let same = |r: &RunRecord| resumed && (r.run_id.is_none() || saved.is_none() || r.run_id == saved);
        let keep = existing.as_ref().filter(|r| same(r));
        if keep.is_none() {
            if state.unsynced_bytes().map_err(io)? > 0 {
                let what = existing.as_ref().and_then(|r| r.run_id.clone()).unwrap_or_else(|| "unsent".into());
                let moved = state.move_aside(&what).map_err(io)?;
                state.create().map_err(io)?;
                self.log(
                    LogLevel::Warn,
                    &format!(
                        "{} holds items of an earlier MLflow run not sent yet; send them with: ptrain sync mlflow {}",
                        moved.display(),
                        moved.display()
                    ),
                );
            } else {
                state.clear_pending().map_err(io)?;
            }
        }
        let run_id = saved.or_else(|| keep.and_then(|r| r.run_id.clone()));
        let known = keep.filter(|r| r.run_id == run_id);
        Ok(RunRecord {
            tracking_uri: self.settings.uri.clone(),
            experiment_name: self.settings.experiment.clone(),
            // As the run directory is named (`runs/<run.name>-<stamp>` unless --run-dir), like wandb's display name.
            run_name: self.settings.run_name.clone().unwrap_or_else(|| {
                Path::new(run.run_dir.as_str()).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| run.run_name.to_string())
            }),
            start_time: keep.map_or((run.start_time * 1000.0) as i64, |r| r.start_time),
            run_id,
            experiment_id: known.and_then(|r| r.experiment_id.clone()),
            artifact_uri: known.and_then(|r| r.artifact_uri.clone()),
        })
    }

    fn start(&mut self, run: &RunInfo<'_>) -> Result<Active, String> {
        let run_dir = PathBuf::from(run.run_dir.as_str());
        let state = StateDir::of_run_dir(&run_dir);
        let record = self.record(run, &state)?;
        state.write_record(&record).map_err(|e| format!("cannot write {}/run.json: {e}", state.dir().display()))?;
        let (params, cut) = params_from_toml(run.config_toml.as_str())?;
        if !cut.is_empty() {
            self.log(LogLevel::Warn, &format!("{} param values were cut to MLflow's 6000 characters: {}", cut.len(), cut.join(", ")));
        }
        let mut first = Item::chunked_params(params);
        first.extend(Item::chunked_tags(tags(run, &run_dir)));
        first.push(Item::Artifact { path: "config.toml".into() });
        let s = &self.settings;
        let client = match &s.uri_problem {
            None => Some(Client::new(&s.uri, s.auth.clone(), s.timeout)),
            Some(problem) => {
                self.log(
                    LogLevel::Warn,
                    &format!(
                        "{problem}; logging to {} instead: send it with `ptrain sync mlflow {} --uri http://<server>`",
                        state.pending_path().display(),
                        run_dir.display()
                    ),
                );
                None
            }
        };
        let context = Context {
            client,
            reopen: record.run_id.is_some() && run.start_step > 0,
            record,
            state: state.clone(),
            timing: Timing { retry: s.retry, flush: s.flush, reconnect: s.reconnect },
            host: self.host,
        };
        let uploader = Uploader::start(context, first);
        Ok(Active { uploader, state, run_dir, start_time: run.start_time })
    }

    fn key(&mut self, name: &str) -> String {
        if let Some(key) = self.keys.get(name) {
            return key.clone();
        }
        let key = sanitize_key(name);
        self.keys.insert(name.to_string(), key.clone());
        key
    }

    /// summary.json as an artifact. The host writes it after every plugin's `on_run_end`
    /// and before it drops the plugins, so this runs from `Drop`; if the file is not
    /// (yet) this run's, `ptrain sync mlflow` uploads it later.
    fn upload_summary(&self, ended: Ended) {
        let item = Item::Artifact { path: "summary.json".into() };
        let path = ended.run_dir.join("summary.json");
        let start = UNIX_EPOCH + Duration::from_secs_f64(ended.start_time.max(0.0));
        let fresh = std::fs::metadata(&path).and_then(|m| m.modified()).is_ok_and(|t| t >= start);
        if fresh && ended.online {
            let run = ended.state.read_record().ok().flatten().and_then(|r| {
                Some(ptrain_mlflow::RunRef { run_id: r.run_id?, experiment_id: r.experiment_id.unwrap_or_default(), artifact_uri: r.artifact_uri? })
            });
            if let Some(run) = run {
                let s = &self.settings;
                let client = Client::new(&s.uri, s.auth.clone(), s.timeout);
                match send(&client, &run, &ended.run_dir, std::slice::from_ref(&item)) {
                    Ok(_) => return,
                    Err(e) if e.kind == ErrorKind::Auth => return,
                    Err(e) => self.log(LogLevel::Warn, &format!("summary.json not uploaded ({}); `ptrain sync mlflow` will", e.message)),
                }
            }
        } else if !fresh {
            self.log(LogLevel::Info, "summary.json is not written yet: `ptrain sync mlflow` uploads it");
        }
        if let Err(e) = ended.state.pending_writer().append(&[item]) {
            self.log(LogLevel::Warn, &format!("cannot write {}: {e}", ended.state.pending_path().display()));
        }
    }
}

impl Plugin for Mlflow {
    const DESCRIPTOR: Descriptor = Descriptor::new(
        "mlflow",
        env!("CARGO_PKG_VERSION"),
        "MLflow tracking server over its REST API; what it cannot send waits for `ptrain sync mlflow`",
        Threading::Worker,
        ATTACHMENTS,
    );

    fn new(options: serde_json::Value, host: HostApi) -> PluginResult<Self> {
        let options = parse_options(options)?;
        let settings =
            Settings::resolve(options, |k| std::env::var(k).ok(), Auth::from_env()).map_err(|e| PluginError::msg(format!("invalid options: {e}")))?;
        Ok(Mlflow { settings, host, resumed_run_id: None, active: None, ended: None, keys: HashMap::new() })
    }

    fn on_run_start(&mut self, run: &RunInfo<'_>) -> PluginResult {
        self.active = Some(self.start(run).map_err(PluginError::msg)?);
        Ok(())
    }

    fn on_metrics(&mut self, batch: &MetricBatch) -> PluginResult {
        let Some(active) = &self.active else { return Ok(()) };
        if let Some(fatal) = active.uploader.fatal() {
            return Err(PluginError::msg(fatal.to_string()));
        }
        let timestamp = (batch.wall_time * 1000.0).round() as i64;
        let names: Vec<(&str, f64)> = batch.scalars().collect();
        let points: Vec<MetricPoint> =
            names.into_iter().map(|(name, value)| MetricPoint { key: self.key(name), value, timestamp, step: batch.step }).collect();
        if let (false, Some(active)) = (points.is_empty(), &mut self.active) {
            active.uploader.push(Item::chunked_metrics(points));
        }
        Ok(())
    }

    fn timer_interval(&self) -> PluginResult<Option<Duration>> {
        Ok(Some(tick_interval(self.settings.flush)))
    }

    /// Opens the run and sends what is due, on the plugin's worker thread; credentials
    /// the server refuses end the plugin here.
    fn on_timer(&mut self) -> PluginResult {
        let Some(active) = &mut self.active else { return Ok(()) };
        active.uploader.tick();
        match active.uploader.fatal() {
            Some(fatal) => Err(PluginError::msg(fatal.to_string())),
            None => Ok(()),
        }
    }

    fn save_state(&mut self) -> PluginResult<Vec<u8>> {
        let id = self.active.as_ref().and_then(|a| a.uploader.run_id()).or_else(|| self.resumed_run_id.clone());
        Ok(id.map(|id| json!({ "run_id": id }).to_string().into_bytes()).unwrap_or_default())
    }

    fn load_state(&mut self, state: &[u8]) -> PluginResult {
        if !state.is_empty() {
            let state: serde_json::Value = serde_json::from_slice(state)?;
            self.resumed_run_id = state["run_id"].as_str().map(str::to_string);
        }
        Ok(())
    }

    fn on_run_end(&mut self, end: &RunEnd<'_>) -> PluginResult<Option<serde_json::Value>> {
        let Some(mut active) = self.active.take() else { return Ok(None) };
        let status = RunStatus::from_exit_code(end.exit_code);
        active.uploader.push(vec![Item::Status { status, end_time: Some(now_ms()) }]);
        let report = active.uploader.finish(self.settings.end_timeout);
        if let Some(fatal) = report.fatal {
            return Err(PluginError::msg(fatal));
        }
        let record = active.state.read_record().ok().flatten();
        let run_url = record.as_ref().and_then(|r| {
            Some(format!("{}/#/experiments/{}/runs/{}", self.settings.uri, r.experiment_id.as_ref()?, r.run_id.as_ref()?))
                .filter(|_| self.settings.uri_problem.is_none())
        });
        let pending = active.state.pending_path();
        let sync_command = format!("ptrain sync mlflow {}", active.run_dir.display());
        let mut fragment = json!({
            "uri": self.settings.uri,
            "experiment": self.settings.experiment,
            "run_id": report.run_id,
            "run_url": run_url,
            "status": status.as_str(),
            "sent": report.sent,
            "pending_items": report.pending_items,
            "refused": report.refused,
        });
        // Items of an earlier part of a resumed run may wait too.
        if report.pending_items > 0 || active.state.unsynced_bytes().unwrap_or(0) > 0 {
            let what = match (report.pending_items, report.gave_up) {
                (0, _) => "items of an earlier part of this run".to_string(),
                (n, true) => format!("{n} items not sent (still sending after {:.0} s)", self.settings.end_timeout.as_secs_f64()),
                (n, false) => format!("{n} items not sent"),
            };
            self.log(LogLevel::Info, &format!("{what} are in {}; send them with: {sync_command}", pending.display()));
            fragment["pending_file"] = json!(pending);
            fragment["sync_command"] = json!(sync_command);
        } else if let Some(url) = &run_url {
            self.log(LogLevel::Info, &format!("run {status} at {url}", status = status.as_str()));
        }
        self.ended = Some(Ended { state: active.state, run_dir: active.run_dir, start_time: active.start_time, online: report.online });
        Ok(Some(fragment))
    }
}

impl Drop for Mlflow {
    fn drop(&mut self) {
        // The host stopped calling us without ending the run (we failed, or training
        // did): end it as FAILED, within the same bounded time.
        if let Some(mut active) = self.active.take() {
            if active.uploader.fatal().is_none() {
                active.uploader.push(vec![Item::Status { status: RunStatus::Failed, end_time: Some(now_ms()) }]);
                active.uploader.finish(self.settings.end_timeout);
            }
        }
        if let Some(ended) = self.ended.take() {
            self.upload_summary(ended);
        }
    }
}

export_plugin!(Mlflow);

#[cfg(test)]
mod tests;
