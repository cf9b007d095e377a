//! Saves that found a worker plugin busy in a call of its own (a slow or hung sink).
//! A save during training never waits for a sink (the end-of-run save waits a
//! little: `trainer::step`): the checkpoint keeps the state the plugin gave at
//! an earlier save, or goes without its state, and `summary.json`'s `busy_at_save`
//! says how often each happened.

use std::collections::BTreeMap;

use serde::Serialize;

use super::Event;

/// One plugin's saves that found it busy: how many, and how many of them kept the
/// state it gave at an earlier save (the others have none of its state).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct BusyAtSave {
    pub saves: u64,
    pub reused: u64,
}

#[derive(Default)]
pub struct BusySaves(BTreeMap<String, BusyAtSave>);

impl BusySaves {
    /// Notes that `plugin` was busy when `event` needed its answer now; `last`: the
    /// step of the save whose state it gave last, if any. Returns whether that state
    /// goes into this checkpoint (a save's state call).
    pub fn note(&mut self, plugin: &str, event: &Event<'_>, last: Option<u64>) -> bool {
        let Event::SaveState { step, .. } = event else {
            tracing::warn!("plugin `{plugin}` is busy in a call of its own: its {} at step {} is skipped", event.name(), event.step());
            return false;
        };
        let entry = self.0.entry(plugin.to_string()).or_default();
        entry.saves += 1;
        entry.reused += u64::from(last.is_some());
        if entry.saves == 1 {
            let kept = match last {
                Some(at) => format!("keeps the state it gave at step {at}"),
                None => "has none of its state".into(),
            };
            tracing::warn!(
                "plugin `{plugin}` is busy in a call of its own at the save of step {step}: training does not wait for it, the \
                 checkpoint {kept} (counted in summary.json's busy_at_save; not repeated)"
            );
        }
        true
    }

    pub fn by_plugin(&self) -> BTreeMap<String, BusyAtSave> {
        self.0.clone()
    }
}
