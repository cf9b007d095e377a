//! The loop: `train` runs the steps, `train_step` is one optimizer step (the step's
//! core, `step_core`, with the timer, hooks and `[debug]` tools at its seams,
//! `observed`), and `after_step` what a due step does after the update, through the
//! run's components (evaluation, metrics, checkpoints, hooks). A step with nothing
//! due pays one gate check.

use std::time::{Duration, Instant};

use ptrain_plugin_api::{CheckpointReason, Hook, Metric, Needs, PhaseTimes, Scalar, StepTensors, TensorRef};

use super::{
    failure::RunError,
    hooks::{step_context, At, HookCall},
    metrics::Sources,
    observed::Observed,
    run::Run,
    save,
    step_core::{StepCore, StepInput},
    stop::Stop,
    timing::{Phase, StepTimer},
    Outcome,
};
use crate::{
    config::ShardMode,
    error::Result,
    host::{Event, Reach},
    panic,
    schedule::{CoreTask, StepPlan},
};

/// How long the end-of-run save waits for a sink busy in a call of its own to give
/// its state (at most `run.shutdown_timeout_s`).
const END_SAVE_WAIT: Duration = Duration::from_secs(5);

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
                if let Some(reason) = self.stop.before_step(self.env.world, step) {
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

    /// One optimizer step: the step's core ([`StepCore::run`]: `accum_steps`
    /// micro-batches forward and backward, the non-finite flag, the gradient
    /// reduction, clipping and the update), with the timer, the due hooks and the
    /// `[debug]` tools at its seams ([`Observed`]).
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
        let whole = self.learner.optimizer.block_wrap().map(|(wrap, _)| wrap);
        self.batches.roll_out(step, self.learner.model.as_mut(), whole.as_deref(), &mut timer)?;
        if let Some(table) = self.batches.take_completions()? {
            // To every sink with this step's metrics (W&B's table, TensorBoard's text).
            self.metrics.emit(Metric::text(crate::rollout::record::COMPLETIONS, table));
        }
        let scale = self.batches.stage(self.objective.as_ref(), self.dist.as_ref(), &mut timer)?;
        self.learner.lr.set(lr)?;
        self.tally.step_trained_tokens = self.batches.step_units();
        let core = StepCore {
            learner: &mut self.learner,
            objective: self.objective.as_ref(),
            dist: self.dist.as_mut(),
            nonfinite: &mut self.nonfinite,
            grad_clip: self.env.config.optim.grad_clip,
        };
        let train_len = core.learner.dataset.train_len();
        let mut seams = Observed {
            step,
            lr,
            plan,
            accum,
            timer: &mut timer,
            env: &self.env,
            tally: &mut self.tally,
            host: &mut self.host,
            schedule: &self.schedule,
            faults: &self.faults,
            dump: &mut self.dump,
            train_len,
        };
        let input = StepInput { step, accum, scale: &scale, grad_norm: detailed };
        let out = core.run(input, &mut self.batches, &mut seams)?;
        self.tally.step_tokens = out.tokens;
        if out.grad_norm.is_some() {
            self.tally.last_grad_norm = out.grad_norm;
        }
        let (phases, hooks_s) = timer.finish();
        let mut metrics = out.metrics;
        if let Some(sampling_s) = self.batches.sampling_s() {
            metrics.push((crate::rollout::LEARNING_S, self.tally.count_rollout(sampling_s, phases.step_s)));
        }
        self.tally.count_step(self.env.world as u64, &phases, hooks_s, out.loss, metrics);
        Ok(phases)
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
        if plan.core(CoreTask::Eval) && stop.is_none() && self.evaluator.enabled() {
            if !plan.needs.contains(Needs::HISTOGRAMS) {
                // This step's gradients are read by nothing after the update but the
                // histograms: evaluation runs without them where they are released.
                self.learner.optimizer.release_grads()?;
            }
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
            let from = Sources::of(&self.env, &self.learner, self.dist.as_ref());
            self.metrics.show_progress(step, lr, &mut self.tally, &from)?;
        }
        Ok(stop)
    }

    /// Calls the inline plugins due at `at.hook` (see [`HookCall`]).
    fn call_hook(&mut self, at: At, tensors: StepTensors) {
        let train_len = self.learner.dataset.train_len();
        let mut call = HookCall { env: &self.env, tally: &self.tally, train_len, host: &mut self.host, schedule: &self.schedule };
        call.call(at, tensors, &self.learner.params);
    }

    /// Evaluates, shows and keeps the result, and calls the `Eval` hook with it.
    fn evaluate(&mut self, step: u64, lr: f64, phases: PhaseTimes) -> Result<()> {
        let point = self.evaluator.run(&mut self.learner, self.objective.as_ref(), self.dist.as_ref(), step)?;
        let metrics = self.metrics.record_eval(&point);
        self.tally.evals.push(point);
        let scalars: Vec<Scalar<'_>> = metrics.iter().filter_map(|m| Some(Scalar { name: m.name.as_rstr(), value: m.as_scalar()? })).collect();
        let at = At { hook: Hook::Eval, step, micro_batch: 0, lr, phases };
        let ctx = step_context(&self.env, &self.tally, self.learner.dataset.train_len(), at, StepTensors::NONE, &scalars);
        self.host.dispatch(Event::Step(&ctx), Reach::Due(self.schedule.due()));
        Ok(())
    }

    /// Whether inline plugins or evaluation emitted metrics not sent yet.
    pub(super) fn has_emitted(&self) -> bool {
        self.metrics.has_emitted() || self.host.has_emitted()
    }

    /// Sends what is due at `step` to the sinks: the core metrics the due sinks
    /// asked for, plus whatever was emitted since the last batch (which reaches
    /// every sink). In the order they were emitted: a step's plugin hooks, its
    /// `Eval` hook, then evaluation's own.
    pub(super) fn emit_metrics(&mut self, step: u64, lr: f64, plan: StepPlan) -> Result<()> {
        let emitted = self.has_emitted();
        let mut metrics = Vec::with_capacity(64);
        self.host.drain_emitted(&mut metrics);
        let from = Sources::of(&self.env, &self.learner, self.dist.as_ref());
        let batch = self.metrics.batch(step, lr, plan.needs, metrics, &mut self.tally, &from)?;
        let reach = if emitted { Reach::Declared } else { Reach::Due(self.schedule.due()) };
        self.host.dispatch(Event::Metrics(batch.into()), reach);
        Ok(())
    }

    /// Saves the run at `step`: rank 0 only, or, sharded, every rank (each hands
    /// over its optimizer slice, rank 0 also the rest). A scheduled save reaches
    /// the checkpoint plugins due now, an emergency save every checkpoint plugin.
    pub(super) fn save(&mut self, step: u64, reason: CheckpointReason) -> Result<()> {
        let sharded = self.learner.optimizer.shard_mode() != ShardMode::None;
        if (self.env.rank != 0 && !sharded) || !self.host.has_checkpointer() {
            return Ok(());
        }
        let waited = Instant::now();
        // Bounded: a writer stuck in I/O is given up (and disabled) at its timeout.
        self.host.wait_saves(step, Duration::from_secs_f64(self.env.config.run.shutdown_timeout_s), &|| false);
        if !self.host.has_checkpointer() {
            self.tally.checkpoint_wait_s += waited.elapsed().as_secs_f64();
            return Ok(());
        }
        let lead = self.env.rank == 0;
        let state = save::train_state(step, &self.env, &self.tally, &self.nonfinite, &self.learner);
        // The plugins' states count as waiting on the save too. A worker busy in a call
        // of its own is not waited for during training (host::busy); at the end of a
        // run no step waits behind the save, so a sink mid-upload gets a little time to
        // give its newest state (bounded: a hung sink costs this once).
        let wait = match reason {
            CheckpointReason::End => END_SAVE_WAIT.min(Duration::from_secs_f64(self.env.config.run.shutdown_timeout_s)),
            CheckpointReason::Scheduled | CheckpointReason::Interrupted | CheckpointReason::NonFinite => Duration::ZERO,
        };
        let plugin_states = if lead { self.host.save_states(step, wait) } else { Vec::new().into() };
        self.tally.checkpoint_wait_s += waited.elapsed().as_secs_f64();
        let payload = save::payload(reason, &state, &self.learner, lead, &self.env.run_data.config_toml, plugin_states)?;
        let reach = match reason {
            CheckpointReason::Scheduled => Reach::Due(self.schedule.due()),
            CheckpointReason::End if step == self.env.total_steps => Reach::Due(self.schedule.due()),
            // A run a plugin ended early: its last step was not planned as the end.
            CheckpointReason::End | CheckpointReason::Interrupted | CheckpointReason::NonFinite => Reach::Declared,
        };
        self.tally.last_save_step = Some(step);
        self.host.dispatch(Event::Checkpoint(payload.into()), reach);
        Ok(())
    }
}
