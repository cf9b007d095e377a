//! The `completions` record: every `grpo.log_completions_every` steps, each sampled
//! completion with its prompt and rewards as a line of `completions.jsonl` in the run
//! directory (TRL's `log_completions` table). Lines go to a writer thread: the
//! training thread never waits on the file.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::Path,
    sync::mpsc::{channel, Sender},
    thread::JoinHandle,
};

use serde_json::json;

use super::sampler::Sampled;
use crate::{
    data::prompts::PromptRow,
    error::{Error, Result},
};

pub struct CompletionLog {
    every: u64,
    lines: Option<Sender<String>>,
    writer: Option<JoinHandle<()>>,
}

impl CompletionLog {
    pub fn open(path: &Path, every: u64) -> Result<CompletionLog> {
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
        Ok(CompletionLog { every, lines: Some(lines), writer: Some(writer) })
    }

    /// Records one prompt's group when `step` is due.
    pub fn record(&self, step: u64, row: &PromptRow, completions: &[Sampled], texts: &[String], names: &[String], rewards: &[Vec<f64>]) {
        if !step.is_multiple_of(self.every) {
            return;
        }
        let Some(lines) = &self.lines else { return };
        for (i, (sampled, text)) in completions.iter().zip(texts).enumerate() {
            let scores: serde_json::Map<String, serde_json::Value> =
                names.iter().zip(rewards).map(|(name, r)| (name.clone(), finite_or_null(r[i]))).collect();
            let line = json!({
                "step": step,
                "prompt": row.text,
                "completion": text,
                "completion_ids": sampled.ids,
                "logps": sampled.logps,
                "rewards": scores,
            });
            let _ = lines.send(line.to_string());
        }
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
