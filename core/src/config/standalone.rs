//! A run that stands alone: its checkpoints hold every weight and, in their
//! `config.toml`, the whole architecture; the tokenizer files are kept in
//! `<run-dir>/tokenizer/` with the path and SHA-256 they had. Resuming, `ptrain
//! logits` and `ptrain export` use those copies when `data.tokenizer` has moved,
//! and need no `model.init_from` directory once there is a checkpoint.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Config;
use crate::error::{Error, Result};

/// `<run-dir>/tokenizer/`: the run's tokenizer files and `source.json`.
pub const TOKENIZER_DIR: &str = "tokenizer";
const SOURCE_FILE: &str = "source.json";
/// A tokenizer's files: `tokenizer.json` (the one `data.tokenizer` names, first),
/// then the files beside it that go with it: the chat template lives in
/// `tokenizer_config.json`, or, as transformers 5 saves it, in `chat_template.jinja`.
pub const TOKENIZER_FILES: [&str; 4] = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"];

/// Where the kept tokenizer came from.
#[derive(Debug, Serialize, Deserialize)]
struct Source {
    /// `data.tokenizer` as the run recorded it (absolute).
    path: String,
    /// Of `tokenizer.json`.
    sha256: String,
}

fn sha256(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    Some(Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect())
}

fn same_file(a: &Path, b: &Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b)
}

/// Copies the run's tokenizer ([`TOKENIZER_FILES`]) into `<run_dir>/tokenizer/`.
pub fn keep_sources(config: &Config, run_dir: &Path) -> Result<()> {
    if !config.tokenizes() {
        return Ok(());
    }
    let source = Path::new(&config.data.tokenizer);
    let dir = run_dir.join(TOKENIZER_DIR);
    std::fs::create_dir_all(&dir).map_err(Error::writing(&dir))?;
    let from_dir = source.parent().unwrap_or(Path::new("."));
    for (name, from) in TOKENIZER_FILES.iter().map(|n| (*n, if *n == TOKENIZER_FILES[0] { source.to_owned() } else { from_dir.join(n) })) {
        let to = dir.join(name);
        // A resumed run may read the copy itself.
        if from.is_file() && !same_file(&from, &to) {
            // Read, then written: a failure names the file that failed and how.
            let bytes = std::fs::read(&from).map_err(|source| Error::Io { path: from.clone(), source })?;
            std::fs::write(&to, bytes).map_err(Error::writing(&to))?;
        }
    }
    let recorded = std::path::absolute(source).unwrap_or_else(|_| source.to_owned());
    let kept = Source { path: recorded.display().to_string(), sha256: sha256(source).unwrap_or_default() };
    let path = dir.join(SOURCE_FILE);
    std::fs::write(&path, serde_json::to_string_pretty(&kept).expect("serializes") + "\n").map_err(Error::writing(&path))
}

/// The run directory a checkpoint belongs to (`<run>/checkpoints/step-N`), or a
/// run directory itself.
pub fn run_dir_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(checkpoints) if ptrain_checkpoint::parse_dir_name(&path.file_name().unwrap_or_default().to_string_lossy()).is_some() => {
            checkpoints.parent().unwrap_or(checkpoints).to_owned()
        }
        _ => path.to_owned(),
    }
}

impl Config {
    /// For a configuration whose weights come from a checkpoint of `run_dir`: a
    /// `data.tokenizer` that is gone is replaced by the copy the run kept, when that
    /// copy is of the same file (path and SHA-256 as recorded).
    pub fn use_kept_tokenizer(&mut self, run_dir: &Path) {
        if !self.tokenizes() || Path::new(&self.data.tokenizer).is_file() {
            return;
        }
        let dir = run_dir.join(TOKENIZER_DIR);
        let Some(source) = std::fs::read(dir.join(SOURCE_FILE)).ok().and_then(|b| serde_json::from_slice::<Source>(&b).ok()) else { return };
        let copy = dir.join(TOKENIZER_FILES[0]);
        let wanted = std::path::absolute(&self.data.tokenizer).map(|p| p.display().to_string()).unwrap_or_default();
        if source.path == wanted && sha256(&copy).is_some_and(|h| h == source.sha256) {
            tracing::info!("data.tokenizer {} is gone: using the copy the run kept, {}", self.data.tokenizer, copy.display());
            self.data.tokenizer = copy.display().to_string();
        }
    }
}

impl Config {
    /// [`super::ConfigBuilder::weights_from`]: takes the kept tokenizer if need be,
    /// and takes out (returning it) a `model.init_from` that is gone, so that it is
    /// not resolved again.
    pub(crate) fn not_needed_with_checkpoint(&mut self, run_dir: &Path) -> Option<String> {
        self.use_kept_tokenizer(run_dir);
        if self.model.init_from.is_empty() || Path::new(&self.model.init_from).exists() {
            return None;
        }
        tracing::info!(
            "model.init_from {} is gone: not needed, the checkpoint has every weight and its configuration the architecture",
            self.model.init_from
        );
        Some(std::mem::take(&mut self.model.init_from))
    }
}
