//! The record of a forced exit. A second signal exits at once; when an inline
//! plugin's hook holds the training thread then (a plugin that hangs), the run
//! never reaches its end, so the signal handler writes `summary.json` itself:
//! status `interrupted`, the hook it was stuck in (`forced_exit`), and the plugins'
//! stalls. It waits for that write a few seconds at most: the run directory may be
//! on a stuck mount, and the exit must not hang on it.

use std::{
    path::PathBuf,
    sync::mpsc,
    time::{Duration, Instant},
};

use crate::host::{Calls, Running};

/// How long the forced exit waits for its summary to be written.
const WRITE_BOUND: Duration = Duration::from_secs(5);

/// What the signal handler knows of the run, gathered at set-up.
pub struct ForcedRecord {
    pub calls: Calls,
    /// `<run-dir>/summary.json` on rank 0; other ranks write none.
    pub path: Option<PathBuf>,
    pub start_step: u64,
    pub total_steps: u64,
    pub world_size: u32,
    pub started: Instant,
}

impl ForcedRecord {
    /// Writes the summary of a run that exits now with `exit_code` on signal `sig`
    /// while `hung` holds the training thread; returns once it is written, or
    /// after [`WRITE_BOUND`].
    pub fn write(&self, sig: i32, exit_code: i32, hung: &Running) {
        let Some(path) = self.path.clone() else { return };
        // A hook before the update belongs to a step not completed.
        let before_update = matches!(hook_order(hung.hook), Some(0..=2));
        let last_step = if before_update { hung.step.saturating_sub(1) } else { hung.step };
        let steps = last_step.saturating_sub(self.start_step);
        let wall_s = self.started.elapsed().as_secs_f64();
        let reason = format!(
            "signal {sig}, twice: exited at once while plugin `{}` was in {} at step {} ({:.0}s)",
            hung.plugin, hung.hook, hung.step, hung.seconds
        );
        let summary = serde_json::json!({
            "status": "interrupted",
            "exit_code": exit_code,
            "stop_reason": reason,
            "forced_exit": {"plugin": hung.plugin, "hook": hung.hook, "step": hung.step, "seconds": hung.seconds},
            "steps": steps,
            "start_step": self.start_step,
            "last_step": last_step,
            "total_steps": self.total_steps,
            "wall_s": wall_s,
            "world_size": self.world_size,
            "plugin_stalls": self.calls.stalls(),
            "parts": [{
                "start_step": self.start_step,
                "last_step": last_step,
                "steps": steps,
                "wall_s": wall_s,
                "status": "interrupted",
                "exit_code": exit_code,
                "stop_reason": reason,
            }],
        });
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new().name("ptrain-forced".into()).spawn(move || {
            let text = serde_json::to_string_pretty(&summary).unwrap_or_default() + "\n";
            let tmp = path.with_extension("json.tmp");
            let _ = tx.send(std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &path)).map(|()| path));
        });
        if spawned.is_err() {
            return;
        }
        match rx.recv_timeout(WRITE_BOUND) {
            Ok(Ok(path)) => super::eprint_line(&format!("summary: {}", path.display())),
            Ok(Err(e)) => super::eprint_line(&format!("summary.json could not be written: {e}")),
            Err(_) => super::eprint_line(&format!("summary.json not written within {}s: exiting without it", WRITE_BOUND.as_secs())),
        }
    }
}

/// Where a step hook runs in a step (0: before the forward pass), `None` for other events.
fn hook_order(hook: &str) -> Option<u8> {
    ["step_start", "after_forward", "after_backward", "step_end"].iter().position(|h| *h == hook).map(|i| i as u8)
}
