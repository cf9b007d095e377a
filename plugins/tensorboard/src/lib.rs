//! `tensorboard`: TensorBoard event files, read back by tensorboard's own reader (skeleton, being written).

use ptrain_plugin_api::{export_plugin, Descriptor, HostApi, Plugin, PluginResult, Threading};

pub struct Skeleton;

impl Plugin for Skeleton {
    const DESCRIPTOR: Descriptor = Descriptor::new("tensorboard", env!("CARGO_PKG_VERSION"), "TensorBoard event files, read back by tensorboard's own reader", Threading::Worker, &[]);

    fn new(_options: serde_json::Value, _host: HostApi) -> PluginResult<Self> {
        Ok(Skeleton)
    }
}

export_plugin!(Skeleton);
