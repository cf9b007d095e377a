//! `checkpoint`: saves the run every `every` steps (default 1000) and at the end,
//! atomically and off the training thread, and keeps the `keep_last` newest plus the
//! `keep_best` best by a metric.
//!
//! The loop blocks only while the host copies tensors to host memory; this plugin's
//! worker thread writes them (see `ptrain_checkpoint` for the format and why a crash
//! never corrupts the latest checkpoint). A save that is due while the previous one
//! is still being written waits for it: saves never overlap and are never dropped.
//!
//! Options (`[plugins.checkpoint]`): `keep_last` (3), `keep_best` (1), `metric`
//! ("eval/loss"), `mode` ("min" | "max"), `dir` (default `<run-dir>/checkpoints`),
//! `on_save_error` ("continue" | "stop").
//!
//! It runs on every rank (`per_rank`). Unsharded runs hand checkpoints to rank 0
//! only. A sharded run (`dist.shard`) hands every rank its optimizer slice: ranks
//! other than 0 write their part and mark it done; rank 0 writes the rest, waits
//! (at most `dist.timeout_s`) for every part, and only then commits, updates
//! `latest` and applies retention.
//!
//! `latest` names the newest checkpoint by step (with checkpoints of an earlier part
//! of the run there too), `best` the best by `metric` among those scored (a
//! checkpoint is scored by the metric observed at its own step); `ptrain export
//! --checkpoint best` reads it.

mod gate;
mod retention;

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use ptrain_plugin_api::{
    export_plugin, parse_options, Attachment, Cadence, CheckpointPayload, Descriptor, Hook, HostApi, LogLevel, MetricBatch, Plugin, PluginResult,
    RunEnd, RunInfo, Threading,
};
use retention::{Action, Entry, Mode, Retention};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
enum OnSaveError {
    #[default]
    Continue,
    Stop,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Options {
    keep_last: usize,
    keep_best: usize,
    metric: String,
    mode: Mode,
    dir: Option<PathBuf>,
    on_save_error: OnSaveError,
}

impl Default for Options {
    fn default() -> Self {
        Options { keep_last: 3, keep_best: 1, metric: "eval/loss".into(), mode: Mode::Min, dir: None, on_save_error: OnSaveError::Continue }
    }
}

/// What survives in checkpoints: the scores of the checkpoints kept so far.
#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    entries: Vec<Entry>,
}

pub struct Checkpointer {
    options: Options,
    host: HostApi,
    dir: PathBuf,
    entries: Vec<Entry>,
    /// The monitored metric's value and the step it was observed at.
    last_metric: Option<(u64, f64)>,
    saved: u64,
    failed: u64,
    deleted: u64,
    write_s: f64,
    reported_errors: Vec<String>,
    latest: Option<String>,
    rank: u32,
    leftovers_removed: bool,
    /// How long rank 0 waits for the other ranks' parts of a sharded checkpoint
    /// (`RunInfo::collective_timeout_s`, `dist.timeout_s`).
    part_wait: Duration,
    /// `[debug] pause_save_at_step` and `pause_save_after_files` (`RunInfo::debug`), and the file
    /// that says the save paused (`<run-dir>/save-paused.rank<r>.json`).
    pause: Option<(u64, u32, PathBuf)>,
    /// `[debug] late_save_at_step` (`RunInfo::debug`).
    late: Option<gate::LateSave>,
}

const ATTACHMENTS: &[Attachment] = &[
    Attachment::new("save", Hook::Checkpoint, Cadence::every(1000).with_end()),
    // Receives eval results (they reach every sink) to score checkpoints.
    Attachment::new("metrics", Hook::Metrics, Cadence::NEVER),
];

impl Checkpointer {
    fn retention(&self) -> Retention {
        Retention { keep_last: self.options.keep_last, keep_best: self.options.keep_best, mode: self.options.mode }
    }

    fn save_failed(&mut self, step: u64, error: ptrain_checkpoint::Error) {
        self.failed += 1;
        let message = error.to_string();
        // One error line per kind of problem (read-only, no space, ...): a full disk
        // does not flood the log with one line per save.
        let kind = match &error {
            ptrain_checkpoint::Error::Io { source, .. } => format!("{:?}", source.kind()),
            ptrain_checkpoint::Error::Invalid { message, .. } => message.clone(),
        };
        if !self.reported_errors.contains(&kind) {
            let kept = self.entries.len();
            self.host.log(LogLevel::Error, "checkpoint", &format!("saving step {step} failed: {message} ({kept} older checkpoint(s) kept)"));
            self.reported_errors.push(kind);
        }
        if self.options.on_save_error == OnSaveError::Stop {
            self.host.request_failure_stop("checkpoint", &format!("saving step {step} failed: {message}"));
        }
    }

    /// Leftovers of a writer that crashed: never committed, safe to remove. With
    /// peers this waits for the first save, whose layout names this launch's
    /// staging directories (`keep`): a peer may already be writing into one.
    fn remove_leftovers(&mut self, keep: Option<&str>) {
        self.leftovers_removed = true;
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let ours = keep.is_some_and(|id| name.ends_with(&format!("-{id}")));
            if (name.starts_with(".tmp-") || name.starts_with(".trash-")) && !ours {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }

    fn apply_retention(&mut self, latest: u64) {
        for Action::Delete(step) in self.retention().plan(&self.entries, latest) {
            let path = self.dir.join(ptrain_checkpoint::dir_name(step));
            match ptrain_checkpoint::delete(&path) {
                Ok(()) => {
                    self.deleted += 1;
                    self.entries.retain(|e| e.step != step);
                }
                Err(e) => self.host.log(LogLevel::Warn, "checkpoint", &format!("could not delete {}: {e}", path.display())),
            }
        }
    }

    /// Writes `payload` (this rank's part of it, sharded), commits it on rank 0
    /// and applies retention.
    fn save(&mut self, payload: &CheckpointPayload, started: Instant) -> PluginResult {
        let layout = ptrain_checkpoint::ShardLayout::from_state_json(payload.state_json.as_str());
        if self.rank != 0 {
            if let Some(layout) = layout {
                let written = ptrain_checkpoint::write_part(&self.dir, payload, &layout, self.rank);
                self.write_s += started.elapsed().as_secs_f64();
                match written {
                    Ok(()) => self.saved += 1,
                    Err(e) => self.save_failed(payload.step, e),
                }
            }
            return Ok(());
        }
        if !self.leftovers_removed {
            self.remove_leftovers(layout.as_ref().map(|l| l.save_id.as_str()));
        }
        let gate = gate::HostGate { host: &self.host, late: self.late.as_ref() };
        let written = match &layout {
            Some(layout) => ptrain_checkpoint::write_sharded(&self.dir, payload, layout, self.part_wait, &gate),
            None => ptrain_checkpoint::write_gated(&self.dir, payload, &gate),
        };
        let written = written.and_then(|path| {
            let Some(path) = path else { return Ok(None) };
            let newest = self.entries.iter().map(|e| e.step).chain([payload.step]).max().unwrap_or(payload.step);
            ptrain_checkpoint::commit_latest(&self.dir, &ptrain_checkpoint::dir_name(newest))?;
            Ok(Some((path, ptrain_checkpoint::dir_name(newest))))
        });
        self.write_s += started.elapsed().as_secs_f64();
        match written {
            Ok(None) => {
                // The host gave this save up (it took longer than `finish_timeout_s`)
                // and has disabled the plugin: what was staged is removed, not committed.
                let message = format!("the save of step {} was given up by the run before its commit: not committed", payload.step);
                self.host.log(LogLevel::Warn, "checkpoint", &message);
            }
            Ok(Some((_, name))) => {
                self.saved += 1;
                self.latest = Some(name);
                // Only a metric observed at this very step scores this checkpoint.
                let score = self.last_metric.filter(|(step, _)| *step == payload.step).map(|(_, v)| v);
                self.entries.retain(|e| e.step != payload.step);
                self.entries.push(Entry { step: payload.step, score });
                self.apply_retention(payload.step);
                let best = self.retention().best(&self.entries).first().map(|e| ptrain_checkpoint::dir_name(e.step));
                if let Err(e) = ptrain_checkpoint::commit_best(&self.dir, best.as_deref()) {
                    self.host.log(LogLevel::Warn, "checkpoint", &format!("could not record the best checkpoint: {e}"));
                }
            }
            Err(e) => self.save_failed(payload.step, e),
        }
        Ok(())
    }
}

impl Plugin for Checkpointer {
    const DESCRIPTOR: Descriptor = Descriptor::new(
        "checkpoint",
        env!("CARGO_PKG_VERSION"),
        "atomic asynchronous checkpoints with keep-last and keep-best retention",
        Threading::Worker,
        ATTACHMENTS,
    )
    .per_rank();

    fn new(options: serde_json::Value, host: HostApi) -> PluginResult<Self> {
        let options: Options = parse_options(options)?;
        Ok(Checkpointer {
            options,
            host,
            dir: PathBuf::new(),
            entries: Vec::new(),
            last_metric: None,
            saved: 0,
            failed: 0,
            deleted: 0,
            write_s: 0.0,
            reported_errors: Vec::new(),
            latest: None,
            rank: 0,
            leftovers_removed: false,
            part_wait: Duration::from_secs(60),
            pause: None,
            late: None,
        })
    }

    fn on_run_start(&mut self, run: &RunInfo<'_>) -> PluginResult {
        self.dir = self.options.dir.clone().unwrap_or_else(|| ptrain_checkpoint::checkpoints_dir(std::path::Path::new(run.run_dir.as_str())));
        self.rank = run.rank;
        // The host's values, not the configuration re-read: nothing to fall back on.
        self.part_wait = Duration::from_secs_f64(run.collective_timeout_s.max(1.0));
        let ready = std::path::Path::new(run.run_dir.as_str()).join(format!("save-paused.rank{}.json", run.rank));
        let debug = run.debug;
        let files = debug.pause_save_after_files.clamp(1, u64::from(u32::MAX)) as u32;
        self.pause = (debug.pause_save_at_step > 0).then_some((debug.pause_save_at_step, files, ready));
        let run_dir = std::path::Path::new(run.run_dir.as_str());
        self.late = (debug.late_save_at_step > 0).then(|| gate::LateSave::new(debug.late_save_at_step, run_dir, run.rank));
        if self.rank != 0 {
            // Other ranks only write their parts; rank 0 owns the directory.
            return Ok(());
        }
        if run.world_size == 1 {
            self.remove_leftovers(None);
        }
        // Checkpoints already here (a resumed run) take part in retention; their
        // scores come from the state restored with the checkpoint.
        for (step, _) in ptrain_checkpoint::list(&self.dir) {
            if !self.entries.iter().any(|e| e.step == step) {
                self.entries.push(Entry { step, score: None });
            }
        }
        self.entries.retain(|e| self.dir.join(ptrain_checkpoint::dir_name(e.step)).is_dir());
        Ok(())
    }

    fn on_metrics(&mut self, batch: &MetricBatch) -> PluginResult {
        if let Some(value) = batch.scalar(&self.options.metric) {
            self.last_metric = Some((batch.step, value));
        }
        Ok(())
    }

    fn on_checkpoint(&mut self, payload: &CheckpointPayload) -> PluginResult {
        let started = Instant::now();
        if let Some((_, files, ready)) = self.pause.as_ref().filter(|(step, ..)| *step == payload.step) {
            ptrain_checkpoint::pause::arm(*files, ready.clone());
        }
        let result = self.save(payload, started);
        ptrain_checkpoint::pause::disarm();
        result
    }

    fn save_state(&mut self) -> PluginResult<Vec<u8>> {
        Ok(serde_json::to_vec(&State { entries: self.entries.clone() })?)
    }

    fn load_state(&mut self, state: &[u8]) -> PluginResult {
        self.entries = serde_json::from_slice::<State>(state)?.entries;
        Ok(())
    }

    fn on_run_end(&mut self, _end: &RunEnd<'_>) -> PluginResult<Option<serde_json::Value>> {
        let best = self.retention().best(&self.entries).first().copied();
        Ok(Some(serde_json::json!({
            "dir": self.dir.display().to_string(),
            "saved": self.saved,
            "failed": self.failed,
            "deleted": self.deleted,
            "write_s": self.write_s,
            "latest": self.latest,
            "kept": self.entries.iter().map(|e| e.step).collect::<Vec<_>>(),
            "best": best.map(|e| serde_json::json!({"step": e.step, "metric": self.options.metric, "value": e.score})),
        })))
    }
}

export_plugin!(Checkpointer);
