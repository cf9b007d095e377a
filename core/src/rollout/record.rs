//! The `completions` record: every `grpo.log_completions_every` steps, each sampled
//! completion with its prompt, rewards and advantage as a line of `completions.jsonl`
//! in the run directory, and the step's completions as one table for the sinks (TRL's
//! `log_completions` table: W&B's table, TensorBoard's text), a `Text` metric named
//! [`COMPLETIONS`] holding `{"columns": [...], "rows": [[...], ...]}`.
//!
//! On several ranks each rank records its own groups; when the step's record is taken
//! every rank's rows are gathered ([`crate::dist::all_gather_bytes`], as TRL's
//! `gather_object`) in rank order, the batch's order, so the file (rank 0's) and the
//! table hold the whole batch. Lines go to a writer thread: the training thread never
//! waits on the file. All of it is done at the record's steps only; nothing at the
//! others.

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

use serde_json::{json, Value};
use tch::Device;

use super::sampler::Sampled;
use crate::{
    data::prompts::PromptRow,
    dist::{all_gather_bytes, Collectives},
    error::{Error, Result},
};

/// The name of the sinks' `completions` record.
pub const COMPLETIONS: &str = "completions";

/// The other ranks of a run on several, with whom the record is gathered.
pub struct Peers {
    pub collectives: Arc<dyn Collectives>,
    pub world: u32,
    /// The group's device (NCCL's collectives take CUDA tensors).
    pub device: Device,
}

pub struct CompletionLog {
    every: u64,
    rank: u32,
    peers: Option<Peers>,
    lines: Option<Sender<String>>,
    writer: Option<JoinHandle<()>>,
    /// This rank's records of the step so far, each a line of completions.jsonl.
    records: Vec<Value>,
    /// Whether the step recorded any: the same on every rank (each samples its share
    /// of the same micro-batches), so every rank gathers at the same steps.
    recorded: bool,
}

impl CompletionLog {
    /// The record of every `every` steps on rank `rank`: the sinks' table, and with
    /// `path` (rank 0) the file. Every rank makes the table (the whole batch's, with
    /// `peers`), which the host sends nowhere but from rank 0, so that every rank
    /// sends its metrics at the same steps (a collective may be in that batch).
    pub fn open(path: Option<&Path>, every: u64, rank: u32, peers: Option<Peers>) -> Result<CompletionLog> {
        let mut log = CompletionLog { every, rank, peers, lines: None, writer: None, records: Vec::new(), recorded: false };
        let Some(path) = path else { return Ok(log) };
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
        (log.lines, log.writer) = (Some(lines), Some(writer));
        Ok(log)
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
        self.recorded = true;
        let each = rows.iter().zip(completions).flat_map(|(row, group)| group.iter().map(move |sampled| (row, sampled)));
        for (i, (row, sampled)) in each.enumerate() {
            let scores: serde_json::Map<String, Value> = names.iter().zip(rewards).map(|(name, r)| (name.clone(), finite_or_null(r[i]))).collect();
            self.records.push(json!({
                "step": step,
                "rank": self.rank,
                "prompt": row.text,
                "completion": texts[i],
                "completion_ids": sampled.ids,
                "logps": sampled.logps,
                "rewards": scores,
                "advantage": finite_or_null(advantages[i]),
            }));
        }
    }

    /// The step's table for the sinks (its columns: step, prompt, completion, each of
    /// `names`' rewards, advantage), once its micro-batches are recorded: every rank's
    /// records gathered in rank order, written to the file (rank 0) and tabled; `None`
    /// at a step without a record, where nothing is gathered.
    pub fn take_table(&mut self, names: &[String]) -> Result<Option<String>> {
        if !std::mem::take(&mut self.recorded) {
            return Ok(None);
        }
        let records = self.gathered()?;
        if let Some(lines) = &self.lines {
            for record in &records {
                let _ = lines.send(record.to_string());
            }
        }
        let rows: Vec<Value> = records
            .iter()
            .map(|r| {
                let mut cells = vec![r["step"].clone(), r["prompt"].clone(), r["completion"].clone()];
                cells.extend(names.iter().map(|name| r["rewards"][name].clone()));
                cells.push(r["advantage"].clone());
                Value::Array(cells)
            })
            .collect();
        let columns: Vec<&str> = ["step", "prompt", "completion"].into_iter().chain(names.iter().map(String::as_str)).chain(["advantage"]).collect();
        Ok(Some(json!({ "columns": columns, "rows": rows }).to_string()))
    }

    /// The step's records of every rank, in rank order (this rank's alone on one).
    fn gathered(&mut self) -> Result<Vec<Value>> {
        let mine = std::mem::take(&mut self.records);
        let Some(peers) = &self.peers else { return Ok(mine) };
        let bytes = serde_json::to_vec(&mine).map_err(|e| Error::Other(format!("the completions record: {e}")))?;
        let parts = all_gather_bytes(peers.collectives.as_ref(), self.rank, peers.world, &bytes, peers.device)
            .map_err(|e| Error::Dist(format!("gathering the completions record: {e}")))?;
        let mut all = Vec::with_capacity(mine.len() * parts.len());
        for (rank, part) in parts.iter().enumerate() {
            let records: Vec<Value> =
                serde_json::from_slice(part).map_err(|e| Error::Dist(format!("rank {rank}'s completions record does not read back: {e}")))?;
            all.extend(records);
        }
        Ok(all)
    }
}

/// NaN (no reward: TRL's `None`) as JSON's null.
fn finite_or_null(v: f64) -> Value {
    serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)
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
