//! Reading and validating checkpoints.

use std::{
    collections::BTreeMap,
    io::Read,
    path::{Path, PathBuf},
};

use ptrain_plugin_api::DType;
use safetensors::SafeTensors;

use crate::{Error, Manifest, Result, ShardEntry, ShardSet};

/// A tensor read back from a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<i64>,
    pub data: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub path: PathBuf,
    pub manifest: Manifest,
    /// The weights (empty when read by [`read_without_tensors`]).
    pub model: BTreeMap<String, Tensor>,
    /// The optimizer state of an unsharded checkpoint (empty for a sharded one:
    /// read its parts with [`Checkpoint::read_part`]; and by [`read_without_tensors`]).
    pub optimizer: BTreeMap<String, Tensor>,
    /// A sharded checkpoint's parts.
    pub shards: Option<ShardSet>,
    pub state: serde_json::Value,
    pub config_toml: String,
    pub plugin_states: BTreeMap<String, Vec<u8>>,
}

/// Checks that every file the manifest lists is present, of its size and CRC.
pub fn validate(checkpoint: &Path) -> Result<Manifest> {
    let manifest_path = checkpoint.join(crate::MANIFEST_FILE);
    let text = std::fs::read(&manifest_path).map_err(|_| Error::invalid(checkpoint, "no manifest.json: the checkpoint is incomplete"))?;
    let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| Error::invalid(&manifest_path, format!("unreadable manifest: {e}")))?;
    let optimizer_files = match (manifest.format, &manifest.shards) {
        (crate::FORMAT_VERSION, None) => Some(crate::OPTIMIZER_FILE),
        (crate::SHARDED_FORMAT_VERSION, Some(shards)) => {
            shards.check(&manifest.files).map_err(|m| Error::invalid(checkpoint, m))?;
            None
        }
        (crate::SHARDED_FORMAT_VERSION, None) => return Err(Error::invalid(checkpoint, "format 2 without optimizer parts")),
        (format, _) => {
            return Err(Error::invalid(
                checkpoint,
                format!("format {format} (this ptrain reads {} and {})", crate::FORMAT_VERSION, crate::SHARDED_FORMAT_VERSION),
            ))
        }
    };
    for required in [crate::MODEL_FILE, crate::STATE_FILE, crate::CONFIG_FILE].into_iter().chain(optimizer_files) {
        if !manifest.files.iter().any(|f| f.path == required) {
            return Err(Error::invalid(checkpoint, format!("manifest lacks {required}")));
        }
    }
    for entry in &manifest.files {
        let path = checkpoint.join(&entry.path);
        let file = std::fs::File::open(&path).map_err(|_| Error::invalid(checkpoint, format!("{} is missing", entry.path)))?;
        let (size, crc) = size_and_crc(file).map_err(Error::io(&path))?;
        if size != entry.size || crc != entry.crc32 {
            return Err(Error::invalid(checkpoint, format!("{} is corrupt (size or checksum mismatch)", entry.path)));
        }
    }
    Ok(manifest)
}

/// A file's size and CRC-32, read a block at a time: checking a checkpoint never
/// holds a whole weight file (a parameter-sharded run reads only its slices of them).
fn size_and_crc(mut file: std::fs::File) -> std::io::Result<(u64, u32)> {
    let (mut hasher, mut size) = (crc32fast::Hasher::new(), 0u64);
    let mut block = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut block) {
            Ok(0) => return Ok((size, hasher.finalize())),
            Ok(n) => {
                hasher.update(&block[..n]);
                size += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

pub(crate) fn tensors(path: &Path) -> Result<BTreeMap<String, Tensor>> {
    let bytes = std::fs::read(path).map_err(Error::io(path))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| Error::invalid(path, e.to_string()))?;
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            let dtype = crate::dtype::from_safetensors(view.dtype())
                .ok_or_else(|| Error::invalid(path, format!("unsupported dtype {} of {name}", view.dtype())))?;
            Ok((name, Tensor { dtype, shape: view.shape().iter().map(|&d| d as i64).collect(), data: view.data().to_vec() }))
        })
        .collect()
}

/// Validates a checkpoint and reads its weights (`model.safetensors`) alone: what
/// loading a trained model for export, probing or initialisation needs.
/// A parameter-sharded checkpoint's weights are re-assembled from its parts.
pub fn read_model(checkpoint: &Path) -> Result<(Manifest, BTreeMap<String, Tensor>)> {
    let manifest = validate(checkpoint)?;
    let model = match manifest.shards.as_ref().and_then(|s| Some((s, s.params.as_ref()?))) {
        Some((set, layout)) => crate::params::consolidate(checkpoint, set, layout, false)?,
        None => tensors(&checkpoint.join(crate::MODEL_FILE))?,
    };
    Ok((manifest, model))
}

/// Validates and reads a checkpoint.
pub fn read(checkpoint: &Path) -> Result<Checkpoint> {
    read_with(checkpoint, true)
}

/// Validates a checkpoint and reads all of it but its tensors: `model` and
/// `optimizer` are left empty, for a reader that takes slices of their files with
/// [`TensorFile`](crate::TensorFile) (a parameter-sharded run, which never holds
/// whole weights).
pub fn read_without_tensors(checkpoint: &Path) -> Result<Checkpoint> {
    read_with(checkpoint, false)
}

fn read_with(checkpoint: &Path, with_tensors: bool) -> Result<Checkpoint> {
    let manifest = validate(checkpoint)?;
    let state_path = checkpoint.join(crate::STATE_FILE);
    let state = serde_json::from_slice(&std::fs::read(&state_path).map_err(Error::io(&state_path))?)
        .map_err(|e| Error::invalid(&state_path, e.to_string()))?;
    let config_path = checkpoint.join(crate::CONFIG_FILE);
    let config_toml = std::fs::read_to_string(&config_path).map_err(Error::io(&config_path))?;
    let mut plugin_states = BTreeMap::new();
    for entry in manifest.files.iter().filter(|f| f.path.starts_with(crate::PLUGINS_DIR)) {
        let name = Path::new(&entry.path).file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        let path = checkpoint.join(&entry.path);
        plugin_states.insert(name, std::fs::read(&path).map_err(Error::io(&path))?);
    }
    Ok(Checkpoint {
        path: checkpoint.to_owned(),
        model: if with_tensors { tensors(&checkpoint.join(crate::MODEL_FILE))? } else { BTreeMap::new() },
        optimizer: if with_tensors && manifest.shards.is_none() { tensors(&checkpoint.join(crate::OPTIMIZER_FILE))? } else { BTreeMap::new() },
        shards: manifest.shards.clone(),
        manifest,
        state,
        config_toml,
        plugin_states,
    })
}

impl Checkpoint {
    /// How a parameter-sharded checkpoint cut its parameters (`None` for others).
    pub fn param_layout(&self) -> Option<&crate::ParamLayout> {
        self.shards.as_ref()?.params.as_ref()
    }

    /// A parameter-sharded checkpoint as an unsharded one: whole weights and whole
    /// optimizer state, re-assembled from the parts (for a run that holds them whole
    /// anyway). Others are returned as they are.
    pub fn consolidated(&self) -> Result<Checkpoint> {
        let (Some(set), Some(layout)) = (&self.shards, self.param_layout()) else { return Ok(self.clone()) };
        let mut optimizer = crate::params::consolidate(&self.path, set, layout, true)?;
        let model = layout.units.iter().flat_map(|u| &u.params).filter_map(|p| Some((p.name.clone(), optimizer.remove(&p.name)?))).collect();
        Ok(Checkpoint { model, optimizer, shards: None, ..self.clone() })
    }

    /// One optimizer part of a sharded checkpoint, read from disk (parts are read
    /// on demand: a rank needs only those that overlap its slice).
    pub fn read_part(&self, part: &ShardEntry) -> Result<BTreeMap<String, Tensor>> {
        tensors(&self.path.join(&part.path))
    }
}
