//! `health`: the model's gradient and parameter health every `every` steps
//! (default 100), per parameter group and in total: gradient norm, parameter
//! norm, the update ratio ||Δw|| / ||w|| of that step, and the fractions of zero
//! and of non-finite gradient entries; plus a gradient spike detector (a robust
//! z-score of the total gradient norm against the last `spike_window` checks)
//! that emits `health/anomaly` and logs one warning naming the step and the group
//! that contributes most.
//!
//! A due step costs a copy of the parameters (at `AfterBackward`, before the
//! update), a few fused reductions on the device, and one read at `StepEnd`;
//! other steps cost nothing. See docs/plugins/health.md.

mod detector;
mod groups;
mod stats;

use ptrain_plugin_api::{
    export_plugin, parse_options, Attachment, Cadence, Descriptor, Hook, HostApi, LogLevel, Needs, Outbox, Plugin, PluginError, PluginResult, RunEnd,
    RunInfo, StepContext, Threading,
};
use serde::{Deserialize, Serialize};

use detector::SpikeDetector;
use groups::{figures, Groups, FIGURES};
use stats::Pending;

const NAME: &str = "health";
/// Anomaly steps listed in the summary, at most.
const MAX_LISTED: usize = 100;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Options {
    /// Module-path components that name a parameter group (0: the whole path).
    group_depth: usize,
    /// Emit per-group metrics (the totals are always emitted).
    per_group: bool,
    /// Checks the spike detector's median and MAD are taken over.
    spike_window: usize,
    /// Robust z-score above which the total gradient norm is an anomaly.
    spike_threshold: f64,
    /// Checks in the history before the detector judges.
    spike_min_checks: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options { group_depth: 3, per_group: true, spike_window: 20, spike_threshold: 10.0, spike_min_checks: 5 }
    }
}

impl Options {
    fn check(self) -> PluginResult<Options> {
        let bad = |key: &str, what: &str| Err(PluginError::msg(format!("invalid options: plugins.{NAME}.{key}: {what}")));
        if self.spike_window < 3 {
            return bad("spike_window", "must be at least 3");
        }
        if !(self.spike_threshold.is_finite() && self.spike_threshold > 0.0) {
            return bad("spike_threshold", "must be a finite number > 0");
        }
        if self.spike_min_checks < 1 || self.spike_min_checks > self.spike_window {
            return bad("spike_min_checks", "must be between 1 and spike_window");
        }
        Ok(self)
    }
}

const ATTACHMENTS: &[Attachment] = &[
    // Both follow `[plugins.health] every`: they are declared with the same cadence.
    Attachment::new("measure", Hook::AfterBackward, Cadence::every(100)).needs(Needs::PARAMS.union(Needs::GRADS)),
    Attachment::new("update", Hook::StepEnd, Cadence::every(100)).needs(Needs::PARAMS),
];

/// What survives in checkpoints: the detector's history.
#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    history: Vec<f64>,
}

pub struct Health {
    options: Options,
    host: HostApi,
    rank: u32,
    world: u32,
    groups: Option<Groups>,
    numel: Vec<f64>,
    pending: Option<Pending>,
    detector: SpikeDetector,
    checks: u64,
    anomalies: Vec<u64>,
    anomaly_count: u64,
    last: Option<groups::Figures>,
    warned_unpaired: bool,
}

impl Health {
    fn measure(&mut self, ctx: &StepContext<'_>) -> PluginResult {
        if let Some(stale) = self.pending.take() {
            self.unpaired(stale.step);
        }
        let params = ctx.params.as_slice();
        if self.groups.as_ref().is_none_or(|g| g.of_tensor.len() != params.len()) {
            self.groups = Some(Groups::new(params.iter().map(|p| p.name.as_str()), self.options.group_depth));
            self.numel = params.iter().map(|p| p.tensor.with(|t| t.numel() as f64).unwrap_or(0.0)).collect();
        }
        self.pending = Some(stats::measure(ctx.step, params, ctx.grads.as_slice())?);
        Ok(())
    }

    fn unpaired(&mut self, step: u64) {
        if !self.warned_unpaired {
            self.warned_unpaired = true;
            let message = format!(
                "step {step} was measured after backward but its step end was not due: give `measure` and `update` the same \
                 cadence ([plugins.health] every = N); such steps are not reported"
            );
            self.host.log(LogLevel::Warn, NAME, &message);
        }
    }

    fn report(&mut self, ctx: &StepContext<'_>, out: &mut Outbox) -> PluginResult {
        let Some(pending) = self.pending.take() else { return Ok(()) };
        if pending.step != ctx.step {
            self.unpaired(pending.step);
            return Ok(());
        }
        let rows = pending.finish(ctx.params.as_slice())?;
        let groups = self.groups.as_ref().expect("measured");
        let total = figures(&rows, &self.numel, 0..self.numel.len());
        for (name, value) in FIGURES.iter().zip(total.values()) {
            out.scalar(format!("health/{name}"), value);
        }
        let per_group: Vec<groups::Figures> = (0..groups.names.len()).map(|g| figures(&rows, &self.numel, groups.members(g))).collect();
        if self.options.per_group {
            for (g, f) in per_group.iter().enumerate() {
                for (name, value) in groups.metric_names[g].iter().zip(f.values()) {
                    out.scalar(name.as_str(), value);
                }
            }
        }
        self.checks += 1;
        let verdict = self.detector.check(total.grad_norm);
        if let Some(z) = verdict.zscore {
            out.scalar("health/grad_norm_zscore", z);
        }
        out.scalar("health/anomaly", if verdict.anomaly { 1.0 } else { 0.0 });
        if verdict.anomaly {
            self.anomaly_count += 1;
            if self.anomalies.len() < MAX_LISTED {
                self.anomalies.push(ctx.step);
            }
            let (top, share) = per_group
                .iter()
                .enumerate()
                .map(|(g, f)| (g, if total.grad_sq > 0.0 { f.grad_sq / total.grad_sq } else { f64::NAN }))
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap_or((0, f64::NAN));
            let group = groups.names.get(top).map_or("?", String::as_str);
            let rank = if self.world > 1 { format!(" on rank {}", self.rank) } else { String::new() };
            let z = verdict.zscore.unwrap_or(f64::NAN);
            let message = format!(
                "gradient spike at step {}{rank}: grad norm {:.4e} is {z:.1} robust SDs above the median {:.4e} of the last {} checks; \
                 largest contribution: {group} ({:.0}% of the squared norm)",
                ctx.step,
                total.grad_norm,
                verdict.median,
                verdict.baseline,
                share * 100.0
            );
            self.host.log(LogLevel::Warn, NAME, &message);
        }
        self.last = Some(total);
        Ok(())
    }
}

impl Plugin for Health {
    const DESCRIPTOR: Descriptor = Descriptor::new(
        NAME,
        env!("CARGO_PKG_VERSION"),
        "gradient and parameter norms, update ratio, zero and non-finite gradients, gradient spike detector",
        Threading::Inline,
        ATTACHMENTS,
    );

    fn new(options: serde_json::Value, host: HostApi) -> PluginResult<Self> {
        let options = parse_options::<Options>(options)?.check()?;
        let detector = SpikeDetector::new(options.spike_window, options.spike_threshold, options.spike_min_checks);
        Ok(Health {
            options,
            host,
            rank: 0,
            world: 1,
            groups: None,
            numel: Vec::new(),
            pending: None,
            detector,
            checks: 0,
            anomalies: Vec::new(),
            anomaly_count: 0,
            last: None,
            warned_unpaired: false,
        })
    }

    fn on_run_start(&mut self, run: &RunInfo<'_>) -> PluginResult {
        self.rank = run.rank;
        self.world = run.world_size;
        Ok(())
    }

    fn on_step(&mut self, ctx: &StepContext<'_>, out: &mut Outbox) -> PluginResult {
        match ctx.hook {
            Hook::AfterBackward => self.measure(ctx),
            Hook::StepEnd => self.report(ctx, out),
            _ => Ok(()),
        }
    }

    fn save_state(&mut self) -> PluginResult<Vec<u8>> {
        Ok(serde_json::to_vec(&State { history: self.detector.history() })?)
    }

    fn load_state(&mut self, state: &[u8]) -> PluginResult {
        self.detector.restore(&serde_json::from_slice::<State>(state)?.history);
        Ok(())
    }

    fn on_run_end(&mut self, _end: &RunEnd<'_>) -> PluginResult<Option<serde_json::Value>> {
        let last = self.last.map(|f| {
            serde_json::json!({"grad_norm": f.grad_norm, "param_norm": f.param_norm, "update_ratio": f.update_ratio,
                "grad_zero_frac": f.grad_zero_frac, "grad_nonfinite_frac": f.grad_nonfinite_frac})
        });
        Ok(Some(serde_json::json!({
            "checks": self.checks,
            "anomalies": self.anomaly_count,
            "anomaly_steps": self.anomalies,
            "groups": self.groups.as_ref().map(|g| g.names.clone()).unwrap_or_default(),
            "last": last,
        })))
    }
}

export_plugin!(Health);

#[cfg(test)]
mod tests;
