//! The core's metrics and progress lines. [`MetricsProcessor`] owns what they need
//! between emissions (since when, since which step) and what evaluation emitted
//! since, and builds a [`MetricBatch`] from the run's [`Tally`] only on steps where
//! a sink is due or something was emitted, at the detail the due sinks asked for.

use std::time::Instant;

use abi_stable::std_types::RVec;
use ptrain_plugin_api::{Histogram, Metric, MetricBatch, Needs, PhaseTimes};
use tch::{Device, Kind, Tensor};

use super::{
    clock::unix_now,
    learner::Learner,
    progress,
    run::RunEnv,
    summary::EvalPoint,
    tally::{Since, Tally},
};
use crate::{
    device,
    dist::DataParallel,
    error::{Error, Result},
};

/// Buckets of the parameter and gradient histograms.
const HISTOGRAM_BUCKETS: usize = 30;

/// What the core metrics are read from, besides the tally.
pub(super) struct Sources<'a> {
    pub dist: &'a dyn DataParallel,
    pub params: &'a [(String, Tensor)],
    /// Distinct training samples, for `train/epoch`.
    pub train_len: u64,
    pub device: Device,
    pub world: u32,
    pub unix_start: f64,
    pub total_steps: u64,
}

impl<'a> Sources<'a> {
    pub fn of(env: &'a RunEnv, learner: &'a Learner, dist: &'a dyn DataParallel) -> Sources<'a> {
        Sources {
            dist,
            params: &learner.params,
            train_len: learner.dataset.train_len(),
            device: env.device,
            world: env.world,
            unix_start: env.unix_start,
            total_steps: env.total_steps,
        }
    }
}

pub(super) struct MetricsProcessor {
    /// What evaluation emitted since the last batch (inline plugins' metrics wait
    /// in the host: `PluginHost::drain_emitted`).
    emitted: Vec<Metric>,
    /// When and at which step the last batch with core metrics went out, and the
    /// phase totals then.
    last_emit: (Instant, u64, PhaseTimes),
    /// When and at which step the last progress line was shown.
    last_progress: (Instant, u64),
    /// Token positions of every rank in this part of the run at the last emission
    /// and the last progress line: rates are the positions computed since.
    tokens_at_emit: u64,
    tokens_at_progress: u64,
    pub progress: progress::Progress,
}

impl MetricsProcessor {
    pub fn new(start_step: u64, progress: progress::Progress) -> MetricsProcessor {
        MetricsProcessor {
            emitted: Vec::with_capacity(64),
            last_emit: (Instant::now(), start_step, PhaseTimes::default()),
            last_progress: (Instant::now(), start_step),
            tokens_at_emit: 0,
            tokens_at_progress: 0,
            progress,
        }
    }

    /// Whether evaluation emitted metrics not sent yet.
    pub fn has_emitted(&self) -> bool {
        !self.emitted.is_empty()
    }

    /// Keeps `metric` for the next batch, which then reaches every sink (the rollout
    /// stage's `completions` record).
    pub fn emit(&mut self, metric: Metric) {
        self.emitted.push(metric);
    }

    /// Shows an evaluation and keeps its metrics (`eval/loss`, `eval/<name>`) for
    /// the next batch; returns them, for the `Eval` hook.
    pub fn record_eval(&mut self, point: &EvalPoint) -> &[Metric] {
        let shown: String = point.metrics.iter().map(|(name, v)| format!(", {name} {v:.3}")).collect();
        let samples = super::eval::held_out_samples(point.samples);
        self.progress.println(&format!("eval at step {}: loss {:.4}{shown} ({samples})", point.step, point.loss));
        let start = self.emitted.len();
        self.emitted.push(Metric::scalar("eval/loss", point.loss));
        self.emitted.extend(point.metrics.iter().map(|(name, v)| Metric::scalar(format!("eval/{name}"), *v)));
        &self.emitted[start..]
    }

    /// The batch of `step`: `metrics` (what plugins emitted), then evaluation's,
    /// then the core metrics `wants` asks for (none: nothing is read).
    pub fn batch(&mut self, step: u64, lr: f64, wants: Needs, mut metrics: Vec<Metric>, tally: &mut Tally, from: &Sources) -> Result<MetricBatch> {
        metrics.append(&mut self.emitted);
        if wants.intersects(Needs::BASIC_METRICS.union(Needs::DETAILED_METRICS).union(Needs::HISTOGRAMS)) {
            metrics.extend(self.core_metrics(step, lr, wants, tally, from)?);
            if wants.contains(Needs::HISTOGRAMS) {
                metrics.extend(histograms(from.params));
            }
            self.last_emit = (Instant::now(), step, tally.phases_total);
        }
        let now = unix_now();
        Ok(MetricBatch { step, wall_time: now, elapsed_s: now - from.unix_start, metrics: RVec::from(metrics) })
    }

    /// `train/*` (`train/loss` the mean step loss since the last emission, and the
    /// objective's metrics likewise, averaged over ranks in one collective), and
    /// with detailed metrics `train/grad_norm`, `time/*` and `memory/*`. A failed
    /// all-reduce is an error: this rank's loss passed off as the mean would be a
    /// wrong number.
    fn core_metrics(&mut self, step: u64, lr: f64, wants: Needs, tally: &mut Tally, from: &Sources) -> Result<Vec<Metric>> {
        let (since, since_step, phases_before) = self.last_emit;
        let steps = step - since_step;
        // The loss read waits for the device: the interval ends after it.
        let mut values = vec![tally.take_mean_loss(Since::Metrics, steps)?];
        let objective = tally.take_metric_sums();
        for (_, sum) in &objective {
            values.push(sum.f_double_value(&[])? / steps.max(1) as f64);
        }
        let world = from.world as u64;
        let secs = since.elapsed().as_secs_f64().max(1e-9);
        let mut names = vec!["train/loss"];
        // The ranks' positions computed ride the same collective, summed.
        values.push(tally.tokens_local as f64);
        from.dist.sum_host(&mut values).map_err(Error::Dist)?;
        let tokens_all = values.pop().unwrap_or_default() as u64;
        tally.agree_tokens(tokens_all);
        for v in &mut values {
            *v /= world as f64;
        }
        let objective: Vec<Metric> =
            objective.iter().zip(values.drain(1..)).map(|((name, _), v)| Metric::scalar(format!("train/{name}"), v)).collect();
        let tokens = tokens_all - self.tokens_at_emit.min(tokens_all);
        self.tokens_at_emit = tokens_all;
        let samples = tally.step_samples * world * steps;
        let epoch = tally.samples_seen as f64 / from.train_len.max(1) as f64;
        values.extend([lr, tokens as f64 / secs, samples as f64 / secs, epoch]);
        names.extend(["train/lr", "train/tokens_per_s", "train/samples_per_s", "train/epoch"]);
        if wants.contains(Needs::DETAILED_METRICS) {
            if let Some(norm) = &tally.last_grad_norm {
                values.push(norm.f_double_value(&[])?);
                names.push("train/grad_norm");
            }
            let p = tally.phases_total.per_step_since(&phases_before, steps);
            values.extend([p.data_s, p.forward_s, p.backward_s, p.optimizer_s, p.step_s]);
            names.extend(["time/data_s", "time/forward_s", "time/backward_s", "time/optimizer_s", "time/step_s"]);
            values.extend([device::current_memory(from.device) as f64, device::peak_memory(from.device) as f64]);
            names.extend(["memory/current_bytes", "memory/peak_bytes"]);
        }
        Ok(names.into_iter().zip(values).map(|(n, v)| Metric::scalar(n, v)).chain(objective).collect())
    }

    /// A progress line (or the bar's message), on rank 0 only: the mean step loss
    /// since the last line, over every rank (a collective, at a step every rank
    /// shows progress), read in the one sync.
    pub fn show_progress(&mut self, step: u64, lr: f64, tally: &mut Tally, from: &Sources) -> Result<()> {
        let (since, since_step) = self.last_progress;
        // The mean loss and the positions computed, of every rank, in one collective.
        let mut sum = [tally.take_mean_loss(Since::Progress, step - since_step)?, tally.tokens_local as f64];
        from.dist.sum_host(&mut sum).map_err(Error::Dist)?;
        let loss = sum[0] / from.world as f64;
        let tokens_all = sum[1] as u64;
        tally.agree_tokens(tokens_all);
        let secs = since.elapsed().as_secs_f64().max(1e-9);
        let steps = (step - since_step).max(1);
        let tokens_per_s = tokens_all.saturating_sub(self.tokens_at_progress) as f64 / secs;
        self.tokens_at_progress = tokens_all;
        let eta_s = secs / steps as f64 * (from.total_steps - step) as f64;
        let epoch = tally.samples_seen as f64 / from.train_len.max(1) as f64;
        self.progress.update(&progress::Line { step, loss, lr, tokens_per_s, eta_s, epoch });
        self.last_progress = (Instant::now(), step);
        Ok(())
    }
}

/// Histograms of every parameter and gradient, bucketed on the device.
fn histograms(params: &[(String, Tensor)]) -> Vec<Metric> {
    let mut out = Vec::new();
    for (name, p) in params {
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

#[cfg(test)]
mod tests;
