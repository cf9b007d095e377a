//! `ptrain export --format hf`: a ptrain checkpoint of a model with a Hugging Face
//! counterpart (its family's, `model::family::HfSpec`) as a directory
//! `transformers.AutoModelForCausalLM.from_pretrained` loads.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
};

use ptrain_plugin_api::DType;
use safetensors::tensor::TensorView;

use super::{names, HfDir, CONFIG_JSON, WEIGHTS};
use crate::{
    config::{Config, ConfigBuilder, TOKENIZER_FILES},
    error::{Error, Result},
    model::family::{self, HfSpec},
};

/// What an export wrote.
#[derive(Debug, Clone)]
pub struct Exported {
    pub checkpoint: PathBuf,
    pub step: u64,
    pub out: PathBuf,
    pub tensors: usize,
    /// The tokenizer files copied along, if the run had a tokenizer.
    pub tokenizer_files: Vec<PathBuf>,
}

/// A checkpoint directory, or the newest valid checkpoint of a run directory (or
/// of its `checkpoints/`).
pub fn resolve_checkpoint(path: &Path) -> Result<PathBuf> {
    if !path.exists() {
        return Err(Error::MissingFile { what: "checkpoint", path: path.to_owned() });
    }
    let (found, warnings) = ptrain_checkpoint::resolve(path);
    for w in warnings {
        tracing::warn!("{w}");
    }
    if let Some(found) = found {
        return Ok(found);
    }
    Err(Error::Checkpoint { path: path.to_owned(), message: "no valid checkpoint here".into() })
}

pub const GENERATION_CONFIG: &str = "generation_config.json";

/// The configuration a checkpoint was trained with (its `config.toml`), as recorded.
pub fn recorded_config(checkpoint: &Path) -> Result<Config> {
    let path = checkpoint.join(ptrain_checkpoint::CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::Io { path: path.clone(), source: e })?;
    let mut config = ConfigBuilder::default().recorded(&text, &path.display().to_string())?.build_recorded()?;
    config.use_kept_tokenizer(&crate::config::run_dir_of(checkpoint));
    // The checkpoint holds the adapters: those the run started from are not read again.
    if let Some(lora) = config.lora.as_mut() {
        lora.init_from.clear();
    }
    Ok(config)
}

fn checkpoint_error(path: &Path, message: impl Into<String>) -> Error {
    Error::Checkpoint { path: path.to_owned(), message: message.into() }
}

/// Writes `out/config.json`, `out/model.safetensors` (Hugging Face names and layouts) and
/// the run's tokenizer files, from the checkpoint at (or newest under) `path`. A
/// LoRA checkpoint (adapters only) needs `merge`: its adapters are merged into the
/// base weights of `model.init_from` (`W + alpha / r * B A`), a full model.
/// With `with_tokenizer`, a run whose tokenizer can no longer be read is refused
/// before anything is written (an export without it loads a one-token vocabulary in
/// `AutoTokenizer`); without, no tokenizer file is written. `base`: a LoRA run's base
/// model found elsewhere than `model.init_from` (its weights must hash to what the run
/// recorded).
pub fn export(path: &Path, out: &Path, with_tokenizer: bool, merge: bool, base: Option<&Path>) -> Result<Exported> {
    let checkpoint = resolve_checkpoint(path)?;
    let (manifest, mut saved) = ptrain_checkpoint::read_model(&checkpoint).map_err(|e| checkpoint_error(&checkpoint, e.to_string()))?;
    let mut config = recorded_config(&checkpoint)?;
    if let Some(base) = base {
        if config.lora().is_none() || !merge {
            return Err(checkpoint_error(&checkpoint, "--base names a LoRA run's base model: use it with --merge (or --format peft)"));
        }
        config.model.init_from = base.display().to_string();
    }
    let m = &config.model;
    if with_tokenizer {
        tokenizer_readable(&config)?;
    }
    let Some(hf) = family::of(m.kind).hf.as_ref() else {
        let kinds = family::kinds(|f| f.hf.is_some(), |k| format!("a {k}"));
        return Err(checkpoint_error(&checkpoint, format!("model.kind = {:?}: only {kinds} exports to the Hugging Face format", m.kind)));
    };
    let weights_path = checkpoint.join(ptrain_checkpoint::MODEL_FILE);
    match (config.lora().is_some(), merge) {
        (false, false) => {}
        (true, true) => saved = super::super::lora::merged(&config, &checkpoint, base)?,
        (true, false) => {
            let message = "a LoRA checkpoint holds only the adapters: export them with --format peft, or a full model with --format hf --merge";
            return Err(checkpoint_error(&checkpoint, message));
        }
        (false, true) => return Err(checkpoint_error(&checkpoint, "--merge merges LoRA adapters, and this run trained none ([lora])")),
    }

    let (tensors, tokenizer_files) = write_hf(&config, hf, saved, &weights_path, out, with_tokenizer)?;
    Ok(Exported { checkpoint, step: manifest.step, out: out.to_owned(), tensors, tokenizer_files })
}

/// Writes `out` as a Hugging Face model directory of `config`'s model with the weights
/// `saved` (ptrain's names; `weights_path`: where they were read, for errors): its
/// `config.json` over `model.init_from`'s, and with `with_tokenizer` the tokenizer files.
/// Returns the tensors written and the tokenizer files copied.
pub(crate) fn write_hf(
    config: &Config,
    hf: &HfSpec,
    saved: BTreeMap<String, ptrain_checkpoint::Tensor>,
    weights_path: &Path,
    out: &Path,
    with_tokenizer: bool,
) -> Result<(usize, Vec<PathBuf>)> {
    let m = &config.model;
    let config_path = weights_path.with_file_name(ptrain_checkpoint::CONFIG_FILE);
    let tensors = hf_tensors(m, hf, saved, weights_path)?;

    std::fs::create_dir_all(out).map_err(|e| Error::Io { path: out.to_owned(), source: e })?;
    let weights_out = out.join(WEIGHTS);
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            TensorView::new(ptrain_checkpoint::dtype::to_safetensors(*dtype), shape.clone(), data).map(|v| (name.clone(), v))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Other(format!("building {}: {e}", weights_out.display())))?;
    write_safetensors(views, &weights_out)?;

    let source = match m.init_from.as_str() {
        "" => None,
        dir => HfDir::open(dir).map_err(|e| tracing::warn!("config.json of {dir} not kept: {e}")).ok(),
    };
    let base = source.as_ref().map(|d| &d.raw_config);
    let mut json = (hf.write)(m, base).map_err(|e| checkpoint_error(&config_path, e))?;
    // Sampling defaults (eos ids, temperature) travel with the model.
    if let Some(generation) = source.as_ref().map(|d| d.dir.join(GENERATION_CONFIG)).filter(|p| p.is_file()) {
        std::fs::copy(&generation, out.join(GENERATION_CONFIG)).map_err(|e| Error::Io { path: generation.clone(), source: e })?;
    }
    let tokenizer_files = if with_tokenizer { copy_tokenizer(config, out)? } else { Vec::new() };
    if with_tokenizer && config.tokenizes() && !config.data.eos_token.is_empty() {
        if let Some(id) = crate::data::tokenize::load_tokenizer(Path::new(&config.data.tokenizer))?.token_to_id(&config.data.eos_token) {
            json.insert("eos_token_id".into(), id.into());
        }
    }
    let json_path = out.join(CONFIG_JSON);
    let text = serde_json::to_string_pretty(&json).expect("JSON serializes") + "\n";
    std::fs::write(&json_path, text).map_err(|e| Error::Io { path: json_path, source: e })?;
    Ok((tensors.len(), tokenizer_files))
}

/// A tensor as a safetensors file holds it: name, type, shape, bytes.
type Bytes = (String, DType, Vec<usize>, Vec<u8>);

/// The checkpoint's tensors `saved` as the Hugging Face model's, in its family's names
/// and layouts (`weights_path`: where they were read, for errors).
fn hf_tensors(
    m: &crate::config::ModelConfig,
    hf: &HfSpec,
    mut saved: BTreeMap<String, ptrain_checkpoint::Tensor>,
    weights_path: &Path,
) -> Result<Vec<Bytes>> {
    let params = names::params(m);
    let known: BTreeSet<&str> = params.iter().map(|p| p.name.as_str()).collect();
    if let Some(extra) = saved.keys().find(|n| !known.contains(n.as_str())) {
        return Err(checkpoint_error(weights_path, format!("tensor `{extra}` has no Hugging Face counterpart")));
    }
    let mut tensors: Vec<Bytes> = Vec::with_capacity(params.len());
    for p in &params {
        let shape: Vec<usize> = p.shape.iter().map(|&d| d as usize).collect();
        let (dtype, data) = match saved.remove(&p.name) {
            Some(t) if t.shape.iter().map(|&d| d as usize).eq(shape.iter().copied()) => (t.dtype, t.data),
            Some(t) => {
                let found: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
                return Err(checkpoint_error(weights_path, format!("`{}` has shape {found:?}, expected {shape:?}", p.name)));
            }
            // A parameter the model lacks and the family writes as zeros (gpt's biases).
            None if (hf.absent_as_zeros)(m, &p.name) => (DType::F32, vec![0u8; shape.iter().product::<usize>() * DType::F32.size()]),
            None => return Err(checkpoint_error(weights_path, format!("no tensor `{}`", p.name))),
        };
        if !p.split.is_empty() {
            // A mixture's stacked experts, written one tensor per expert as `save_pretrained` does.
            let mut at = 0;
            for (name, part) in &p.split {
                let len = part.iter().product::<i64>() as usize * dtype.size();
                tensors.push((name.clone(), dtype, part.iter().map(|&d| d as usize).collect(), data[at..at + len].to_vec()));
                at += len;
            }
            continue;
        }
        let (data, shape) =
            if p.conv1d { (names::transpose_bytes(&data, shape[0], shape[1], dtype.size()), vec![shape[1], shape[0]]) } else { (data, shape) };
        tensors.push((p.hf_name().to_string(), dtype, shape, data));
    }
    Ok(tensors)
}

/// Writes `views` to `path` as transformers and peft save them (`format: pt`), through
/// a temporary file beside it, so an interrupted export leaves no half-written file.
pub(super) fn write_safetensors(views: Vec<(String, TensorView<'_>)>, path: &Path) -> Result<()> {
    let metadata: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    safetensors::serialize_to_file(views, Some(metadata), &tmp).map_err(|e| Error::Other(format!("writing {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::Io { path: path.to_owned(), source: e })
}

/// Refuses, before anything is written, a run whose tokenizer can no longer be read:
/// an export without it loads a one-token vocabulary in `AutoTokenizer`.
pub(super) fn tokenizer_readable(config: &Config) -> Result<()> {
    let tokenizer = Path::new(&config.data.tokenizer);
    if config.tokenizes() && !tokenizer.is_file() {
        return Err(Error::MissingFile { what: "the run's data.tokenizer (export --no-tokenizer exports without it)", path: tokenizer.to_owned() });
    }
    Ok(())
}

/// Copies `data.tokenizer` (as `tokenizer.json`) and the files beside it that go
/// with it ([`TOKENIZER_FILES`]); nothing for a run that tokenizes no text.
pub(super) fn copy_tokenizer(config: &Config, out: &Path) -> Result<Vec<PathBuf>> {
    let source = Path::new(&config.data.tokenizer);
    if !config.tokenizes() {
        return Ok(Vec::new());
    }
    let mut copied = Vec::new();
    let mut copy = |from: &Path, name: &str| -> Result<()> {
        let to = out.join(name);
        std::fs::copy(from, &to).map_err(|e| Error::Io { path: from.to_owned(), source: e })?;
        copied.push(to);
        Ok(())
    };
    let (main, beside) = TOKENIZER_FILES.split_first().expect("a tokenizer has files");
    copy(source, main)?;
    let dir = source.parent().unwrap_or(Path::new("."));
    for &name in beside {
        if dir.join(name).is_file() {
            copy(&dir.join(name), name)?;
        }
    }
    Ok(copied)
}
