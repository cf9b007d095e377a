//! The stable ABI between `ptrain` and its plugins.
//!
//! Plugins are `cdylib` crates loaded at run time. Authors implement the Rust-level
//! [`Plugin`] trait and call [`export_plugin!`]; everything that crosses the library
//! boundary is an `abi_stable` type defined here, and every entry point is wrapped in
//! `catch_unwind` so a panicking plugin is disabled instead of aborting the run.
//!
//! Plugins declare *attachments*: a [`Hook`] (where in the loop) and a [`Cadence`]
//! (which steps). The host calls `on_step`, `on_metrics` and `on_checkpoint` only
//! when one of the plugin's attachments is due; `on_run_start`, `on_run_end`,
//! `save_state` and `load_state` reach every plugin (see [`Plugin`]). A worker plugin
//! that has periodic work (flushing a file, sending to a server) asks for a timer
//! ([`Plugin::timer_interval`]) and its worker thread calls [`Plugin::on_timer`]. An
//! inline plugin with slow work hands it to the host's deferred-work thread
//! ([`HostApi::defer`]). A reward plugin (GRPO, [`Descriptor::reward`], 0.6.0) scores
//! sampled completions on its worker thread ([`Plugin::score`], [`RewardBatch`]).
//!
//! A guide from the author's side, with a sink walkthrough, every tensor a step
//! carries, testing and building: `docs/plugins.md` in ptrain's repository, or
//! `ptrain plugins new <name>` for a ready crate.
//!
//! Libraries are never unloaded: a loaded plugin stays mapped until the process exits.

mod abi;
mod attachment;
mod checkpoint;
mod context;
mod deferred;
mod dtype;
mod error;
pub mod export;
mod host;
pub mod loss;
mod metrics;
mod plugin;
mod reward;
#[cfg(feature = "tch")]
mod tensor;
pub mod testing;
pub mod unknown_key;

pub use abi::{FfiPlugin, FfiPlugin_TO, PluginBox, PluginMod, PluginModRef, ROOT_MODULE_NAME};
pub use attachment::{Attachment, Cadence, Descriptor, Hook, Needs, StepWindows, Threading};
pub use checkpoint::{CheckpointPayload, CheckpointReason, DType, NamedBlob, TensorBlob};
pub use context::{
    DebugFaults, DeviceInfo, DeviceKind, LayerKind, LayerSpec, ModelInfo, NamedTensor, PhaseTimes, RunEnd, RunInfo, StepContext, StepTensors, Task,
    TensorRef,
};
pub use deferred::{DeferredBox, FfiDeferred, FfiDeferred_TO};
pub use error::{PluginError, PluginResult};
pub use host::{HostApi, LogLevel, STOP_FAILURE_PREFIX};
pub use loss::IGNORE_INDEX;
pub use metrics::{Histogram, Metric, MetricBatch, MetricValue, Outbox, Scalar};
pub use plugin::{guard, parse_options, Adapter, Plugin};
pub use reward::{OwnedRewardBatch, RewardBatch};

/// Re-exported so that [`export_plugin!`] works without authors naming abi_stable.
#[doc(hidden)]
pub use abi_stable as __abi_stable;

/// The plugin-api version a plugin was built against, checked by the host on load.
pub const API_VERSION: &str = env!("CARGO_PKG_VERSION");
