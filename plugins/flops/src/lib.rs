//! `flops`: FLOPs per step, achieved FLOP/s and MFU, measured at a cadence (skeleton, being written).

use ptrain_plugin_api::{export_plugin, Descriptor, HostApi, Plugin, PluginResult, Threading};

pub struct Skeleton;

impl Plugin for Skeleton {
    const DESCRIPTOR: Descriptor = Descriptor::new("flops", env!("CARGO_PKG_VERSION"), "FLOPs per step, achieved FLOP/s and MFU, measured at a cadence", Threading::Inline, &[]);

    fn new(_options: serde_json::Value, _host: HostApi) -> PluginResult<Self> {
        Ok(Skeleton)
    }
}

export_plugin!(Skeleton);
