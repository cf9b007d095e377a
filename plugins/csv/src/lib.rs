//! `csv`: `<run-dir>/metrics.csv` in the layout of Lightning's `CSVLogger`: one row
//! per emitted step, a `step` column and one column per scalar metric name, an empty
//! cell where a metric was not emitted at that step. `pandas.read_csv` reads it with
//! no options (empty cells are NaN).
//!
//! Cadence: basic metrics (`train/*`) every 10 steps and at the end, detailed ones
//! (grad norm, phase times, memory) every 50; metrics of other plugins and evaluations
//! at the steps they are produced.
//!
//! Options (`[plugins.csv]`): `path` (default `<run-dir>/metrics.csv`).

mod table;

use std::path::PathBuf;

use ptrain_plugin_api::{
    export_plugin, parse_options, Attachment, Cadence, Descriptor, Hook, HostApi, MetricBatch, Needs, Plugin, PluginError, PluginResult, RunEnd,
    RunInfo, Threading,
};
use serde::Deserialize;

use crate::table::{column_name, Table};

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct Options {
    path: Option<PathBuf>,
}

pub struct Csv {
    options: Options,
    table: Option<Table>,
    path: PathBuf,
}

const ATTACHMENTS: &[Attachment] = &[
    Attachment::new("metrics", Hook::Metrics, Cadence::every(10).with_end()).needs(Needs::BASIC_METRICS),
    Attachment::new("detailed", Hook::Metrics, Cadence::every(50)).needs(Needs::DETAILED_METRICS),
];

impl Plugin for Csv {
    const DESCRIPTOR: Descriptor = Descriptor::new(
        "csv",
        env!("CARGO_PKG_VERSION"),
        "<run-dir>/metrics.csv like Lightning's CSVLogger: a step column, one column per metric",
        Threading::Worker,
        ATTACHMENTS,
    );

    fn new(options: serde_json::Value, _host: HostApi) -> PluginResult<Self> {
        Ok(Csv { options: parse_options(options)?, table: None, path: PathBuf::new() })
    }

    fn on_run_start(&mut self, run: &RunInfo<'_>) -> PluginResult {
        self.path = self.options.path.clone().unwrap_or_else(|| PathBuf::from(run.run_dir.as_str()).join("metrics.csv"));
        let table = Table::open(&self.path, run.start_step).map_err(|e| PluginError::msg(format!("{}: {e}", self.path.display())))?;
        self.table = Some(table);
        Ok(())
    }

    fn on_metrics(&mut self, batch: &MetricBatch) -> PluginResult {
        let Some(table) = self.table.as_mut() else { return Ok(()) };
        let values: Vec<(String, f64)> = batch.scalars().map(|(name, v)| (column_name(name), v)).collect();
        if values.is_empty() {
            return Ok(());
        }
        table.append(batch.step, &values).map_err(|e| PluginError::msg(format!("{}: {e}", self.path.display())))
    }

    fn on_run_end(&mut self, _end: &RunEnd<'_>) -> PluginResult<Option<serde_json::Value>> {
        let Some(table) = self.table.take() else { return Ok(None) };
        Ok(Some(serde_json::json!({
            "path": self.path,
            "rows": table.rows,
            "columns": table.columns().len() + 1,
            "rewrites": table.rewrites,
        })))
    }
}

export_plugin!(Csv);

#[cfg(test)]
mod tests {
    use abi_stable::std_types::{RSlice, RVec};
    use ptrain_plugin_api::{testing, Metric};

    use super::*;

    fn batch(step: u64, metrics: Vec<Metric>) -> MetricBatch {
        MetricBatch { step, wall_time: 0.0, elapsed_s: 0.0, metrics: RVec::from(metrics) }
    }

    #[test]
    fn rows_follow_the_emitted_steps_through_the_hooks() {
        let dir = tempfile::tempdir().unwrap();
        let mut csv = Csv::new(serde_json::json!({}), HostApi::standalone()).unwrap();
        let run_dir = dir.path().to_str().unwrap();
        csv.on_run_start(&RunInfo { run_dir: run_dir.into(), ..testing::run_info() }).unwrap();
        csv.on_metrics(&batch(10, vec![Metric::scalar("train/loss", 2.0), Metric::text("note", "x")])).unwrap();
        csv.on_metrics(&batch(15, vec![Metric::text("only", "text")])).unwrap();
        csv.on_metrics(&batch(20, vec![Metric::scalar("train/loss", 1.5), Metric::scalar("eval/loss", 1.75)])).unwrap();
        let summary = csv.on_run_end(&RunEnd { step: 20, exit_code: 0, wall_s: 1.0, scalars: RSlice::EMPTY }).unwrap().unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap(), "step,eval/loss,train/loss\n10,,2.0\n20,1.75,1.5\n");
        assert_eq!((summary["rows"].as_u64(), summary["columns"].as_u64(), summary["rewrites"].as_u64()), (Some(2), Some(3), Some(2)));
    }

    #[test]
    fn unknown_options_are_refused() {
        let err = Csv::new(serde_json::json!({ "detailed": true }), HostApi::standalone()).err().unwrap();
        assert!(err.message().contains("detailed"), "{err}");
    }
}
