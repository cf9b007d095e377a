//! `dpo.precompute_reference`'s log-probabilities on disk, beside the token cache
//! (`<tokens_cache>/reference-<key>.logps`), so a later run of the same pairs, model
//! and reference reuses them without loading the reference. The key hashes what
//! the values depend on: every pair's token ids and how they are cut and collated
//! (`data.max_seq_len`, `dpo.truncation_mode`, `data.packing`, `data.batch_size`),
//! the model's configuration, the run's precision, `train.loss_chunk` and device
//! type, and the reference: `dpo.reference` (or `model.init_from`, or the seed of a
//! random start) with every file under it by name, size and modification time.
//!
//! Layout (little-endian): `PTRREFL1`, training pairs `n` (u64), held-out pairs `m`
//! (u64), then `2 (n + m)` f32: each pair's (chosen, rejected). Written to a
//! temporary name and renamed, so a file under the final name is complete.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{
    config::Config,
    data::{preference::PreferenceData, token_cache, Split},
    error::Result,
};

const MAGIC: &[u8; 8] = b"PTRREFL1";
/// Bumped when the layout or what the values mean changes.
const SCHEME: &str = "ptrain-reference-logps-1";

/// Every file under `path` (itself if a file), by relative name, size and
/// modification time, into `key`; nothing for a path that does not exist.
fn fingerprint(path: &Path, key: &mut Sha256) {
    let mut stack = vec![path.to_path_buf()];
    let mut files = Vec::new();
    while let Some(p) = stack.pop() {
        match std::fs::read_dir(&p) {
            Ok(entries) => stack.extend(entries.flatten().map(|e| e.path())),
            Err(_) => files.push(p),
        }
    }
    files.sort();
    for file in files {
        let Ok(meta) = std::fs::metadata(&file) else { continue };
        let modified = meta.modified().ok().and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_nanos()).unwrap_or(0);
        key.update(file.strip_prefix(path).unwrap_or(&file).as_os_str().as_encoded_bytes());
        key.update(format!("\0{}\0{modified}\0", meta.len()));
    }
}

/// The file holding the reference log-probabilities of `data` under `config`.
pub fn file(config: &Config, data: &PreferenceData, device: tch::Device) -> PathBuf {
    let mut key = Sha256::new();
    let settings = (
        SCHEME,
        &config.model,
        format!("{:?}", config.train.precision),
        config.loss_chunk(),
        device.is_cuda(),
        config.data.batch_size,
        config.lora().is_some(),
        &config.dpo.reference,
        &config.model.init_from,
        config.run.seed,
    );
    key.update(serde_json::to_string(&settings).expect("settings serialize"));
    data.fingerprint(&mut key);
    let reference = if config.dpo.reference.is_empty() { &config.model.init_from } else { &config.dpo.reference };
    if !reference.is_empty() {
        fingerprint(Path::new(reference), &mut key);
    }
    token_cache::cache_dir(config).join(format!("reference-{}.logps", &token_cache::hex(&key.finalize())[..16]))
}

/// The stored values of `file` for `data`'s training and held-out pairs, if the
/// file is there, complete and of their number.
pub fn read(file: &Path, data: &PreferenceData) -> Option<[Vec<[f32; 2]>; 2]> {
    let bytes = std::fs::read(file).ok()?;
    let (n, m) = (data.len(Split::Train), data.len(Split::Val));
    let u64_at = |at: usize| bytes.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize);
    let complete = bytes.get(..8) == Some(&MAGIC[..]) && u64_at(8)? == n && u64_at(16)? == m && bytes.len() == 24 + 8 * (n + m);
    if !complete {
        return None;
    }
    let f32_at = |i: usize| f32::from_le_bytes(bytes[24 + 4 * i..28 + 4 * i].try_into().expect("4 bytes"));
    let pairs = |from: usize, count: usize| (from..from + count).map(|p| [f32_at(2 * p), f32_at(2 * p + 1)]).collect();
    Some([pairs(0, n), pairs(n, m)])
}

/// Stores `logps` (training, held-out) in `file`.
pub fn write(file: &Path, logps: &[Vec<[f32; 2]>; 2]) -> Result<()> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend((logps[0].len() as u64).to_le_bytes());
    bytes.extend((logps[1].len() as u64).to_le_bytes());
    bytes.extend(logps.iter().flatten().flatten().flat_map(|v| v.to_le_bytes()));
    token_cache::write_whole(file, &bytes)
}
