//! The core's metrics and progress lines. [`MetricsProcessor`] owns what they need
//! between emissions (since when, since which step), and what inline plugins and
//! evaluation emitted since; `Run::emit_metrics` builds a batch only on steps where
//! a sink is due or something was emitted, at the detail the due sinks asked for.

use std::time::Instant;

use abi_stable::std_types::RVec;
use ptrain_plugin_api::{Histogram, Metric, MetricBatch, Needs, PhaseTimes};
use tch::{Device, Kind, Tensor};

use super::{clock::unix_now, progress, run::Run};
use crate::{
    device,
    error::{Error, Result},
    host::{Event, Reach},
    schedule::StepPlan,
};

/// Buckets of the parameter and gradient histograms.
const HISTOGRAM_BUCKETS: usize = 30;

pub(super) struct MetricsProcessor {
    /// What evaluation emitted since the last batch (inline plugins' metrics wait
    /// in the host: `PluginHost::drain_emitted`).
    pub emitted: Vec<Metric>,
    /// When and at which step the last batch with core metrics went out, and the
    /// phase totals then.
    last_emit: (Instant, u64, PhaseTimes),
    /// When and at which step the last progress line was shown.
    last_progress: (Instant, u64),
    pub progress: progress::Progress,
}

impl MetricsProcessor {
    pub fn new(start_step: u64, progress: progress::Progress) -> MetricsProcessor {
        MetricsProcessor {
            emitted: Vec::with_capacity(64),
            last_emit: (Instant::now(), start_step, PhaseTimes::default()),
            last_progress: (Instant::now(), start_step),
            progress,
        }
    }
}

impl Run {
    /// Whether inline plugins or evaluation emitted metrics not sent yet.
    pub(super) fn has_emitted(&self) -> bool {
        !self.metrics.emitted.is_empty() || self.host.has_emitted()
    }

    /// Sends what is due at `step` to the sinks: the core metrics the due sinks
    /// asked for, plus whatever was emitted since the last batch (which reaches
    /// every sink).
    pub(super) fn emit_metrics(&mut self, step: u64, lr: f64, plan: StepPlan) -> Result<()> {
        // In the order they were emitted: a step's plugin hooks, its `Eval` hook,
        // then evaluation's own.
        let mut metrics = Vec::with_capacity(64);
        self.host.drain_emitted(&mut metrics);
        metrics.append(&mut self.metrics.emitted);
        let emitted = !metrics.is_empty();
        let wants = plan.needs;
        if wants.intersects(Needs::BASIC_METRICS.union(Needs::DETAILED_METRICS).union(Needs::HISTOGRAMS)) {
            metrics.extend(self.core_metrics(step, lr, wants)?);
            if wants.contains(Needs::HISTOGRAMS) {
                metrics.extend(self.histograms());
            }
            self.metrics.last_emit = (Instant::now(), step, self.tally.phases_total);
        }
        let now = unix_now();
        let batch = MetricBatch { step, wall_time: now, elapsed_s: now - self.env.unix_start, metrics: RVec::from(metrics) };
        let reach = if emitted { Reach::Declared } else { Reach::Due(self.schedule.due()) };
        self.host.dispatch(Event::Metrics(batch.into()), reach);
        Ok(())
    }

    /// `train/*` (`train/loss` the mean step loss since the last emission, and the
    /// objective's metrics likewise, averaged over ranks in one collective), and with detailed
    /// metrics `train/grad_norm`, `time/*` and `memory/*`. A failed all-reduce is
    /// an error: this rank's loss passed off as the mean would be a wrong number.
    fn core_metrics(&mut self, step: u64, lr: f64, wants: Needs) -> Result<Vec<Metric>> {
        let (since, since_step, phases_before) = self.metrics.last_emit;
        let steps = step - since_step;
        // The loss read waits for the device: the interval ends after it.
        let mut values = vec![self.tally.take_mean_loss(0, steps)];
        // The objective's metrics, as the loss: the mean over the steps and ranks.
        let objective = self.tally.take_metric_sums();
        for (_, sum) in &objective {
            values.push(sum.f_double_value(&[])? / steps.max(1) as f64);
        }
        let (tally, world) = (&self.tally, self.env.world as u64);
        let secs = since.elapsed().as_secs_f64().max(1e-9);
        let mut names = vec!["train/loss"];
        self.dist.sum_host(&mut values).map_err(Error::Dist)?;
        for v in &mut values {
            *v /= world as f64;
        }
        let objective: Vec<Metric> =
            objective.iter().zip(values.drain(1..)).map(|((name, _), v)| Metric::scalar(format!("train/{name}"), v)).collect();
        let tokens = tally.step_tokens * world * steps;
        let samples = tally.step_samples * world * steps;
        let epoch = tally.samples_seen as f64 / self.learner.dataset.train_len().max(1) as f64;
        values.extend([lr, tokens as f64 / secs, samples as f64 / secs, epoch]);
        names.extend(["train/lr", "train/tokens_per_s", "train/samples_per_s", "train/epoch"]);
        if wants.contains(Needs::DETAILED_METRICS) {
            if let Some(norm) = &tally.last_grad_norm {
                values.push(norm.double_value(&[]));
                names.push("train/grad_norm");
            }
            let p = tally.phases_total.per_step_since(&phases_before, steps);
            values.extend([p.data_s, p.forward_s, p.backward_s, p.optimizer_s, p.step_s]);
            names.extend(["time/data_s", "time/forward_s", "time/backward_s", "time/optimizer_s", "time/step_s"]);
            values.extend([device::current_memory(self.env.device) as f64, device::peak_memory(self.env.device) as f64]);
            names.extend(["memory/current_bytes", "memory/peak_bytes"]);
        }
        Ok(names.into_iter().zip(values).map(|(n, v)| Metric::scalar(n, v)).chain(objective).collect())
    }

    /// Histograms of every parameter and gradient, bucketed on the device.
    fn histograms(&self) -> Vec<Metric> {
        let mut out = Vec::new();
        for (name, p) in &self.learner.params {
            for (prefix, t) in [("params", p.detach()), ("grads", p.grad())] {
                if !t.defined() {
                    continue;
                }
                let t = t.to_kind(Kind::Float).flatten(0, -1);
                let stats = Tensor::stack(&[t.min(), t.max(), t.sum(Kind::Float), t.square().sum(Kind::Float)], 0);
                let stats: Vec<f32> = Vec::try_from(stats.to_device(Device::Cpu)).unwrap_or_default();
                let counts: Vec<f32> = Vec::try_from(t.histc(HISTOGRAM_BUCKETS as i64).to_device(Device::Cpu)).unwrap_or_default();
                if stats.len() < 4 || !stats.iter().all(|v| v.is_finite()) {
                    continue;
                }
                let (min, max) = (stats[0] as f64, stats[1] as f64);
                let histogram = Histogram {
                    min,
                    max,
                    num: t.numel() as f64,
                    sum: stats[2] as f64,
                    sum_squares: stats[3] as f64,
                    bucket_limits: Histogram::equal_width_limits(min, max, HISTOGRAM_BUCKETS).collect(),
                    bucket_counts: counts.iter().map(|&c| c as f64).collect(),
                };
                out.push(Metric::histogram(format!("{prefix}/{name}"), histogram));
            }
        }
        out
    }

    /// A progress line (or the bar's message), on rank 0 only: the mean step loss
    /// since the last line, over every rank (a collective, at a step every rank
    /// shows progress), read in the one sync.
    pub(super) fn show_progress(&mut self, step: u64, lr: f64) -> Result<()> {
        let (since, since_step) = self.metrics.last_progress;
        let mut loss = self.tally.take_mean_loss(1, step - since_step);
        let mut sum = [loss];
        self.dist.sum_host(&mut sum).map_err(Error::Dist)?;
        loss = sum[0] / self.env.world as f64;
        let secs = since.elapsed().as_secs_f64().max(1e-9);
        let steps = (step - since_step).max(1);
        let tokens_per_s = (self.tally.step_tokens * self.env.world as u64 * steps) as f64 / secs;
        let eta_s = secs / steps as f64 * (self.env.total_steps - step) as f64;
        self.metrics.progress.update(&progress::Line { step, loss, lr, tokens_per_s, eta_s });
        self.metrics.last_progress = (Instant::now(), step);
        Ok(())
    }
}
