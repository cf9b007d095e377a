//! Handing a checkpoint to the checkpoint plugins. The loop waits only for a
//! previous save still being written and for the copies to host memory; the
//! plugin's worker thread does the I/O.

use std::time::Instant;

use ptrain_plugin_api::{CheckpointPayload, CheckpointReason};

use super::{
    payload,
    run::Run,
    state::{EvalRecord, TrainState},
};
use crate::{
    config::ShardMode,
    error::Result,
    host::{Event, Reach},
};

impl Run {
    /// The training state at `step`, as `state.json` keeps it.
    fn train_state(&self, step: u64) -> TrainState {
        TrainState {
            samples_seen: self.tally.samples_seen,
            tokens_seen: self.tally.tokens_seen,
            nonfinite_total: self.nonfinite.total,
            nonfinite_run: self.nonfinite.run,
            eval: self.tally.evals.last().map(|e| EvalRecord { step: e.step, loss: e.loss }),
            shard: self.learner.optimizer.checkpoint_layout(),
            lora_base_sha256: self.env.lora_base.clone(),
            ..TrainState::new(step, self.env.config.run.seed, self.env.world)
        }
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
        self.host.wait_saves();
        self.tally.checkpoint_wait_s += waited.elapsed().as_secs_f64();
        let lead = self.env.rank == 0;
        let weights = if lead { &self.learner.params[..] } else { &[] };
        let model = weights.iter().map(|(n, t)| payload::to_blob(n, t)).collect::<Result<Vec<_>>>()?;
        let optimizer = self.learner.optimizer.state().iter().map(|(n, t)| payload::to_blob(n, t)).collect::<Result<Vec<_>>>()?;
        let plugin_states = if lead { self.host.save_states(step) } else { Vec::new().into() };
        let payload = CheckpointPayload {
            step,
            reason,
            model: model.into(),
            optimizer: optimizer.into(),
            state_json: self.train_state(step).to_json().into(),
            config_toml: self.env.run_data.config_toml.as_str().into(),
            plugin_states,
        };
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
