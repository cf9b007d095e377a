//! `perf`: where a step's time goes, throughput, memory, and a slowdown warning.
//!
//! At the cadence (first step, every 50 steps, end) it differences the host's
//! cumulative phase times and wall clock since its last report, reads memory
//! (the CUDA allocator's counters, `/proc` for the host), and feeds the slowdown
//! detector. Between reports it is never called. See docs/plugins/perf.md.

mod detector;
mod memory;

use ptrain_plugin_api::{
    export_plugin, parse_options, Attachment, Cadence, Descriptor, DeviceKind, Hook, HostApi, LogLevel, Outbox, PhaseTimes, Plugin, PluginError,
    PluginResult, RunEnd, RunInfo, StepContext, Threading,
};
use serde::Deserialize;
use serde_json::json;

use detector::{Detector, Slowdown};

const NAME: &str = "perf";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Options {
    /// Relative growth of the step time that warns: 0.2 is 20%.
    slowdown_threshold: f64,
    /// Steps in the baseline window and in the rolling window compared with it.
    slowdown_window: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options { slowdown_threshold: 0.2, slowdown_window: 100 }
    }
}

const ATTACHMENTS: &[Attachment] = &[
    // The first step only anchors the windows: its time is warm-up.
    Attachment::new("report", Hook::StepEnd, Cadence::every(50).with_first_step().with_end()),
];

/// The host's counters at a report.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    step: u64,
    elapsed: f64,
    totals: PhaseTimes,
}

pub struct Perf {
    host: HostApi,
    detector: Detector,
    cuda: Option<i32>,
    world: u64,
    step_samples: u64,
    step_tokens: u64,
    first: Option<Snapshot>,
    last: Option<Snapshot>,
    slowdown: Option<(u64, Slowdown)>,
}

/// Rates of a span between two snapshots, across all ranks.
struct Rates {
    steps_per_s: f64,
    samples_per_s: f64,
    tokens_per_s: f64,
}

impl Perf {
    fn rates(&self, from: &Snapshot, to: &Snapshot) -> Option<Rates> {
        let wall = to.elapsed - from.elapsed;
        let steps = to.step.checked_sub(from.step).filter(|&n| n > 0)? as f64;
        (wall > 0.0).then(|| Rates {
            steps_per_s: steps / wall,
            samples_per_s: steps * (self.step_samples * self.world) as f64 / wall,
            tokens_per_s: steps * (self.step_tokens * self.world) as f64 / wall,
        })
    }

    fn report(&mut self, ctx: &StepContext<'_>, out: &mut Outbox) {
        let now = Snapshot { step: ctx.step, elapsed: ctx.elapsed_s, totals: ctx.phases_total };
        if let Some(prev) = self.last.filter(|p| now.step > p.step) {
            let p = now.totals.per_step_since(&prev.totals, now.step - prev.step);
            out.scalar("perf/data_s", p.data_s);
            out.scalar("perf/forward_s", p.forward_s);
            out.scalar("perf/backward_s", p.backward_s);
            out.scalar("perf/optimizer_s", p.optimizer_s);
            out.scalar("perf/step_s", p.step_s);
            if p.step_s > 0.0 {
                out.scalar("perf/data_ratio", p.data_s / p.step_s);
            }
            if let Some(r) = self.rates(&prev, &now) {
                out.scalar("perf/steps_per_s", r.steps_per_s);
                out.scalar("perf/samples_per_s", r.samples_per_s);
                out.scalar("perf/tokens_per_s", r.tokens_per_s);
            }
        }
        if let Some((rss, peak)) = memory::host_rss() {
            out.scalar("perf/host_rss_bytes", rss as f64);
            out.scalar("perf/host_peak_rss_bytes", peak as f64);
        }
        if let Some(m) = self.cuda.and_then(memory::gpu) {
            out.scalar("perf/gpu_memory_bytes", m.allocated as f64);
            out.scalar("perf/gpu_peak_memory_bytes", m.peak as f64);
            out.scalar("perf/gpu_reserved_bytes", m.reserved as f64);
        }
        if let Some(slowdown) = self.detector.observe(now.step, now.totals) {
            self.host.log(LogLevel::Warn, NAME, &slowdown.message(self.detector.threshold()));
            self.slowdown = Some((now.step, slowdown));
        }
        if let Some(ratio) = self.detector.ratio() {
            out.scalar("perf/step_time_vs_baseline", ratio);
        }
        self.first.get_or_insert(now);
        self.last = Some(now);
    }

    fn summary(&self) -> serde_json::Value {
        let mut s = json!({ "slowdown": null });
        let span = self.first.zip(self.last).filter(|(first, last)| last.step > first.step);
        if let Some((first, last)) = span {
            let p = last.totals.per_step_since(&first.totals, last.step - first.step);
            s["steps"] = json!({ "first": first.step + 1, "last": last.step });
            s["per_step_s"] =
                json!({ "data": p.data_s, "forward": p.forward_s, "backward": p.backward_s, "optimizer": p.optimizer_s, "step": p.step_s });
            if p.step_s > 0.0 {
                s["data_ratio"] = (p.data_s / p.step_s).into();
            }
            if let Some(r) = self.rates(&first, &last) {
                s["steps_per_s"] = r.steps_per_s.into();
                s["samples_per_s"] = r.samples_per_s.into();
                s["tokens_per_s"] = r.tokens_per_s.into();
            }
        }
        if let Some((_, peak)) = memory::host_rss() {
            s["host_peak_rss_bytes"] = peak.into();
        }
        if let Some(m) = self.cuda.and_then(memory::gpu) {
            s["gpu_peak_memory_bytes"] = m.peak.into();
        }
        if let Some(b) = self.detector.baseline() {
            s["baseline_step_s"] = b.per_step.step_s.into();
        }
        if let Some(l) = self.detector.latest() {
            s["latest_step_s"] = l.per_step.step_s.into();
        }
        if let Some((step, d)) = &self.slowdown {
            s["slowdown"] = json!({
                "step": step,
                "phase": d.phase.name(),
                "growth": d.growth,
                "baseline_step_s": d.baseline.per_step.step_s,
                "recent_step_s": d.recent.per_step.step_s,
            });
        }
        s
    }
}

impl Plugin for Perf {
    const DESCRIPTOR: Descriptor =
        Descriptor::new(NAME, env!("CARGO_PKG_VERSION"), "phase times, throughput, memory and a slowdown detector", Threading::Inline, ATTACHMENTS);

    fn new(options: serde_json::Value, host: HostApi) -> PluginResult<Self> {
        let options: Options = parse_options(options)?;
        if !options.slowdown_threshold.is_finite() || options.slowdown_threshold <= 0.0 {
            return Err(PluginError::msg("invalid options: slowdown_threshold must be a number > 0"));
        }
        if options.slowdown_window == 0 {
            return Err(PluginError::msg("invalid options: slowdown_window must be >= 1"));
        }
        Ok(Perf {
            host,
            detector: Detector::new(options.slowdown_threshold, options.slowdown_window),
            cuda: None,
            world: 1,
            step_samples: 0,
            step_tokens: 0,
            first: None,
            last: None,
            slowdown: None,
        })
    }

    fn on_run_start(&mut self, run: &RunInfo<'_>) -> PluginResult {
        self.cuda = (run.device.kind == DeviceKind::Cuda).then_some(run.device.index.max(0));
        self.world = run.world_size.max(1) as u64;
        Ok(())
    }

    fn on_step(&mut self, ctx: &StepContext<'_>, out: &mut Outbox) -> PluginResult {
        if ctx.hook == Hook::StepEnd {
            self.step_samples = ctx.step_samples;
            self.step_tokens = ctx.step_tokens;
            self.report(ctx, out);
        }
        Ok(())
    }

    // Kept in checkpoints so that a resumed run does not warn a second time.
    fn save_state(&mut self) -> PluginResult<Vec<u8>> {
        Ok(vec![self.detector.fired() as u8])
    }

    fn load_state(&mut self, state: &[u8]) -> PluginResult {
        self.detector.set_fired(state.first() == Some(&1));
        Ok(())
    }

    fn on_run_end(&mut self, _end: &RunEnd<'_>) -> PluginResult<Option<serde_json::Value>> {
        Ok(Some(self.summary()))
    }
}

export_plugin!(Perf);

#[cfg(test)]
mod tests;
