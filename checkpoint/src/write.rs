//! Writing a checkpoint: everything into `.tmp-step-N-<pid>`, fsync, then one rename.

use std::{
    fs::File,
    io::Write,
    path::{Path, PathBuf},
};

use ptrain_plugin_api::{CheckpointPayload, CheckpointReason, TensorBlob};
use safetensors::tensor::TensorView;

use crate::{commit::fsync_dir, dir_name, Error, FileEntry, Manifest, Result};

pub(crate) fn reason(r: CheckpointReason) -> &'static str {
    match r {
        CheckpointReason::Scheduled => "scheduled",
        CheckpointReason::End => "end",
        CheckpointReason::Interrupted => "interrupted",
        CheckpointReason::NonFinite => "nonfinite",
    }
}

/// A file written and fsync'ed, recording its size and CRC for the manifest.
/// `step` is the checkpoint's, for `[debug] pause_save_at_step` (see [`crate::pause`]).
pub(crate) fn write_file(dir: &Path, relative: &str, bytes: &[u8], files: &mut Vec<FileEntry>, step: u64) -> Result<()> {
    let path = dir.join(relative);
    let mut file = File::create(&path).map_err(Error::io(&path))?;
    file.write_all(bytes).map_err(Error::io(&path))?;
    file.sync_all().map_err(Error::io(&path))?;
    files.push(FileEntry { path: relative.to_string(), size: bytes.len() as u64, crc32: crc32fast::hash(bytes) });
    crate::pause::after_file(step, &path)
}

/// `blobs` as a safetensors file, with `format: pt`, the step and `extra` in its metadata.
pub(crate) fn safetensors_bytes(path: &Path, blobs: &[TensorBlob], step: u64, extra: &[(&str, String)]) -> Result<Vec<u8>> {
    let views = blobs
        .iter()
        .map(|b| {
            let shape: Vec<usize> = b.shape.iter().map(|&d| d as usize).collect();
            TensorView::new(crate::dtype::to_safetensors(b.dtype), shape, b.data.as_slice()).map(|v| (b.name.as_str().to_string(), v))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::invalid(path, format!("tensor does not match its shape: {e}")))?;
    let metadata = [("format".to_string(), "pt".to_string()), ("step".to_string(), step.to_string())]
        .into_iter()
        .chain(extra.iter().map(|(k, v)| (k.to_string(), v.clone())))
        .collect();
    safetensors::serialize(views, Some(metadata)).map_err(|e| Error::invalid(path, e.to_string()))
}

/// Writes `payload` as `<checkpoints>/step-N` and returns its path. When that
/// directory already exists and is valid, it is kept as it is (a step's state is
/// deterministic); an invalid one is replaced.
pub fn write(checkpoints: &Path, payload: &CheckpointPayload) -> Result<PathBuf> {
    match write_gated(checkpoints, payload, &crate::Ungated)? {
        Some(path) => Ok(path),
        None => Err(Error::invalid(checkpoints, "the commit was refused")),
    }
}

/// [`write`], the rename that makes the checkpoint passed through `gate`: `None`
/// when the gate refused it (what was staged is removed).
pub fn write_gated(checkpoints: &Path, payload: &CheckpointPayload, gate: &dyn crate::CommitGate) -> Result<Option<PathBuf>> {
    std::fs::create_dir_all(checkpoints).map_err(Error::io(checkpoints))?;
    let name = dir_name(payload.step);
    let target = checkpoints.join(&name);
    if target.exists() {
        if crate::validate(&target).is_ok() {
            return Ok(Some(target));
        }
        crate::delete(&target)?;
    }
    let tmp = checkpoints.join(format!(".tmp-{name}-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(Error::io(&tmp))?;
    }
    let result = write_into(&tmp, payload);
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    commit_staged(checkpoints, &tmp, &target, payload.step, gate)
}

/// Renames the complete `staged` directory to `target` if `gate` lets it; removes it
/// if not.
pub(crate) fn commit_staged(checkpoints: &Path, staged: &Path, target: &Path, step: u64, gate: &dyn crate::CommitGate) -> Result<Option<PathBuf>> {
    let mut rename = || {
        std::fs::rename(staged, target).map_err(Error::io(target))?;
        fsync_dir(checkpoints)
    };
    match gate.commit(step, &mut rename) {
        Some(done) => done.map(|()| Some(target.to_path_buf())),
        None => {
            let _ = std::fs::remove_dir_all(staged);
            Ok(None)
        }
    }
}

fn write_into(tmp: &Path, payload: &CheckpointPayload) -> Result<()> {
    std::fs::create_dir_all(tmp).map_err(Error::io(tmp))?;
    let mut files = Vec::new();
    let optimizer = safetensors_bytes(&tmp.join(crate::OPTIMIZER_FILE), &payload.optimizer, payload.step, &[])?;
    write_file(tmp, crate::OPTIMIZER_FILE, &optimizer, &mut files, payload.step)?;
    drop(optimizer);
    write_common(tmp, payload, &mut files)?;
    let manifest = Manifest { format: crate::FORMAT_VERSION, step: payload.step, reason: reason(payload.reason).into(), files, shards: None };
    write_manifest(tmp, &manifest)
}

/// What every checkpoint has besides its optimizer state: weights, state.json,
/// the configuration and the plugins' states.
pub(crate) fn write_common(tmp: &Path, payload: &CheckpointPayload, files: &mut Vec<FileEntry>) -> Result<()> {
    std::fs::create_dir_all(tmp.join(crate::PLUGINS_DIR)).map_err(Error::io(tmp))?;
    let model = safetensors_bytes(&tmp.join(crate::MODEL_FILE), &payload.model, payload.step, &[])?;
    write_file(tmp, crate::MODEL_FILE, &model, files, payload.step)?;
    drop(model);
    write_file(tmp, crate::STATE_FILE, payload.state_json.as_bytes(), files, payload.step)?;
    write_file(tmp, crate::CONFIG_FILE, payload.config_toml.as_bytes(), files, payload.step)?;
    for blob in payload.plugin_states.iter() {
        let relative = format!("{}/{}.bin", crate::PLUGINS_DIR, blob.name.as_str());
        write_file(tmp, &relative, blob.data.as_slice(), files, payload.step)?;
    }
    fsync_dir(&tmp.join(crate::PLUGINS_DIR))
}

/// The manifest, last, then the directory: after this the checkpoint is complete.
pub(crate) fn write_manifest(tmp: &Path, manifest: &Manifest) -> Result<()> {
    let text = serde_json::to_vec_pretty(manifest).expect("manifest serializes");
    let path = tmp.join(crate::MANIFEST_FILE);
    let mut file = File::create(&path).map_err(Error::io(&path))?;
    file.write_all(&text).map_err(Error::io(&path))?;
    file.sync_all().map_err(Error::io(&path))?;
    fsync_dir(tmp)
}
