//! `early-stop`: watches one metric the run emits (default `eval/loss`; any
//! emitted name, a plugin's included) and asks the host to end the run, as
//! Lightning's `EarlyStopping` would: when it has not improved by more than
//! `min_delta` for `patience` checks, when it reaches `stopping_threshold`, when
//! it passes `divergence_threshold`, or when it is not finite (`check_finite`).
//!
//! A check is a metrics batch that holds the metric. The end is a normal one: the
//! final checkpoint is saved (with this plugin's state, so a resumed run keeps the
//! best value and the patience counter), summary.json names the plugin and the
//! reason, and ptrain exits 0. See docs/plugins/early-stop.md.

mod rule;

use ptrain_plugin_api::{
    export_plugin, parse_options, Attachment, Cadence, Descriptor, Hook, HostApi, LogLevel, MetricBatch, Needs, Plugin, PluginError, PluginResult,
    RunEnd, RunInfo, Threading,
};
use serde::Deserialize;

use rule::{Mode, Progress, Rule};

const NAME: &str = "early-stop";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Options {
    monitor: String,
    patience: u64,
    min_delta: f64,
    mode: Mode,
    stopping_threshold: Option<f64>,
    divergence_threshold: Option<f64>,
    check_finite: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            monitor: "eval/loss".into(),
            patience: 3,
            min_delta: 0.0,
            mode: Mode::Min,
            stopping_threshold: None,
            divergence_threshold: None,
            check_finite: true,
        }
    }
}

impl Options {
    fn rule(self) -> PluginResult<(String, Rule)> {
        let bad = |key: &str, what: &str| Err(PluginError::msg(format!("invalid options: plugins.{NAME}.{key}: {what}")));
        if self.monitor.is_empty() {
            return bad("monitor", "must name a metric");
        }
        if !(self.min_delta.is_finite() && self.min_delta >= 0.0) {
            return bad("min_delta", "must be a finite number >= 0");
        }
        for (key, t) in [("stopping_threshold", self.stopping_threshold), ("divergence_threshold", self.divergence_threshold)] {
            if t.is_some_and(|t| !t.is_finite()) {
                return bad(key, "must be a finite number");
            }
        }
        if let (Some(s), Some(d)) = (self.stopping_threshold, self.divergence_threshold) {
            if !self.mode.better(s, d) {
                return bad("divergence_threshold", "must be worse than stopping_threshold for this mode");
            }
        }
        let rule = Rule {
            patience: self.patience,
            min_delta: self.min_delta,
            mode: self.mode,
            stopping_threshold: self.stopping_threshold,
            divergence_threshold: self.divergence_threshold,
            check_finite: self.check_finite,
        };
        Ok((self.monitor, rule))
    }
}

const ATTACHMENTS: &[Attachment] = &[
    // Metrics emitted by evaluation and by plugins reach every plugin attached to
    // `Metrics`, whatever its cadence; this cadence (the evaluation steps) is for
    // the core's own `train/*` metrics, computed only when something asks.
    Attachment::new("watch", Hook::Metrics, Cadence::NEVER.with_eval()).needs(Needs::BASIC_METRICS),
];

pub struct EarlyStop {
    host: HostApi,
    monitor: String,
    rule: Rule,
    progress: Progress,
    /// Why and at which step this plugin asked to stop.
    stopped: Option<(u64, String)>,
    rank: u32,
}

impl Plugin for EarlyStop {
    const DESCRIPTOR: Descriptor = Descriptor::new(
        NAME,
        env!("CARGO_PKG_VERSION"),
        "stops the run when a metric stops improving, diverges, reaches a target or turns non-finite",
        Threading::Inline,
        ATTACHMENTS,
    );

    fn new(options: serde_json::Value, host: HostApi) -> PluginResult<Self> {
        let (monitor, rule) = parse_options::<Options>(options)?.rule()?;
        Ok(EarlyStop { host, monitor, rule, progress: Progress::default(), stopped: None, rank: 0 })
    }

    fn on_run_start(&mut self, run: &RunInfo<'_>) -> PluginResult {
        self.rank = run.rank;
        Ok(())
    }

    fn on_metrics(&mut self, batch: &MetricBatch) -> PluginResult {
        if self.stopped.is_some() {
            return Ok(());
        }
        let Some(value) = batch.scalar(&self.monitor) else { return Ok(()) };
        if let Some(reason) = self.rule.check(&mut self.progress, batch.step, value, &self.monitor) {
            self.host.request_stop(NAME, &reason);
            self.stopped = Some((batch.step, reason));
        }
        Ok(())
    }

    fn save_state(&mut self) -> PluginResult<Vec<u8>> {
        Ok(serde_json::to_vec(&self.progress)?)
    }

    fn load_state(&mut self, state: &[u8]) -> PluginResult {
        self.progress = serde_json::from_slice(state)?;
        Ok(())
    }

    fn on_run_end(&mut self, _end: &RunEnd<'_>) -> PluginResult<Option<serde_json::Value>> {
        if self.progress.checks == 0 && self.rank == 0 {
            let message = format!(
                "never saw `{}` in the run's metrics: check the name; core train/* metrics are computed only at a cadence \
                 ([plugins.early-stop] every = N)",
                self.monitor
            );
            self.host.log(LogLevel::Warn, NAME, &message);
        }
        let best = self.progress.best.map(|(step, value)| serde_json::json!({"step": step, "value": value}));
        Ok(Some(serde_json::json!({
            "monitor": self.monitor,
            "mode": self.rule.mode,
            "best": best,
            "wait": self.progress.wait,
            "checks": self.progress.checks,
            "stopped_step": self.stopped.as_ref().map(|s| s.0),
            "reason": self.stopped.as_ref().map(|s| s.1.clone()),
        })))
    }
}

export_plugin!(EarlyStop);

#[cfg(test)]
mod tests;
