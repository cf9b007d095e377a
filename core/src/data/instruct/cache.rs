//! Encoded rows, cached: `<cache>/<stem>-<key>.rows` holds every kept row's ids
//! and trained-token mask, memory-mapped by later runs. The key hashes the files,
//! the tokenizer, its configuration (the chat template) and the settings that
//! change the ids or the masks (form, column names), so unchanged data is encoded
//! once.
//!
//! Layout (little-endian): `PTRROWS2`, rows `n` (u64), tokens `t` (u64); `t` words
//! (u32: the id in the low 31 bits, bit 31 set when trained); `n + 1` row offsets
//! (u64); `n` trained-token counts (u32). Rows stream in and the counts and
//! offsets, known at the end, go last; written to a temporary name and renamed, so
//! a file under the final name is complete.

use std::{
    io::{BufWriter, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
};

use memmap2::Mmap;

use crate::data::text::encode::Encoded;
use crate::{
    data::reader::Place,
    error::{Error, Result},
};

/// Bumped when the layout or the encoding changes.
pub const SCHEME: &str = "ptrain-rows-2";
const MAGIC: &[u8; 8] = b"PTRROWS2";
const HEADER: usize = 24;
const TRAINED: u32 = 1 << 31;

/// One row's words in the mapping.
pub struct Row<'a> {
    words: &'a [u8],
}

impl Row<'_> {
    fn word(&self, i: usize) -> u32 {
        u32::from_le_bytes(self.words[4 * i..4 * i + 4].try_into().expect("4 bytes"))
    }

    pub fn id(&self, i: usize) -> u32 {
        self.word(i) & !TRAINED
    }

    /// Whether predicting token `i` is trained.
    pub fn trained(&self, i: usize) -> bool {
        self.word(i) & TRAINED != 0
    }

    /// Trained tokens among the first `len` but the first (never a target).
    pub fn trained_within(&self, len: usize) -> usize {
        (1..len.min(self.words.len() / 4)).filter(|&i| self.trained(i)).count()
    }
}

/// What a source's encoding found, kept beside the cache file.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Meta {
    pub source: String,
    pub files: Vec<String>,
    pub rows: u64,
    pub tokens: u64,
    pub trained_tokens: u64,
    /// Rows left out because none of their tokens is trained, and the first of
    /// them (place and reason).
    pub untrained: u64,
    pub first_untrained: Option<String>,
    pub max_id: u32,
    pub tokenizers_version: String,
}

/// Rows of one source, mapped.
pub struct RowStore {
    map: Mmap,
    pub path: PathBuf,
    pub meta: Meta,
    /// Seconds this run spent encoding it (`None`: reused from the cache).
    pub encoded: Option<f64>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_owned(), source }
}

impl RowStore {
    pub fn len(&self) -> usize {
        self.meta.rows as usize
    }

    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.map[at..at + 8].try_into().expect("8 bytes"))
    }

    fn offsets_at(&self) -> usize {
        HEADER + 4 * self.meta.tokens as usize
    }

    /// Token range of row `r`.
    fn span(&self, r: usize) -> (usize, usize) {
        let at = self.offsets_at() + 8 * r;
        (self.u64_at(at) as usize, self.u64_at(at + 8) as usize)
    }

    pub fn row_len(&self, r: usize) -> usize {
        let (a, b) = self.span(r);
        b - a
    }

    /// Trained tokens of row `r` (the first token never counts).
    pub fn row_trained(&self, r: usize) -> usize {
        let at = self.offsets_at() + 8 * (self.len() + 1) + 4 * r;
        u32::from_le_bytes(self.map[at..at + 4].try_into().expect("4 bytes")) as usize
    }

    /// Row `r`'s words, located once.
    pub fn row(&self, r: usize) -> Row<'_> {
        let (a, b) = self.span(r);
        Row { words: &self.map[HEADER + 4 * a..HEADER + 4 * b] }
    }

    /// The cached store at `file`, if complete and of this scheme.
    pub fn open(file: &Path) -> Option<RowStore> {
        let meta: Meta = serde_json::from_slice(&std::fs::read(meta_path(file)).ok()?).ok()?;
        let handle = std::fs::File::open(file).ok()?;
        // SAFETY: a read-only mapping of a cache file ptrain wrote and renamed into
        // place whole; it is only replaced by a rename, never written in place.
        let map = unsafe { Mmap::map(&handle) }.ok()?;
        let (rows, tokens) = (meta.rows as usize, meta.tokens as usize);
        let complete = map.len() == HEADER + 4 * tokens + 8 * (rows + 1) + 4 * rows && &map[..8] == MAGIC;
        complete.then(|| RowStore { map, path: file.to_owned(), meta, encoded: None })
    }
}

pub fn meta_path(file: &Path) -> PathBuf {
    file.with_extension("rows.json")
}

/// Writes rows as they come, to a temporary file renamed into place at the end.
pub struct Writer {
    out: BufWriter<std::fs::File>,
    tmp: PathBuf,
    file: PathBuf,
    offsets: Vec<u64>,
    trained: Vec<u32>,
    started: std::time::Instant,
    pub meta: Meta,
}

impl Writer {
    pub fn create(file: &Path, meta: Meta) -> Result<Writer> {
        let dir = file.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let tmp = dir.join(format!(".{}.tmp-{}", file.file_name().and_then(|n| n.to_str()).unwrap_or("rows"), std::process::id()));
        let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp).map_err(io(&tmp))?);
        out.write_all(&[0u8; HEADER]).map_err(io(&tmp))?;
        Ok(Writer { out, tmp, file: file.to_owned(), offsets: vec![0], trained: Vec::new(), started: std::time::Instant::now(), meta })
    }

    /// Adds a row; one with no trained token is counted and left out.
    pub fn push(&mut self, row: &Encoded, place: &Place) -> Result<()> {
        if !row.trains() {
            self.meta.untrained += 1;
            if self.meta.first_untrained.is_none() {
                let reason = row.untrained.as_deref().unwrap_or("no token is trained");
                self.meta.first_untrained = Some(format!("{} {}: {reason}", place.file.display(), place.at));
            }
            return Ok(());
        }
        let mut trained = 0u32;
        let mut words = Vec::with_capacity(4 * row.ids.len());
        for (i, (&id, &t)) in row.ids.iter().zip(&row.trained).enumerate() {
            if id >= TRAINED {
                return Err(place.error(format!("token id {id} is beyond what the cache stores (2^31)")));
            }
            self.meta.max_id = self.meta.max_id.max(id);
            trained += (t && i > 0) as u32;
            words.extend_from_slice(&(id | if t { TRAINED } else { 0 }).to_le_bytes());
        }
        self.out.write_all(&words).map_err(io(&self.tmp))?;
        self.meta.tokens += row.ids.len() as u64;
        self.meta.trained_tokens += trained as u64;
        self.meta.rows += 1;
        self.offsets.push(self.meta.tokens);
        self.trained.push(trained);
        Ok(())
    }

    /// Completes the file and maps it.
    pub fn finish(mut self) -> Result<RowStore> {
        let tmp = self.tmp.clone();
        let result = self.write_tail();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result?;
        let meta_file = meta_path(&self.file);
        std::fs::write(&meta_file, serde_json::to_string_pretty(&self.meta).expect("meta serializes")).map_err(io(&meta_file))?;
        std::fs::rename(&tmp, &self.file).map_err(io(&self.file))?;
        let mut store = RowStore::open(&self.file)
            .ok_or_else(|| Error::Data { path: self.file.clone(), message: "the cache file just written does not read back".into() })?;
        store.encoded = Some(self.started.elapsed().as_secs_f64());
        Ok(store)
    }

    fn write_tail(&mut self) -> Result<()> {
        let tmp = self.tmp.clone();
        for offset in &self.offsets {
            self.out.write_all(&offset.to_le_bytes()).map_err(io(&tmp))?;
        }
        for count in &self.trained {
            self.out.write_all(&count.to_le_bytes()).map_err(io(&tmp))?;
        }
        self.out.seek(SeekFrom::Start(8)).map_err(io(&tmp))?;
        self.out.write_all(&self.meta.rows.to_le_bytes()).map_err(io(&tmp))?;
        self.out.write_all(&self.meta.tokens.to_le_bytes()).map_err(io(&tmp))?;
        self.out.seek(SeekFrom::Start(0)).map_err(io(&tmp))?;
        self.out.write_all(MAGIC).map_err(io(&tmp))?;
        self.out.flush().map_err(io(&tmp))?;
        self.out.get_ref().sync_all().map_err(io(&tmp))
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Unfinished (an error mid-way): no partial file stays behind.
        if self.tmp.exists() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
