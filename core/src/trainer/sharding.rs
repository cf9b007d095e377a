//! What `dist.shard = "parameters"` needs from set-up: the model cut into shards as
//! it is built, the process group's collectives for the optimizer's gathers, and a
//! clear refusal of what it does not support yet (every path that reads whole
//! parameters between steps).

use tch::{nn, Kind};

use crate::{
    config::{Config, Precision, ShardMode},
    dist::DataParallel,
    error::{ConfigError, Error, Result},
    model::{self, Model},
    optim::{CutModel, ParamSharding, Planned, ShardSpec, StreamingCut},
};

/// The configured decoder in `vs`, each unit cut into this rank's shard as
/// soon as its variables exist (a block's whole tensors go before the next block is
/// made: the same random draws as the whole model's, in the same order), and
/// `model.init_from`'s values read straight into the shards, this rank's slices only.
/// With LoRA the base is frozen and sharded like the rest, and its digest is returned
/// as [`model::lora::base_digest`] takes it from a whole base: from the weight files,
/// or from each drawn tensor before it is cut (no `model.init_from`).
pub(super) fn build_cut(config: &Config, vs: &nn::VarStore, spec: &ShardSpec) -> Result<(Box<dyn Model>, CutModel, Option<String>)> {
    let params: Vec<(String, Vec<i64>)> = model::hf::names::params(&config.model).into_iter().map(|p| (p.name, p.shape)).collect();
    let planned = match (config.lora(), config.train.precision) {
        (None, _) => Planned::Trained,
        // LoRA stores the frozen block matrices in bf16 under bf16 (`lora::store_base_bf16`).
        (Some(_), Precision::Bf16) => Planned::Frozen { matrices: Kind::BFloat16 },
        (Some(_), _) => Planned::Frozen { matrices: Kind::Float },
    };
    let (lora, drawn) = (config.lora().is_some(), config.model.init_from.is_empty());
    let mut cutting = StreamingCut::new(&params, spec.rank, spec.world, vs.device(), planned)?;
    if drawn {
        cutting = cutting.digesting_base();
    }
    let model = model::decoder_in_blocks(config, &vs.root(), &mut |block| cutting.block_built(vs, block))?;
    let (cut, drawn_digest) = cutting.finish(vs)?;
    if lora {
        model::lora::freeze_base(vs);
        if let Some(t) =
            model.block_matrices().iter().find(|t| t.requires_grad() || !matches!(planned, Planned::Frozen { matrices } if t.kind() == matrices))
        {
            return Err(Error::Other(format!("parameter sharding: a block matrix of the LoRA base is {:?}, expected {planned:?}", t.kind())));
        }
    }
    let base_hash = if drawn { drawn_digest } else { model::hf::load_pieces(&config.model, &cut.owned_pieces(), lora)? };
    Ok((model, cut, base_hash))
}

/// The collectives and settings of parameter sharding, when the run shards parameters.
pub(super) fn param_sharding(config: &Config, dist: &dyn DataParallel) -> Option<ParamSharding> {
    (config.dist.shard == ShardMode::Parameters).then_some(())?;
    let collectives = dist.shard_collectives()?;
    let (reshard_after_forward, offload) = (config.dist.reshard_after_forward, config.dist.offload_optimizer);
    let gather_kind = if config.train.precision == Precision::Bf16 { Kind::BFloat16 } else { Kind::Float };
    Some(ParamSharding { collectives, reshard_after_forward, offload, cut: None, gather_kind })
}

/// With `configured` (parameters sharded, the model the configuration's, not a
/// factory's), refuses a kind whose family has no numbered blocks (`mlp`,
/// `torchscript`): parameter sharding gathers a model block by block. A usage error,
/// before anything is loaded.
pub(super) fn refuse_unblocked_kind(config: &Config, configured: bool) -> Result<()> {
    let kind = config.model.kind;
    if !configured || model::family::of(kind).blocks() {
        return Ok(());
    }
    Err(Error::Config(ConfigError {
        origin: "[dist]".into(),
        key: "dist.shard".into(),
        message: format!(
            "dist.shard = \"parameters\" gathers a model block by block: model.kind = {:?} has no blocks (use a {}, or \"gradients\")",
            kind.name(),
            model::family::kinds(|f| f.blocks(), str::to_string)
        ),
    }))
}

/// Refuses (as a usage error, before training) what parameter sharding cannot do yet.
pub(super) fn refuse_unsupported(config: &Config, reads_params: bool) -> Result<()> {
    let refused = [
        ("run.plugins", reads_params, "plugins that read parameters, gradients or histograms"),
        ("debug.dump_params", config.debug.dump_params, "debug.dump_params"),
        ("debug.dump_tensors_at", !config.debug.dump_tensors_at.is_empty(), "debug.dump_tensors_at"),
    ];
    match refused.iter().find(|(_, on, _)| *on) {
        None => Ok(()),
        Some((key, _, what)) => Err(Error::Config(ConfigError {
            origin: "[dist]".into(),
            key: (*key).into(),
            message: format!("dist.shard = \"parameters\" does not support {what} yet (use \"gradients\")"),
        })),
    }
}
