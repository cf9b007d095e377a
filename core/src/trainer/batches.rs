//! A step's micro-batches, and how their losses add up to the step's loss.
//!
//! Text windows and classification rows weigh every target alike: a micro-batch's
//! loss is its mean, divided by `accum_steps`. Instruction data does not (rows
//! differ in length and in how many of their tokens are trained), so averaging
//! each micro-batch on its own would make the loss depend on how a step is split
//! (transformers #34191). Its step loss is the sum over the step's trained tokens
//! divided by their number in the whole step, all micro-batches and all ranks:
//! the step's micro-batches are fetched first and their counts (host integers)
//! added, and across ranks the count is all-reduced once, on the device.

use std::collections::VecDeque;

use ptrain_plugin_api::Task;
use tch::{Kind, Reduction, Tensor};

use super::{
    debug::host_copy,
    run::{Learner, Run},
    timing::{Phase, StepTimer},
};
use crate::{
    data::Batch,
    error::{Error, Result},
    model::{self, chunked_loss},
};

/// How a micro-batch's loss becomes its share of the step's loss.
pub(super) enum LossScale {
    /// The micro-batch's mean, divided by the micro-batches of the step.
    Mean {
        accum: u64,
    },
    /// The micro-batch's summed loss times ranks / (the step's trained tokens on
    /// all ranks): the gradient all-reduce averages over ranks.
    PerToken(Tensor),
    PerTokenHost(f64),
}

impl LossScale {
    pub fn apply(&self, task: Task, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        Ok(match self {
            LossScale::Mean { accum } => {
                let mut loss = model::loss(task, logits, targets);
                if *accum > 1 {
                    loss /= *accum as f64;
                }
                loss
            }
            LossScale::PerTokenHost(factor) => model::token_loss(logits, targets, Reduction::Sum)?.f_mul_scalar(*factor)?,
            LossScale::PerToken(factor) => model::token_loss(logits, targets, Reduction::Sum)?.f_mul(factor)?,
        })
    }
}

impl LossScale {
    /// The loss of the hidden states' logits, computed `chunk` positions at a time
    /// ([`chunked_loss::summed`]), scaled as [`LossScale::apply`] scales.
    pub fn apply_chunked(&self, hidden: &Tensor, weight: &Tensor, targets: &Tensor, chunk: i64) -> Result<Tensor> {
        let sum = chunked_loss::summed(hidden, weight, targets, chunk)?;
        Ok(match self {
            LossScale::Mean { accum } => {
                let count = targets.f_ne(-100)?.f_sum(Kind::Float)?.f_clamp_min(1.0)?;
                sum.f_div(&count)?.f_div_scalar(*accum as f64)?
            }
            LossScale::PerTokenHost(factor) => sum.f_mul_scalar(*factor)?,
            LossScale::PerToken(factor) => sum.f_mul(factor)?,
        })
    }
}

impl Learner {
    /// The micro-batch's logits (unless chunked) and its scaled loss. With
    /// `loss_chunk > 0` and a model that hands out its hidden states, the loss is
    /// computed a chunk of positions at a time and there are no logits.
    pub(super) fn forward_loss(&mut self, batch: &Batch, scale: &LossScale, loss_chunk: i64) -> Result<(Option<Tensor>, Tensor)> {
        if loss_chunk > 0 {
            if let Some((hidden, weight)) = self.forward_hidden(batch, true)? {
                return Ok((None, scale.apply_chunked(&hidden, &weight, &batch.targets, loss_chunk)?));
            }
        }
        let logits = self.forward(batch, true)?;
        let loss = scale.apply(self.task, &logits, &batch.targets)?;
        Ok((Some(logits), loss))
    }
}

/// Micro-batches fetched ahead within a step, and what a dump keeps of them.
#[derive(Default)]
pub(super) struct Staged {
    batches: VecDeque<Batch>,
    /// `[debug] dump_tensors_at`: each micro-batch's tensors and per-token losses.
    pub dumped: Vec<(String, Tensor)>,
    /// Instruction data on several ranks: trained tokens of every rank, summed on
    /// the device, read at the end.
    pub trained_all_ranks: Option<Tensor>,
}

impl Run {
    fn fetch(&mut self) -> Result<Batch> {
        let loader = self.learner.loader.as_mut().ok_or_else(|| Error::Other("the data loader has stopped".into()))?;
        Ok(loader.next_batch()?.to_device(self.env.device, true))
    }

    /// Fetches the step's first micro-batch and, for instruction data, the rest,
    /// and says how their losses are scaled.
    pub(super) fn stage_batches(&mut self, timer: &mut StepTimer) -> Result<LossScale> {
        let accum = self.env.config.optim.accum_steps;
        let first = self.fetch()?;
        let Some(mut count) = first.trained_tokens else {
            self.staged.batches.push_back(first);
            return Ok(LossScale::Mean { accum });
        };
        self.staged.batches.push_back(first);
        for _ in 1..accum {
            let batch = self.fetch()?;
            count += batch.trained_tokens.unwrap_or(0);
            self.staged.batches.push_back(batch);
        }
        timer.book(Phase::Data);
        self.tally.step_trained_tokens = count.max(0) as u64;
        self.tally.trained_tokens += self.tally.step_trained_tokens;
        if self.env.world == 1 {
            // The count is this rank's alone, known on the host: no device scalar.
            return Ok(LossScale::PerTokenHost(1.0 / count.max(1) as f64));
        }
        let mut all = Tensor::from(count as f64).f_to_device(self.env.device)?;
        self.dist.all_reduce_sum(&mut all).map_err(Error::Dist)?;
        let total = match self.staged.trained_all_ranks.take() {
            Some(t) => t.f_add(&all)?,
            None => all.shallow_clone(),
        };
        self.staged.trained_all_ranks = Some(total);
        Ok(LossScale::PerToken(all.f_clamp_min(1.0)?.f_reciprocal()?.f_mul_scalar(self.env.world as f64)?.f_to_kind(Kind::Float)?))
    }

    /// The next micro-batch of the step: staged, or fetched now.
    pub(super) fn next_staged(&mut self) -> Result<Batch> {
        match self.staged.batches.pop_front() {
            Some(batch) => Ok(batch),
            None => self.fetch(),
        }
    }

    /// Host copies of a micro-batch's tensors and per-token losses, for the dump.
    pub(super) fn keep_batch_for_dump(&mut self, micro: u64, batch: &Batch, logits: Option<&Tensor>) -> Result<()> {
        let name = |what: &str| format!("batch{micro}/{what}");
        let dumped = &mut self.staged.dumped;
        dumped.push((name("inputs"), host_copy(&batch.inputs)));
        dumped.push((name("targets"), host_copy(&batch.targets)));
        if let Some(s) = &batch.segments {
            dumped.push((name("positions"), host_copy(&s.positions)));
            dumped.push((name("segments"), host_copy(&s.ids)));
        }
        if let Some(logits) = logits.filter(|l| l.dim() == 3) {
            dumped.push((name("token_loss"), host_copy(&model::token_loss(logits, &batch.targets, Reduction::None)?.f_detach()?)));
        }
        Ok(())
    }
}
