//! The `latest` pointer and removal, both crash-safe, and the gate a staged
//! checkpoint passes to become one.

use std::{fs::File, io::Write, path::Path};

use crate::{Error, Result, BEST_FILE, LATEST_FILE};

pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(Error::io(dir))
}

/// Points `latest` at `name`: written to a temporary file, fsync'ed, renamed.
pub fn commit_latest(checkpoints: &Path, name: &str) -> Result<()> {
    commit_pointer(checkpoints, LATEST_FILE, name)
}

/// Points `best` at `name` (the checkpoint plugin's best by its metric), or
/// removes it when there is none.
pub fn commit_best(checkpoints: &Path, name: Option<&str>) -> Result<()> {
    match name {
        Some(name) => commit_pointer(checkpoints, BEST_FILE, name),
        None => match std::fs::remove_file(checkpoints.join(BEST_FILE)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::Io { path: checkpoints.join(BEST_FILE), source: e }),
            _ => Ok(()),
        },
    }
}

/// The checkpoint `best` names, if any.
pub fn read_best(checkpoints: &Path) -> Option<String> {
    read_pointer(checkpoints, BEST_FILE)
}

fn commit_pointer(checkpoints: &Path, pointer_file: &str, name: &str) -> Result<()> {
    let tmp = checkpoints.join(format!(".{pointer_file}.tmp-{}", std::process::id()));
    let mut file = File::create(&tmp).map_err(Error::io(&tmp))?;
    file.write_all(format!("{name}\n").as_bytes()).map_err(Error::io(&tmp))?;
    file.sync_all().map_err(Error::io(&tmp))?;
    let pointer = checkpoints.join(pointer_file);
    std::fs::rename(&tmp, &pointer).map_err(Error::io(&pointer))?;
    fsync_dir(checkpoints)
}

/// The checkpoint `latest` names, if any.
pub fn read_latest(checkpoints: &Path) -> Option<String> {
    read_pointer(checkpoints, LATEST_FILE)
}

fn read_pointer(checkpoints: &Path, file: &str) -> Option<String> {
    let name = std::fs::read_to_string(checkpoints.join(file)).ok()?;
    let name = name.trim();
    crate::parse_dir_name(name).map(|_| name.to_string())
}

/// Removes a checkpoint: renamed out of the way first, so a crash mid-removal
/// leaves a hidden directory that nothing mistakes for a checkpoint.
pub fn delete(checkpoint: &Path) -> Result<()> {
    let parent = checkpoint.parent().unwrap_or(Path::new("."));
    let name = checkpoint.file_name().and_then(|n| n.to_str()).unwrap_or("checkpoint");
    let trash = parent.join(format!(".trash-{name}-{}", std::process::id()));
    std::fs::rename(checkpoint, &trash).map_err(Error::io(checkpoint))?;
    fsync_dir(parent)?;
    std::fs::remove_dir_all(&trash).map_err(Error::io(&trash))
}

/// Decides, when a staged checkpoint is complete, whether it may become `step-N`:
/// the writer's host may have given the save up by then (a writer that took longer
/// than it was allowed), and a checkpoint must not appear after the run's summary.
pub trait CommitGate {
    /// Runs `commit` (the rename) and returns what it returned if the save may still
    /// commit; `None`, running nothing, if not.
    fn commit(&self, step: u64, commit: &mut dyn FnMut() -> Result<()>) -> Option<Result<()>>;
}

/// Every save commits: for tools and tests, where no host gives a save up.
pub struct Ungated;

impl CommitGate for Ungated {
    fn commit(&self, _step: u64, commit: &mut dyn FnMut() -> Result<()>) -> Option<Result<()>> {
        Some(commit())
    }
}
