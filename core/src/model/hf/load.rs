//! Copies a Hugging Face checkpoint's weights into ptrain's `gpt` or `llama`
//! (`model.init_from`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    path::{Path, PathBuf},
};

use memmap2::{Mmap, UncheckedAdvice};
use safetensors::{tensor::TensorView, Dtype, SafeTensors};
use tch::{nn, Kind, Tensor};

use super::{names, HfDir};
use crate::{
    config::ModelConfig,
    error::{Error, Result},
};

fn map(path: &Path) -> Result<Mmap> {
    let file = File::open(path).map_err(|e| Error::Io { path: path.to_owned(), source: e })?;
    // SAFETY: read-only mapping of a weight file nobody should be writing.
    unsafe { Mmap::map(&file) }.map_err(|e| Error::Io { path: path.to_owned(), source: e })
}

/// Drops the pages of `bytes` (a tensor inside `mmap`, just copied into its variable)
/// from the process's resident memory: without it every weight file would stay
/// resident beside the model until loading ends, doubling the loading peak.
fn forget(mmap: &Mmap, bytes: &[u8]) {
    let offset = bytes.as_ptr() as usize - mmap.as_ptr() as usize;
    // SAFETY: the mapping is private and read-only, so MADV_DONTNEED loses nothing: a
    // later read of these pages (none is made) reloads them from the file.
    if let Err(e) = unsafe { mmap.unchecked_advise_range(UncheckedAdvice::DontNeed, offset, bytes.len()) } {
        tracing::debug!("madvise(DONTNEED) on a weight file: {e}");
    }
}

/// The tch kind of a pretrained weight: floating-point types only.
fn kind(dtype: Dtype) -> Option<Kind> {
    ptrain_checkpoint::dtype::from_safetensors(dtype).filter(|d| d.is_float()).map(|d| d.kind())
}

/// The variable `transformer.h.0.ln_1.weight` under `vs` (tch paths take one
/// component at a time).
fn variable(vs: &nn::Path, name: &str) -> Option<Tensor> {
    let (dirs, leaf) = name.rsplit_once('.')?;
    let mut parts = dirs.split('.');
    let mut path = vs.sub(parts.next()?);
    for part in parts {
        path = path.sub(part);
    }
    path.get(leaf)
}

fn shape_of(view: &TensorView<'_>) -> Vec<i64> {
    view.shape().iter().map(|&d| d as i64).collect()
}

/// Loads `m.init_from`'s weights into the `gpt` or `llama` built under `vs` from `m`.
///
/// Every parameter must be present with GPT-2's shape; any other tensor than the
/// known buffers and the tied head is refused, so a file that is not what
/// `config.json` says never trains silently.
pub fn load_weights(vs: &nn::Path, m: &ModelConfig) -> Result<()> {
    let hf = HfDir::open(&m.init_from)?;
    if let Some(mismatch) = hf.arch.mismatch(m) {
        return Err(Error::Data {
            path: hf.config_path(),
            message: format!(
                "{mismatch}: the configuration was not resolved against model.init_from (build it with ConfigBuilder, or call Config::resolve_pretrained)"
            ),
        });
    }
    let maps: Vec<(PathBuf, Mmap)> = hf.weight_files.iter().map(|p| Ok((p.clone(), map(p)?))).collect::<Result<_>>()?;
    let mut found: BTreeMap<String, (&Path, TensorView<'_>)> = BTreeMap::new();
    for (path, mmap) in &maps {
        let st = SafeTensors::deserialize(mmap).map_err(|e| Error::Data { path: path.clone(), message: format!("not a safetensors file: {e}") })?;
        for (name, view) in st.tensors() {
            found.insert(names::canonical_for(m.kind, &name), (path.as_path(), view));
        }
    }
    let params = names::params(m);
    let expected: BTreeSet<&str> = params.iter().map(|p| p.hf_name()).collect();
    let unexpected: Vec<(&String, &Path)> =
        found.iter().filter(|(n, _)| !expected.contains(n.as_str()) && !names::is_known_extra_for(m, n)).map(|(n, (p, _))| (n, *p)).collect();
    if let Some((name, path)) = unexpected.first() {
        let more = if unexpected.len() > 1 { format!(" (and {} more)", unexpected.len() - 1) } else { String::new() };
        return Err(Error::Data {
            path: path.to_path_buf(),
            message: format!("unexpected tensor `{name}`{more}: not a parameter of a {:?} with n_layer = {}", m.kind, m.n_layer),
        });
    }
    let arch = format!("n_layer = {}, n_embd = {}, vocab_size = {}, positions = {}", m.n_layer, m.n_embd, m.vocab_size, m.block_size);
    let mut plan = Vec::with_capacity(params.len());
    for p in &params {
        let Some((path, view)) = found.get(p.hf_name()) else {
            let path = maps.first().map_or(hf.dir.clone(), |(file, _)| file.clone());
            return Err(Error::Data { path, message: format!("missing tensor `{}` (config.json: {arch})", p.hf_name()) });
        };
        let shape = shape_of(view);
        if shape != p.hf_shape() {
            return Err(Error::Data {
                path: path.to_path_buf(),
                message: format!("tensor `{}` has shape {shape:?}, expected {:?} (config.json: {arch})", p.hf_name(), p.hf_shape()),
            });
        }
        let kind = kind(view.dtype())
            .ok_or_else(|| Error::Data { path: path.to_path_buf(), message: format!("tensor `{}` has dtype {:?}", p.hf_name(), view.dtype()) })?;
        let var = variable(vs, &p.name).ok_or_else(|| Error::Other(format!("the model has no parameter `{}`", p.name)))?;
        let mmap = &maps.iter().find(|(file, _)| file == path).expect("a view of a mapped file").1;
        plan.push((p, view, kind, var, shape, mmap));
    }
    tch::no_grad(|| -> Result<()> {
        for (p, view, kind, mut var, shape, mmap) in plan {
            let mut t = Tensor::f_from_data_size(view.data(), &shape, kind)?.to_kind(var.kind());
            if p.conv1d {
                t = t.tr();
            }
            var.f_copy_(&t)?;
            forget(mmap, view.data());
        }
        Ok(())
    })?;
    tracing::info!("loaded {} tensors from {}", params.len(), hf.dir.display());
    Ok(())
}
