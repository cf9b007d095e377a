//! Copies a Hugging Face checkpoint's weights into the configured model
//! (`model.init_from`), by its family's parameter table.

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
    model::base_digest::{BaseDigest, TensorHash},
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

/// Loads `m.init_from`'s weights into the model built under `vs` from `m`.
///
/// Every parameter must be present with the Hugging Face shape; any other tensor than the
/// known buffers and the tied head is refused, so a file that is not what
/// `config.json` says never trains silently.
pub fn load_weights(vs: &nn::Path, m: &ModelConfig) -> Result<()> {
    let vars = names::params(m)
        .into_iter()
        .map(|p| variable(vs, &p.name).map(|v| (p.name.clone(), v)).ok_or_else(|| Error::Other(format!("the model has no parameter `{}`", p.name))))
        .collect::<Result<BTreeMap<String, Tensor>>>()?;
    each_weight(m, |p, weight| {
        let mut var = vars[&p.name].shallow_clone();
        var.f_copy_(&weight.whole()?.f_to_kind(var.kind())?)?;
        Ok(())
    })
}

/// Loads into each of `pieces` (the variable slices a rank holds under parameter
/// sharding) its elements of `m.init_from`'s weights, with the checks of
/// [`load_weights`]: only those bytes of the files are read. With `hash_base`
/// (LoRA, whose frozen base is these weights) every weight is read, a slice at a
/// time, and digested as [`lora::base_digest`](crate::model::lora::base_digest) digests
/// the loaded model (float32, ptrain's layout): the digest is returned.
pub fn load_pieces(m: &ModelConfig, pieces: &[crate::optim::OwnedPiece], hash_base: bool) -> Result<Option<String>> {
    let mut by_name: BTreeMap<&str, Vec<&crate::optim::OwnedPiece>> = BTreeMap::new();
    for piece in pieces {
        by_name.entry(piece.name.as_str()).or_default().push(piece);
    }
    let mut hash = hash_base.then(BaseDigest::default);
    each_weight(m, |p, weight| {
        if let Some(h) = hash.as_mut() {
            hash_weight(h, p, weight)?;
        }
        for piece in by_name.get(p.name.as_str()).into_iter().flatten() {
            let values = weight.slice(piece.offset as i64, piece.dest.numel() as i64)?;
            piece.dest.shallow_clone().f_copy_(&values.f_to_kind(piece.dest.kind())?)?;
        }
        Ok(())
    })?;
    Ok(hash.map(BaseDigest::finish))
}

/// Adds `weight` to the base's digest as the loaded float32 variable `p` would be.
fn hash_weight(digest: &mut BaseDigest, p: &names::Param, weight: &Weight<'_>) -> Result<()> {
    let mut h = TensorHash::new(&p.name, &p.shape, Kind::Float);
    if weight.kind == Kind::Float && weight.as_stored() {
        // Already the bytes the loaded variable holds: hashed from the file, nothing allocated.
        h.bytes(weight.views[0].data());
        digest.add(h);
        return Ok(());
    }
    h.slices(p.shape.iter().product(), |at, len| Ok(weight.slice(at, len)?.f_to_kind(Kind::Float)?))?;
    digest.add(h);
    Ok(())
}

/// One parameter's tensor in a weight file, in ptrain's layout: one tensor, or the
/// tensors it is split into on disk (a mixture's experts, [`names::Param::split`]), one
/// after the other.
struct Weight<'a> {
    views: Vec<&'a TensorView<'a>>,
    kind: Kind,
    shape: Vec<i64>,
    conv1d: bool,
}

impl Weight<'_> {
    /// The weight in ptrain's layout. Read in place from the file's mapping where
    /// the layout allows (the caller copies it into its variable at once), so loading
    /// copies each byte once, not twice.
    fn whole(&self) -> Result<Tensor> {
        if let [view] = self.views[..] {
            let t = self.in_place(view.data(), &self.shape)?;
            return Ok(if self.conv1d { t.f_tr()?.f_contiguous()? } else { t });
        }
        let parts = self.views.iter().map(|v| self.in_place(v.data(), &[-1])).collect::<Result<Vec<_>>>()?;
        Ok(Tensor::f_cat(&parts, 0)?.f_reshape(&self.shape)?)
    }

    /// `bytes` (inside the mapping) as a tensor of `shape` that aliases them, or a
    /// copy when they are not aligned to the element size (safetensors does not
    /// align a tensor after one of a smaller type).
    fn in_place(&self, bytes: &[u8], shape: &[i64]) -> Result<Tensor> {
        let shape = if shape == [-1] { vec![(bytes.len() / self.kind.elt_size_in_bytes()) as i64] } else { shape.to_vec() };
        if !(bytes.as_ptr() as usize).is_multiple_of(self.kind.elt_size_in_bytes()) {
            return Ok(Tensor::f_from_data_size(bytes, &shape, self.kind)?);
        }
        // SAFETY: `bytes` holds `shape`'s elements of `kind` (each_weight checked the
        // shape and dtype against the header; safetensors checked the byte length),
        // aligned as just checked. The tensor aliases the read-only mapping, which
        // outlives it: it lives only inside `each_weight`'s call of `each`, the mapping
        // until each_weight returns, and it is only read (copied from, converted).
        Ok(unsafe { Tensor::f_from_blob(bytes.as_ptr(), &shape, &[], self.kind, tch::Device::Cpu) }?)
    }

    /// Elements `[offset, offset + len)` of the flattened parameter: read from the
    /// file alone, unless Hugging Face stores it transposed or split (then the whole
    /// is read).
    fn slice(&self, offset: i64, len: i64) -> Result<Tensor> {
        if self.conv1d || self.views.len() > 1 {
            return Ok(self.whole()?.f_reshape([-1])?.f_narrow(0, offset, len)?);
        }
        let elem = self.kind.elt_size_in_bytes();
        let bytes = &self.views[0].data()[offset as usize * elem..(offset + len) as usize * elem];
        self.in_place(bytes, &[len])
    }

    /// Whether it is one tensor stored as ptrain holds it.
    fn as_stored(&self) -> bool {
        !self.conv1d && self.views.len() == 1
    }
}

/// Opens and checks `m.init_from` (see [`load_weights`]), then hands `each` every
/// parameter with its weight in name order, without gradient tracking; each
/// weight's pages are dropped from memory once it was used.
fn each_weight(m: &ModelConfig, mut each: impl FnMut(&names::Param, &Weight<'_>) -> Result<()>) -> Result<()> {
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
    let expected: BTreeSet<&str> = params.iter().flat_map(|p| std::iter::once(p.hf_name()).chain(p.split.iter().map(|(n, _)| n.as_str()))).collect();
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
        // Stored whole, or (a mixture's experts) split into the tensors `save_pretrained` writes.
        let stored: Vec<(&str, Vec<i64>)> = match found.contains_key(p.hf_name()) || p.split.is_empty() {
            true => vec![(p.hf_name(), p.hf_shape())],
            false => p.split.iter().map(|(n, shape)| (n.as_str(), shape.clone())).collect(),
        };
        let mut views: Vec<(&TensorView<'_>, Kind)> = Vec::with_capacity(stored.len());
        for (name, expected) in stored {
            let Some((path, view)) = found.get(name) else {
                let path = maps.first().map_or(hf.dir.clone(), |(file, _)| file.clone());
                return Err(Error::Data { path, message: format!("missing tensor `{name}` (config.json: {arch})") });
            };
            let shape = shape_of(view);
            if shape != expected {
                return Err(Error::Data {
                    path: path.to_path_buf(),
                    message: format!("tensor `{name}` has shape {shape:?}, expected {expected:?} (config.json: {arch})"),
                });
            }
            let kind = kind(view.dtype())
                .ok_or_else(|| Error::Data { path: path.to_path_buf(), message: format!("tensor `{name}` has dtype {:?}", view.dtype()) })?;
            if views.first().is_some_and(|(_, first)| *first != kind) {
                return Err(Error::Data {
                    path: path.to_path_buf(),
                    message: format!("tensor `{name}` has dtype {:?}, unlike its experts", view.dtype()),
                });
            }
            views.push((view, kind));
        }
        let kind = views[0].1;
        // One tensor: in the file's layout (GPT-2's Conv1D transposed, `whole` turns it); split: ptrain's.
        let shape = if views.len() == 1 { p.hf_shape() } else { p.shape.clone() };
        plan.push((p, Weight { views: views.into_iter().map(|(v, _)| v).collect(), kind, shape, conv1d: p.conv1d }));
    }
    plan.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    tch::no_grad(|| -> Result<()> {
        for (p, weight) in &plan {
            each(p, weight)?;
            for view in &weight.views {
                // The mapping holding it (a split weight's tensors may lie in several files).
                if let Some((_, mmap)) = maps.iter().find(|(_, m)| m.as_ptr_range().contains(&view.data().as_ptr())) {
                    forget(mmap, view.data());
                }
            }
        }
        Ok(())
    })?;
    tracing::info!("loaded {} tensors from {}", params.len(), hf.dir.display());
    Ok(())
}
