//! `tensorboard`: native TensorBoard event files under `<run-dir>/tensorboard/`.
//!
//! Scalars (basic and detailed metrics) every 10 steps, parameter and gradient
//! histograms every 500 (`[plugins.tensorboard.histograms] every = 0` turns them
//! off), the resolved configuration as text at the start, and a GRPO run's
//! `completions` record (`grpo.log_completions_every`) as a markdown table. Runs on its own
//! worker thread; records are buffered and flushed by the plugin's timer every
//! `flush_secs` (called on that thread) and at the end.
//!
//! Options (`[plugins.tensorboard]`): `logdir` (default `<run-dir>/tensorboard`),
//! `flush_secs` (default 30). An I/O error disables the plugin with one error line.

pub mod completions;
pub mod event_file;
pub mod flushed;
pub mod proto;
pub mod tfrecord;

use std::{path::PathBuf, time::Duration};

use ptrain_plugin_api::{
    export_plugin, parse_options, Attachment, Cadence, Descriptor, Hook, HostApi, MetricBatch, MetricValue, Needs, Plugin, PluginError, PluginResult,
    RunEnd, RunInfo, Threading,
};
use serde::Deserialize;

use crate::{
    flushed::FlushedWriter,
    proto::{Event, HistogramProto, Value},
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Options {
    logdir: Option<PathBuf>,
    flush_secs: f64,
}

impl Default for Options {
    fn default() -> Options {
        Options { logdir: None, flush_secs: 30.0 }
    }
}

pub struct TensorBoard {
    options: Options,
    writer: Option<FlushedWriter>,
}

const ATTACHMENTS: &[Attachment] = &[
    Attachment::new("scalars", Hook::Metrics, Cadence::every(10).with_end()).needs(Needs::BASIC_METRICS.union(Needs::DETAILED_METRICS)),
    // No `at_end`, so that `every = 0` switches histograms off entirely.
    Attachment::new("histograms", Hook::Metrics, Cadence::every(500)).needs(Needs::HISTOGRAMS),
];

/// The configuration as Markdown: TensorBoard's text dashboard would otherwise
/// render TOML's `[section]` and `# comment` lines as Markdown.
fn config_markdown(config_toml: &str) -> String {
    format!("```toml\n{}\n```", config_toml.trim_end())
}

fn histogram(h: &ptrain_plugin_api::Histogram) -> HistogramProto {
    HistogramProto {
        min: h.min,
        max: h.max,
        num: h.num,
        sum: h.sum,
        sum_squares: h.sum_squares,
        bucket_limit: h.bucket_limits.to_vec(),
        bucket: h.bucket_counts.to_vec(),
    }
}

impl TensorBoard {
    fn writer(&mut self) -> Option<&mut FlushedWriter> {
        self.writer.as_mut()
    }
}

impl Plugin for TensorBoard {
    const DESCRIPTOR: Descriptor = Descriptor::new(
        "tensorboard",
        env!("CARGO_PKG_VERSION"),
        "TensorBoard event files in <run-dir>/tensorboard: scalars, histograms and the config",
        Threading::Worker,
        ATTACHMENTS,
    );

    fn new(options: serde_json::Value, _host: HostApi) -> PluginResult<Self> {
        let options: Options = parse_options(options)?;
        if !(options.flush_secs.is_finite() && options.flush_secs > 0.0) {
            return Err(PluginError::msg(format!("invalid options: flush_secs must be a number of seconds > 0, got {}", options.flush_secs)));
        }
        Ok(TensorBoard { options, writer: None })
    }

    fn on_run_start(&mut self, run: &RunInfo<'_>) -> PluginResult {
        let dir = self.options.logdir.clone().unwrap_or_else(|| PathBuf::from(run.run_dir.as_str()).join("tensorboard"));
        let (file, path) = event_file::create(&dir, run.start_time)
            .map_err(|e| PluginError::msg(format!("cannot create an event file in {}: {e}", dir.display())))?;
        let mut writer = FlushedWriter::new(file, path);
        if run.start_step > 0 {
            // A resumed run redoes the steps after its checkpoint: readers drop what
            // the interrupted run logged from here on.
            writer.write(&Event::session_start(run.start_time, run.start_step + 1)).map_err(PluginError::msg)?;
        }
        let config = Value::text("config", &config_markdown(run.config_toml.as_str()));
        writer.write(&Event::summary(run.start_time, run.start_step, vec![config])).map_err(PluginError::msg)?;
        self.writer = Some(writer);
        Ok(())
    }

    fn timer_interval(&self) -> PluginResult<Option<Duration>> {
        Ok(Some(Duration::from_secs_f64(self.options.flush_secs)))
    }

    fn on_timer(&mut self) -> PluginResult {
        self.writer().map_or(Ok(()), FlushedWriter::flush).map_err(PluginError::msg)
    }

    fn on_metrics(&mut self, batch: &MetricBatch) -> PluginResult {
        let Some(writer) = self.writer() else { return Ok(()) };
        let values: Vec<Value> = batch
            .metrics
            .iter()
            .filter_map(|m| match &m.value {
                MetricValue::Scalar(v) => Some(Value::scalar(m.name.as_str(), *v)),
                MetricValue::Histogram(h) if h.num > 0.0 => Some(Value::histogram(m.name.as_str(), histogram(h))),
                MetricValue::Histogram(_) => None,
                // A GRPO run's completions record: its JSON table as a markdown table.
                MetricValue::Text(t) if m.name.as_str() == completions::NAME => {
                    Some(Value::text(m.name.as_str(), &completions::markdown(t.as_str()).unwrap_or_else(|| t.to_string())))
                }
                MetricValue::Text(t) => Some(Value::text(m.name.as_str(), t.as_str())),
            })
            .collect();
        if values.is_empty() {
            return Ok(());
        }
        writer.write(&Event::summary(batch.wall_time, batch.step, values)).map_err(PluginError::msg)
    }

    fn on_run_end(&mut self, _end: &RunEnd<'_>) -> PluginResult<Option<serde_json::Value>> {
        let Some(writer) = self.writer.take() else { return Ok(None) };
        let path = writer.path().display().to_string();
        let written = writer.close().map_err(PluginError::msg)?;
        Ok(Some(serde_json::json!({ "file": path, "records": written.records, "bytes": written.bytes })))
    }
}

export_plugin!(TensorBoard);

#[cfg(test)]
mod tests;
