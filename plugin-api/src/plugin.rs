//! The Rust-level plugin trait authors implement, and the adapter that puts it
//! behind the stable ABI with every call guarded by `catch_unwind`.

use std::{
    any::Any,
    cell::RefCell,
    panic::{catch_unwind, AssertUnwindSafe},
    sync::Once,
    time::Duration,
};

use abi_stable::std_types::{RResult, RSlice, RString, RVec};

use crate::{
    abi::FfiPlugin,
    attachment::{Descriptor, StepWindows},
    checkpoint::CheckpointPayload,
    context::{RunEnd, RunInfo, StepContext},
    error::{PluginError, PluginResult},
    host::HostApi,
    metrics::{MetricBatch, Outbox},
    reward::RewardBatch,
};

/// A ptrain plugin. Implement it, then `ptrain_plugin_api::export_plugin!(MyPlugin);`.
///
/// When each method is called is one rule, the same for inline and worker plugins:
/// - `on_run_start` (once, before the first step), `on_run_end` (once, at the end,
///   also after a signal), `save_state` (at each checkpoint) and `load_state` (on
///   resume, when the checkpoint holds state of this plugin) are called on every
///   plugin that has not failed. They need no attachment.
/// - `on_step`, `on_metrics` and `on_checkpoint` are called only through attachments
///   in [`Plugin::DESCRIPTOR`], when one is due: a step hook or `Metrics` at its
///   cadence, `Eval` at the steps that evaluate, `Checkpoint` when a save is due.
///   Besides, metrics that plugins or evaluation emitted reach every plugin with a
///   `Metrics` attachment, and emergency checkpoints (signal, non-finite stop) every
///   plugin with a `Checkpoint` attachment, due or not.
///
/// A plugin that returns an error or panics is never called again, not even
/// `on_run_end`. Inline plugins are called on the training thread and may read
/// tensors (never block there); worker plugins are called on their own thread, in
/// order, and never see tensors.
pub trait Plugin: Send + Sized + 'static {
    const DESCRIPTOR: Descriptor;

    /// Creates the plugin from its options: the plugin's config table minus the
    /// host's cadence keys, as a JSON object. Reject unknown options here.
    fn new(options: serde_json::Value, host: HostApi) -> PluginResult<Self>;

    /// Once, before the first step (after `load_state` on resume). Every plugin.
    fn on_run_start(&mut self, _run: &RunInfo<'_>) -> PluginResult {
        Ok(())
    }

    /// Scheduled step hooks and [`crate::Hook::Eval`]; `ctx.hook` says which. Inline
    /// plugins only.
    fn on_step(&mut self, _ctx: &StepContext<'_>, _out: &mut Outbox) -> PluginResult {
        Ok(())
    }

    /// A batch of metrics (sinks): `batch.metrics`, each a name and a [`crate::MetricValue`].
    fn on_metrics(&mut self, _batch: &MetricBatch) -> PluginResult {
        Ok(())
    }

    /// A checkpoint to persist: host copies of the model, optimizer and states.
    fn on_checkpoint(&mut self, _payload: &CheckpointPayload) -> PluginResult {
        Ok(())
    }

    /// State to keep in checkpoints (empty: none); handed back through `load_state`
    /// on resume. Every plugin, at each checkpoint.
    fn save_state(&mut self) -> PluginResult<Vec<u8>> {
        Ok(Vec::new())
    }

    fn load_state(&mut self, _state: &[u8]) -> PluginResult {
        Ok(())
    }

    /// Flush and close. A returned JSON value goes into summary.json under the
    /// plugin's name. Every plugin, once; a worker's queue is drained first.
    fn on_run_end(&mut self, _end: &RunEnd<'_>) -> PluginResult<Option<serde_json::Value>> {
        Ok(None)
    }

    /// Windows of consecutive steps on which this plugin's step hooks are due, on
    /// top of their cadences (a profiler's recording windows). Asked once, right
    /// after [`Plugin::new`]; an error there is an option mistake (exit 2).
    fn step_windows(&self) -> PluginResult<StepWindows> {
        Ok(StepWindows::NONE)
    }

    /// How often [`Plugin::on_timer`] is called (`None`: never), for periodic work
    /// that no event brings: flushing a buffered file, sending batched rows to a
    /// server, trying a server again. Asked once, right after [`Plugin::new`]; an
    /// error there, or a timer on an inline plugin, is an option mistake (exit 2).
    /// Worker plugins only: their thread calls it, so a plugin needs no thread of its
    /// own for this.
    fn timer_interval(&self) -> PluginResult<Option<Duration>> {
        Ok(None)
    }

    /// Called on the plugin's worker thread about every [`Plugin::timer_interval`]
    /// (counted from the end of the previous call), between two events, from the
    /// end of `on_run_start` until `on_run_end`; never on the training thread, and
    /// never while another method runs. A busy queue delays a tick by at most the
    /// event being handled. Ticks are not queued up: one late tick is one call.
    /// Not called after `on_run_end`, so `on_run_end` must flush what is left.
    fn on_timer(&mut self) -> PluginResult {
        Ok(())
    }

    /// A reward function (GRPO, `[[grpo.rewards]] kind = "plugin"`): one score per
    /// completion of `batch`, in its order, or `None` for a completion this function
    /// does not score (TRL's `None`: left out of the weighted sum). Called on the
    /// plugin's worker thread for each sampled micro-batch, for plugins whose
    /// descriptor says [`Descriptor::reward`] (worker plugins only). The step waits for
    /// the answer (at most the reward's `timeout_s`): an error, a panic, a wrong count
    /// or no answer in time fails the run, as a raising reward function fails TRL's.
    fn score(&mut self, _batch: &RewardBatch<'_>) -> PluginResult<Vec<Option<f64>>> {
        Err("this plugin scores no rewards: implement Plugin::score".into())
    }
}

/// Deserializes plugin options, naming the offending key by its configuration path:
/// `invalid options: plugins.gradwatch.every_n: invalid type: string "oops", expected f64`.
/// Use `#[serde(deny_unknown_fields)]` on the options struct so a misspelt option is
/// refused too (the run then exits 2 before training).
pub fn parse_options<T: serde::de::DeserializeOwned>(options: serde_json::Value) -> PluginResult<T> {
    serde_path_to_error::deserialize(options).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        let key = crate::unknown_key::key(&path, &message);
        let table = OPTIONS_OF.with(|name| name.borrow().as_ref().map(|n| format!("plugins.{n}")));
        let key = match (table, key.as_str()) {
            (Some(table), "." | "") => table,
            (Some(table), _) => format!("{table}.{key}"),
            (None, _) => key,
        };
        PluginError::msg(format!("invalid options: {key}: {message}"))
    })
}

thread_local! {
    static PANIC_LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
    /// The plugin whose options are being parsed (set while `Plugin::new` runs), so
    /// [`parse_options`] names keys as the user wrote them: `plugins.<name>.<key>`.
    static OPTIONS_OF: RefCell<Option<&'static str>> = const { RefCell::new(None) };
}

/// Runs `f` (a plugin's `new`) with `plugin` as the table [`parse_options`] reports under.
pub(crate) fn with_options_of<T>(plugin: &'static str, f: impl FnOnce() -> T) -> T {
    /// Restores the previous name even when `f` panics.
    struct Restore(Option<&'static str>);
    impl Drop for Restore {
        fn drop(&mut self) {
            OPTIONS_OF.with(|name| *name.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(OPTIONS_OF.with(|name| name.borrow_mut().replace(plugin)));
    f()
}

/// Replaces this library's panic hook (each cdylib has its own std) so a panic is
/// reported once, by the host, as one line naming the plugin.
fn install_quiet_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let location = info.location().map(|l| format!("{}:{}", l.file(), l.line()));
            PANIC_LOCATION.with(|slot| *slot.borrow_mut() = location);
        }))
    });
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_string());
    match PANIC_LOCATION.with(|slot| slot.borrow_mut().take()) {
        Some(location) => format!("panicked at {location}: {what}"),
        None => format!("panicked: {what}"),
    }
}

/// Runs `f`, turning both errors and panics into an error string for the host.
pub fn guard<T>(f: impl FnOnce() -> PluginResult<T>) -> RResult<T, RString> {
    install_quiet_panic_hook();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => RResult::ROk(value),
        Ok(Err(error)) => RResult::RErr(error.into_message().into()),
        Err(payload) => RResult::RErr(panic_message(&*payload).into()),
    }
}

/// Puts a [`Plugin`] behind the [`FfiPlugin`] trait object.
pub struct Adapter<P>(pub P);

impl<P: Plugin> FfiPlugin for Adapter<P> {
    fn on_run_start(&mut self, run: &RunInfo<'_>) -> RResult<(), RString> {
        guard(|| self.0.on_run_start(run))
    }

    fn on_step(&mut self, ctx: &StepContext<'_>, out: &mut Outbox) -> RResult<(), RString> {
        guard(|| self.0.on_step(ctx, out))
    }

    fn on_metrics(&mut self, batch: &MetricBatch) -> RResult<(), RString> {
        guard(|| self.0.on_metrics(batch))
    }

    fn on_checkpoint(&mut self, payload: &CheckpointPayload) -> RResult<(), RString> {
        guard(|| self.0.on_checkpoint(payload))
    }

    fn save_state(&mut self) -> RResult<RVec<u8>, RString> {
        guard(|| self.0.save_state().map(RVec::from))
    }

    fn load_state(&mut self, state: RSlice<'_, u8>) -> RResult<(), RString> {
        guard(|| self.0.load_state(state.as_slice()))
    }

    fn on_run_end(&mut self, end: &RunEnd<'_>) -> RResult<RString, RString> {
        guard(|| {
            let summary = self.0.on_run_end(end)?;
            Ok(summary.map(|v| v.to_string()).unwrap_or_default().into())
        })
    }

    fn step_windows(&self) -> RResult<StepWindows, RString> {
        guard(|| self.0.step_windows())
    }

    fn timer_secs(&self) -> RResult<f64, RString> {
        guard(|| Ok(self.0.timer_interval()?.map_or(0.0, |every| every.as_secs_f64())))
    }

    fn on_timer(&mut self) -> RResult<(), RString> {
        guard(|| self.0.on_timer())
    }

    fn score(&mut self, batch: &RewardBatch<'_>) -> RResult<RVec<f64>, RString> {
        guard(|| Ok(self.0.score(batch)?.into_iter().map(|s| s.unwrap_or(f64::NAN)).collect()))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::{parse_options, with_options_of};

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Options {
        every_n: f64,
        #[serde(default)]
        nested: Nested,
    }

    #[derive(Debug, Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Nested {
        depth: u32,
    }

    fn error(options: serde_json::Value) -> String {
        with_options_of("gradwatch", || parse_options::<Options>(options)).unwrap_err().to_string()
    }

    #[test]
    fn option_errors_name_the_key_path_under_the_plugin_table() {
        assert_eq!(
            error(serde_json::json!({ "every_n": "oops" })),
            "invalid options: plugins.gradwatch.every_n: invalid type: string \"oops\", expected f64"
        );
        let unknown = error(serde_json::json!({ "every_n": 1.0, "colour": "red" }));
        assert!(unknown.starts_with("invalid options: plugins.gradwatch.colour: unknown field `colour`"), "{unknown}");
        let nested = error(serde_json::json!({ "every_n": 1.0, "nested": { "depth": -1 } }));
        assert!(nested.starts_with("invalid options: plugins.gradwatch.nested.depth: invalid value: integer `-1`"), "{nested}");
        let missing = error(serde_json::json!({}));
        assert_eq!(missing, "invalid options: plugins.gradwatch: missing field `every_n`");
    }

    #[test]
    fn outside_the_host_the_key_path_starts_at_the_options() {
        let e = parse_options::<Options>(serde_json::json!({ "every_n": true })).unwrap_err().to_string();
        assert_eq!(e, "invalid options: every_n: invalid type: boolean `true`, expected f64");
    }
}
