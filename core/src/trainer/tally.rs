//! Running totals of the run: read by hook contexts, metrics, checkpoints and the
//! summary. The losses stay on the device: a step adds to them in place, and only
//! what reports them reads them.

use ptrain_plugin_api::PhaseTimes;
use tch::{Kind, Tensor};

use super::summary::EvalPoint;
use crate::{
    error::Result,
    objective::{add_metrics, Metrics},
};

#[derive(Default)]
pub(super) struct Tally {
    /// Samples in one optimizer step on one rank.
    pub step_samples: u64,
    /// Token positions computed in the current optimizer step on this rank, padding
    /// included (a classifier's sample counts as one): the batches' own sizes,
    /// known once the step's micro-batches are fetched.
    pub step_tokens: u64,
    /// Over every rank, since the start of training (resumed runs included).
    /// `tokens_seen` is exact after each reading of the ranks' totals
    /// ([`Tally::agree_tokens`], at progress lines, metrics and the end); between
    /// them it adds this rank's positions for every rank.
    pub samples_seen: u64,
    pub tokens_seen: u64,
    /// `tokens_seen` when this part of the run started.
    pub tokens_before: u64,
    /// Token positions this rank computed in this part of the run.
    pub tokens_local: u64,
    /// Instruction data: the trained tokens (the units its objective counts) on this
    /// rank in the current step.
    pub step_trained_tokens: u64,
    pub phases_total: PhaseTimes,
    /// Time spent in inline plugins' step hooks, kept out of the phases.
    pub hooks_total_s: f64,
    /// Device scalars, read only when something reports them.
    pub first_loss: Option<Tensor>,
    pub last_loss: Option<Tensor>,
    pub last_grad_norm: Option<Tensor>,
    /// Sums of the step losses on the device: [0] since the last `train/loss`,
    /// [1] since the last progress line. One in-place add a step, no sync.
    loss_sums: Option<Tensor>,
    /// Sums of the objective's step metrics on the device since the last
    /// emission (empty for objectives without any).
    metric_sums: Metrics,
    pub evals: Vec<EvalPoint>,
    /// Time the loop waited for a previous save to finish.
    pub checkpoint_wait_s: f64,
    /// The step of the last checkpoint handed to the checkpoint plugins.
    pub last_save_step: Option<u64>,
    /// With a rollout stage (GRPO from prompts): the seconds spent in it, and the rest
    /// of the steps' (learning).
    pub sampling_s: Option<f64>,
    pub learning_s: Option<f64>,
}

/// Which running sum of the step losses to read.
#[derive(Clone, Copy)]
pub(super) enum Since {
    /// The last `train/loss`.
    Metrics = 0,
    /// The last progress line.
    Progress = 1,
}

impl Tally {
    /// The totals of a run whose steps each take `step_samples` samples on a rank,
    /// having seen `samples_seen` and `tokens_seen` before (a resumed run's).
    pub fn new(step_samples: u64, samples_seen: u64, tokens_seen: u64) -> Tally {
        Tally { step_samples, samples_seen, tokens_seen, tokens_before: tokens_seen, ..Tally::default() }
    }

    /// Every rank's positions in this part of the run, read by a collective:
    /// `tokens_seen` becomes exact.
    pub fn agree_tokens(&mut self, all_ranks: u64) {
        self.tokens_seen = self.tokens_before + all_ranks;
    }

    /// Positions of every rank in this part of the run (exact as of the last
    /// [`Tally::agree_tokens`]).
    pub fn tokens_this_part(&self) -> u64 {
        self.tokens_seen - self.tokens_before
    }

    /// The mean step loss since the last read of `since` over `steps` steps, and
    /// that sum started again. A host sync; NaN before any step.
    pub fn take_mean_loss(&mut self, since: Since, steps: u64) -> Result<f64> {
        let Some(sums) = &self.loss_sums else { return Ok(f64::NAN) };
        let mut sum = sums.f_select(0, since as i64)?;
        let value = sum.f_double_value(&[])?;
        let _ = sum.f_zero_()?;
        Ok(value / steps.max(1) as f64)
    }

    /// The objective's metrics since the last emission, each summed over the steps
    /// (device scalars, not read here), and the sums started again.
    pub fn take_metric_sums(&mut self) -> Metrics {
        std::mem::take(&mut self.metric_sums)
    }

    /// Counts a step that spent `sampling_s` of its `step_s` in the rollout stage;
    /// returns the rest, its learning seconds, as a step metric (a host scalar).
    pub fn count_rollout(&mut self, sampling_s: f64, step_s: f64) -> Tensor {
        let learning_s = (step_s - sampling_s).max(0.0);
        *self.sampling_s.get_or_insert(0.0) += sampling_s;
        *self.learning_s.get_or_insert(0.0) += learning_s;
        Tensor::from(learning_s)
    }

    /// Counts one finished optimizer step over `world` ranks: its (detached) loss
    /// and the objective's metrics, scaled as the loss.
    pub fn count_step(&mut self, world: u64, phases: &PhaseTimes, hooks_s: f64, loss: Tensor, metrics: Metrics) {
        self.phases_total = self.phases_total.plus(phases);
        self.hooks_total_s += hooks_s;
        self.samples_seen += self.step_samples * world;
        self.tokens_seen += self.step_tokens * world;
        self.tokens_local += self.step_tokens;
        if self.first_loss.is_none() {
            self.first_loss = Some(loss.shallow_clone());
        }
        match &mut self.loss_sums {
            // A failed add shows as a wrong mean, never as a failed step.
            Some(sums) => drop(sums.f_add_(&loss)),
            None => self.loss_sums = loss.f_to_kind(Kind::Double).and_then(|l| l.f_repeat([2])).ok(),
        }
        if !metrics.is_empty() {
            drop(add_metrics(&mut self.metric_sums, metrics));
        }
        self.last_loss = Some(loss);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(tally: &mut Tally, loss: f64, metrics: &[(&'static str, f64)]) {
        let metrics = metrics.iter().map(|(n, v)| (*n, Tensor::from(*v))).collect();
        tally.count_step(2, &PhaseTimes { step_s: 1.0, ..PhaseTimes::default() }, 0.5, Tensor::from(loss as f32), metrics);
    }

    #[test]
    fn each_reader_gets_the_mean_since_its_own_last_read() {
        let mut tally = Tally::new(4, 0, 0);
        tally.step_tokens = 32;
        assert!(tally.take_mean_loss(Since::Metrics, 1).unwrap().is_nan(), "nothing before the first step");
        for loss in [1.0, 3.0] {
            step(&mut tally, loss, &[]);
        }
        assert_eq!(tally.take_mean_loss(Since::Metrics, 2).unwrap(), 2.0);
        step(&mut tally, 8.0, &[]);
        assert_eq!(tally.take_mean_loss(Since::Metrics, 1).unwrap(), 8.0, "started again after the read");
        assert_eq!(tally.take_mean_loss(Since::Progress, 3).unwrap(), 4.0, "the progress line's own sum: all three");
        let (first, last) = (tally.first_loss.as_ref().unwrap(), tally.last_loss.as_ref().unwrap());
        assert_eq!((first.double_value(&[]), last.double_value(&[])), (1.0, 8.0));
        assert_eq!((tally.samples_seen, tally.tokens_seen), (24, 192), "three steps of two ranks");
        assert_eq!(tally.tokens_local, 96, "this rank's");
        tally.agree_tokens(180);
        assert_eq!((tally.tokens_seen, tally.tokens_this_part()), (180, 180), "the ranks' own counts, read");
        assert_eq!((tally.phases_total.step_s, tally.hooks_total_s), (3.0, 1.5));
    }

    #[test]
    fn the_objectives_metrics_are_summed_over_steps_until_taken() {
        let mut tally = Tally::default();
        assert!(tally.take_metric_sums().is_empty());
        step(&mut tally, 1.0, &[("rewards/chosen", 0.5), ("rewards/margin", 2.0)]);
        step(&mut tally, 1.0, &[("rewards/chosen", 1.5)]);
        let taken: Vec<(&str, f64)> = tally.take_metric_sums().iter().map(|(n, v)| (*n, v.double_value(&[]))).collect();
        assert_eq!(taken, [("rewards/chosen", 2.0), ("rewards/margin", 2.0)]);
        assert!(tally.take_metric_sums().is_empty(), "started again");
    }
}
