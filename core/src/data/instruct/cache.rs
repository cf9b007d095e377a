//! Encoded rows, cached: `<cache>/<stem>-<key>.rows` holds every kept row's ids
//! and trained-token mask, memory-mapped by later runs. The key hashes the file,
//! the tokenizer, its configuration (the chat template) and the settings that
//! change the ids or the masks, so unchanged data is encoded once.
//!
//! Layout (little-endian): `PTRROWS1`, rows `n` (u64), tokens (u64), `n + 1` row
//! offsets (u64), the ids (u32 each), the mask (u8 each, 1 = trained). Written to
//! a temporary name and renamed, so a file under the final name is complete.

use std::{
    io::{BufWriter, Write},
    path::{Path, PathBuf},
    time::Instant,
};

use memmap2::Mmap;
use sha2::{Digest, Sha256};

use super::{
    encode::{Encoded, Encoder},
    rows,
};
use crate::{
    config::DataKind,
    data::{token_cache::hex, tokenize::TOKENIZERS_VERSION},
    error::{Error, Result},
};

/// Bumped when the layout or the encoding changes.
const SCHEME: &str = "ptrain-rows-1";
const MAGIC: &[u8; 8] = b"PTRROWS1";
const HEADER: usize = 24;

/// One row's bytes in the mapping.
pub struct Row<'a> {
    ids: &'a [u8],
    mask: &'a [u8],
}

impl Row<'_> {
    pub fn id(&self, i: usize) -> u32 {
        u32::from_le_bytes(self.ids[4 * i..4 * i + 4].try_into().expect("4 bytes"))
    }

    /// Whether predicting token `i` is trained.
    pub fn trained(&self, i: usize) -> bool {
        self.mask[i] != 0
    }

    /// Whether any of the first `len` tokens but the first is trained (the first
    /// token is never a target).
    pub fn trains_within(&self, len: usize) -> bool {
        self.mask.iter().take(len).skip(1).any(|&m| m != 0)
    }
}

/// Rows of one file, mapped.
pub struct RowStore {
    map: Mmap,
    pub path: PathBuf,
    rows: usize,
    tokens: usize,
    /// Rows left out because none of their tokens is trained.
    pub untrained: u64,
    pub max_id: u32,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Meta {
    source: String,
    rows: u64,
    tokens: u64,
    untrained: u64,
    max_id: u32,
    tokenizers_version: String,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_owned(), source }
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::MissingFile { what, path: path.to_owned() },
        _ => Error::Io { path: path.to_owned(), source: e },
    })
}

impl RowStore {
    pub fn len(&self) -> usize {
        self.rows
    }

    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.map[at..at + 8].try_into().expect("8 bytes"))
    }

    /// Token range of row `r`.
    fn span(&self, r: usize) -> (usize, usize) {
        (self.u64_at(HEADER + 8 * r) as usize, self.u64_at(HEADER + 8 * (r + 1)) as usize)
    }

    pub fn row_len(&self, r: usize) -> usize {
        let (a, b) = self.span(r);
        b - a
    }

    /// Row `r`'s ids and mask, located once.
    pub fn row(&self, r: usize) -> Row<'_> {
        let (a, b) = self.span(r);
        let ids = HEADER + 8 * (self.rows + 1);
        let mask = ids + 4 * self.tokens;
        Row { ids: &self.map[ids + 4 * a..ids + 4 * b], mask: &self.map[mask + a..mask + b] }
    }

    fn open(path: &Path, meta: &Meta) -> Option<RowStore> {
        let file = std::fs::File::open(path).ok()?;
        // SAFETY: a read-only mapping of a cache file ptrain wrote and renamed into
        // place whole; it is only replaced by a rename, never written in place.
        let map = unsafe { Mmap::map(&file) }.ok()?;
        let (rows, tokens) = (meta.rows as usize, meta.tokens as usize);
        let complete = map.len() == HEADER + 8 * (rows + 1) + 5 * tokens && &map[..8] == MAGIC;
        complete.then(|| RowStore { map, path: path.to_owned(), rows, tokens, untrained: meta.untrained, max_id: meta.max_id })
    }
}

/// The encoded rows of `source`, encoding them first unless cached. `key_parts`
/// are the settings besides the file and `encoder` that change the result.
pub fn prepare(source: &Path, kind: DataKind, encoder: &Encoder, key_parts: &[&str], dir: &Path) -> Result<RowStore> {
    let text = read(source, "data file")?;
    let mut key = Sha256::new();
    for part in [SCHEME, TOKENIZERS_VERSION].iter().chain(key_parts) {
        key.update(part.as_bytes());
        key.update([0]);
    }
    key.update(Sha256::digest(&text));
    let stem: String =
        source.file_stem().and_then(|s| s.to_str()).unwrap_or("data").chars().filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c)).collect();
    let file = dir.join(format!("{stem}-{}.rows", &hex(&key.finalize())[..16]));
    let meta_path = file.with_extension("rows.json");
    let cached = std::fs::read(&meta_path).ok().and_then(|m| serde_json::from_slice::<Meta>(&m).ok());
    if let Some(store) = cached.as_ref().and_then(|meta| RowStore::open(&file, meta)) {
        tracing::info!("data: reusing {} for {} ({} rows)", file.display(), source.display(), store.len());
        return Ok(store);
    }
    let text = std::str::from_utf8(&text).map_err(|e| Error::Data { path: source.to_owned(), message: format!("not UTF-8 text: {e}") })?;
    let started = Instant::now();
    let (encoded, untrained) = encode_lines(text, source, kind, encoder)?;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tmp = dir.join(format!(".{}.tmp-{}", file.file_name().and_then(|n| n.to_str()).unwrap_or("rows"), std::process::id()));
    let meta = write(&encoded, &tmp, source, untrained).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    std::fs::write(&meta_path, serde_json::to_string_pretty(&meta).expect("meta serializes")).map_err(io(&meta_path))?;
    std::fs::rename(&tmp, &file).map_err(io(&file))?;
    tracing::info!("data: encoded {} rows of {} in {:.2}s into {}", meta.rows, source.display(), started.elapsed().as_secs_f64(), file.display());
    RowStore::open(&file, &meta).ok_or_else(|| Error::Data { path: file.clone(), message: "the cache file just written does not read back".into() })
}

/// Every row of `text`, in order, on all cores; rows with no trained token are
/// left out and counted. The first bad row is an error naming its line.
fn encode_lines(text: &str, source: &Path, kind: DataKind, encoder: &Encoder) -> Result<(Vec<Encoded>, u64)> {
    let lines: Vec<(usize, &str)> = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return Err(Error::Data { path: source.to_owned(), message: "the file holds no rows".into() });
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(lines.len());
    let chunk = lines.len().div_ceil(threads);
    let encode = |(n, line): &(usize, &str)| -> std::result::Result<Encoded, (usize, String)> {
        rows::parse(line, kind).and_then(|example| encoder.encode(&example)).map_err(|message| (n + 1, message))
    };
    let results: Vec<std::result::Result<Vec<Encoded>, (usize, String)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = lines.chunks(chunk).map(|part| scope.spawn(move || part.iter().map(encode).collect())).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err((0, "a tokenizing thread panicked".into())))).collect()
    });
    let mut rows = Vec::with_capacity(lines.len());
    for part in results {
        rows.extend(part.map_err(|(line, message)| Error::Data { path: source.to_owned(), message: format!("line {line}: {message}") })?);
    }
    let before = rows.len();
    rows.retain(|r| r.trained.iter().skip(1).any(|&t| t));
    let untrained = (before - rows.len()) as u64;
    Ok((rows, untrained))
}

fn write(rows: &[Encoded], path: &Path, source: &Path, untrained: u64) -> Result<Meta> {
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path).map_err(io(path))?);
    let tokens: usize = rows.iter().map(|r| r.ids.len()).sum();
    let mut put = |bytes: &[u8]| out.write_all(bytes).map_err(io(path));
    put(MAGIC)?;
    put(&(rows.len() as u64).to_le_bytes())?;
    put(&(tokens as u64).to_le_bytes())?;
    let mut offset = 0u64;
    put(&offset.to_le_bytes())?;
    for r in rows {
        offset += r.ids.len() as u64;
        put(&offset.to_le_bytes())?;
    }
    let mut max_id = 0;
    for id in rows.iter().flat_map(|r| &r.ids) {
        max_id = max_id.max(*id);
        put(&id.to_le_bytes())?;
    }
    for t in rows.iter().flat_map(|r| &r.trained) {
        put(&[*t as u8])?;
    }
    let file = out.into_inner().map_err(|e| Error::Io { path: path.to_owned(), source: e.into_error() })?;
    file.sync_all().map_err(io(path))?;
    Ok(Meta {
        source: source.display().to_string(),
        rows: rows.len() as u64,
        tokens: tokens as u64,
        untrained,
        max_id,
        tokenizers_version: TOKENIZERS_VERSION.into(),
    })
}
