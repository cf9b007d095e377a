//! Set-up's learning stages, each returning one component: the data (and the
//! evaluator over its held-out part), the model (built whole, by a factory, or cut
//! into this rank's shard as it is built), and the learner (the objective, the
//! optimizer over the trainable parameters, the checkpoint's state restored).

use std::sync::Arc;

use tch::{nn, Device};

use super::{super::sharding, place::Place};
use crate::{
    checkpoint::Checkpoint,
    config::{Config, Precision, ShardMode},
    data::Dataset,
    dist::DataParallel,
    error::{Error, Result},
    model::{self, Model},
    objective::{self, Objective},
    optim::{CutModel, GradMemory, ParamSharding},
    trainer::{
        eval::{held_out_samples, Evaluator},
        learner::Learner,
        state::{self, TrainState},
        ModelFactory,
    },
};

/// The configured dataset (or the one handed over), and the evaluator over its
/// held-out samples.
pub(in crate::trainer) fn data(
    config: &Config,
    given: Option<Arc<dyn Dataset>>,
    dist: &dyn DataParallel,
    device: Device,
) -> Result<(Arc<dyn Dataset>, Evaluator)> {
    let dataset = match given {
        Some(d) => d,
        None => crate::data::from_config(config)?,
    };
    let (rank, world) = (dist.rank(), dist.world_size());
    if world > 1 && config.data.kind.is_grpo() && config.grpo.scale_rewards == crate::config::ScaleRewards::Batch {
        let message =
            "\"batch\" divides by the standard deviation of a rank's rewards; on several ranks that is not the batch's: use \"group\" or \"none\"";
        return Err(crate::error::ConfigError { origin: "configuration".into(), key: "grpo.scale_rewards".into(), message: message.into() }.into());
    }
    let evaluator = Evaluator::new(config, dataset.val_len(), rank, world, device)?;
    match (evaluator.enabled(), rank) {
        (false, 0) => tracing::info!("nothing is held out (data.val_fraction = 0, no data.val_path): no evaluation"),
        (true, 0) => tracing::info!("each evaluation covers {}", held_out_samples(evaluator.covers())),
        _ => {}
    }
    Ok((dataset, evaluator))
}

/// A model with its parameters in its store, as set-up built it.
pub(in crate::trainer) struct BuiltModel {
    pub vs: nn::VarStore,
    pub model: Box<dyn Model>,
    /// Parameter sharding's cut, when the model was cut while built.
    pub cut: Option<CutModel>,
    /// LoRA: the digest of the frozen base.
    pub lora_base: Option<String>,
    /// Every parameter, trainable or frozen (LoRA's base).
    pub all_params: u64,
}

/// The model: a factory's, or the configuration's (cut into this rank's shard as it
/// is built under parameter sharding). A checkpoint holds every weight, so
/// `model.init_from`'s are not read (they may be gone), but for LoRA, whose
/// checkpoints hold only the adapters.
pub(in crate::trainer) fn model(
    config: &Config,
    factory: Option<ModelFactory>,
    place: &Place,
    resuming: bool,
    dataset: &dyn Dataset,
    device: Device,
) -> Result<BuiltModel> {
    let vs = nn::VarStore::new(device);
    let (mut cut, mut streamed_base_hash) = (None, None);
    let model = match factory {
        Some(factory) => factory(&vs.root(), dataset)?,
        None => {
            let mut built = config.clone();
            if resuming && config.lora().is_none() {
                built.model.init_from.clear();
            }
            // The checkpoint holds the adapters: those the run started from are not read.
            if let Some(lora) = built.lora.as_mut().filter(|_| resuming) {
                lora.init_from.clear();
            }
            match place.shard.as_ref().filter(|s| s.mode == ShardMode::Parameters) {
                Some(spec) => {
                    let (model, whole, base_hash) = sharding::build_cut(&built, &vs, spec)?;
                    (cut, streamed_base_hash) = (Some(whole), base_hash);
                    model
                }
                None => model::build(&built, &vs, dataset)?,
            }
        }
    };
    let bf16 = config.train.precision == Precision::Bf16;
    let lora_base = config.lora().map(|_| model::lora::settle_base(&vs, model.as_ref(), bf16, streamed_base_hash)).transpose()?;
    let all_params = vs.variables().values().map(|t| t.numel() as u64).sum();
    Ok(BuiltModel { vs, model, cut, lora_base, all_params })
}

/// The steps the run takes: `train.steps`, or `train.epochs` over the training set.
pub(in crate::trainer) fn total_steps(config: &Config, dataset: &dyn Dataset, world: u32) -> u64 {
    match config.train.epochs {
        e if e > 0.0 => {
            let global = config.data.batch_size as u64 * config.optim.accum_steps * world as u64;
            let steps = (e * dataset.train_len() as f64 / global as f64).ceil().max(1.0) as u64;
            tracing::info!("train.epochs = {e}: {steps} steps of {global} samples over {} training samples", dataset.train_len());
            steps
        }
        _ => config.train.steps,
    }
}

/// The learner and the objective over `built`, with the checkpoint's weights,
/// optimizer state and counters restored (or a fresh state), and every rank's
/// parameters made equal.
pub(in crate::trainer) fn learner(
    config: &Config,
    mut built: BuiltModel,
    dataset: Arc<dyn Dataset>,
    place: &Place,
    dist: &dyn DataParallel,
    checkpoint: Option<&Checkpoint>,
    total_steps: u64,
) -> Result<(Learner, Box<dyn Objective>, TrainState)> {
    let objective = objective::build(config, built.model.as_mut(), &built.vs, dataset.as_ref())?;
    if place.shards_params() {
        sharding::refuse_unsupported(config, false)?;
    }
    let cut = built.cut.take();
    let shard = place.shard.clone().map(|spec| (spec, sharding::param_sharding(config, dist).map(|with| ParamSharding { cut, ..with })));
    // One rank releases its gradients between steps; data parallelism keeps them
    // for the all-reduce buckets bound to them.
    let grads = if dist.world_size() == 1 { GradMemory::Released } else { GradMemory::Kept };
    let mut learner = Learner::new(built.vs, built.model, dataset, config, shard, grads, total_steps)?;
    let restored = match checkpoint {
        Some(ckpt) => {
            // Resuming on another model.init_from (other weights of the same shapes),
            // or a LoRA run without [lora], or the other way round, is refused.
            model::adapters::same_base(&ckpt.path, &ckpt.state, std::path::Path::new(&config.model.init_from), built.lora_base.as_deref())?;
            let restored = state::restore(ckpt, &mut learner.params, learner.optimizer.as_mut())?;
            if restored.step >= total_steps {
                tracing::warn!("the run is already at step {}, at or past train.steps = {total_steps}: nothing to train", restored.step);
            }
            tracing::info!("resuming from {} (step {})", ckpt.path.display(), restored.step);
            restored
        }
        None => TrainState::new(0, config.run.seed, dist.world_size()),
    };
    // (Sharded parameters were broadcast before they were cut.)
    if learner.optimizer.block_wrap().is_none() {
        dist.broadcast_params(&learner.params.iter().map(|(_, t)| t.shallow_clone()).collect::<Vec<_>>()).map_err(Error::Dist)?;
    }
    Ok((learner, objective, restored))
}
