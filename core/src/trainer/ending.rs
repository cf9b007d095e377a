//! How a run ended ([`Ending`]): the status, exit code and reason its summary
//! records, decided from why the loop stopped and amended by what fails at the end.

use ptrain_plugin_api::CheckpointReason;

use super::{failure::RunError, stop::Stop};

/// How the run ended, as its summary and exit code say.
pub(super) struct Ending {
    pub status: &'static str,
    pub exit_code: i32,
    pub stop_reason: Option<String>,
    /// The save the end makes, if any.
    pub last_save: Option<CheckpointReason>,
    pub error: Option<RunError>,
    /// The plugin whose request ended the run.
    pub stopped_by: Option<String>,
}

impl Ending {
    pub fn of(stop: &Option<Stop>) -> Ending {
        let (status, exit_code, stop_reason, last_save) = match stop {
            None => ("completed", 0, None, None),
            Some(Stop::Signal(sig)) => ("interrupted", 128 + sig, Some(format!("signal {sig}")), Some(CheckpointReason::Interrupted)),
            // A plugin that decides training is done (early stopping) ends the run
            // normally: the final checkpoint is an end-of-run save.
            Some(Stop::Requested(r)) if !r.failure => ("stopped", 0, Some(r.to_string()), Some(CheckpointReason::End)),
            Some(Stop::Requested(r)) => ("stopped", 1, Some(r.to_string()), Some(CheckpointReason::Interrupted)),
            Some(Stop::NonFinite(r)) => ("nonfinite", 1, Some(r.clone()), Some(CheckpointReason::NonFinite)),
            Some(Stop::Failed(e)) => ("failed", 1, Some(e.to_string()), None),
        };
        let error = match stop {
            Some(Stop::Failed(e)) => Some(e.clone()),
            _ => None,
        };
        let stopped_by = match stop {
            Some(Stop::Requested(r)) if !r.plugin.is_empty() => Some(r.plugin.clone()),
            _ => None,
        };
        Ending { status, exit_code, stop_reason, last_save, error, stopped_by }
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
