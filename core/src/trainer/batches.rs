//! A step's micro-batches, fetched ahead when the step's divisor needs them.
//!
//! The objective says what each micro-batch counts ([`Count`]). Micro-batch means
//! need nothing ahead: the step divides by `accum_steps`. Units (instruction
//! data's trained tokens) differ between micro-batches and ranks: the step's
//! micro-batches are fetched first and their counts (host integers) added, and
//! across ranks that count is all-reduced once, on the device ([`StepScale`]).

use std::collections::VecDeque;

use tch::{Device, Tensor};

use super::{
    step_core::MicroBatches,
    timing::{Phase, StepTimer},
};
use crate::{
    data::{Batch, Loader},
    dist::DataParallel,
    error::{Error, Result},
    model::{decoder::BlockWrap, Model},
    objective::{Count, Objective, StepScale},
    rollout::RolloutStage,
};

pub(super) struct StepBatches {
    /// Taken at the end, which stops its threads.
    loader: Option<Loader>,
    device: Device,
    accum: u64,
    /// Fetched ahead within the step.
    staged: VecDeque<Batch>,
    /// Units counted on this rank, since the start of this part of the run.
    units: u64,
    /// Units counted on this rank in the current step (0 when the objective counts
    /// micro-batches): plugins read it as `StepContext::step_trained_tokens`.
    step_units: u64,
    /// Units counted on several ranks: those of every rank, summed on the device
    /// (read at the end only).
    units_all_ranks: Option<Tensor>,
    /// On-line RL (`data.kind = "prompts"`): turns the step's prompts into scored
    /// rollouts before the core ([`StepBatches::roll_out`]).
    rollout: Option<RolloutStage>,
    /// The step's rollouts, served before the loader's batches.
    rolled: VecDeque<Batch>,
}

impl MicroBatches for StepBatches {
    fn next(&mut self) -> Result<Batch> {
        StepBatches::next(self)
    }
}

impl StepBatches {
    pub fn new(loader: Loader, device: Device, accum: u64) -> StepBatches {
        StepBatches {
            loader: Some(loader),
            device,
            accum,
            staged: VecDeque::with_capacity(accum as usize),
            units: 0,
            step_units: 0,
            units_all_ranks: None,
            rollout: None,
            rolled: VecDeque::new(),
        }
    }

    /// With a rollout stage, the step's batches are its rollouts.
    pub fn with_rollout(self, rollout: Option<RolloutStage>) -> StepBatches {
        StepBatches { rollout, ..self }
    }

    /// The rollout stage, when there is one: the step's `accum_steps` micro-batches of
    /// prompts are sampled with `model` and scored, and served as the step's batches.
    /// `whole`: parameter sharding's wrap, which holds the whole model on each rank
    /// for the stage (ZeRO-3: a rank's sampler runs as many forwards as its own
    /// completions need, which no per-block gather with the other ranks could follow).
    pub fn roll_out(&mut self, step: u64, model: &mut dyn Model, whole: Option<&dyn BlockWrap>, timer: &mut StepTimer) -> Result<()> {
        if self.rollout.is_none() {
            return Ok(());
        }
        let prompts = (0..self.accum).map(|_| self.fetch()).collect::<Result<Vec<_>>>()?;
        let stage = self.rollout.as_mut().ok_or_else(|| Error::Other("the rollout stage has stopped".into()))?;
        whole.map_or(Ok(()), |w| w.hold_whole(true))?;
        let rolled = stage.roll_out(step, model, prompts);
        whole.map_or(Ok(()), |w| w.hold_whole(false))?;
        self.rolled.extend(rolled?);
        timer.book(Phase::Data);
        Ok(())
    }

    /// The step's `completions` record (a JSON table, every rank's completions), at
    /// the steps the rollout stage records one.
    pub fn take_completions(&mut self) -> Result<Option<String>> {
        self.rollout.as_mut().map_or(Ok(None), RolloutStage::take_completions)
    }

    /// The seconds the step spent in the rollout stage, when there is one.
    pub fn sampling_s(&self) -> Option<f64> {
        self.rollout.as_ref().map(|stage| stage.step_s)
    }

    fn fetch(&mut self) -> Result<Batch> {
        if let Some(batch) = self.rolled.pop_front() {
            return Ok(batch);
        }
        let loader = self.loader.as_mut().ok_or_else(|| Error::Other("the data loader has stopped".into()))?;
        Ok(loader.next_batch()?.to_device(self.device, true))
    }

    /// Fetches the step's first micro-batch and, when the objective counts units,
    /// the rest, and says what the step divides their sums by.
    pub fn stage(&mut self, objective: &dyn Objective, dist: &dyn DataParallel, timer: &mut StepTimer) -> Result<StepScale> {
        let first = self.fetch()?;
        let mut count = objective.count(&first)?;
        self.staged.push_back(first);
        if let Count::Units(mut units) = count {
            for _ in 1..self.accum {
                let batch = self.fetch()?;
                if let Count::Units(n) = objective.count(&batch)? {
                    units += n;
                }
                self.staged.push_back(batch);
            }
            timer.book(Phase::Data);
            self.units += units;
            self.step_units = units;
            count = Count::Units(units);
        }
        let (scale, all_ranks) = StepScale::of_step(count, self.accum, dist, self.device)?;
        if let Some(all) = all_ranks {
            self.units_all_ranks = Some(match self.units_all_ranks.take() {
                Some(total) => total.f_add(&all)?,
                None => all,
            });
        }
        Ok(scale)
    }

    /// The next micro-batch of the step: staged, or fetched now.
    pub fn next(&mut self) -> Result<Batch> {
        match self.staged.pop_front() {
            Some(batch) => Ok(batch),
            None => self.fetch(),
        }
    }

    /// The units counted (instruction data's trained tokens) on every rank: a read
    /// from the device with several ranks (0 if that fails).
    pub fn units_counted(&self) -> u64 {
        match &self.units_all_ranks {
            Some(all) => all.f_to_device(Device::Cpu).and_then(|t| t.f_double_value(&[])).map_or(0, |v| v as u64),
            None => self.units,
        }
    }

    /// The units this rank counted in the step staged last.
    pub fn step_units(&self) -> u64 {
        self.step_units
    }

    /// Stops the loader's threads.
    pub fn stop(&mut self) {
        self.loader = None;
        // Its completions writer finishes its lines.
        self.rollout = None;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tch::Kind;

    use super::*;
    use crate::{
        data::{loader::DrawPlan, BatchKey, Dataset, Split},
        dist::SingleRank,
        objective::{CausalLmMean, CausalLmPerToken},
    };

    /// Rows of 4 tokens; micro-batch m trains m + 1 of them. Remembers what it was asked for.
    #[derive(Default)]
    struct Counted {
        asked: Mutex<Vec<BatchKey>>,
    }

    impl Dataset for Counted {
        fn batch(&self, _split: Split, key: BatchKey) -> Result<Batch> {
            self.asked.lock().unwrap().push(key);
            let tokens = Tensor::zeros([1, 4], (Kind::Int64, Device::Cpu));
            let trained = key.micro as i64 + 1;
            Ok(Batch {
                inputs: tokens.copy(),
                targets: tokens,
                dataset_ids: None,
                segments: None,
                payload: crate::data::Payload::TrainedTokens(trained),
                samples: 1,
                tokens: 4,
            })
        }
        fn dataset_names(&self) -> Vec<String> {
            Vec::new()
        }
        fn train_len(&self) -> u64 {
            100
        }
        fn seq_len(&self) -> i64 {
            4
        }
    }

    fn batches(data: &Arc<Counted>) -> StepBatches {
        let plan = DrawPlan { first_step: 1, accum_steps: 3, batch_size: 1, rank: 0, world: 1 };
        StepBatches::new(Loader::new(data.clone(), plan, 0, 1, None), Device::Cpu, 3)
    }

    fn timer() -> StepTimer {
        StepTimer::start(Device::Cpu, false)
    }

    #[test]
    fn a_step_counted_in_units_is_fetched_whole_before_its_first_forward() {
        let data = Arc::new(Counted::default());
        let mut step = batches(&data);
        let scale = step.stage(&CausalLmPerToken { chunk: 0 }, &SingleRank, &mut timer()).unwrap();
        assert_eq!(data.asked.lock().unwrap().len(), 3, "every micro-batch fetched to count its units");
        assert!(matches!(scale, StepScale::Host(f) if f == 1.0 / 6.0), "1 + 2 + 3 trained tokens: {scale:?}");
        let micros: Vec<u64> = (0..3).map(|_| step.next().unwrap().payload.trained_tokens().unwrap() as u64 - 1).collect();
        assert_eq!(micros, [0, 1, 2], "served in order");
        assert_eq!(data.asked.lock().unwrap().len(), 3, "from the staged ones");
        step.stage(&CausalLmPerToken { chunk: 0 }, &SingleRank, &mut timer()).unwrap();
        assert_eq!(step.units_counted(), 12, "the units of both steps");
    }

    #[test]
    fn a_step_of_micro_batch_means_fetches_each_when_it_is_due() {
        let data = Arc::new(Counted::default());
        let mut step = batches(&data);
        let scale = step.stage(&CausalLmMean { chunk: 0 }, &SingleRank, &mut timer()).unwrap();
        assert!(matches!(scale, StepScale::MicroBatches(3)), "{scale:?}");
        assert_eq!(data.asked.lock().unwrap().len(), 1, "only the first, to ask what it counts");
        for micro in 0..3 {
            assert_eq!(step.next().unwrap().payload.trained_tokens(), Some(micro + 1));
            assert_eq!(data.asked.lock().unwrap().len() as i64, micro + 1, "fetched when due");
        }
        assert_eq!(step.units_counted(), 0, "no units");
        step.stop();
        assert!(step.next().unwrap_err().to_string().contains("stopped"));
    }
}
