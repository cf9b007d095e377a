//! Encoded pairs, cached: `<cache>/<stem>-<key>.pairs` holds every pair's prompt,
//! chosen and rejected ids as [`super::encode`] made them (before any truncation,
//! which `data.max_seq_len` and `dpo.truncation_mode` apply when a run reads them),
//! with a `.pairs.json` beside it saying what it holds. The key is instruction
//! rows' ([`sources::cache_file`]): the files' contents, the tokenizer, its
//! configuration (the chat template), the EOS token and the columns, so unchanged
//! pairs are encoded once, by `ptrain tokenize` or the first run.
//!
//! Layout (little-endian): `PTRPAIR1`, pairs `n` (u64); `3n` lengths (u32: each
//! pair's prompt, chosen, rejected); then every pair's ids (u32) in that order.
//! Written to a temporary name and renamed, so a file under the final name is
//! complete.

use std::path::{Path, PathBuf};

use super::{encode, encode::EncodedPair, rows};
use crate::{
    data::{
        reader::Rows,
        text::{
            encode::Encoder,
            sources::{self, SourceSpec},
        },
        token_cache,
        tokenize::TOKENIZERS_VERSION,
    },
    error::{Error, Result},
};

/// Bumped when the layout or the encoding changes.
const SCHEME: &str = "ptrain-pairs-1";
const MAGIC: &[u8; 8] = b"PTRPAIR1";
const HEADER: usize = 16;

/// What a source's pairs hold, kept beside the cache file.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct PairMeta {
    pub source: String,
    pub files: Vec<String>,
    pub pairs: u64,
    pub prompt_tokens: u64,
    pub chosen_tokens: u64,
    pub rejected_tokens: u64,
    pub max_id: u32,
    pub tokenizers_version: String,
}

/// One source's cache file.
#[derive(Debug, Clone)]
pub struct PairFile {
    pub path: PathBuf,
    pub meta: PairMeta,
    /// Seconds this run spent encoding its pairs (`None`: reused from the cache).
    pub encoded: Option<f64>,
}

fn meta_path(file: &Path) -> PathBuf {
    file.with_extension("pairs.json")
}

/// A pair's ids in the order the file holds them.
fn parts(p: &EncodedPair) -> [&Vec<u32>; 3] {
    [&p.prompt, &p.chosen, &p.rejected]
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

impl PairFile {
    /// The cached pairs at `file`, if complete and of this scheme.
    fn open(file: &Path) -> Option<(PairFile, Vec<EncodedPair>)> {
        let meta: PairMeta = serde_json::from_slice(&std::fs::read(meta_path(file)).ok()?).ok()?;
        let bytes = std::fs::read(file).ok()?;
        let n = meta.pairs as usize;
        let tokens = (meta.prompt_tokens + meta.chosen_tokens + meta.rejected_tokens) as usize;
        let complete = bytes.len() == HEADER + 4 * (3 * n + tokens)
            && bytes[..8] == MAGIC[..]
            && u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")) == meta.pairs;
        if !complete {
            return None;
        }
        let mut at = HEADER + 12 * n;
        let mut ids = |len: u32| -> Vec<u32> {
            let out = (0..len as usize).map(|i| u32_at(&bytes, at + 4 * i)).collect();
            at += 4 * len as usize;
            out
        };
        let lengths = |p: usize, k: usize| u32_at(&bytes, HEADER + 4 * (3 * p + k));
        let pairs = (0..n).map(|p| EncodedPair { prompt: ids(lengths(p, 0)), chosen: ids(lengths(p, 1)), rejected: ids(lengths(p, 2)) }).collect();
        Some((PairFile { path: file.to_owned(), meta, encoded: None }, pairs))
    }

    /// Writes `pairs` to `file`, with their meta.
    fn write(file: &Path, mut meta: PairMeta, pairs: &[EncodedPair], started: std::time::Instant) -> Result<PairFile> {
        meta.pairs = pairs.len() as u64;
        for p in pairs {
            meta.prompt_tokens += p.prompt.len() as u64;
            meta.chosen_tokens += p.chosen.len() as u64;
            meta.rejected_tokens += p.rejected.len() as u64;
            meta.max_id = parts(p).into_iter().flatten().fold(meta.max_id, |m, &id| m.max(id));
        }
        let mut bytes = MAGIC.to_vec();
        bytes.extend(meta.pairs.to_le_bytes());
        bytes.extend(pairs.iter().flat_map(parts).flat_map(|ids| (ids.len() as u32).to_le_bytes()));
        bytes.extend(pairs.iter().flat_map(parts).flatten().flat_map(|id| id.to_le_bytes()));
        let meta_file = meta_path(file);
        token_cache::write_whole(&meta_file, serde_json::to_string_pretty(&meta).expect("meta serializes").as_bytes())?;
        // The pairs last: a file under their name is complete, its meta beside it.
        token_cache::write_whole(file, &bytes)?;
        Ok(PairFile { path: file.to_owned(), meta, encoded: Some(started.elapsed().as_secs_f64()) })
    }
}

/// The encoded pairs of `spec`, encoding them first unless cached. `key_parts` are
/// the settings besides the files and the reading that change the encoding.
pub fn prepare(spec: &SourceSpec, encoder: &Encoder, key_parts: &[&str], dir: &Path) -> Result<(PairFile, Vec<EncodedPair>)> {
    let parts: Vec<&str> = [SCHEME].into_iter().chain(key_parts.iter().copied()).collect();
    let (shards, file) = sources::cache_file(spec, &parts, dir, "pairs")?;
    if let Some(cached) = PairFile::open(&file) {
        tracing::info!("data: reusing {} for {} ({} pairs)", file.display(), spec.path, cached.1.len());
        return Ok(cached);
    }
    let started = std::time::Instant::now();
    let meta = PairMeta {
        source: spec.path.clone(),
        files: shards.iter().map(|s| s.path.display().to_string()).collect(),
        tokenizers_version: TOKENIZERS_VERSION.into(),
        ..PairMeta::default()
    };
    let (columns, ignore) = (&spec.shaper.columns, &spec.shaper.ignore);
    let mut pairs = Vec::new();
    sources::encode_all(
        &spec.name,
        Rows::shards(shards, ignore),
        |record| rows::shape(record, columns, ignore).and_then(|pair| encode::encode(encoder, &pair)),
        |pair, _| {
            pairs.push(pair);
            Ok(())
        },
    )?;
    if pairs.is_empty() {
        return Err(Error::Data { path: PathBuf::from(&spec.path), message: "the file holds no rows".into() });
    }
    let written = PairFile::write(&file, meta, &pairs, started)?;
    let seconds = written.encoded.unwrap_or_default().max(1e-9);
    let n = pairs.len() as f64;
    tracing::info!("data: encoded {n} pairs of {} in {seconds:.2}s ({:.0} pairs/s) into {}", spec.path, n / seconds, file.display());
    Ok((written, pairs))
}
