//! `jsonl`: writes `<run-dir>/metrics.jsonl`, one flat JSON object per emitted step:
//! `{"step": 120, "train/loss": 2.31, "train/lr": 0.0006, ...}`. Scalars only.
//!
//! Options (`[plugins.jsonl]`): `path` (default `<run-dir>/metrics.jsonl`) and
//! `detailed` (default true: also grad norm, phase times and memory).

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::PathBuf,
};

use ptrain_plugin_api::{
    export_plugin, parse_options, Attachment, Cadence, Descriptor, Hook, HostApi, MetricBatch, MetricValue, Needs, Plugin, PluginResult, RunEnd,
    RunInfo, Threading,
};
use serde::Deserialize;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct Options {
    path: Option<PathBuf>,
    detailed: Option<bool>,
}

pub struct Jsonl {
    options: Options,
    out: Option<BufWriter<File>>,
    lines: u64,
}

const ATTACHMENTS: &[Attachment] =
    &[Attachment::new("metrics", Hook::Metrics, Cadence::every(10).with_end()).needs(Needs::BASIC_METRICS.union(Needs::DETAILED_METRICS))];

impl Plugin for Jsonl {
    const DESCRIPTOR: Descriptor = Descriptor::new(
        "jsonl",
        env!("CARGO_PKG_VERSION"),
        "every emitted step as one JSON object per line in <run-dir>/metrics.jsonl",
        Threading::Worker,
        ATTACHMENTS,
    );

    fn new(options: serde_json::Value, _host: HostApi) -> PluginResult<Self> {
        Ok(Jsonl { options: parse_options(options)?, out: None, lines: 0 })
    }

    fn on_run_start(&mut self, run: &RunInfo<'_>) -> PluginResult {
        let path = self.options.path.clone().unwrap_or_else(|| PathBuf::from(run.run_dir.as_str()).join("metrics.jsonl"));
        // Append, so a resumed run continues the same file.
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
        self.out = Some(BufWriter::new(file));
        Ok(())
    }

    fn on_metrics(&mut self, batch: &MetricBatch) -> PluginResult {
        let Some(out) = self.out.as_mut() else { return Ok(()) };
        // A batch of text alone (a GRPO run's `completions` record at a step without
        // metrics) has no number to write; completions.jsonl holds the completions.
        if !batch.metrics.is_empty() && batch.metrics.iter().all(|m| matches!(m.value, MetricValue::Text(_))) {
            return Ok(());
        }
        let detailed = self.options.detailed.unwrap_or(true);
        let mut row = serde_json::Map::new();
        row.insert("step".into(), batch.step.into());
        for (name, value) in batch.scalars() {
            if !(detailed || name.starts_with("train/") || name.starts_with("eval/")) {
                continue;
            }
            // JSON has no NaN or infinity: they are written as null.
            row.insert(name.into(), serde_json::Number::from_f64(value).map_or(serde_json::Value::Null, serde_json::Value::Number));
        }
        serde_json::to_writer(&mut *out, &row)?;
        out.write_all(b"\n")?;
        out.flush()?;
        self.lines += 1;
        Ok(())
    }

    fn on_run_end(&mut self, _end: &RunEnd<'_>) -> PluginResult<Option<serde_json::Value>> {
        if let Some(mut out) = self.out.take() {
            out.flush()?;
        }
        Ok(Some(serde_json::json!({ "lines": self.lines })))
    }
}

export_plugin!(Jsonl);
