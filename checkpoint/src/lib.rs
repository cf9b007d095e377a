//! The checkpoint directory format.
//!
//! ```text
//! <run-dir>/checkpoints/
//!   step-00001000/
//!     model.safetensors      weights, loadable by safetensors.torch.load_file
//!     optimizer.safetensors  optimizer state (unsharded runs), or
//!     optimizer-rank00000-of-00002.safetensors ...  each rank's slice (sharded runs)
//!     state.json             step, counters, data position, RNG scheme
//!     config.toml            the resolved configuration
//!     plugins/<name>.bin     each plugin's own state
//!     manifest.json          sizes and CRC-32 of every file above, written last
//!   latest                   name of the newest checkpoint, written last
//!   best                     name of the best by the checkpoint plugin's metric, if scored
//! ```
//!
//! "The latest checkpoint" has one meaning everywhere (`latest`, `ptrain checkpoints
//! list` and `verify`, `--auto-resume`, `ptrain export`): the valid checkpoint of
//! the highest step ([`find_resumable`]).
//!
//! A checkpoint is written into a temporary directory, every file and the directory
//! are fsync'ed, and it is renamed into place: a crash at any moment leaves either
//! the whole checkpoint or none of it, and never touches older ones. A sharded run's
//! ranks write their parts into one staging directory and rank 0 commits it once
//! every part is there (see [`shard`]).

mod commit;
pub mod dtype;
mod find;
pub mod params;
pub mod pause;
mod read;
pub mod shard;
mod slices;
mod write;

use std::path::{Path, PathBuf};

pub use commit::{commit_best, commit_latest, delete, read_best, read_latest, CommitGate, Ungated};
pub use find::{checkpoints_in, find_resumable, list, newest_complete, resolve};
pub use params::{ParamEntry, ParamLayout, UnitLayout};
pub use read::{read, read_model, read_without_tensors, validate, Checkpoint, Tensor};
pub use shard::{part_name, write_part, write_sharded, ShardEntry, ShardLayout, ShardSet};
pub use slices::{TensorEntry, TensorFile};
pub use write::{write, write_gated};

pub const MODEL_FILE: &str = "model.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const STATE_FILE: &str = "state.json";
pub const CONFIG_FILE: &str = "config.toml";
pub const MANIFEST_FILE: &str = "manifest.json";
pub const PLUGINS_DIR: &str = "plugins";
pub const LATEST_FILE: &str = "latest";
pub const BEST_FILE: &str = "best";
pub const FORMAT_VERSION: u32 = 1;
/// Sharded checkpoints: the optimizer state is in one part per rank.
pub const SHARDED_FORMAT_VERSION: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
}

impl Error {
    pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
        move |source| Error::Io { path: path.to_owned(), source }
    }

    pub fn invalid(path: &Path, message: impl Into<String>) -> Error {
        Error::Invalid { path: path.to_owned(), message: message.into() }
    }

    /// Whether the error is a full disk or a permission problem, which a run can
    /// survive by keeping its older checkpoints.
    pub fn is_storage(&self) -> bool {
        matches!(self, Error::Io { source, .. } if matches!(source.raw_os_error(), Some(28 | 13 | 30 | 122)) || source.kind() == std::io::ErrorKind::PermissionDenied)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `step-00001000`.
pub fn dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

pub fn parse_dir_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    (digits.len() >= 8 && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok()).flatten()
}

/// `<run-dir>/checkpoints`.
pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// The manifest: what a complete checkpoint contains.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Manifest {
    pub format: u32,
    pub step: u64,
    pub reason: String,
    pub files: Vec<FileEntry>,
    /// Sharded checkpoints (format 2): the optimizer parts and their slices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<ShardSet>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct FileEntry {
    pub path: String,
    pub size: u64,
    pub crc32: u32,
}

#[cfg(test)]
mod tests;
