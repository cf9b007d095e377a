// sabi_trait expands to impls inside consts.
#![allow(non_local_definitions)]

//! The raw stable-ABI surface: the root module every plugin library exports and the
//! trait object the host drives. Authors use [`crate::Plugin`] instead.

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    package_version_strings, sabi_trait,
    sabi_types::VersionStrings,
    std_types::{RBox, RResult, RSlice, RStr, RString, RVec},
    StableAbi,
};

use crate::{
    attachment::{Descriptor, StepWindows},
    checkpoint::CheckpointPayload,
    context::{RunEnd, RunInfo, StepContext},
    host::HostApi,
    metrics::{MetricBatch, Outbox},
    reward::RewardBatch,
};

/// The root-module name every ptrain plugin library carries; anything else is foreign.
pub const ROOT_MODULE_NAME: &str = "ptrain_plugin";

/// A live plugin instance as the host sees it. Every method returns an error string
/// instead of unwinding: the [`crate::Adapter`] catches panics inside the plugin.
#[sabi_trait]
pub trait FfiPlugin: Send {
    fn on_run_start(&mut self, run: &RunInfo<'_>) -> RResult<(), RString>;

    fn on_step(&mut self, ctx: &StepContext<'_>, out: &mut Outbox) -> RResult<(), RString>;

    fn on_metrics(&mut self, batch: &MetricBatch) -> RResult<(), RString>;

    fn on_checkpoint(&mut self, payload: &CheckpointPayload) -> RResult<(), RString>;

    fn save_state(&mut self) -> RResult<RVec<u8>, RString>;

    fn load_state(&mut self, state: RSlice<'_, u8>) -> RResult<(), RString>;

    /// Returns a JSON summary fragment, or an empty string for none.
    #[sabi(last_prefix_field)]
    fn on_run_end(&mut self, end: &RunEnd<'_>) -> RResult<RString, RString>;

    /// Windows of steps (see [`crate::Plugin::step_windows`]). The defaults of this
    /// and the next methods are for a trait object written by hand; the host loads
    /// only plugins of its own minor version, whose vtables have every entry.
    fn step_windows(&self) -> RResult<StepWindows, RString> {
        RResult::ROk(StepWindows::NONE)
    }

    /// Seconds between two [`FfiPlugin::on_timer`] calls; 0: no timer. Asked once,
    /// after `create`.
    fn timer_secs(&self) -> RResult<f64, RString> {
        RResult::ROk(0.0)
    }

    /// A timer tick, on the worker plugin's own thread (see [`crate::Plugin::on_timer`]).
    fn on_timer(&mut self) -> RResult<(), RString> {
        RResult::ROk(())
    }

    /// One score per completion of `batch`, NaN for none (see [`crate::Plugin::score`]),
    /// on the reward plugin's worker thread. Added in 0.6.0.
    fn score(&mut self, _batch: &RewardBatch<'_>) -> RResult<RVec<f64>, RString> {
        RResult::RErr("this plugin scores no rewards (its descriptor has no `.reward()`)".into())
    }
}

pub type PluginBox = FfiPlugin_TO<'static, RBox<()>>;

/// The root module of a plugin library.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModRef)))]
#[sabi(missing_field(panic))]
pub struct PluginMod {
    pub descriptor: extern "C" fn() -> RResult<Descriptor, RString>,

    /// Creates an instance from the plugin's options (its config table, as JSON).
    #[sabi(last_prefix_field)]
    pub create: extern "C" fn(options_json: RStr<'_>, host: HostApi) -> RResult<PluginBox, RString>,
}

impl RootModule for PluginModRef {
    declare_root_module_statics! {PluginModRef}
    const BASE_NAME: &'static str = ROOT_MODULE_NAME;
    const NAME: &'static str = ROOT_MODULE_NAME;
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}
