//! The commit of a staged checkpoint, asked of the host (`HostApi::commit_checkpoint`):
//! a save the host gave up on is removed rather than committed after the run's
//! summary. With `[debug] late_save_at_step`, that step's save waits before asking
//! until the test releases it, and says what it was told.

use std::path::{Path, PathBuf};

use ptrain_checkpoint::{CommitGate, Result};
use ptrain_plugin_api::HostApi;

/// `[debug] late_save_at_step`'s files in the run directory: `ready` when the save is
/// staged, `release` (made by the test) to go on, `done` with whether it committed.
pub struct LateSave {
    pub step: u64,
    ready: PathBuf,
    release: PathBuf,
    done: PathBuf,
}

impl LateSave {
    pub fn new(step: u64, run_dir: &Path, rank: u32) -> LateSave {
        LateSave {
            step,
            ready: run_dir.join(format!("save-late.rank{rank}.json")),
            release: run_dir.join("save-release"),
            done: run_dir.join(format!("save-late-done.rank{rank}.json")),
        }
    }

    fn hold(&self, step: u64) {
        tell(&self.ready, serde_json::json!({"pid": std::process::id(), "step": step}));
        while !self.release.exists() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// Through a rename: whoever waits for `path` never reads half of it.
fn tell(path: &Path, value: serde_json::Value) {
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, value.to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

pub struct HostGate<'a> {
    pub host: &'a HostApi,
    pub late: Option<&'a LateSave>,
}

impl CommitGate for HostGate<'_> {
    fn commit(&self, step: u64, commit: &mut dyn FnMut() -> Result<()>) -> Option<Result<()>> {
        let late = self.late.filter(|late| late.step == step);
        if let Some(late) = late {
            late.hold(step);
        }
        let done = self.host.commit_checkpoint("checkpoint", step, commit);
        if let Some(late) = late {
            tell(&late.done, serde_json::json!({"step": step, "committed": done.as_ref().is_some_and(|d| d.is_ok())}));
        }
        done
    }
}
