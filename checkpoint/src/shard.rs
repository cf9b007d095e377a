//! Sharded checkpoints: every rank writes its slice of the optimizer state, rank 0
//! writes everything else and commits once every slice is on disk.
//!
//! All ranks of one launch write into the same staging directory,
//! `.tmp-step-N-<save id>` (the save id is agreed by the ranks when the run starts,
//! so a crashed launch's leftovers are never mistaken for this one's). A rank
//! writes and fsyncs its part, then a marker `.part-<rank>.json` (size, CRC and
//! slice) through a temporary file and a rename. Rank 0 waits for all markers,
//! removes them, writes the manifest (which lists every part with its offsets),
//! and renames the directory into place. A kill at any moment leaves either no
//! committed checkpoint or a complete one.

use std::{
    fs::File,
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use ptrain_plugin_api::CheckpointPayload;
use serde::{Deserialize, Serialize};

use crate::{
    commit::fsync_dir,
    dir_name,
    params::ParamLayout,
    write::{reason, safetensors_bytes, write_common, write_file, write_manifest},
    Error, FileEntry, Manifest, Result,
};

/// How the optimizer state of a sharded run is cut: `state.json`'s `shard`.
///
/// The flat index space is every trainable parameter flattened and concatenated in
/// name order (the order of `model.safetensors`); rank r owns `ranges[r]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardLayout {
    /// `optimizer` or `gradients`.
    pub mode: String,
    pub world_size: u32,
    /// Elements in the flat index space.
    pub numel: u64,
    /// `[start, end)` of each rank's slice, by rank.
    pub ranges: Vec<[u64; 2]>,
    /// Identifies the launch that wrote it (its staging directories).
    pub save_id: String,
    /// `parameters`: how the parameters themselves are cut (the parts hold them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<ParamLayout>,
}

impl ShardLayout {
    /// The layout a payload's `state.json` declares, if it is sharded.
    pub fn from_state_json(state_json: &str) -> Option<ShardLayout> {
        let value: serde_json::Value = serde_json::from_str(state_json).ok()?;
        serde_json::from_value(value.get("shard")?.clone()).ok()
    }

    fn check(&self) -> std::result::Result<(), String> {
        if self.ranges.len() != self.world_size as usize || self.world_size == 0 {
            return Err(format!("{} slices for {} ranks", self.ranges.len(), self.world_size));
        }
        let mut next = 0;
        for [start, end] in &self.ranges {
            if *start != next || end < start {
                return Err(format!("slices do not tile [0, {}): {:?}", self.numel, self.ranges));
            }
            next = *end;
        }
        if next != self.numel {
            return Err(format!("slices end at {next}, not at {}", self.numel));
        }
        Ok(())
    }
}

/// The sharded part of a manifest: each rank's part and its slice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardSet {
    pub numel: u64,
    pub world_size: u32,
    pub parts: Vec<ShardEntry>,
    /// Parameter-sharded checkpoints: each parameter's name, shape and place in the
    /// parts, which hold the weights (`model.safetensors` is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<ParamLayout>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardEntry {
    pub rank: u32,
    pub path: String,
    /// The slice `[start, end)` of the flat index space this part holds.
    pub start: u64,
    pub end: u64,
}

impl ShardSet {
    /// Parts present, in rank order, tiling `[0, numel)`.
    pub(crate) fn check(&self, files: &[FileEntry]) -> std::result::Result<(), String> {
        let mut next = 0;
        for (r, part) in self.parts.iter().enumerate() {
            if part.rank as usize != r || part.start != next || part.end < part.start {
                return Err(format!("optimizer parts do not tile [0, {}) in rank order", self.numel));
            }
            if !files.iter().any(|f| f.path == part.path) {
                return Err(format!("manifest lacks {}", part.path));
            }
            next = part.end;
        }
        if next != self.numel || self.parts.len() != self.world_size as usize {
            return Err(format!("optimizer parts cover [0, {next}) of [0, {}) with {} of {} ranks", self.numel, self.parts.len(), self.world_size));
        }
        Ok(())
    }
}

/// `optimizer-rank00001-of-00002.safetensors`.
pub fn part_name(rank: u32, world_size: u32) -> String {
    format!("optimizer-rank{rank:05}-of-{world_size:05}.safetensors")
}

fn staging(checkpoints: &Path, step: u64, layout: &ShardLayout) -> PathBuf {
    checkpoints.join(format!(".tmp-{}-{}", dir_name(step), layout.save_id))
}

fn marker_name(rank: u32) -> String {
    format!(".part-{rank}.json")
}

#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    rank: u32,
    start: u64,
    end: u64,
    file: FileEntry,
}

/// Whether `step` is already committed and valid (a step's state is
/// deterministic: it is kept as it is).
fn committed(checkpoints: &Path, step: u64) -> bool {
    let target = checkpoints.join(dir_name(step));
    target.exists() && crate::validate(&target).is_ok()
}

/// Writes this rank's optimizer slice (`payload.optimizer`) into the launch's
/// staging directory and marks it complete. Ranks other than 0 call this and
/// nothing else.
pub fn write_part(checkpoints: &Path, payload: &CheckpointPayload, layout: &ShardLayout, rank: u32) -> Result<()> {
    layout.check().map_err(|m| Error::invalid(checkpoints, m))?;
    let [start, end] = *layout.ranges.get(rank as usize).ok_or_else(|| Error::invalid(checkpoints, format!("rank {rank} has no slice")))?;
    if committed(checkpoints, payload.step) {
        return Ok(());
    }
    let dir = staging(checkpoints, payload.step, layout);
    std::fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
    let name = part_name(rank, layout.world_size);
    let extra = [("rank", rank.to_string()), ("world_size", layout.world_size.to_string()), ("start", start.to_string()), ("end", end.to_string())];
    let bytes = safetensors_bytes(&dir.join(&name), &payload.optimizer, payload.step, &extra)?;
    let mut files = Vec::new();
    write_file(&dir, &name, &bytes, &mut files, payload.step)?;
    drop(bytes);
    let marker = Marker { rank, start, end, file: files.pop().expect("the part") };
    let tmp = dir.join(format!("{}.tmp", marker_name(rank)));
    let mut file = File::create(&tmp).map_err(Error::io(&tmp))?;
    file.write_all(&serde_json::to_vec(&marker).expect("marker serializes")).map_err(Error::io(&tmp))?;
    file.sync_all().map_err(Error::io(&tmp))?;
    let path = dir.join(marker_name(rank));
    std::fs::rename(&tmp, &path).map_err(Error::io(&path))?;
    fsync_dir(&dir)
}

/// Rank 0: writes its own part and everything but the optimizer state, waits (at
/// most `wait`) until every other rank's part is marked complete, then commits
/// the checkpoint as `<checkpoints>/step-N` through `gate` and returns its path
/// (`None`: the gate refused it). On failure or refusal the staging directory is
/// removed and nothing is committed.
pub fn write_sharded(
    checkpoints: &Path,
    payload: &CheckpointPayload,
    layout: &ShardLayout,
    wait: Duration,
    gate: &dyn crate::CommitGate,
) -> Result<Option<PathBuf>> {
    let target = checkpoints.join(dir_name(payload.step));
    if committed(checkpoints, payload.step) {
        return Ok(Some(target));
    }
    if target.exists() {
        crate::delete(&target)?;
    }
    let dir = staging(checkpoints, payload.step, layout);
    let result = write_part(checkpoints, payload, layout, 0).and_then(|()| assemble(&dir, payload, layout, wait));
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(e);
    }
    crate::write::commit_staged(checkpoints, &dir, &target, payload.step, gate)
}

fn assemble(dir: &Path, payload: &CheckpointPayload, layout: &ShardLayout, wait: Duration) -> Result<()> {
    let mut files = Vec::new();
    write_common(dir, payload, &mut files)?;
    let markers = wait_for_parts(dir, layout, wait)?;
    let mut parts = Vec::new();
    for marker in markers {
        parts.push(ShardEntry { rank: marker.rank, path: marker.file.path.clone(), start: marker.start, end: marker.end });
        files.push(marker.file);
    }
    for rank in 0..layout.world_size {
        let path = dir.join(marker_name(rank));
        std::fs::remove_file(&path).map_err(Error::io(&path))?;
    }
    let shards = ShardSet { numel: layout.numel, world_size: layout.world_size, parts, params: layout.params.clone() };
    let manifest =
        Manifest { format: crate::SHARDED_FORMAT_VERSION, step: payload.step, reason: reason(payload.reason).into(), files, shards: Some(shards) };
    write_manifest(dir, &manifest)
}

/// Every rank's marker, in rank order, each checked against the layout.
fn wait_for_parts(dir: &Path, layout: &ShardLayout, wait: Duration) -> Result<Vec<Marker>> {
    let deadline = Instant::now() + wait;
    let mut markers = Vec::with_capacity(layout.world_size as usize);
    for rank in 0..layout.world_size {
        let path = dir.join(marker_name(rank));
        let text = loop {
            match std::fs::read(&path) {
                Ok(text) => break text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Error::invalid(dir, format!("rank {rank}'s optimizer part did not arrive within {} s", wait.as_secs())));
                }
                Err(e) => return Err(Error::io(&path)(e)),
            }
        };
        let marker: Marker = serde_json::from_slice(&text).map_err(|e| Error::invalid(&path, e.to_string()))?;
        let [start, end] = layout.ranges[rank as usize];
        if (marker.rank, marker.start, marker.end) != (rank, start, end) {
            return Err(Error::invalid(
                &path,
                format!("part of rank {} for [{}, {}), expected rank {rank} [{start}, {end})", marker.rank, marker.start, marker.end),
            ));
        }
        markers.push(marker);
    }
    Ok(markers)
}
