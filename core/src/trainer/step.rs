//! The loop: `train` runs the steps, `train_step` is one optimizer step,
//! `forward_backward_step` one micro-batch, and `after_step` what a due step does
//! after the update. A step with nothing due pays one gate check.

use std::time::Instant;

use ptrain_plugin_api::{CheckpointReason, Hook, Needs, PhaseTimes, StepTensors, TensorRef};
use tch::Tensor;

use super::{
    failure::RunError,
    hooks::At,
    run::Run,
    stop::Stop,
    timing::{Phase, StepTimer},
    Outcome,
};
use crate::{
    error::Result,
    objective::{add_metrics, Metrics, StepScale},
    panic,
    schedule::{CoreTask, StepPlan},
};

/// How far the loop got: the last step done and the one running.
#[derive(Clone, Copy)]
struct Reached {
    done: u64,
    running: u64,
}

impl Run {
    /// Trains, and ends the run through [`Run::finish`] however the loop ended: its
    /// last step, a stop, an error or a panic on the training thread (a data
    /// worker's death and libtorch errors arrive as one of these). A failure ends
    /// as `status = "failed"` with exit 1, its summary written and the sinks drained.
    pub fn train(mut self) -> Result<Outcome> {
        // Plugins' start-up (opening files, the flops plugin's peak measurement) is
        // set-up, not training.
        let plugins_started = Instant::now();
        self.host.run_start(&self.env.run_data);
        self.env.setup_s += plugins_started.elapsed().as_secs_f64();
        let started = Instant::now();
        let mut reached = Reached { done: self.env.start_step, running: self.env.start_step };
        let device = self.env.device;
        let stop = match panic::catching(|| self.steps(&mut reached)) {
            Ok(Ok(stop)) => stop,
            // The error reaches the user as `Outcome.summary.error` (the CLI prints it).
            Ok(Err(error)) => Some(Stop::Failed(RunError::from_error(&error, reached.running, device))),
            Err(panic) => Some(Stop::Failed(RunError::from_panic(panic, reached.running, device))),
        };
        self.finish(reached.done, stop, started)
    }

    /// The steps, until the last one or a reason to stop.
    fn steps(&mut self, reached: &mut Reached) -> Result<Option<Stop>> {
        for step in self.env.start_step + 1..=self.env.total_steps {
            reached.running = step;
            let plan = if self.schedule.is_due(step) {
                // Planning opens the gate first, so a stop asked for from now on
                // is seen at the next step at the latest. Plugins that failed or
                // asked to leave leave the schedule first.
                let host = &mut self.host;
                let plan = self.schedule.plan(step, || host.take_departed(step));
                if let Some(reason) = self.stop.before_step(self.env.world) {
                    return Ok(Some(reason));
                }
                plan
            } else {
                StepPlan::NONE
            };
            let lr = self.learner.lr_schedule.lr(step);
            let phases = self.train_step(step, lr, plan)?;
            reached.done = step;
            if !plan.is_empty() {
                if let Some(reason) = self.after_step(step, lr, phases, plan)? {
                    return Ok(Some(reason));
                }
            }
        }
        Ok((reached.done < self.env.total_steps).then(|| self.stop.requested()).flatten())
    }

    /// One optimizer step: `accum_steps` micro-batches forward and backward, the
    /// non-finite flag, the gradient all-reduce, clipping and the update.
    fn train_step(&mut self, step: u64, lr: f64, plan: StepPlan) -> Result<PhaseTimes> {
        if self.learner.reseed {
            tch::manual_seed(self.env.config.run.seed.wrapping_add(step.wrapping_mul(0x9E37_79B9)) as i64);
        }
        let accum = self.env.config.optim.accum_steps;
        let detailed = plan.needs.contains(Needs::DETAILED_METRICS);
        let mut timer = StepTimer::start(self.env.device, detailed);
        if plan.has(Hook::StepStart) {
            self.call_hook(At { hook: Hook::StepStart, step, micro_batch: 0, lr, phases: timer.phases }, StepTensors::NONE);
            timer.book(Phase::Hooks);
        }
        self.learner.optimizer.zero_grad()?;
        let scale = self.stage_batches(&mut timer)?;
        let mut step_loss: Option<Tensor> = None;
        // The objective's metrics, scaled as the loss: empty (no allocation) for
        // objectives without any.
        let mut step_metrics = Metrics::new();
        for micro in 0..accum {
            let (loss, metrics) = self.forward_backward_step(step, micro, lr, plan, &scale, &mut timer)?;
            add_metrics(&mut step_metrics, metrics)?;
            step_loss = Some(match step_loss {
                None => loss,
                Some(sum) => sum + loss,
            });
        }
        let mut step_loss = step_loss.expect("at least one micro-batch");
        if plan.has(Hook::AfterBackward) {
            let tensors = StepTensors { loss: TensorRef::of(&step_loss), ..StepTensors::NONE };
            self.call_hook(At { hook: Hook::AfterBackward, step, micro_batch: accum - 1, lr, phases: timer.phases }, tensors);
            timer.book(Phase::Hooks);
        }
        let dump = self.dumps_tensors_at(step).then(|| self.tensors_before_update());
        let found_inf = self.nonfinite.flag(step, &mut step_loss);
        self.learner.optimizer.reduce_gradients(self.dist.as_mut(), found_inf)?;
        if self.env.config.optim.grad_clip > 0.0 || detailed {
            self.tally.last_grad_norm = Some(self.learner.optimizer.clip_grad_norm()?);
        }
        self.learner.optimizer.step(lr, Some(found_inf))?;
        self.learner.optimizer.sync_params(self.dist.as_mut())?;
        if plan.is_empty() {
            timer.book(Phase::Optimizer);
        } else {
            // A due step reads from the device (loss, flags): the wait is this step's.
            timer.settle(Phase::Optimizer);
        }
        if let Some(before) = dump {
            self.dump_tensors(step, before)?;
        }
        let (phases, hooks_s) = timer.finish();
        self.tally.count_step(self.env.world as u64, &phases, hooks_s, step_loss, step_metrics);
        Ok(phases)
    }

    /// One micro-batch: forward, the `AfterForward` hook when due, backward.
    /// Returns its (detached, scaled) loss and metrics: the step's are their sums.
    fn forward_backward_step(
        &mut self,
        step: u64,
        micro: u64,
        lr: f64,
        plan: StepPlan,
        scale: &StepScale,
        timer: &mut StepTimer,
    ) -> Result<(Tensor, Metrics)> {
        let batch = self.next_staged()?;
        timer.book(Phase::Data);
        let sum = self.objective.sum(&mut self.learner, &batch, true)?;
        let (logits, mut loss) = (sum.logits, scale.apply(sum.loss)?);
        let metrics = sum.metrics.into_iter().map(|(name, value)| Ok((name, scale.apply(value.f_detach()?)?))).collect::<Result<Metrics>>()?;
        if self.faults.at(step) {
            self.faults.inject(step)?;
        }
        if self.nonfinite.injects() && self.nonfinite.injected_at(step) {
            loss *= f64::NAN;
        }
        if self.dumps_tensors_at(step) {
            self.keep_batch_for_dump(micro, &batch, logits.as_ref())?;
        }
        timer.book(Phase::Forward);
        if plan.has(Hook::AfterForward) {
            let tensors = StepTensors {
                loss: TensorRef::of(&loss),
                // None with train.loss_chunk: the whole logits never exist.
                logits: logits.as_ref().map_or(TensorRef::NULL, TensorRef::of),
                labels: TensorRef::of(&batch.targets),
                dataset_ids: batch.dataset_ids.as_ref().map_or(TensorRef::NULL, TensorRef::of),
                inputs: TensorRef::of(&batch.inputs),
            };
            self.call_hook(At { hook: Hook::AfterForward, step, micro_batch: micro, lr, phases: timer.phases }, tensors);
            timer.book(Phase::Hooks);
        }
        // f_backward: a failure in backward (an activation checkpoint's recompute
        // running out of memory) ends the run as failed, not as a panic.
        match self.grad_spike_at(step) {
            Some(factor) => (&loss * factor).f_backward()?,
            None => loss.f_backward()?,
        }
        timer.book(Phase::Backward);
        Ok((loss.detach(), metrics))
    }

    /// Everything a due step does after the update, in order. Returns a reason to stop.
    fn after_step(&mut self, step: u64, lr: f64, phases: PhaseTimes, plan: StepPlan) -> Result<Option<Stop>> {
        if plan.has(Hook::StepEnd) {
            let at = At { hook: Hook::StepEnd, step, micro_batch: self.env.config.optim.accum_steps - 1, lr, phases };
            let loss = self.tally.last_loss.as_ref().map_or(TensorRef::NULL, TensorRef::of);
            self.call_hook(at, StepTensors { loss, ..StepTensors::NONE });
        }
        let mut stop = None;
        if plan.core(CoreTask::NonFiniteCheck) {
            stop = self.nonfinite.check(step);
            if stop.is_none() {
                stop = self.stop.agree(self.dist.as_ref())?;
            }
        }
        if plan.core(CoreTask::Eval) && stop.is_none() {
            self.evaluate(step, lr, phases)?;
        }
        if plan.core(CoreTask::EmptyCache) {
            let _ = ptrain_torch_ext::cuda::empty_cache();
        }
        // Metrics first: a checkpoint plugin scores this step's checkpoint by them.
        if plan.has(Hook::Metrics) || self.has_emitted() {
            self.emit_metrics(step, lr, plan)?;
        }
        if plan.has(Hook::Checkpoint) && stop.is_none() {
            let reason = if step == self.env.total_steps { CheckpointReason::End } else { CheckpointReason::Scheduled };
            self.save(step, reason)?;
        }
        if plan.core(CoreTask::Progress) {
            self.show_progress(step, lr)?;
        }
        Ok(stop)
    }
}
