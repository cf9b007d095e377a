//! What `dist.shard = "parameters"` needs from set-up: the process group's
//! collectives for the optimizer's gathers, and a clear refusal of what it does not
//! support yet (every path that reads whole parameters between steps).

use crate::{
    config::{Config, ShardMode},
    dist::DataParallel,
    error::{ConfigError, Error, Result},
    optim::ParamSharding,
};

/// The collectives and settings of parameter sharding, when the run shards parameters.
pub(super) fn param_sharding(config: &Config, dist: &dyn DataParallel) -> Option<ParamSharding> {
    (config.dist.shard == ShardMode::Parameters).then_some(())?;
    let collectives = dist.shard_collectives()?;
    let (reshard_after_forward, offload) = (config.dist.reshard_after_forward, config.dist.offload_optimizer);
    Some(ParamSharding { collectives, reshard_after_forward, offload, frozen: Vec::new() })
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
