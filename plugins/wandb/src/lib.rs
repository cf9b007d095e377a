//! `wandb`: Weights & Biases runs without the Python SDK.
//!
//! By default an offline run directory that the real `wandb sync` uploads later
//! (`<run-dir>/wandb/offline-run-<YYYYMMDD_HHMMSS>-<id>/run-<id>.wandb`). With
//! `WANDB_MODE=online` and `WANDB_API_KEY` the run is also streamed to the W&B API
//! by the plugin's timer, on its worker thread (rows, and the tables' files), and
//! the local copy still holds everything.
//!
//! Cadence: basic metrics every 10 steps and at the end, detailed ones (grad norm,
//! phase times, memory) every 50, histograms off unless `[plugins.wandb.histograms]
//! every = N`. Options and environment variables: see `settings.rs` and
//! docs/plugins/wandb.md. A GRPO run's `completions` record is logged as a W&B
//! table ([`table`]). The run always ends with an exit record, also after an
//! interrupt (exit code 130/143) or a failure (1), so `wandb sync` never sees a crash.

pub mod api;
pub mod history;
pub mod leveldb;
pub mod meta;
pub mod offline;
pub mod online;
pub mod proto;
pub mod settings;
pub mod table;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use ptrain_plugin_api::{
    export_plugin, parse_options, Attachment, Cadence, Descriptor, Hook, HostApi, MetricBatch, MetricValue, Needs, Plugin, PluginError, PluginResult,
    RunEnd, RunInfo, Threading,
};
use serde_json::json;

use crate::{
    history::{Latest, Row},
    meta::RunMeta,
    offline::OfflineRun,
    online::Online,
    settings::{Mode, Settings},
};

const ATTACHMENTS: &[Attachment] = &[
    Attachment::new("metrics", Hook::Metrics, Cadence::every(10).with_end()).needs(Needs::BASIC_METRICS),
    Attachment::new("detailed", Hook::Metrics, Cadence::every(50)).needs(Needs::DETAILED_METRICS),
    Attachment::new("histograms", Hook::Metrics, Cadence::NEVER).needs(Needs::HISTOGRAMS),
];

pub struct Wandb {
    settings: Settings,
    /// The W&B run id saved in the checkpoint being resumed.
    resumed_id: Option<String>,
    active: Option<Active>,
}

struct Active {
    meta: RunMeta,
    offline: OfflineRun,
    online: Option<Online>,
    latest: Latest,
    rows: u64,
}

/// `path` as a shell word, for a command people copy.
fn shell_word(path: &Path) -> String {
    let s = path.display().to_string();
    if s.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@".contains(c)) {
        s
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn runtime_since(start: f64) -> f64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(start);
    (now - start).max(0.0)
}

impl Active {
    /// Writes the summary and the exit record and ends the upload; returns the
    /// summary fragment, or the error that kept the exit record from the file.
    fn finish(mut self, settings: &Settings, exit_code: i32) -> Result<serde_json::Value, String> {
        let runtime = runtime_since(self.meta.start_time);
        let summary = self.latest.items(runtime);
        let written = self.offline.write_summary(&summary).and_then(|()| self.offline.write_exit(exit_code, runtime));
        let dir = std::fs::canonicalize(self.offline.dir()).unwrap_or_else(|_| self.offline.dir().to_path_buf());
        let mut fragment = json!({
            "mode": if self.online.is_some() { "online" } else { "offline" },
            "run_id": self.meta.id,
            "dir": dir,
            "rows": self.rows,
        });
        // `wandb sync` skips directories of online runs unless told otherwise. A
        // resumed offline run is uploaded with the directories of its earlier parts
        // (already synced ones are skipped), which `wandb sync` appends in start order.
        let sync = if self.online.is_some() {
            format!("wandb sync --include-online {}", shell_word(&dir))
        } else {
            let parts = if self.meta.resume { crate::offline::parts_of(&dir, &self.meta.id) } else { vec![dir.clone()] };
            format!("wandb sync {}", parts.iter().map(|p| shell_word(p)).collect::<Vec<_>>().join(" "))
        };
        let upload = self.online.take().map(|online| online.finish(exit_code, self.latest.json(runtime), settings.upload_timeout));
        match &upload {
            // A file that could not be finished is reported by the host as our error.
            None if written.is_err() => {}
            None => {
                eprintln!("wandb: offline run saved in {}\nwandb: upload it with: {sync}", dir.display());
                fragment["sync_command"] = json!(sync);
            }
            Some(report) if report.complete => {
                let url = report.run.as_ref().map(|r| settings.run_url(&r.entity, &r.project, &r.id)).unwrap_or_default();
                let files = if report.files_sent > 0 { format!(", {} files", report.files_sent) } else { String::new() };
                eprintln!("wandb: run uploaded: {url} ({} rows{files}; local copy in {})", report.rows_sent, dir.display());
                fragment["upload"] = json!({ "complete": true, "rows_sent": report.rows_sent, "files_sent": report.files_sent, "url": url });
            }
            Some(report) => {
                let why = report.error.clone().unwrap_or_default();
                eprintln!(
                    "wandb: upload incomplete ({} of {} rows, {} of {} files sent): {why}\nwandb: the local copy has everything; upload it with: {sync}",
                    report.rows_sent,
                    report.rows_sent + report.rows_not_sent,
                    report.files_sent,
                    report.files_sent + report.files_not_sent
                );
                fragment["sync_command"] = json!(sync);
                fragment["upload"] = json!({
                    "complete": false,
                    "rows_sent": report.rows_sent,
                    "rows_not_sent": report.rows_not_sent,
                    "files_sent": report.files_sent,
                    "files_not_sent": report.files_not_sent,
                    "error": why,
                });
            }
        }
        written.map_err(|e| format!("cannot write {}: {e}", self.offline.file().display()))?;
        Ok(fragment)
    }
}

/// Writes the batch's `completions` record as a table file with its files record, and
/// points the row's value at it (see [`table`]); answers the files' paths under the
/// run's files, for the online upload.
fn write_tables(batch: &MetricBatch, offline: &mut OfflineRun, row: &mut Row) -> std::io::Result<Vec<String>> {
    let mut paths = Vec::new();
    for m in batch.metrics.iter().filter(|m| m.name.as_str() == table::NAME) {
        let MetricValue::Text(text) = &m.value else { continue };
        let Some(written) = table::write(&offline.files_dir(), table::NAME, batch.step, text.as_str())? else { continue };
        offline.write_files(vec![written.path.clone()])?;
        if let Some(item) = row.items.iter_mut().find(|(key, _)| key == table::NAME) {
            item.1 = written.value;
        }
        paths.push(written.path);
    }
    Ok(paths)
}

impl Wandb {
    fn start(&self, run: &RunInfo<'_>) -> Result<Active, String> {
        let s = &self.settings;
        let id = s.id.clone().or_else(|| self.resumed_id.clone()).unwrap_or_else(meta::new_run_id);
        let run_dir = PathBuf::from(run.run_dir.as_str());
        let root = s.dir.clone().unwrap_or_else(|| run_dir.clone());
        let default_name = run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| run.run_name.to_string());
        let meta = RunMeta {
            id: id.clone(),
            project: s.project.clone(),
            entity: s.entity.clone(),
            display_name: s.name.clone().unwrap_or(default_name),
            tags: s.tags.clone(),
            group: s.group.clone(),
            job_type: s.job_type.clone(),
            notes: s.notes.clone(),
            host: meta::hostname(),
            config: meta::config_from_toml(run.config_toml.as_str())?,
            start_time: run.start_time,
            starting_step: run.start_step,
            resume: run.start_step > 0,
        };
        let prefix = if s.mode == Mode::Online { "run" } else { "offline-run" };
        let mut stamp_time = run.start_time;
        let mut offline = loop {
            match OfflineRun::create(&root, prefix, &meta::local_stamp(stamp_time), &id) {
                // A resumed run that starts within the second its previous part started
                // in: the next free second keeps the directories in start order.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && stamp_time < run.start_time + 60.0 => stamp_time += 1.0,
                created => break created,
            }
        }
        .map_err(|e| format!("cannot create a W&B run directory in {}: {e}", root.join("wandb").display()))?;
        offline.write_run(&meta).map_err(|e| format!("cannot write {}: {e}", offline.file().display()))?;
        let online = match (s.mode, &s.api_key) {
            (Mode::Online, Some(key)) => Some(Online::start(api::Api::new(&s.base_url, key), meta.clone())),
            _ => None,
        };
        Ok(Active { meta, offline, online, latest: Latest::default(), rows: 0 })
    }

    /// Ends the run with `exit_code` after a failure of ours, so the file still
    /// ends with an exit record, and hands back the failure to report.
    fn abandon(&mut self, error: String, exit_code: i32) -> PluginError {
        if let Some(active) = self.active.take() {
            let _ = active.finish(&self.settings, exit_code);
        }
        PluginError::msg(error)
    }
}

impl Plugin for Wandb {
    const DESCRIPTOR: Descriptor = Descriptor::new(
        "wandb",
        env!("CARGO_PKG_VERSION"),
        "Weights & Biases: offline runs for `wandb sync`, or online with WANDB_MODE=online",
        Threading::Worker,
        ATTACHMENTS,
    );

    fn new(options: serde_json::Value, _host: HostApi) -> PluginResult<Self> {
        let options = parse_options(options)?;
        let settings = Settings::resolve(options, |var| std::env::var(var).ok()).map_err(|e| PluginError::msg(format!("invalid options: {e}")))?;
        Ok(Wandb { settings, resumed_id: None, active: None })
    }

    fn on_run_start(&mut self, run: &RunInfo<'_>) -> PluginResult {
        if self.settings.mode == Mode::Disabled {
            return Ok(());
        }
        self.active = Some(self.start(run).map_err(PluginError::msg)?);
        Ok(())
    }

    fn on_metrics(&mut self, batch: &MetricBatch) -> PluginResult {
        let Some(active) = self.active.as_mut() else { return Ok(()) };
        let runtime = (batch.wall_time - active.meta.start_time).max(0.0);
        let mut row = Row::from_batch(batch, runtime);
        let tables = match write_tables(batch, &mut active.offline, &mut row) {
            Ok(paths) => paths,
            Err(e) => {
                let error = format!("cannot write {}: {e}", active.offline.files_dir().display());
                return Err(self.abandon(error, 1));
            }
        };
        active.latest.update(&row);
        if let Err(e) = active.offline.write_history(&row) {
            let error = format!("cannot write {}: {e}", active.offline.file().display());
            return Err(self.abandon(error, 1));
        }
        active.rows += 1;
        if let Some(online) = &mut active.online {
            // The row streams the same `table-file` value as the local copy's, and the
            // table's file goes up before it, as the official client uploads it.
            for path in tables {
                let local = active.offline.files_dir().join(&path);
                online.push_file(path, local);
            }
            online.push(row.json_line(), active.latest.json(runtime));
        }
        Ok(())
    }

    fn timer_interval(&self) -> PluginResult<Option<Duration>> {
        Ok((self.settings.mode != Mode::Disabled).then_some(online::TICK))
    }

    /// Flushes the offline file every 5 s and streams rows online, on the plugin's
    /// worker thread.
    fn on_timer(&mut self) -> PluginResult {
        let Some(active) = self.active.as_mut() else { return Ok(()) };
        if let Err(e) = active.offline.flush_if_due() {
            let error = format!("cannot write {}: {e}", active.offline.file().display());
            return Err(self.abandon(error, 1));
        }
        if let Some(online) = &mut active.online {
            online.tick();
        }
        Ok(())
    }

    fn save_state(&mut self) -> PluginResult<Vec<u8>> {
        let id = self.active.as_ref().map(|a| a.meta.id.clone()).or_else(|| self.resumed_id.clone());
        Ok(id.map(|id| json!({ "run_id": id }).to_string().into_bytes()).unwrap_or_default())
    }

    fn load_state(&mut self, state: &[u8]) -> PluginResult {
        let state: serde_json::Value = serde_json::from_slice(state)?;
        self.resumed_id = state["run_id"].as_str().map(str::to_string);
        Ok(())
    }

    fn on_run_end(&mut self, end: &RunEnd<'_>) -> PluginResult<Option<serde_json::Value>> {
        let Some(active) = self.active.take() else { return Ok(None) };
        active.finish(&self.settings, end.exit_code).map(Some).map_err(PluginError::msg)
    }
}

impl Drop for Wandb {
    /// The host stopped calling us (we failed, or training failed) without ending
    /// the run: end it as failed, so `wandb sync` sees an exit record.
    fn drop(&mut self) {
        if let Some(active) = self.active.take() {
            let _ = active.finish(&self.settings, 1);
        }
    }
}

export_plugin!(Wandb);

#[cfg(test)]
mod tests;
