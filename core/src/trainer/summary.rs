//! `<run-dir>/summary.json`: the figures of the part of the run that just ended,
//! and in `parts` every part of the run so far (a resumed run appends one part to
//! the `parts` of the summary it finds): where each started and ended, its wall
//! time, and why it ended.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{ending::FailedBy, failure::RunError};
use crate::host::{BusyAtSave, Failure, LoadedInfo, Stall};

#[derive(Debug, Clone, Serialize, Default)]
pub struct PhaseSummary {
    pub data_s: f64,
    pub forward_s: f64,
    pub backward_s: f64,
    pub optimizer_s: f64,
    /// Inside inline plugins' step hooks.
    pub hooks_s: f64,
}

/// One evaluation: the objective's loss and metrics over the held-out batches.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalPoint {
    pub step: u64,
    pub loss: f64,
    /// Classification's accuracy (also among `metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Held-out samples the evaluation covered, all ranks together (rows; with
    /// `data.packing`, packed sequences; text windows for language-model data).
    pub samples: u64,
    /// Every metric of the objective, as `eval/<name>` reports it (not in
    /// `summary.json`, which keeps `accuracy` alone).
    #[serde(skip)]
    pub metrics: Vec<(&'static str, f64)>,
}

/// A checkpoint as the disk holds it at the end of the run.
#[derive(Debug, Clone, Serialize)]
pub struct OnDisk {
    pub step: u64,
    pub path: std::path::PathBuf,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// `completed`, `interrupted`, `stopped` (a plugin ended it early: exit 0),
    /// `nonfinite` or `failed` (an error or a panic, or a plugin's failure: see
    /// `error`, and `failed_by`).
    pub status: String,
    pub exit_code: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// Why a `failed` run failed, and at which step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
    /// The plugin whose request ended the run (`HostApi::request_stop`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
    /// The plugin that failed the run, with the hook and step (a critical plugin's
    /// failure or stall, `HostApi::request_failure_stop`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_by: Option<FailedBy>,
    pub steps: u64,
    pub start_step: u64,
    pub last_step: u64,
    pub total_steps: u64,
    pub samples: u64,
    pub tokens: u64,
    /// Passes over the training samples, since the start of training.
    pub epochs: f64,
    /// Instruction data: the tokens the loss was computed on (all ranks), their
    /// rate, and the rows read, cut and left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trained_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trained_tokens_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_rows: Option<crate::data::instruct::RowCounts>,
    pub wall_s: f64,
    pub setup_s: f64,
    pub steps_per_s: f64,
    pub samples_per_s: f64,
    pub tokens_per_s: f64,
    pub first_loss: Option<f64>,
    pub final_loss: Option<f64>,
    pub final_eval_loss: Option<f64>,
    pub evals: Vec<EvalPoint>,
    pub phase_times: PhaseSummary,
    pub peak_memory_bytes: u64,
    pub device: String,
    pub device_name: String,
    pub precision: String,
    pub world_size: u32,
    pub collective_s: f64,
    /// `dist.shard` as trained (`none` when there was a single rank).
    pub shard: String,
    /// Per rank, measured from the tensors held: optimizer state, gradient held
    /// after the last step, and gradient held when a step's gradient is reduced.
    pub optimizer_state_bytes: Vec<u64>,
    pub gradient_bytes: Vec<u64>,
    pub gradient_peak_bytes: Vec<u64>,
    /// Per rank: parameters held between steps (`parameters`: the rank's chunks),
    /// and peak memory (CUDA's peak allocated, or the peak RSS).
    pub parameter_bytes: Vec<u64>,
    pub rank_peak_memory_bytes: Vec<u64>,
    /// Per rank: the peak memory once the model was loaded (built, `model.init_from`
    /// read, cut into shards with `parameters`), before the optimizer's buffers.
    pub rank_load_peak_memory_bytes: Vec<u64>,
    /// Per rank, with `parameters`: the bytes the largest block takes while gathered
    /// (bf16 under `train.precision = "bf16"`: half of float32's); 0 otherwise.
    pub gathered_block_bytes: Vec<u64>,
    pub model: String,
    /// Every parameter of the model, and those trained (with LoRA, the adapters'
    /// only: the base is frozen and has no gradient nor optimizer state).
    pub parameters: u64,
    pub trainable_parameters: u64,
    pub nonfinite_steps: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<String>,
    /// The newest complete checkpoint on disk once the plugins have ended (rank 0;
    /// a save given up on is not there), where `--auto-resume` continues.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<OnDisk>,
    pub checkpoint_wait_s: f64,
    /// GRPO from prompts: the steps' seconds in the rollout stage (sampling, scoring)
    /// and the rest of them (learning), inside `wall_s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampling_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learning_s: Option<f64>,
    pub plugins_loaded: Vec<LoadedInfo>,
    pub plugin_failures: Vec<Failure>,
    /// Plugins that took themselves off the schedule, with why.
    pub detached_plugins: BTreeMap<String, String>,
    /// Worker plugins given up on at the end (`finish_timeout_s`, a signal during
    /// the drain), with how many events each never handled.
    pub abandoned_plugins: BTreeMap<String, u64>,
    /// Plugins whose calls ran longer than their `hook_warn_s` (an inline one held
    /// training meanwhile): the longest such call, and how many there were.
    pub plugin_stalls: BTreeMap<String, Stall>,
    pub queue_drops: BTreeMap<String, u64>,
    /// Saves that found a worker plugin busy in a call of its own: how many, and how
    /// many kept the state it gave at an earlier save (training does not wait for it).
    pub busy_at_save: BTreeMap<String, BusyAtSave>,
    /// Per worker plugin: seconds the training thread waited for room in its full
    /// queue (`on_full = "block"`), inside `wall_s`.
    pub queue_blocked_s: BTreeMap<String, f64>,
    /// Per worker plugin: seconds its end-of-run drain took (after `wall_s`).
    pub plugin_drain_s: BTreeMap<String, f64>,
    pub plugins: BTreeMap<String, serde_json::Value>,
    /// Every part of the run, oldest first, this one last (see the module doc).
    pub parts: Vec<serde_json::Value>,
}

impl Summary {
    /// This part of the run, as `parts` lists it; `started_at` in Unix seconds.
    fn part(&self, started_at: f64) -> serde_json::Value {
        serde_json::json!({
            "start_step": self.start_step,
            "last_step": self.last_step,
            "steps": self.steps,
            "started_at": started_at,
            "wall_s": self.wall_s,
            "status": self.status,
            "exit_code": self.exit_code,
            "stop_reason": self.stop_reason,
            "error": self.error,
            "resumed_from": self.resumed_from,
            "first_loss": self.first_loss,
            "final_loss": self.final_loss,
            "evals": self.evals,
        })
    }

    /// Fills `parts`: those of the summary at `path` when this part resumed the
    /// run (a summary from before `parts` existed counts as one part), then this one.
    pub fn with_parts(mut self, path: &std::path::Path, started_at: f64) -> Summary {
        let earlier =
            self.resumed_from.as_ref().and_then(|_| std::fs::read(path).ok()).and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
        let found = earlier.clone().filter(|_| self.steps == 0);
        let mut parts: Vec<serde_json::Value> = match earlier {
            Some(serde_json::Value::Object(mut old)) => match old.remove("parts") {
                Some(serde_json::Value::Array(parts)) => parts,
                _ => {
                    let keys =
                        ["start_step", "last_step", "steps", "wall_s", "status", "exit_code", "stop_reason", "first_loss", "final_loss", "evals"];
                    vec![serde_json::Value::Object(keys.iter().filter_map(|k| Some((k.to_string(), old.get(*k)?.clone()))).collect())]
                }
            },
            _ => Vec::new(),
        };
        // This part's own earlier record (the summary written first after a signal at the end).
        parts.retain(|p| p.get("started_at").and_then(serde_json::Value::as_f64) != Some(started_at));
        parts.push(self.part(started_at));
        self.parts = parts;
        if let Some(found) = found {
            self.carry_losses(&found);
        }
        self
    }

    /// A resumed part that trained nothing (a finished run resumed: "nothing to
    /// train") keeps the run's losses and evaluations from the summary it found,
    /// rather than blanking the record of the run with its own empty ones.
    fn carry_losses(&mut self, old: &serde_json::Value) {
        let loss = |key: &str| old.get(key).and_then(serde_json::Value::as_f64);
        self.first_loss = self.first_loss.or(loss("first_loss"));
        self.final_loss = self.final_loss.or(loss("final_loss"));
        self.final_eval_loss = self.final_eval_loss.or(loss("final_eval_loss"));
        if self.evals.is_empty() {
            self.evals = old.get("evals").and_then(|e| serde_json::from_value(e.clone()).ok()).unwrap_or_default();
        }
    }

    /// What the summary says that a user needs, on one line of JSON: how the run
    /// ended, where it got to, its losses, and its newest checkpoint. Printed on
    /// stderr when the summary cannot be written, or its write never returns.
    pub fn essentials(&self) -> serde_json::Value {
        // As the disk holds it at the end; the plugin's report beside it.
        let checkpoint = self
            .plugins
            .get("checkpoint")
            .map(|c| serde_json::json!({ "newest": self.checkpoint, "dir": c.get("dir"), "latest": c.get("latest"), "kept": c.get("kept") }));
        serde_json::json!({
            "status": self.status,
            "exit_code": self.exit_code,
            "error": self.error,
            "stop_reason": self.stop_reason,
            "start_step": self.start_step,
            "last_step": self.last_step,
            "total_steps": self.total_steps,
            "first_loss": self.first_loss,
            "final_loss": self.final_loss,
            "final_eval_loss": self.final_eval_loss,
            "checkpoint": checkpoint,
            "plugin_failures": self.plugin_failures.len(),
            "abandoned_plugins": self.abandoned_plugins,
        })
    }

    /// Writes the summary through a temporary file and a rename; a write that fails
    /// (a full disk) leaves no temporary file behind.
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).expect("summary serializes");
        let tmp = path.with_extension("json.tmp");
        let written = std::fs::write(&tmp, text + "\n").and_then(|()| std::fs::rename(&tmp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}
