//! `flops`: model FLOPs per optimizer step, achieved FLOP/s and MFU.
//!
//! The FLOPs of a step are fixed by the shapes, so they are found once: counted
//! from the layers the model describes (exact), or, for models that cannot
//! describe themselves, measured by libtorch's profiler over the first step on
//! rank 0 and shared with one broadcast. At the cadence (first step, every 500
//! steps, end) the plugin only does arithmetic on the host: achieved FLOP/s over
//! the wall time since its last report, and MFU against the device's peak.
//! See docs/plugins/flops.md.

mod count;
mod peak;

use std::time::Duration;

use ptrain_plugin_api::{
    export_plugin, parse_options, Attachment, Cadence, Descriptor, DeviceKind, Hook, HostApi, LogLevel, Outbox, Plugin, PluginError, PluginResult,
    RunEnd, RunInfo, StepContext, TensorRef, Threading,
};
use ptrain_torch_ext::profiler::{self, FlopCounts};
use serde::Deserialize;
use tch::{Device, Kind, Tensor};

use peak::Peak;

const NAME: &str = "flops";

#[derive(Debug, Deserialize, Default, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Method {
    /// Count when the model describes its layers, else profile.
    #[default]
    Auto,
    Count,
    Profiler,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Options {
    method: Method,
    /// Peak TFLOP/s of one device, instead of the datasheet table or the benchmark.
    peak_tflops: Option<f64>,
    /// Longest time the matmul benchmark that measures a peak the table lacks may take.
    benchmark_s: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options { method: Method::Auto, peak_tflops: None, benchmark_s: 0.1 }
    }
}

const ATTACHMENTS: &[Attachment] = &[
    Attachment::new("report", Hook::StepEnd, Cadence::every(500).with_first_step().with_end()),
    // The profiler, when used, spans the forward and backward passes of every
    // micro-batch of the first step: the model's work, without the optimizer's.
    Attachment::new("profile_start", Hook::StepStart, Cadence::NEVER.with_first_step()),
    Attachment::new("profile_stop", Hook::AfterBackward, Cadence::NEVER.with_first_step()),
];

/// A point of the run: steps run by this process, wall seconds since its start,
/// and token positions computed by every rank (`tokens_seen`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Mark {
    steps: u64,
    elapsed: f64,
    tokens: u64,
}

pub struct Flops {
    options: Options,
    host: HostApi,
    method: Method,
    rank: u32,
    world: u32,
    device: Device,
    step_samples: u64,
    /// Token positions of the step `per_step` counts, on one rank: the configured
    /// shape (`step_samples x seq_len`), or the profiled step's own.
    step_tokens: u64,
    /// Model FLOPs of one optimizer step of `step_tokens` positions on one rank
    /// (every micro-batch). Steps that compute fewer positions (rows padded only to
    /// the longest of their micro-batch) count in proportion.
    per_step: Option<f64>,
    peak: Option<Peak>,
    profiling: bool,
    profiled: Option<FlopCounts>,
    shared: bool,
    warned: bool,
    /// The end of the last report's window, and the start of the first one.
    last: Option<Mark>,
    first: Option<Mark>,
}

impl Flops {
    /// Rank 0 measures; in a distributed run the others wait for its broadcast.
    fn measures(&self) -> bool {
        self.rank == 0 || self.world <= 1
    }

    fn find_peak(&self, run: &RunInfo<'_>) -> Option<Peak> {
        if let Some(tflops) = self.options.peak_tflops {
            return Some(Peak { flops: tflops * 1e12, source: "option peak_tflops".into() });
        }
        if !self.measures() {
            return None;
        }
        // Autocast runs matmuls in bf16 on CUDA only; the CPU trains in fp32.
        let bf16 = self.device.is_cuda() && run.precision.as_str() == "bf16";
        if self.device.is_cuda() {
            if let Some(peak) = peak::from_table(run.device.name.as_str(), bf16) {
                return Some(peak);
            }
        }
        let kind = if bf16 { Kind::BFloat16 } else { Kind::Float };
        match peak::measure(self.device, kind, Duration::from_secs_f64(self.options.benchmark_s)) {
            Ok(peak) => Some(peak),
            Err(e) => {
                self.host.log(LogLevel::Warn, NAME, &format!("could not measure the device's peak ({e}): no MFU"));
                None
            }
        }
    }

    /// The one collective of the plugin: rank 0's FLOP count (and the positions it
    /// is of) and peak to all ranks.
    fn share(&mut self) -> PluginResult {
        let values = [self.per_step.unwrap_or(-1.0), self.peak.as_ref().map_or(-1.0, |p| p.flops), self.step_tokens as f64];
        let tensor = Tensor::from_slice(&values).to_device(self.device);
        self.host.broadcast(TensorRef::of(&tensor), 0).map_err(PluginError::msg)?;
        let values = Vec::<f64>::try_from(tensor.to_device(Device::Cpu))?;
        if self.rank != 0 {
            self.per_step = (values[0] >= 0.0).then_some(values[0]);
            self.peak = (values[1] > 0.0).then(|| Peak { flops: values[1], source: "rank 0".into() });
            self.step_tokens = (values[2] as u64).max(1);
        }
        Ok(())
    }

    fn stop_profiler(&mut self) -> PluginResult<FlopCounts> {
        self.profiling = false;
        Ok(profiler::count_stop()?)
    }

    fn report(&mut self, ctx: &StepContext<'_>, out: &mut Outbox) -> PluginResult {
        if self.profiling {
            // The step ended without reaching the backward hook: the count is partial.
            self.stop_profiler()?;
        }
        if !self.shared {
            self.shared = true;
            if self.world > 1 {
                self.share()?;
            }
        }
        let Some(per_step) = self.per_step else {
            if !self.warned {
                self.warned = true;
                self.host.log(LogLevel::Warn, NAME, "no FLOP count for this model: nothing to report");
            }
            return Ok(());
        };
        out.scalar("flops/step", self.flops_of(per_step, ctx.step_tokens));
        let now = Mark { steps: ctx.steps_run, elapsed: ctx.elapsed_s, tokens: ctx.tokens_seen };
        // The first step alone (warm-up, set-up hooks) would understate the rate.
        let before = now.tokens.saturating_sub(now.steps * self.step_tokens * self.world.max(1) as u64);
        let start = self.last.or((now.steps > 1).then_some(Mark { steps: 0, elapsed: 0.0, tokens: before }));
        if let Some(start) = start {
            if now.steps > start.steps && now.elapsed > start.elapsed {
                let achieved = self.achieved(per_step, &start, &now);
                out.scalar("flops/achieved_tflops", achieved / 1e12);
                if let Some(peak) = &self.peak {
                    out.scalar("perf/mfu", achieved / peak.flops);
                }
                self.first.get_or_insert(start);
            }
        }
        self.last = Some(now);
        Ok(())
    }

    /// FLOPs of a step computing `positions` token positions on this rank.
    fn flops_of(&self, per_step: f64, positions: u64) -> f64 {
        per_step * positions as f64 / self.step_tokens.max(1) as f64
    }

    /// FLOP/s on this rank between two marks: the positions every rank computed
    /// (`tokens_seen`), this rank's share, at `per_step`'s FLOPs per position.
    fn achieved(&self, per_step: f64, from: &Mark, to: &Mark) -> f64 {
        let positions = to.tokens.saturating_sub(from.tokens) / self.world.max(1) as u64;
        self.flops_of(per_step, positions) / (to.elapsed - from.elapsed)
    }

    fn summary(&self) -> serde_json::Value {
        let mut s = serde_json::json!({
            "method": if self.method == Method::Profiler { "profiler" } else { "count" },
            "scope": "per rank; multiply by world_size for the whole run",
            "world_size": self.world,
        });
        if let Some(per_step) = self.per_step {
            s["flops_per_step"] = per_step.into();
            s["flops_per_sample"] = (per_step / self.step_samples.max(1) as f64).into();
            s["flops_per_token"] = (per_step / self.step_tokens.max(1) as f64).into();
        }
        if let Some(peak) = &self.peak {
            s["peak_tflops"] = (peak.flops / 1e12).into();
            s["peak_source"] = peak.source.clone().into();
        }
        if let (Some(per_step), Some(first), Some(last)) = (self.per_step, self.first, self.last) {
            if last.steps > first.steps && last.elapsed > first.elapsed {
                let achieved = self.achieved(per_step, &first, &last);
                s["achieved_tflops"] = (achieved / 1e12).into();
                if let Some(peak) = &self.peak {
                    s["mfu"] = (achieved / peak.flops).into();
                }
            }
        }
        if let Some(c) = self.profiled {
            s["profile"] = serde_json::json!({
                "matmul": c.matmul,
                "attention": c.attention,
                "elementwise_not_counted": c.elementwise,
                "ops": c.counted_ops + c.attention_ops,
            });
        }
        s
    }
}

impl Plugin for Flops {
    const DESCRIPTOR: Descriptor = Descriptor::new(
        NAME,
        env!("CARGO_PKG_VERSION"),
        "FLOPs per step, achieved FLOP/s and MFU, measured at a cadence",
        Threading::Inline,
        ATTACHMENTS,
    );

    fn new(options: serde_json::Value, host: HostApi) -> PluginResult<Self> {
        let options: Options = parse_options(options)?;
        if options.peak_tflops.is_some_and(|p| !p.is_finite() || p <= 0.0) {
            return Err(PluginError::msg("invalid options: peak_tflops must be a number > 0"));
        }
        if !options.benchmark_s.is_finite() || options.benchmark_s < 0.0 {
            return Err(PluginError::msg("invalid options: benchmark_s must be a number >= 0"));
        }
        Ok(Flops {
            options,
            host,
            method: Method::Auto,
            rank: 0,
            world: 1,
            device: Device::Cpu,
            step_samples: 1,
            step_tokens: 1,
            per_step: None,
            peak: None,
            profiling: false,
            profiled: None,
            shared: false,
            warned: false,
            last: None,
            first: None,
        })
    }

    fn on_run_start(&mut self, run: &RunInfo<'_>) -> PluginResult {
        self.rank = run.rank;
        self.world = run.world_size;
        self.device = match run.device.kind {
            DeviceKind::Cuda => Device::Cuda(run.device.index.max(0) as usize),
            DeviceKind::Cpu => Device::Cpu,
        };
        self.step_samples = run.batch_size * run.accum_steps.max(1);
        self.step_tokens = self.step_samples * run.seq_len.max(1);
        let layers = run.model.layers.as_slice();
        self.method = match self.options.method {
            Method::Auto if layers.is_empty() => Method::Profiler,
            Method::Auto => Method::Count,
            Method::Count if layers.is_empty() => {
                return Err(PluginError::msg(format!("method = \"count\" needs a model that lists its layers; `{}` does not", run.model.kind)));
            }
            m => m,
        };
        if self.method == Method::Count {
            self.per_step = Some((count::per_sample(layers).total() * self.step_samples) as f64);
        }
        self.peak = self.find_peak(run);
        if let Some(peak) = &self.peak {
            self.host.log(LogLevel::Info, NAME, &format!("peak {:.3} TFLOP/s per device ({})", peak.flops / 1e12, peak.source));
        }
        Ok(())
    }

    fn on_step(&mut self, ctx: &StepContext<'_>, out: &mut Outbox) -> PluginResult {
        match ctx.hook {
            Hook::StepStart if self.method == Method::Profiler && self.measures() && self.per_step.is_none() && !self.profiling => {
                profiler::count_start()?;
                self.profiling = true;
            }
            Hook::AfterBackward if self.profiling => {
                let counts = self.stop_profiler()?;
                // Model FLOPs: matmuls and attention. Elementwise adds and multiplies
                // (residuals, dropout masks) are left out, as the count leaves them out.
                self.per_step = Some((counts.matmul + counts.attention) as f64);
                // The profiled step's own positions (all its micro-batches are fetched by now).
                self.step_tokens = ctx.step_tokens.max(1);
                self.profiled = Some(counts);
            }
            Hook::StepEnd => self.report(ctx, out)?,
            _ => {}
        }
        Ok(())
    }

    fn on_run_end(&mut self, _end: &RunEnd<'_>) -> PluginResult<Option<serde_json::Value>> {
        if self.profiling {
            self.stop_profiler()?;
        }
        Ok(Some(self.summary()))
    }
}

export_plugin!(Flops);

#[cfg(test)]
mod tests;
