//! What a checkpoint hands to the checkpoint plugins: the learner's weights and
//! optimizer state copied to host memory (the only part of a save the loop waits
//! for, besides a previous save still being written), and the training state. The
//! plugin's worker thread does the I/O.

use abi_stable::std_types::RVec;
use ptrain_plugin_api::{CheckpointPayload, CheckpointReason, NamedBlob};

use super::{
    learner::Learner,
    nonfinite::NonFinite,
    payload,
    run::RunEnv,
    state::{EvalRecord, TrainState},
    tally::Tally,
};
use crate::{config::ShardMode, error::Result};

/// The training state at `step`, as `state.json` keeps it.
pub(super) fn train_state(step: u64, env: &RunEnv, tally: &Tally, nonfinite: &NonFinite, learner: &Learner) -> TrainState {
    TrainState {
        samples_seen: tally.samples_seen,
        tokens_seen: tally.tokens_seen,
        nonfinite_total: nonfinite.total,
        nonfinite_run: nonfinite.run,
        eval: tally.evals.last().map(|e| EvalRecord { step: e.step, loss: e.loss }),
        shard: learner.optimizer.checkpoint_layout(),
        lora_base_digest: env.lora_base.clone(),
        ..TrainState::new(step, env.config.run.seed, env.world)
    }
}

/// The checkpoint of `state.step`: the weights only from the `lead` rank (the
/// others hand over their slice of a sharded optimizer's state), the plugins'
/// states and the configuration.
pub(super) fn payload(
    reason: CheckpointReason,
    state: &TrainState,
    learner: &Learner,
    lead: bool,
    config_toml: &str,
    plugin_states: RVec<NamedBlob>,
) -> Result<CheckpointPayload> {
    // With `parameters` no rank holds whole weights: each part carries its chunks.
    let whole = lead && learner.optimizer.shard_mode() != ShardMode::Parameters;
    let weights = if whole { &learner.params[..] } else { &[] };
    let model = weights.iter().map(|(n, t)| payload::to_blob(n, t)).collect::<Result<Vec<_>>>()?;
    let held = learner.optimizer.state().into_iter().chain(learner.optimizer.sharded_params());
    let optimizer = held.map(|(n, t)| payload::to_blob(&n, &t)).collect::<Result<Vec<_>>>()?;
    Ok(CheckpointPayload {
        step: state.step,
        reason,
        model: model.into(),
        optimizer: optimizer.into(),
        state_json: state.to_json().into(),
        config_toml: config_toml.into(),
        plugin_states,
    })
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use super::*;
    use crate::config::{Config, ConfigBuilder};

    fn mlp() -> Config {
        ConfigBuilder::default().set("model.kind=\"mlp\"").unwrap().set("data.synthetic_len=64").unwrap().build().unwrap()
    }

    #[test]
    fn the_lead_rank_hands_over_every_weight_and_every_rank_its_optimizer_state() {
        let learner = Learner::for_tests(&mlp());
        let state = TrainState { samples_seen: 96, ..TrainState::new(3, 1337, 2) };
        let lead = payload(CheckpointReason::Scheduled, &state, &learner, true, "[run]", RVec::new()).unwrap();
        assert_eq!((lead.step, lead.reason, lead.config_toml.as_str()), (3, CheckpointReason::Scheduled, "[run]"));
        assert_eq!(lead.model.len(), learner.params.len());
        for (blob, (name, param)) in lead.model.iter().zip(&learner.params) {
            assert_eq!(blob.name.as_str(), name);
            let saved = Tensor::from_slice(&blob.data).view_dtype(Kind::Float).view(param.size().as_slice());
            assert!(saved.equal(&param.detach().to_device(Device::Cpu)), "{name} copied as it is");
        }
        assert_eq!(lead.optimizer.len(), learner.optimizer.state().len());
        assert!(!lead.optimizer.is_empty());
        assert_eq!(serde_json::from_str::<TrainState>(lead.state_json.as_str()).unwrap(), state);
        let other = payload(CheckpointReason::Scheduled, &state, &learner, false, "[run]", RVec::new()).unwrap();
        assert!(other.model.is_empty(), "one copy of the weights, from rank 0");
        assert_eq!(other.optimizer.len(), lead.optimizer.len());
    }
}
