//! `wandb`: W&B offline run directories for wandb sync, and an optional online mode (skeleton, being written).

use ptrain_plugin_api::{export_plugin, Descriptor, HostApi, Plugin, PluginResult, Threading};

pub struct Skeleton;

impl Plugin for Skeleton {
    const DESCRIPTOR: Descriptor = Descriptor::new("wandb", env!("CARGO_PKG_VERSION"), "W&B offline run directories for wandb sync, and an optional online mode", Threading::Worker, &[]);

    fn new(_options: serde_json::Value, _host: HostApi) -> PluginResult<Self> {
        Ok(Skeleton)
    }
}

export_plugin!(Skeleton);
