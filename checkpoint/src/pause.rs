//! `[debug] pause_save_at_step`: a save that stops for good after its first
//! files are written, and says so through a file. Tests kill the writer then, so
//! the kill is known to land inside a save rather than somewhere near one.
//!
//! The writer checks it once per file written (each file is fsync'ed, so the check
//! costs nothing beside it); only the thread that armed it pauses.

use std::{
    cell::RefCell,
    path::{Path, PathBuf},
};

use crate::{Error, Result};

struct Armed {
    after_files: u32,
    written: u32,
    ready: PathBuf,
}

thread_local! {
    static ARMED: RefCell<Option<Armed>> = const { RefCell::new(None) };
}

/// Makes this thread's next save stop after its `after_files`-th file (1 = the
/// first) is written and fsync'ed: `ready` then receives, as JSON, the process id,
/// the step and the file last written, and the thread sleeps until the process
/// is killed. A save that writes fewer files does not pause; [`disarm`] after it.
pub fn arm(after_files: u32, ready: PathBuf) {
    ARMED.with(|a| *a.borrow_mut() = Some(Armed { after_files: after_files.max(1), written: 0, ready }));
}

/// Undoes [`arm`] (a save that ended without pausing).
pub fn disarm() {
    ARMED.with(|a| *a.borrow_mut() = None);
}

/// Called by the writer after each file of step `step` is on disk.
pub(crate) fn after_file(step: u64, file: &Path) -> Result<()> {
    let ready = ARMED.with(|a| {
        let mut armed = a.borrow_mut();
        let due = armed.as_mut().is_some_and(|armed| {
            armed.written += 1;
            armed.written == armed.after_files
        });
        if due {
            armed.take().map(|armed| armed.ready)
        } else {
            None
        }
    });
    let Some(ready) = ready else { return Ok(()) };
    let text = serde_json::json!({"pid": std::process::id(), "step": step, "file": file.display().to_string()}).to_string();
    // Through a rename: whoever waits for `ready` never reads half of it.
    let tmp = ready.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(Error::io(&tmp))?;
    std::fs::rename(&tmp, &ready).map_err(Error::io(&ready))?;
    loop {
        std::thread::park();
    }
}
