//! The `completions` record: every `grpo.log_completions_every` steps, each sampled
//! completion with its prompt, rewards and advantage as a line of `completions.jsonl`
//! in the run directory, and the step's completions as one table for the sinks (TRL's
//! `log_completions` table: W&B's table, TensorBoard's text), a `Text` metric named
//! [`COMPLETIONS`] holding `{"columns": [...], "rows": [[...], ...]}`. Lines go to a
//! writer thread: the training thread never waits on the file. Both are built at the
//! record's steps only; nothing is done at the others.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::Path,
    sync::{
        mpsc::{channel, Sender},
        Arc,
    },
    thread::JoinHandle,
};

use serde_json::json;

use super::sampler::Sampled;
use crate::{
    data::prompts::PromptRow,
    error::{Error, Result},
};

/// The name of the sinks' `completions` record.
pub const COMPLETIONS: &str = "completions";

pub struct CompletionLog {
    every: u64,
    lines: Option<Sender<String>>,
    writer: Option<JoinHandle<()>>,
    /// The rows of the step's table so far: step, prompt, completion, each reward,
    /// advantage.
    table: Vec<serde_json::Value>,
}

impl CompletionLog {
    /// The record of every `every` steps: the sinks' table, and with `path` (rank 0)
    /// the file. The other ranks make their tables too, which the host sends nowhere,
    /// so that every rank sends its metrics at the same steps (a collective may be in
    /// that batch).
    pub fn open(path: Option<&Path>, every: u64) -> Result<CompletionLog> {
        let Some(path) = path else {
            return Ok(CompletionLog { every, lines: None, writer: None, table: Vec::new() });
        };
        let file = File::create(path).map_err(|e| Error::Other(format!("{}: {e}", path.display())))?;
        let (lines, received) = channel::<String>();
        let shown = path.display().to_string();
        let writer = std::thread::Builder::new()
            .name("ptrain-completions".into())
            .spawn(move || {
                let mut out = BufWriter::new(file);
                let written = received.iter().try_for_each(|line| writeln!(out, "{line}").and_then(|_| out.flush()));
                if let Err(e) = written {
                    tracing::warn!("{shown}: {e}: completions are no longer recorded");
                }
            })
            .map_err(|e| Error::Other(format!("starting the completions writer: {e}")))?;
        Ok(CompletionLog { every, lines: Some(lines), writer: Some(writer), table: Vec::new() })
    }

    /// Whether `step`'s completions are recorded.
    pub fn due(&self, step: u64) -> bool {
        step.is_multiple_of(self.every)
    }

    /// Records a micro-batch's groups (`completions[g]`, prompt `rows[g]`), their texts,
    /// rewards by function (`rewards[f][i]`, completion `i` of the micro-batch) and
    /// advantages, at a step that is [`CompletionLog::due`].
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &mut self,
        step: u64,
        rows: &[Arc<PromptRow>],
        completions: &[Vec<Sampled>],
        texts: &[String],
        names: &[String],
        rewards: &[Vec<f64>],
        advantages: &[f64],
    ) {
        let each = rows.iter().zip(completions).flat_map(|(row, group)| group.iter().map(move |sampled| (row, sampled)));
        for (i, (row, sampled)) in each.enumerate() {
            let mut cells = vec![json!(step), json!(row.text), json!(texts[i])];
            cells.extend(rewards.iter().map(|r| finite_or_null(r[i])));
            cells.push(finite_or_null(advantages[i]));
            self.table.push(serde_json::Value::Array(cells));
            let Some(lines) = &self.lines else { continue };
            let scores: serde_json::Map<String, serde_json::Value> =
                names.iter().zip(rewards).map(|(name, r)| (name.clone(), finite_or_null(r[i]))).collect();
            let line = json!({
                "step": step,
                "prompt": row.text,
                "completion": texts[i],
                "completion_ids": sampled.ids,
                "logps": sampled.logps,
                "rewards": scores,
                "advantage": finite_or_null(advantages[i]),
            });
            let _ = lines.send(line.to_string());
        }
    }

    /// The step's table for the sinks (its columns: step, prompt, completion, each of
    /// `names`' rewards, advantage), once its micro-batches are recorded; `None` at a
    /// step without a record.
    pub fn take_table(&mut self, names: &[String]) -> Option<String> {
        if self.table.is_empty() {
            return None;
        }
        let columns: Vec<&str> = ["step", "prompt", "completion"].into_iter().chain(names.iter().map(String::as_str)).chain(["advantage"]).collect();
        Some(json!({ "columns": columns, "rows": std::mem::take(&mut self.table) }).to_string())
    }
}

/// NaN (no reward: TRL's `None`) as JSON's null.
fn finite_or_null(v: f64) -> serde_json::Value {
    serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, serde_json::Value::Number)
}

impl Drop for CompletionLog {
    /// Closes the channel and waits for the writer: every line recorded is written.
    fn drop(&mut self) {
        self.lines = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}
