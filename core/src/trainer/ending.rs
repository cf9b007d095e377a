//! How a run ended ([`Ending`]): the status, exit code and reason its summary
//! records, decided from why the loop stopped and amended by what fails at the end.

use ptrain_plugin_api::CheckpointReason;
use serde::Serialize;

use super::{failure::RunError, stop::Stop};

/// The plugin that failed the run (a critical plugin's error, panic, stall or
/// abandonment, or a plugin's `request_failure_stop`): where, and at which step.
#[derive(Debug, Clone, Serialize)]
pub struct FailedBy {
    pub plugin: String,
    /// The hook it failed or asked in, when known (a plugin may ask from a thread of its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hook: Option<String>,
    pub step: u64,
}

/// How the run ended, as its summary and exit code say.
#[derive(Clone)]
pub(super) struct Ending {
    pub status: &'static str,
    pub exit_code: i32,
    pub stop_reason: Option<String>,
    /// The save the end makes, if any.
    pub last_save: Option<CheckpointReason>,
    pub error: Option<RunError>,
    /// The plugin whose request ended the run (exit 0).
    pub stopped_by: Option<String>,
    /// The plugin that failed it.
    pub failed_by: Option<FailedBy>,
}

impl Ending {
    /// `last_step`: the last step that completed, where a stop whose step is unknown happened.
    pub fn of(stop: &Option<Stop>, last_step: u64) -> Ending {
        let (status, exit_code, stop_reason, last_save) = match stop {
            None => ("completed", 0, None, None),
            Some(Stop::Signal(sig)) => ("interrupted", 128 + sig, Some(format!("signal {sig}")), Some(CheckpointReason::Interrupted)),
            // A plugin that decides training is done (early stopping) ends the run
            // normally: the final checkpoint is an end-of-run save.
            Some(Stop::Requested(r)) if !r.failure => ("stopped", 0, Some(r.to_string()), Some(CheckpointReason::End)),
            // A plugin's failure, or a critical plugin's: the run failed (its state is
            // whole, so the emergency checkpoint is saved).
            Some(Stop::Requested(r)) => ("failed", 1, Some(r.to_string()), Some(CheckpointReason::Interrupted)),
            Some(Stop::NonFinite(r)) => ("nonfinite", 1, Some(r.clone()), Some(CheckpointReason::NonFinite)),
            Some(Stop::Failed(e)) => ("failed", 1, Some(e.to_string()), None),
        };
        let at = |r: &crate::host::StopRequest| r.at.as_ref().map_or(last_step, |(_, step)| *step);
        let error = match stop {
            Some(Stop::Failed(e)) => Some(e.clone()),
            Some(Stop::Requested(r)) if r.failure => {
                // A rank stops for another's failure: that rank's own summary says which.
                let kind = if r.plugin.is_empty() { "another_rank" } else { "plugin" };
                Some(RunError { kind: kind.into(), message: r.to_string(), location: None, step: at(r) })
            }
            _ => None,
        };
        let stopped_by = match stop {
            Some(Stop::Requested(r)) if !r.plugin.is_empty() && !r.failure => Some(r.plugin.clone()),
            _ => None,
        };
        let failed_by = match stop {
            Some(Stop::Requested(r)) if !r.plugin.is_empty() && r.failure => {
                Some(FailedBy { plugin: r.plugin.clone(), hook: r.at.as_ref().map(|(hook, _)| hook.clone()), step: at(r) })
            }
            _ => None,
        };
        Ending { status, exit_code, stop_reason, last_save, error, stopped_by, failed_by }
    }

    /// A failure in the end's own work: the run fails (a signal's run stays
    /// interrupted, exit 130/143), unless it already failed.
    pub fn fail_at_end(&mut self, cause: RunError) {
        if self.error.is_none() {
            if self.status != "interrupted" {
                (self.status, self.exit_code) = ("failed", 1);
            }
            self.error = Some(cause);
        }
    }
}
