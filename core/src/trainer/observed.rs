//! What sits around the step's core in the eager loop ([`Observed`], the core's
//! [`Seams`]): the step timer's phase boundaries, the inline plugins' `AfterForward`
//! and `AfterBackward` hooks when due, and the `[debug]` tools (faults injected into
//! the loss, a gradient spike, tensor dumps). Each costs an untaken branch on a
//! step where it is not due.

use ptrain_plugin_api::{Hook, StepTensors, TensorRef};
use tch::Tensor;

use super::{
    debug::{Faults, TensorDump},
    hooks::{At, HookCall},
    learner::Learner,
    run::RunEnv,
    step_core::Seams,
    tally::Tally,
    timing::{Phase, StepTimer},
};
use crate::{data::Batch, error::Result, host::PluginHost, schedule::RunSchedule, schedule::StepPlan};

/// The eager step's seams, borrowing what they use from the run.
pub(super) struct Observed<'a> {
    pub step: u64,
    pub lr: f64,
    pub plan: StepPlan,
    pub accum: u64,
    pub timer: &'a mut StepTimer,
    pub env: &'a RunEnv,
    pub tally: &'a mut Tally,
    pub host: &'a mut PluginHost,
    pub schedule: &'a RunSchedule,
    pub faults: &'a Faults,
    pub dump: &'a mut TensorDump,
    pub train_len: u64,
}

impl Observed<'_> {
    /// Calls the plugins due at `hook` and books their time apart from the phases.
    fn hook(&mut self, hook: Hook, micro_batch: u64, tensors: StepTensors, params: &[(String, Tensor)]) {
        let at = At { hook, step: self.step, micro_batch, lr: self.lr, phases: self.timer.phases };
        let mut call = HookCall { env: self.env, tally: self.tally, train_len: self.train_len, host: self.host, schedule: self.schedule };
        call.call(at, tensors, params);
        self.timer.book(Phase::Hooks);
    }
}

impl Seams for Observed<'_> {
    fn fetched(&mut self, _micro: u64, _batch: &Batch) {
        self.timer.book(Phase::Data);
    }

    fn forwarded(&mut self, learner: &Learner, micro: u64, batch: &Batch, logits: Option<&Tensor>, loss: &mut Tensor) -> Result<()> {
        if self.faults.at(self.step) {
            self.faults.inject(self.step)?;
        }
        if self.faults.nan_at(self.step) {
            *loss *= f64::NAN;
        }
        if self.dump.at(self.step) {
            self.dump.keep_batch(micro, batch, logits)?;
        }
        self.timer.book(Phase::Forward);
        if self.plan.has(Hook::AfterForward) {
            let tensors = StepTensors {
                loss: TensorRef::of(loss),
                // None with train.loss_chunk: the whole logits never exist.
                logits: logits.map_or(TensorRef::NULL, TensorRef::of),
                labels: TensorRef::of(&batch.targets),
                dataset_ids: batch.dataset_ids.as_ref().map_or(TensorRef::NULL, TensorRef::of),
                inputs: TensorRef::of(&batch.inputs),
            };
            self.hook(Hook::AfterForward, micro, tensors, &learner.params);
        }
        Ok(())
    }

    fn backward_factor(&mut self, _micro: u64) -> Option<f64> {
        self.faults.grad_spike(self.step)
    }

    fn backwarded(&mut self, _micro: u64) {
        self.timer.book(Phase::Backward);
    }

    fn before_update(&mut self, learner: &Learner, loss: &Tensor, tokens: u64) -> Result<()> {
        // Every micro-batch is taken now: the positions this step computes.
        self.tally.step_tokens = tokens;
        if self.plan.has(Hook::AfterBackward) {
            let tensors = StepTensors { loss: TensorRef::of(loss), ..StepTensors::NONE };
            self.hook(Hook::AfterBackward, self.accum - 1, tensors, &learner.params);
        }
        if self.dump.at(self.step) {
            self.dump.keep_before_update(&learner.params);
        }
        Ok(())
    }

    fn updated(&mut self, learner: &Learner) -> Result<()> {
        if self.plan.is_empty() {
            self.timer.book(Phase::Optimizer);
        } else {
            // A due step reads from the device (loss, flags): the wait is this step's.
            self.timer.settle(Phase::Optimizer);
        }
        if self.dump.at(self.step) {
            self.dump.write(self.step, &learner.params, &self.env.run_dir, self.env.rank)?;
        }
        Ok(())
    }
}
