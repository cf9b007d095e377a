//! Hugging Face interop: start from a local `transformers` directory
//! (`model.init_from`: a `model_type` some family of `model::family` reads) and export a
//! checkpoint that `AutoModelForCausalLM` loads.
//!
//! The same parameter table ([`names::params`], the family's) drives both directions,
//! so the loader and the exporter cannot disagree about a name or a transposition.
//! Each family's `config.json` mapping is in its own files (`model/llama/hf.rs`).

pub mod arch;
mod export;
mod load;
pub mod names;
mod peft;

use std::path::{Path, PathBuf};

pub use arch::HfArch;
pub(crate) use export::write_hf;
pub use export::{export, recorded_config, resolve_checkpoint, Exported, GENERATION_CONFIG};
pub use load::{load_pieces, load_weights};
pub use peft::{export_peft, ADAPTER_CONFIG, ADAPTER_WEIGHTS};

use crate::{
    config::looks_like_hub_name,
    error::{ConfigError, Error, Result},
};

pub const CONFIG_JSON: &str = "config.json";
pub const WEIGHTS: &str = "model.safetensors";
pub const WEIGHTS_INDEX: &str = "model.safetensors.index.json";

/// A local model directory: its `config.json` read, its weight files found.
#[derive(Debug, Clone)]
pub struct HfDir {
    pub dir: PathBuf,
    pub arch: HfArch,
    /// `config.json` as written, so an export can keep what ptrain does not model
    /// (token ids, task parameters).
    pub raw_config: serde_json::Map<String, serde_json::Value>,
    /// The safetensors files holding the weights (several for a sharded checkpoint).
    pub weight_files: Vec<PathBuf>,
}

impl HfDir {
    /// Opens `model.init_from`: a directory with `config.json`, or a hub cache
    /// `models--org--name/` (its `refs/main` snapshot, or its only one).
    pub fn open(spec: &str) -> Result<HfDir> {
        let dir = locate(spec)?;
        let config_path = dir.join(CONFIG_JSON);
        let text = std::fs::read_to_string(&config_path).map_err(|e| Error::Io { path: config_path.clone(), source: e })?;
        let raw: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&text).map_err(|e| Error::Data { path: config_path.clone(), message: format!("not a JSON object: {e}") })?;
        let arch = HfArch::from_json(&raw).map_err(|message| Error::Data { path: config_path.clone(), message })?;
        let weight_files = weight_files(&dir)?;
        Ok(HfDir { dir, arch, raw_config: raw, weight_files })
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join(CONFIG_JSON)
    }
}

/// Where the local hub cache would keep `name`, if it is there.
fn cached_hub_dir(name: &str) -> Option<PathBuf> {
    let cache = std::env::var_os("HF_HUB_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HF_HOME").map(|h| PathBuf::from(h).join("hub")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub")))?;
    let dir = cache.join(format!("models--{}", name.replace('/', "--")));
    dir.join("snapshots").is_dir().then_some(dir)
}

fn locate(spec: &str) -> Result<PathBuf> {
    let path = Path::new(spec);
    if !path.exists() {
        if looks_like_hub_name(spec) {
            let last = spec.rsplit('/').next().unwrap_or(spec);
            let cached = cached_hub_dir(spec).map(|d| format!(" (your hub cache has it: set model.init_from = \"{}\")", d.display()));
            return Err(ConfigError {
                origin: "configuration".into(),
                key: "model.init_from".into(),
                message: format!(
                    "no directory `{spec}`, and ptrain downloads nothing. If it is a Hugging Face hub model id, download it first: \
                     `hf download {spec} --local-dir models/{last}` (or huggingface_hub.snapshot_download(\"{spec}\") in Python), and set \
                     model.init_from to that directory; if it is a local path, download the model there: \
                     `hf download <model id> --local-dir {spec}`{}",
                    cached.unwrap_or_default()
                ),
            }
            .into());
        }
        // Most often a base model moved since a run recorded it: say how to name it.
        return Err(Error::Data {
            path: path.to_owned(),
            message: "model.init_from directory not found: if the model moved, give its new directory \
                      (`--base DIR` to ptrain run, generate, logits and export; or --set model.init_from=DIR)"
                .into(),
        });
    }
    if !path.is_dir() {
        return Err(Error::Data { path: path.to_owned(), message: "model.init_from names a file: give the directory holding config.json".into() });
    }
    if path.join(CONFIG_JSON).is_file() {
        return Ok(path.to_owned());
    }
    let snapshots = path.join("snapshots");
    if snapshots.is_dir() {
        let main = std::fs::read_to_string(path.join("refs/main")).ok().map(|r| snapshots.join(r.trim())).filter(|d| d.is_dir());
        let all: Vec<PathBuf> = std::fs::read_dir(&snapshots).into_iter().flatten().filter_map(|e| e.ok()).map(|e| e.path()).collect();
        let chosen = match (main, all.as_slice()) {
            (Some(main), _) => main,
            (None, [only]) => only.clone(),
            (None, _) => {
                return Err(Error::Data {
                    path: snapshots,
                    message: format!("{} snapshots and no refs/main: set model.init_from to one snapshots/<revision> directory", all.len()),
                })
            }
        };
        if chosen.join(CONFIG_JSON).is_file() {
            return Ok(chosen);
        }
        return Err(Error::Data { path: chosen, message: "no config.json in this hub snapshot (download the model's config.json too)".into() });
    }
    Err(Error::Data {
        path: path.to_owned(),
        message:
            "no config.json: not a Hugging Face model directory (save_pretrained and `hf download` write config.json beside model.safetensors), \
                  nor a ptrain run directory with a valid checkpoint, nor a peft adapter directory (adapter_config.json)"
                .into(),
    })
}

fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join(WEIGHTS);
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join(WEIGHTS_INDEX);
    if index.is_file() {
        let bad = |message: String| Error::Data { path: index.clone(), message };
        let text = std::fs::read_to_string(&index).map_err(|e| Error::Io { path: index.clone(), source: e })?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let map = json.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| bad("no weight_map".into()))?;
        let mut files: Vec<PathBuf> = map.values().filter_map(|v| v.as_str()).map(|f| dir.join(f)).collect();
        files.sort();
        files.dedup();
        if let Some(missing) = files.iter().find(|f| !f.is_file()) {
            return Err(Error::MissingFile { what: "weight shard", path: missing.clone() });
        }
        return Ok(files);
    }
    let message = if dir.join("pytorch_model.bin").exists() {
        "only pytorch_model.bin here: ptrain reads safetensors; convert it with transformers \
         (GPT2LMHeadModel.from_pretrained(dir).save_pretrained(dir)) or download model.safetensors"
    } else {
        "no model.safetensors (or model.safetensors.index.json): download the weights with config.json"
    };
    Err(Error::Data { path: dir.to_owned(), message: message.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_names_are_told_from_paths() {
        for name in ["gpt2", "openai-community/gpt2", "distilbert/distilgpt2", "EleutherAI/gpt-neo-125m"] {
            assert!(looks_like_hub_name(name), "{name}");
        }
        for path in ["/models/gpt2", "./gpt2", "a/b/c", "../gpt2", "gpt2/", ""] {
            assert!(!looks_like_hub_name(path), "{path}");
        }
    }

    #[test]
    fn a_hub_cache_directory_resolves_to_its_main_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("models--org--tiny");
        for rev in ["aaa", "bbb"] {
            std::fs::create_dir_all(repo.join("snapshots").join(rev)).unwrap();
            std::fs::write(repo.join("snapshots").join(rev).join(CONFIG_JSON), "{}").unwrap();
        }
        assert!(matches!(locate(repo.to_str().unwrap()), Err(Error::Data { .. })), "two snapshots, no refs/main");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "bbb\n").unwrap();
        assert_eq!(locate(repo.to_str().unwrap()).unwrap(), repo.join("snapshots/bbb"));
    }

    #[test]
    fn a_missing_hub_name_says_to_download_it() {
        let e = locate("no-such-org/no-such-model-xyz").unwrap_err().to_string();
        assert!(e.contains("model.init_from") && e.contains("hf download no-such-org/no-such-model-xyz"), "{e}");
    }
}
