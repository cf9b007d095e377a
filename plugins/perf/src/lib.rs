//! `perf`: phase times, throughput, memory and a slowdown detector (skeleton, being written).

use ptrain_plugin_api::{export_plugin, Descriptor, HostApi, Plugin, PluginResult, Threading};

pub struct Skeleton;

impl Plugin for Skeleton {
    const DESCRIPTOR: Descriptor = Descriptor::new("perf", env!("CARGO_PKG_VERSION"), "phase times, throughput, memory and a slowdown detector", Threading::Inline, &[]);

    fn new(_options: serde_json::Value, _host: HostApi) -> PluginResult<Self> {
        Ok(Skeleton)
    }
}

export_plugin!(Skeleton);
