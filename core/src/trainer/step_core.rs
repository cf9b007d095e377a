//! The core of a training step: the step's micro-batches in; forward and the
//! objective, backward, the non-finite flag, the gradient reduction, clipping and the
//! update; the step's loss, metrics and gradient norm out, on the device, and the
//! positions it computed. Nothing in it reads the device, keeps time, logs, calls a
//! plugin or writes a file: hooks, the step timer and the `[debug]` tools sit at its
//! [`Seams`], whose every default does nothing.
//!
//! So it is the part of a step that can be replayed as it is: a CUDA graph captures
//! [`StepCore::run`] once per shape with seams that do nothing and replays it (docs/architecture.md,
//! "Step modes"); on-line RL samples its rollouts before it and hands them in as the
//! micro-batches.

use tch::Tensor;

use super::{learner::Learner, nonfinite::NonFinite};
use crate::{
    data::Batch,
    dist::DataParallel,
    error::Result,
    objective::{add_metrics, Metrics, Objective, StepScale},
};

/// Where the step's micro-batches come from (the loader's staged batches in the
/// eager step).
pub(super) trait MicroBatches {
    fn next(&mut self) -> Result<Batch>;
}

/// What runs around the core, at fixed points of every step. Each default does
/// nothing.
pub(super) trait Seams {
    /// Micro-batch `micro` was taken.
    fn fetched(&mut self, _micro: u64, _batch: &Batch) {}

    /// Micro-batch `micro`'s forward and objective ran: `loss` (scaled to the step,
    /// with its graph) goes to backward next. An observer may read it, the batch and
    /// the logits (`None` with the chunked loss), or change it (a `[debug]` fault).
    fn forwarded(&mut self, _learner: &Learner, _micro: u64, _batch: &Batch, _logits: Option<&Tensor>, _loss: &mut Tensor) -> Result<()> {
        Ok(())
    }

    /// A factor micro-batch `micro`'s backward runs with (the reported loss keeps its
    /// value): a `[debug]` gradient spike.
    fn backward_factor(&mut self, _micro: u64) -> Option<f64> {
        None
    }

    /// Micro-batch `micro`'s backward ran.
    fn backwarded(&mut self, _micro: u64) {}

    /// Every backward ran and the gradients are there; the update comes next.
    /// `tokens`: the positions of the step's micro-batches.
    fn before_update(&mut self, _learner: &Learner, _loss: &Tensor, _tokens: u64) -> Result<()> {
        Ok(())
    }

    /// The update ran; the parameters are the new ones.
    fn updated(&mut self, _learner: &Learner) -> Result<()> {
        Ok(())
    }
}

/// What a step computed: device tensors, read only when something reports them.
pub(super) struct StepOut {
    /// The step's loss (detached): the sum of its scaled micro-batch losses.
    pub loss: Tensor,
    /// The objective's metrics, scaled as the loss (empty for objectives without any).
    pub metrics: Metrics,
    /// The global gradient norm before clipping, when clipping or asked for.
    pub grad_norm: Option<Tensor>,
    /// Token positions of the step's micro-batches, padding included (host counts
    /// from the batches' sizes).
    pub tokens: u64,
}

/// What one step is: which step, divided by what. Its learning rate is on the
/// device already (`Learner::lr`, set before the core runs).
pub(super) struct StepInput<'a> {
    pub step: u64,
    pub accum: u64,
    pub scale: &'a StepScale,
    /// Compute the gradient norm even without clipping (detailed metrics asked for it).
    pub grad_norm: bool,
}

/// The parts of the run a step updates.
pub(super) struct StepCore<'a> {
    pub learner: &'a mut Learner,
    pub objective: &'a dyn Objective,
    pub dist: &'a mut dyn DataParallel,
    pub nonfinite: &'a mut NonFinite,
    /// `optim.grad_clip`.
    pub grad_clip: f64,
}

impl StepCore<'_> {
    /// One optimizer step: `accum` micro-batches forward and backward, the
    /// non-finite flag, the gradient reduction, clipping, the update and the
    /// parameters made equal on every rank.
    pub fn run(self, input: StepInput, batches: &mut dyn MicroBatches, seams: &mut dyn Seams) -> Result<StepOut> {
        let StepCore { learner, objective, dist, nonfinite, grad_clip } = self;
        learner.optimizer.zero_grad()?;
        let (mut loss, mut metrics, mut tokens) = (None::<Tensor>, Metrics::new(), 0);
        for micro in 0..input.accum {
            let batch = batches.next()?;
            tokens += batch.tokens.max(0) as u64;
            seams.fetched(micro, &batch);
            let sum = objective.sum(&mut learner.runner(), &batch, true)?;
            let mut micro_loss = input.scale.apply(sum.loss)?;
            let scaled = sum.metrics.into_iter().map(|(name, value)| Ok((name, input.scale.apply(value.f_detach()?)?)));
            add_metrics(&mut metrics, scaled.collect::<Result<Metrics>>()?)?;
            add_metrics(&mut metrics, per_micro_batch(sum.means, input.accum)?)?;
            if let Some(aux) = learner.model.take_aux_loss() {
                micro_loss = add_aux(micro_loss, aux, input.accum, &mut metrics)?;
            }
            seams.forwarded(learner, micro, &batch, sum.logits.as_ref(), &mut micro_loss)?;
            // f_backward: a failure in backward (an activation checkpoint's recompute
            // running out of memory) ends the run as failed, not as a panic.
            match seams.backward_factor(micro) {
                Some(factor) => (&micro_loss * factor).f_backward()?,
                None => micro_loss.f_backward()?,
            }
            seams.backwarded(micro);
            let micro_loss = micro_loss.f_detach()?;
            loss = Some(match loss {
                None => micro_loss,
                Some(sum) => sum.f_add(&micro_loss)?,
            });
        }
        let mut loss = loss.ok_or_else(|| crate::error::Error::Other("a step of no micro-batch (optim.accum_steps = 0)".into()))?;
        seams.before_update(learner, &loss, tokens)?;
        let found_inf = nonfinite.flag(input.step, &mut loss);
        learner.optimizer.reduce_gradients(dist, found_inf)?;
        let grad_norm = (grad_clip > 0.0 || input.grad_norm).then(|| learner.optimizer.clip_grad_norm()).transpose()?;
        learner.optimizer.step(&learner.lr, Some(found_inf))?;
        learner.optimizer.sync_params(dist)?;
        seams.updated(learner)?;
        Ok(StepOut { loss, metrics, grad_norm, tokens })
    }
}

/// `micro_loss` plus the model's auxiliary loss (a mixture's router losses), as each
/// forward's loss in transformers: a term per forward, so a micro-batch's share is it
/// over the step's `accum` micro-batches whatever the objective counts (the gradient
/// all-reduce then averages the ranks'); its metrics added to the step's alike.
fn add_aux(micro_loss: Tensor, aux: crate::model::AuxLoss, accum: u64, metrics: &mut Metrics) -> Result<Tensor> {
    add_metrics(metrics, per_micro_batch(aux.metrics, accum)?)?;
    Ok(micro_loss.f_add(&StepScale::MicroBatches(accum).apply(aux.loss)?)?)
}

/// Metrics that are means over a micro-batch as shares of a step of `accum` (divided
/// as a step of micro-batch means divides them; the ranks' shares are averaged when
/// the metrics are read), detached.
fn per_micro_batch(means: Metrics, accum: u64) -> Result<Metrics> {
    let share = StepScale::MicroBatches(accum);
    means.into_iter().map(|(name, value)| Ok((name, share.apply(value.f_detach()?)?))).collect()
}

#[cfg(test)]
mod tests;
