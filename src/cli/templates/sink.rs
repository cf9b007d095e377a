//! `{{name}}`: a ptrain sink (made by `ptrain plugins new {{name}} --sink`).
//!
//! A worker plugin: it runs on its own thread behind a bounded queue, so its file I/O
//! never stalls training. It writes every metrics batch it receives to
//! `<run-dir>/{{name}}.csv` (option `path`), one row per scalar: `step,name,value`.
//! It receives the core metrics at its cadence (every 10 steps and the last one) and,
//! at any step, whatever inline plugins and evaluation emitted.
//!
//! ```text
//! cargo build --release        # target/release/libptrain_plugin_{{lib}}.so
//! cargo test --release         # the unit test below, on plugin-api's testing fixtures
//! PTRAIN_PLUGIN_PATH=$PWD/target/release ptrain run --plugins {{name}} --set plugins.{{name}}.every=1
//! ```

use std::{
    fs::{File, OpenOptions},
    io::{BufWriter, Write},
    path::PathBuf,
};

use ptrain_plugin_api::{
    bail, export_plugin, parse_options, Attachment, Cadence, Descriptor, Hook, HostApi,
    MetricBatch, MetricValue, Needs, Plugin, PluginResult, RunEnd, RunInfo, Threading,
};
use serde::Deserialize;

/// Options: the keys of `[plugins.{{name}}]` other than the host's (`every`, ...,
/// `queue`, `on_full`).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct Options {
    /// Where to write; default `<run-dir>/{{name}}.csv`.
    path: Option<PathBuf>,
}

pub struct {{Type}} {
    options: Options,
    out: Option<BufWriter<File>>,
    rows: u64,
}

const ATTACHMENTS: &[Attachment] = &[
    // `BASIC_METRICS` asks the core for train/loss, train/lr, throughput and epoch
    // on the due steps (`DETAILED_METRICS` would add grad norm, phase times, memory).
    Attachment::new("metrics", Hook::Metrics, Cadence::every(10).with_end())
        .needs(Needs::BASIC_METRICS),
];

impl Plugin for {{Type}} {
    const DESCRIPTOR: Descriptor = Descriptor::new(
        "{{name}}",
        env!("CARGO_PKG_VERSION"),
        "every metrics batch as CSV rows (step,name,value)",
        Threading::Worker,
        ATTACHMENTS,
    );

    fn new(options: serde_json::Value, _host: HostApi) -> PluginResult<Self> {
        let options: Options = parse_options(options)?;
        // A bad option is refused here: the run stops before training (exit 2) with
        // this message. `Err("...".into())` works too.
        if let Some(path) = options.path.as_ref().filter(|path| path.is_dir()) {
            bail!("path = {}: a directory; name a file", path.display());
        }
        Ok({{Type}} {
            options,
            out: None,
            rows: 0,
        })
    }

    /// Called on every plugin before the first step: open the file here.
    fn on_run_start(&mut self, run: &RunInfo<'_>) -> PluginResult {
        let file = format!("{}.csv", Self::DESCRIPTOR.name);
        let default = PathBuf::from(run.run_dir.as_str()).join(file);
        let path = self.options.path.clone().unwrap_or(default);
        // A resumed run (start_step > 0) continues the file; a fresh one starts it.
        let resumed = run.start_step > 0 && path.exists();
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .append(resumed)
            .truncate(!resumed)
            .open(&path)?;
        let mut out = BufWriter::new(file);
        if !resumed {
            writeln!(out, "step,name,value")?;
        }
        self.out = Some(out);
        Ok(())
    }

    fn on_metrics(&mut self, batch: &MetricBatch) -> PluginResult {
        let Some(out) = self.out.as_mut() else {
            return Ok(());
        };
        for metric in batch.metrics.iter() {
            // Scalars only; histograms (HISTOGRAMS) and text are skipped here.
            if let MetricValue::Scalar(value) = metric.value {
                writeln!(out, "{},{},{value}", batch.step, metric.name)?;
                self.rows += 1;
            }
        }
        // Flushed per batch: readers see complete rows while the run goes on.
        out.flush()?;
        Ok(())
    }

    /// Called on every plugin at the end, after the queue is drained.
    fn on_run_end(&mut self, _end: &RunEnd<'_>) -> PluginResult<Option<serde_json::Value>> {
        if let Some(mut out) = self.out.take() {
            out.flush()?;
        }
        // Goes into summary.json under "plugins"."{{name}}".
        Ok(Some(serde_json::json!({ "rows": self.rows })))
    }
}

export_plugin!({{Type}});

#[cfg(test)]
mod tests {
    use ptrain_plugin_api::{testing, Metric};

    use super::*;

    #[test]
    fn writes_one_row_per_scalar() {
        let name = format!("{{name}}-test-{}", std::process::id());
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let options = serde_json::json!({});
        let mut plugin = {{Type}}::new(options, HostApi::standalone()).unwrap();
        let run_dir = dir.display().to_string();
        plugin
            .on_run_start(&RunInfo {
                run_dir: run_dir.as_str().into(),
                ..testing::run_info()
            })
            .unwrap();
        let batch = testing::metric_batch(
            10,
            vec![
                Metric::scalar("train/loss", 2.5),
                Metric::text("note", "skipped"),
            ],
        );
        plugin.on_metrics(&batch).unwrap();
        let summary = plugin.on_run_end(&testing::run_end(10)).unwrap();
        assert_eq!(summary, Some(serde_json::json!({ "rows": 1 })));
        let text = std::fs::read_to_string(dir.join("{{name}}.csv")).unwrap();
        assert_eq!(text, "step,name,value\n10,train/loss,2.5\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_for_path_is_refused() {
        let options = serde_json::json!({ "path": std::env::temp_dir() });
        let err = {{Type}}::new(options, HostApi::standalone()).err().unwrap();
        assert!(err.message().ends_with(": a directory; name a file"), "{err}");
    }
}
