//! The end of a run, however it ended: an emergency checkpoint when it stopped
//! early, the last metrics, the plugins' end, the summary, and the ranks' agreement
//! (through the rendezvous store, within `dist.end_timeout_s`): rank 0 writes the
//! summary once every rank has finished its end, and no rank leaves before it has.
//!
//! A failed run (an error or a panic in training) ends here too, with less: no
//! checkpoint (the state may be half-updated; the newest one on disk stays the
//! newest), no collectives (the other ranks may not be here), and device reads
//! that may fail again are caught; the plugins' end and the summary as always.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use ptrain_plugin_api::CheckpointReason;
use tch::{Device, Kind, Tensor};

use super::{
    ending::Ending,
    failure::RunError,
    late_signal::{self, EndSignals},
    memory::MemoryFigures,
    run::Run,
    stop::{Stop, StopControl},
    summary::{PhaseSummary, Summary},
    summary_write, Outcome,
};
use crate::{
    device,
    error::{Error, Result},
    host::RunEndData,
    panic,
    schedule::StepPlan,
};

/// Whether a signal came: from the end on, one ends the waits (the plugins' drain,
/// the other ranks).
fn signalled(stop: &StopControl) -> Box<dyn Fn() -> bool + '_> {
    match &stop.signals {
        Some(signals) => Box::new(signals.draining()),
        None => Box::new(|| false),
    }
}

/// What the end read from the device: the first and last loss, and the memory held.
type EndFigures = (Option<f64>, Option<f64>, MemoryFigures);

impl Run {
    /// Ends the run, however it ended: the end's work (an emergency save, the last
    /// metrics, the figures), the plugins' end, the summary, and the ranks'
    /// agreement around rank 0's writing it.
    pub(super) fn finish(mut self, last_step: u64, stop: Option<Stop>, started: Instant) -> Result<Outcome> {
        let mut ending = Ending::of(&stop, last_step);
        // A plugin's failure stop is agreed by every rank, as any stop: only an error or
        // a panic in training leaves the other ranks anywhere.
        let mut collective = !matches!(stop, Some(Stop::Failed(_)));
        if let Some(reason) = ending.stop_reason.as_ref().filter(|_| collective) {
            self.metrics.progress.println(&format!("stopping after step {last_step}: {reason}"));
        }
        // The end's own work (the last save and metrics, the figures read from the
        // device, the collectives) fails like a step: an error or a panic in it (a
        // libtorch error, a collective that timed out) fails the run, and the rest
        // of the end still happens: the plugins' end and the summary.
        let mut signals = EndSignals::mark(self.stop.signals.as_ref());
        let read = panic::catching(|| self.end_work(last_step, ending.last_save, stop.is_some(), collective, &signals));
        self.batches.stop();
        let device = self.env.device;
        let failed_at_end = match read {
            Ok(Ok(figures)) => Ok(figures),
            Ok(Err(e)) => Err(RunError::from_error(&e, last_step, device)),
            Err(panic) => Err(RunError::from_panic(panic, last_step, device)),
        };
        let figures = match failed_at_end {
            Ok(figures) => figures,
            Err(mut cause) => {
                cause.message = format!("at the end of the run, after step {last_step}: {}", cause.message);
                tracing::error!("{}", cause.message);
                ending.fail_at_end(cause);
                collective = false;
                self.figures_after_failure()
            }
        };
        let wall_s = started.elapsed().as_secs_f64();
        self.metrics.progress.finish();
        if signals.take(self.stop.signals.as_ref(), &mut ending) {
            let first = self.summary(last_step, ending.clone(), figures.clone(), wall_s, BTreeMap::new());
            late_signal::write_first(&self.env, first);
        }
        let plugins = self.end_plugins(last_step, &mut ending, wall_s, figures.1, &signals);
        let summary = self.summary(last_step, ending, figures, wall_s, plugins);
        self.record(summary, collective, last_step, signals.late())
    }

    /// The plugins' end (workers drain their queues, within `run.shutdown_timeout_s`
    /// or until a signal), and the exit code it decides: a critical plugin failed or
    /// given up on fails a completed run, any plugin under `run.strict_plugins`
    /// makes it exit 3.
    fn end_plugins(
        &mut self,
        last_step: u64,
        ending: &mut Ending,
        wall_s: f64,
        final_loss: Option<f64>,
        signals: &EndSignals,
    ) -> BTreeMap<String, serde_json::Value> {
        let final_eval_loss = self.tally.evals.last().map(|e| e.loss);
        let scalars = [("train/loss", final_loss), ("eval/loss", final_eval_loss)];
        let scalars = scalars.into_iter().filter_map(|(name, v)| Some((name.to_string(), v?))).collect();
        let end = RunEndData { step: last_step, exit_code: ending.exit_code, wall_s, scalars };
        let shutdown = signals.bound(Duration::from_secs_f64(self.env.config.run.shutdown_timeout_s));
        let summaries = self.host.run_end(end, shutdown, &*signalled(&self.stop));
        // Decided after the plugins' end, which may fail too; the plugins saw how training
        // went. A plugin given up on at the end counts as failed.
        let plugin_failed = !self.host.failures().is_empty() || !self.host.abandoned().is_empty();
        ending.exit_code = match ending.exit_code {
            // A critical plugin failed or was given up on in its end, after training.
            0 if self.host.critical_lost() => 1,
            0 if self.env.config.run.strict_plugins && plugin_failed => super::EXIT_PLUGIN_FAILED,
            code => code,
        };
        summaries
    }

    /// The run's record as this rank knows it.
    fn summary(
        &self,
        last_step: u64,
        ending: Ending,
        (first_loss, final_loss, memory): EndFigures,
        wall_s: f64,
        plugins: BTreeMap<String, serde_json::Value>,
    ) -> Summary {
        let (env, tally) = (&self.env, &self.tally);
        let steps = last_step - env.start_step;
        let samples = steps * tally.step_samples * env.world as u64;
        // Positions computed, padding included: the batches' own sizes, not the configured shape.
        let tokens = tally.tokens_this_part();
        let p = &tally.phases_total;
        let data_rows = self.learner.dataset.row_counts();
        // Instruction data: the units its objective counted are its trained tokens.
        let trained_tokens = data_rows.as_ref().map(|_| self.batches.units_counted());
        let per_s = |n: f64| n / wall_s.max(1e-9);
        Summary {
            epochs: tally.samples_seen as f64 / self.learner.dataset.train_len().max(1) as f64,
            trained_tokens,
            trained_tokens_per_s: trained_tokens.map(|t| per_s(t as f64)),
            data_rows,
            status: ending.status.into(),
            exit_code: ending.exit_code,
            stop_reason: ending.stop_reason,
            error: ending.error,
            stopped_by: ending.stopped_by,
            failed_by: ending.failed_by,
            steps,
            start_step: env.start_step,
            last_step,
            total_steps: env.total_steps,
            samples,
            tokens,
            wall_s,
            setup_s: env.setup_s,
            steps_per_s: per_s(steps as f64),
            samples_per_s: per_s(samples as f64),
            tokens_per_s: per_s(tokens as f64),
            first_loss,
            final_loss,
            final_eval_loss: tally.evals.last().map(|e| e.loss),
            evals: tally.evals.clone(),
            phase_times: PhaseSummary {
                data_s: p.data_s,
                forward_s: p.forward_s,
                backward_s: p.backward_s,
                optimizer_s: p.optimizer_s,
                hooks_s: tally.hooks_total_s,
            },
            peak_memory_bytes: device::peak_memory(env.device),
            device: device::label(env.device),
            device_name: env.run_data.device_name.clone(),
            precision: env.run_data.precision.clone(),
            world_size: env.world,
            collective_s: self.dist.collective_secs(),
            shard: self.learner.optimizer.shard_mode().name().into(),
            optimizer_state_bytes: memory.optimizer_state_bytes,
            gradient_bytes: memory.gradient_bytes,
            gradient_peak_bytes: memory.gradient_peak_bytes,
            parameter_bytes: memory.parameter_bytes,
            rank_peak_memory_bytes: memory.peak_memory_bytes,
            rank_load_peak_memory_bytes: memory.load_peak_memory_bytes,
            gathered_block_bytes: memory.gathered_block_bytes,
            model: env.run_data.model_kind.clone(),
            parameters: env.all_params,
            trainable_parameters: env.run_data.n_params,
            nonfinite_steps: self.nonfinite.total,
            resumed_from: env.resumed_from.clone(),
            checkpoint: late_signal::newest_checkpoint(env),
            checkpoint_wait_s: tally.checkpoint_wait_s,
            sampling_s: tally.sampling_s,
            learning_s: tally.learning_s,
            plugins_loaded: self.host.loaded(),
            plugin_failures: self.host.failures().to_vec(),
            detached_plugins: self.host.detached(),
            abandoned_plugins: self.host.abandoned().clone(),
            plugin_stalls: self.host.stalls(),
            queue_drops: self.host.queue_drops(),
            busy_at_save: self.host.busy_at_save(),
            queue_blocked_s: self.host.queue_blocked_s(),
            plugin_drain_s: self.host.drain_s().clone(),
            plugins,
            parts: Vec::new(),
        }
    }

    /// Writes the record: every rank has finished its end (saves waited for, plugins
    /// ended) before rank 0 writes it, and no rank leaves before it has; a rank that
    /// never got there fails the run, named in it.
    fn record(self, mut summary: Summary, collective: bool, last_step: u64, late: bool) -> Result<Outcome> {
        let env = &self.env;
        let end_timeout = Duration::from_secs(env.config.dist.end_timeout_s);
        // After a signal in the end, the other ranks are not waited for: the grace is short.
        let signalled: Box<dyn Fn() -> bool + '_> = if late { Box::new(|| true) } else { signalled(&self.stop) };
        let agreed = collective && env.world > 1 && {
            match self.dist.end_arrive(end_timeout, &*signalled) {
                Ok(()) => true,
                Err(e) => {
                    let message = format!("the end-of-run agreement failed after step {last_step}: {e}");
                    tracing::error!("{message}");
                    // A signal's run stays interrupted (exit 130/143); any other fails.
                    if summary.status != "interrupted" {
                        summary.status = "failed".into();
                    }
                    summary.exit_code = summary.exit_code.max(1);
                    summary.error.get_or_insert(RunError { kind: "error".into(), message, location: None, step: last_step });
                    false
                }
            }
        };
        if env.config.debug.dump_params && collective {
            self.dump_params()?;
        }
        let path = env.run_dir.join("summary.json");
        // A summary that cannot be written (a full or read-only disk) loses the run's
        // record: the CLI then prints its essentials, and the run does not exit 0. One
        // whose write never returns (a hung mount) is left to a second signal.
        let (mut summary, summary_error) = summary_write::write(summary, &path, env.unix_start, env.rank == 0, self.stop.signals.as_ref());
        if summary_error.is_some() && summary.exit_code == 0 {
            summary.exit_code = 1;
        }
        let mut exit_code = summary.exit_code;
        // No rank leaves before rank 0 has written (one rank alone has no one to wait for).
        if agreed {
            if let Err(e) = self.dist.end_release(end_timeout, &*signalled) {
                // Rank 0's record is written (or its failure reported); this rank fails.
                tracing::error!("at the end of the run: {e}");
                exit_code = exit_code.max(1);
                if env.rank == 0 && summary_error.is_none() && !signalled() {
                    summary = summary_write::rank_lost_after(summary, &e, &path, env.unix_start, self.stop.signals.as_ref());
                }
            }
        }
        Ok(Outcome { summary, run_dir: self.env.run_dir.clone(), exit_code, summary_error })
    }

    /// The last save (an emergency one after a stop), the last metrics, the saves
    /// waited for, and the figures read from the device: the first and last loss,
    /// the positions computed and the memory held, over every rank when `collective`.
    fn end_work(
        &mut self,
        last_step: u64,
        last_save: Option<CheckpointReason>,
        stopped: bool,
        collective: bool,
        signals: &EndSignals,
    ) -> Result<(Option<f64>, Option<f64>, MemoryFigures)> {
        if let Some(reason) = last_save {
            let saved_already = reason == CheckpointReason::End && self.tally.last_save_step == Some(last_step);
            if last_step > self.env.start_step && !saved_already {
                self.save(last_step, reason)?;
            }
        }
        if stopped && self.has_emitted() {
            // Only what plugins and evaluation emitted: no core metrics, no collective.
            self.emit_metrics(last_step, self.learner.lr_schedule.lr(last_step), StepPlan::NONE)?;
        }
        self.faults.at_finish();
        let figures = if collective {
            // Every distributed stop is agreed (see `StopControl::agree`), so all ranks
            // end at the same step and meet in these collectives. They come before
            // the wait for the last save (rank 0's, handed over as host copies): the
            // other ranks do not wait on its I/O inside a collective's timeout.
            let (first, last) = self.mean_losses(true)?;
            let mut tokens = [self.tally.tokens_local as f64];
            self.dist.sum_host(&mut tokens).map_err(Error::Dist)?;
            self.tally.agree_tokens(tokens[0] as u64);
            let memory =
                MemoryFigures::gather(self.learner.optimizer.as_ref(), self.dist.as_ref(), self.env.device, self.learner.load_peak_memory, true)?;
            (first, last, memory)
        } else {
            self.figures_after_failure()
        };
        // A signal ends this wait: the summary is written before anything more is waited for.
        let received = self.stop.signals.as_ref();
        let shutdown = Duration::from_secs_f64(self.env.config.run.shutdown_timeout_s);
        self.host.wait_saves(last_step, shutdown, &|| signals.arrived(received));
        Ok(figures)
    }

    /// What can still be read after a failure, this rank's alone: a device that
    /// failed may fail again, so each read is caught.
    fn figures_after_failure(&self) -> (Option<f64>, Option<f64>, MemoryFigures) {
        let losses = panic::catching(|| self.mean_losses(false)).ok().and_then(|r| r.ok()).unwrap_or((None, None));
        let memory = panic::catching(|| {
            MemoryFigures::gather(self.learner.optimizer.as_ref(), self.dist.as_ref(), self.env.device, self.learner.load_peak_memory, false)
        });
        (losses.0, losses.1, memory.ok().and_then(|r| r.ok()).unwrap_or_default())
    }

    /// The first and last training loss, averaged over the ranks (this rank's
    /// alone without `collective`).
    fn mean_losses(&self, collective: bool) -> Result<(Option<f64>, Option<f64>)> {
        let (Some(first), Some(last)) = (&self.tally.first_loss, &self.tally.last_loss) else {
            return Ok((None, None));
        };
        let mut both = Tensor::f_stack(&[first.f_to_kind(Kind::Double)?, last.f_to_kind(Kind::Double)?], 0)?;
        if collective {
            self.dist.all_reduce_sum(&mut both).map_err(Error::Dist)?;
            both = both.f_div_scalar(self.env.world as f64)?;
        }
        let v = Vec::<f64>::try_from(both.f_to_device(Device::Cpu)?)?;
        Ok((v.first().copied(), v.get(1).copied()))
    }

    /// `[debug] dump_params`: this rank's final parameters, so tests can compare ranks.
    fn dump_params(&self) -> Result<()> {
        let dir = &self.env.run_dir;
        std::fs::create_dir_all(dir).map_err(Error::writing(dir))?;
        let path = dir.join(format!("params-rank{}.safetensors", self.env.rank));
        let host = self.learner.params.iter().map(|(n, t)| Ok((n.as_str(), t.f_to_device(Device::Cpu)?))).collect::<Result<Vec<_>>>()?;
        Tensor::write_safetensors(&host, &path)?;
        Ok(())
    }
}
