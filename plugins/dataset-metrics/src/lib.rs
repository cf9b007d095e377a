//! `dataset-metrics`: per-dataset loss and accuracy, accumulated on the device (skeleton, being written).

use ptrain_plugin_api::{export_plugin, Descriptor, HostApi, Plugin, PluginResult, Threading};

pub struct Skeleton;

impl Plugin for Skeleton {
    const DESCRIPTOR: Descriptor = Descriptor::new("dataset-metrics", env!("CARGO_PKG_VERSION"), "per-dataset loss and accuracy, accumulated on the device", Threading::Inline, &[]);

    fn new(_options: serde_json::Value, _host: HostApi) -> PluginResult<Self> {
        Ok(Skeleton)
    }
}

export_plugin!(Skeleton);
