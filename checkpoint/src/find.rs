//! Finding a checkpoint: the committed ones of a checkpoints directory, the newest
//! valid one, and the one a path names (a checkpoint, a run or a checkpoints
//! directory). Resuming, `ptrain checkpoints`, export, `ptrain logits` and
//! `model.init_from` all find theirs here.

use std::path::{Path, PathBuf};

use crate::{parse_dir_name, validate};

/// Committed checkpoint directories under `checkpoints`, by step, oldest first.
pub fn list(checkpoints: &Path) -> Vec<(u64, PathBuf)> {
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(checkpoints)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((parse_dir_name(e.file_name().to_str()?)?, e.path())))
        .filter(|(_, p)| p.is_dir())
        .collect();
    found.sort();
    found
}

/// The checkpoints directory `path` names: the one a run directory's recorded
/// `config.toml` names (`[plugins.checkpoint] dir`: a run whose checkpoints are written
/// elsewhere), else its `checkpoints/`, or `path` itself (a checkpoints directory).
pub fn checkpoints_in(path: &Path) -> PathBuf {
    if let Some(recorded) = recorded_checkpoints_dir(path) {
        return recorded;
    }
    let nested = crate::checkpoints_dir(path);
    if nested.is_dir() {
        nested
    } else {
        path.to_owned()
    }
}

/// The checkpoint plugin's `dir` a run directory's `config.toml` records (absolute, as
/// the run records it; a relative one is taken from the run directory), when it is a
/// directory. A checkpoint's own `config.toml` is not a run's: `None` there.
fn recorded_checkpoints_dir(run_dir: &Path) -> Option<PathBuf> {
    if run_dir.join(crate::MANIFEST_FILE).exists() {
        return None;
    }
    let text = std::fs::read_to_string(run_dir.join(crate::CONFIG_FILE)).ok()?;
    let table: toml::Table = text.parse().ok()?;
    let dir = table.get("plugins")?.get("checkpoint")?.get("dir")?.as_str()?;
    Some(run_dir.join(dir)).filter(|d| !dir.is_empty() && d.is_dir())
}

/// The checkpoint `path` names: a checkpoint directory itself, or the newest valid
/// checkpoint of a run or checkpoints directory (see [`find_resumable`]).
pub fn resolve(path: &Path) -> (Option<PathBuf>, Vec<String>) {
    if path.join(crate::MANIFEST_FILE).exists() {
        return (Some(path.to_owned()), Vec::new());
    }
    find_resumable(&checkpoints_in(path))
}

/// The newest valid checkpoint under `checkpoints`, with a warning for each newer
/// one that failed validation. `Ok(None)` when there is none at all.
pub fn find_resumable(checkpoints: &Path) -> (Option<PathBuf>, Vec<String>) {
    let mut warnings = Vec::new();
    for (_, path) in list(checkpoints).into_iter().rev() {
        match validate(&path) {
            Ok(_) => return (Some(path), warnings),
            Err(e) => warnings.push(format!("skipping invalid checkpoint {e}")),
        }
    }
    (None, warnings)
}

/// The newest checkpoint under `checkpoints` that is complete as the disk holds it
/// now (its manifest read, every file it lists there at its size), without reading
/// the files through (no checksums): what the end of a run names as its newest.
pub fn newest_complete(checkpoints: &Path) -> Option<(u64, PathBuf)> {
    list(checkpoints).into_iter().rev().find(|(_, path)| {
        let Ok(text) = std::fs::read(path.join(crate::MANIFEST_FILE)) else { return false };
        let Ok(manifest) = serde_json::from_slice::<crate::Manifest>(&text) else { return false };
        manifest.files.iter().all(|f| std::fs::metadata(path.join(&f.path)).is_ok_and(|m| m.len() == f.size))
    })
}
