//! Writing a recorded window: libtorch's Chrome trace export (the slow part) and
//! the memory snapshot. Runs on the host's deferred-work thread (`HostApi::defer`),
//! so the training thread only stops the profiler and hands the result over.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use ptrain_plugin_api::{HostApi, LogLevel};
use ptrain_torch_ext::trace::Recorded;

use crate::NAME;

pub struct Window {
    pub trace: Recorded,
    pub path: PathBuf,
    /// The CUDA caching allocator's pickled snapshot, and where it goes.
    pub snapshot: Option<(Vec<u8>, PathBuf)>,
}

/// What the saves wrote, for the summary.
#[derive(Debug, Default)]
pub struct Written {
    pub files: Vec<String>,
    pub failed: u64,
}

/// Hands `window` to the host's deferred-work thread, which writes it and notes
/// the result in `written`. A file that cannot be written is logged and counted,
/// not a plugin failure: the next window may well be written.
pub fn defer(host: HostApi, window: Window, written: &Arc<Mutex<Written>>) {
    let written = written.clone();
    host.defer(NAME, move || {
        let result = write(window);
        let mut written = written.lock().expect("trace lock");
        match result {
            Ok(paths) => written.files.extend(paths.iter().map(|p| p.display().to_string())),
            Err(e) => {
                written.failed += 1;
                host.log(LogLevel::Error, NAME, &format!("could not write a trace: {e}"));
            }
        }
        Ok(())
    });
}

fn write(window: Window) -> Result<Vec<PathBuf>, String> {
    if let Some(dir) = window.path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    window.trace.save(&window.path).map_err(|e| format!("{}: {e}", window.path.display()))?;
    let mut paths = vec![window.path];
    if let Some((bytes, path)) = window.snapshot {
        std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        paths.push(path);
    }
    Ok(paths)
}
