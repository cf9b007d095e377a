//! Whether a run shards its optimizer, agreed by every rank at set-up.

use tch::{Device, Tensor};

use crate::{
    config::ShardMode,
    dist::DataParallel,
    error::{Error, Result},
};

/// What a sharded run agreed on at set-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSpec {
    pub mode: ShardMode,
    pub rank: u32,
    pub world: u32,
    /// Rank 0's random number for this launch: names the staging directory of
    /// sharded checkpoints, so a crashed launch's parts are never taken for ours.
    pub save_id: u64,
    /// Rank 0's clock at set-up (names a default run directory the same on all ranks).
    pub launch_secs: u64,
}

impl ShardSpec {
    /// The sharding to use: `None` for `shard = "none"`, and, with one warning, for
    /// a run without peers. Ranks agree on rank 0's save id and clock (one
    /// broadcast; a host tensor, which the collectives stage on the group's device).
    pub fn agree(mode: ShardMode, dist: &dyn DataParallel) -> Result<Option<ShardSpec>> {
        if mode == ShardMode::None {
            return Ok(None);
        }
        if dist.world_size() < 2 {
            tracing::warn!("dist.shard = \"{}\" needs more than one rank; training unsharded", mode.name());
            return Ok(None);
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let nonce = (u64::from(std::process::id()) << 32) ^ now.subsec_nanos() as u64 ^ now.as_secs().rotate_left(17);
        let mut agreed = Tensor::from_slice(&[(nonce >> 1) as i64, now.as_secs() as i64]);
        dist.collectives().broadcast(&mut agreed, 0).map_err(Error::Dist)?;
        let v = Vec::<i64>::try_from(agreed.to_device(Device::Cpu)).map_err(|e| Error::Other(e.to_string()))?;
        Ok(Some(ShardSpec { mode, rank: dist.rank(), world: dist.world_size(), save_id: v[0] as u64, launch_secs: v[1] as u64 }))
    }
}
