//! A step's micro-batches, fetched ahead when the step's divisor needs them.
//!
//! The objective says what each micro-batch counts ([`Count`]). Micro-batch means
//! need nothing ahead: the step divides by `accum_steps`. Units (instruction
//! data's trained tokens) differ between micro-batches and ranks: the step's
//! micro-batches are fetched first and their counts (host integers) added, and
//! across ranks that count is all-reduced once, on the device ([`StepScale`]).

use std::collections::VecDeque;

use tch::{Reduction, Tensor};

use super::{
    debug::host_copy,
    run::Run,
    timing::{Phase, StepTimer},
};
use crate::{
    data::Batch,
    error::{Error, Result},
    objective::{cross_entropy, Count, StepScale},
};

/// Micro-batches fetched ahead within a step, and what a dump keeps of them.
#[derive(Default)]
pub(super) struct Staged {
    batches: VecDeque<Batch>,
    /// `[debug] dump_tensors_at`: each micro-batch's tensors and per-token losses.
    pub dumped: Vec<(String, Tensor)>,
    /// Units counted on several ranks: those of every rank, summed on the device,
    /// read at the end.
    pub units_all_ranks: Option<Tensor>,
}

impl Run {
    fn fetch(&mut self) -> Result<Batch> {
        let loader = self.learner.loader.as_mut().ok_or_else(|| Error::Other("the data loader has stopped".into()))?;
        Ok(loader.next_batch()?.to_device(self.env.device, true))
    }

    /// Fetches the step's first micro-batch and, when the objective counts units,
    /// the rest, and says what the step divides their sums by.
    pub(super) fn stage_batches(&mut self, timer: &mut StepTimer) -> Result<StepScale> {
        let accum = self.env.config.optim.accum_steps;
        let first = self.fetch()?;
        let mut count = self.objective.count(&first)?;
        self.staged.batches.push_back(first);
        if let Count::Units(mut units) = count {
            for _ in 1..accum {
                let batch = self.fetch()?;
                if let Count::Units(n) = self.objective.count(&batch)? {
                    units += n;
                }
                self.staged.batches.push_back(batch);
            }
            timer.book(Phase::Data);
            self.tally.trained_tokens += units;
            count = Count::Units(units);
        }
        let (scale, all_ranks) = StepScale::of_step(count, accum, self.dist.as_ref(), self.env.device)?;
        if let Some(all) = all_ranks {
            self.staged.units_all_ranks = Some(match self.staged.units_all_ranks.take() {
                Some(total) => total.f_add(&all)?,
                None => all,
            });
        }
        Ok(scale)
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
            dumped.push((name("token_loss"), host_copy(&cross_entropy(logits, &batch.targets, Reduction::None)?.f_detach()?)));
        }
        Ok(())
    }
}
