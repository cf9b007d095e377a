//! `hello`: an example third-party plugin (skeleton, being written).

use ptrain_plugin_api::{export_plugin, Descriptor, HostApi, Plugin, PluginResult, Threading};

pub struct Skeleton;

impl Plugin for Skeleton {
    const DESCRIPTOR: Descriptor = Descriptor::new("hello", env!("CARGO_PKG_VERSION"), "an example third-party plugin", Threading::Worker, &[]);

    fn new(_options: serde_json::Value, _host: HostApi) -> PluginResult<Self> {
        Ok(Skeleton)
    }
}

export_plugin!(Skeleton);
