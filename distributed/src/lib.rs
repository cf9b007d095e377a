//! Data-parallel training for ptrain on libtorch's own distributed engine (c10d):
//! a TCPStore rendezvous, Gloo for CPU tensors and NCCL for CUDA tensors, driven
//! through a small C++ shim. Ranks come from the torchrun (or Slurm) environment
//! ([`env`]); [`launch`] starts a one-node job the way torchrun does.
//!
//! ```no_run
//! # fn main() -> Result<(), ptrain_core::Error> {
//! let config = ptrain_core::Config::default();
//! // One rank of several under torchrun, or the single-rank run without it.
//! let dp = ptrain_dist::from_env(&config)?;
//! let trainer = ptrain_core::Trainer::new(config.clone()).data_parallel(dp);
//! # Ok(()) }
//! ```

mod buckets;
mod data_parallel;
mod end;
pub mod env;
mod ffi;
mod flat;
pub mod group;
pub mod launch;
mod shard_group;
#[cfg(test)]
mod tests;

use std::time::Duration;

use ptrain_core::{
    config::{Config, DistBackend},
    dist::{DataParallel, SingleRank},
    ConfigError, Error,
};

pub use data_parallel::C10dDataParallel;
pub use group::{nccl_compiled, Backend, Group, GroupSpec};

fn usage(origin: &str, key: &str, message: impl Into<String>) -> Error {
    Error::Config(ConfigError { origin: origin.into(), key: key.into(), message: message.into() })
}

/// Joins the process group the environment describes, or, without one, the
/// single-rank run ([`SingleRank`]). Bad variables or settings are usage errors (exit 2,
/// nothing contacted); a failed rendezvous is [`Error::Dist`].
pub fn from_env(config: &Config) -> Result<Box<dyn DataParallel>, Error> {
    let placement = env::placement().map_err(|e| usage("the environment", e.key, e.message))?;
    let Some(p) = placement else { return Ok(Box::new(SingleRank)) };
    let d = &config.dist;
    // dist.timeout_s, dist.nccl_timeout_s and dist.bucket_mb are in range: the
    // configuration's checks (core/src/config/ranges.rs) ran before.
    let device = ptrain_core::device::select(config.run.device, p.local_rank as usize)?;
    let backend = match d.backend {
        DistBackend::Gloo => Backend::Gloo,
        DistBackend::Auto if device.is_cuda() => Backend::Nccl,
        DistBackend::Auto => Backend::Gloo,
        DistBackend::Nccl if !device.is_cuda() => {
            return Err(usage("[dist]", "dist.backend", "nccl needs CUDA devices, but this run trains on the CPU (use gloo)"));
        }
        DistBackend::Nccl if !nccl_compiled() => {
            return Err(usage("[dist]", "dist.backend", "this build of ptrain has no NCCL (it was built against a libtorch without CUDA)"));
        }
        DistBackend::Nccl => Backend::Nccl,
    };
    let spec = GroupSpec {
        master_addr: p.master_addr.clone(),
        master_port: p.master_port,
        rank: p.rank,
        world_size: p.world_size,
        timeout: Duration::from_secs(d.timeout_s),
        nccl_timeout: Duration::from_secs(d.nccl_timeout_s),
        backend,
        device,
        gloo_ifname: std::env::var("GLOO_SOCKET_IFNAME").ok().filter(|s| !s.is_empty()),
        agent_store: env::agent_store_prefix(),
        listen_fd: env::master_listen_fd().filter(|_| p.rank == 0),
    };
    tracing::info!(
        "rank {} of {} (local rank {}): {} process group via {}:{}",
        p.rank,
        p.world_size,
        p.local_rank,
        backend.name(),
        p.master_addr,
        p.master_port
    );
    let group = Group::connect(spec).map_err(|e| {
        Error::Dist(format!(
            "rank {} could not join the process group at {}:{} within dist.timeout_s = {}: {e}",
            p.rank, p.master_addr, p.master_port, d.timeout_s
        ))
    })?;
    Ok(Box::new(C10dDataParallel::new(group, d.bucket_mb)))
}
