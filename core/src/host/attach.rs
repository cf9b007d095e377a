//! A loaded plugin's attachments as slots of the run's schedule: each with the
//! cadence its `[plugins.<name>]` table sets (or the plugin's default), and which
//! hooks the plugin declares.

use ptrain_plugin_api::{Descriptor, Hook, StepWindows, Threading};

use super::PluginLibrary;
use crate::{
    config::PluginSettings,
    error::Error,
    schedule::{Cadence, Owner, SlotSpec},
};

/// The cadence of a plugin's first attachment when it has one with a schedule:
/// the table's cadence keys are then that attachment's (the trace's `every`).
pub(super) fn primary(d: &Descriptor) -> Option<Cadence> {
    d.attachments.first().filter(|a| a.hook.is_scheduled()).map(|a| a.cadence)
}

/// The slots of plugin `index` (named `name`, described by `d`) and the hooks it
/// declares as a bit mask.
pub(super) fn slots(d: &Descriptor, index: usize, name: &str, settings: &PluginSettings) -> (Vec<SlotSpec>, u32) {
    let primary = primary(d);
    let (mut slots, mut declared) = (Vec::new(), 0);
    for a in d.attachments.iter() {
        // Run start and end reach every plugin: an attachment to them (as plugins
        // once declared) means nothing.
        if a.hook.is_lifecycle() {
            continue;
        }
        if d.threading == Threading::Worker && !matches!(a.hook, Hook::Metrics | Hook::Checkpoint) {
            tracing::warn!("plugin `{name}`: worker plugins cannot attach to {}; ignored", a.hook.name());
            continue;
        }
        declared |= a.hook.bit();
        let cadence = match a.hook {
            // Due exactly when the run evaluates.
            Hook::Eval => Cadence::NEVER.with_eval(),
            _ => {
                // The first attachment, and those declared with its cadence (they run
                // together with it: health's AfterBackward and StepEnd), follow the
                // table's cadence keys.
                let base = if primary == Some(a.cadence) { settings.primary.apply(a.cadence) } else { a.cadence };
                let cadence = settings.attachments.get(a.name.as_str()).map_or(base, |o| o.apply(base));
                if cadence.is_never() && !a.cadence.is_never() {
                    tracing::warn!(
                        "plugin `{name}`: attachment `{}` is never due with these settings (every = 0 and every_secs = 0 switch those off)",
                        a.name
                    );
                }
                cadence
            }
        };
        slots.push(SlotSpec { owner: Owner::Plugin(index), hook: a.hook, cadence, needs: a.needs, windows: StepWindows::NONE });
    }
    (slots, declared)
}

/// The plugin's attachments once it is created: a plugin may describe them from its
/// options (the `python` plugin: the functions its module defines, at the cadences
/// the module declares), so the host asks again. Only the cadences and needs of the
/// attachments it declared at load may change, and which of them it keeps.
pub(super) fn described(lib: &PluginLibrary, loaded: &Descriptor, name: &str) -> Result<Descriptor, Error> {
    let refuse = |message: String| Error::Plugin { name: name.to_string(), message };
    let d = lib.module.descriptor()().into_result().map_err(|e| refuse(format!("failed to describe itself: {e}")))?;
    let known = |a: &ptrain_plugin_api::Attachment| loaded.attachments.iter().any(|l| l.name == a.name && l.hook == a.hook);
    if d.threading != loaded.threading || d.name != loaded.name {
        return Err(refuse("described itself differently once created (its name or threading changed)".into()));
    }
    if let Some(new) = d.attachments.iter().find(|a| !known(a)) {
        return Err(refuse(format!("added attachment `{}` once created: only those declared at load may be kept", new.name)));
    }
    Ok(d)
}

/// Gives the step hooks of plugin `index` its profiling `windows` (runs of
/// consecutive steps it asked for).
pub(super) fn set_windows(slots: &mut [SlotSpec], index: usize, windows: StepWindows) {
    let steps = [Hook::StepStart, Hook::AfterForward, Hook::AfterBackward, Hook::StepEnd];
    for slot in slots.iter_mut().filter(|s| s.owner == Owner::Plugin(index) && steps.contains(&s.hook)) {
        slot.windows = windows;
    }
}
