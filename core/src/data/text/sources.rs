//! Where text data's rows are ([`SourceSpec`], one per `data.path`, `[[data.datasets]]`
//! entry and `data.val_path`: [`sources`]), the cache file their encoding goes to
//! ([`cache_file`], keyed by the files' contents and every setting that changes the
//! encoding), and the encoding itself ([`encode_all`]): rows read a batch at a time on
//! a reader thread, shaped and encoded on every core (rayon), handed on in order as
//! they come. The file is never held whole; a terminal shows the rows going by.

use std::{
    path::{Path, PathBuf},
    sync::mpsc,
};

use rayon::prelude::*;

use sha2::{Digest, Sha256};

use crate::{
    config::{ColumnMap, Config, DataFormat, DataKind},
    data::{
        reader::{self, Place, Record, Rows},
        token_cache::hex,
        tokenize::TOKENIZERS_VERSION,
    },
    error::{Error, Result},
};

/// How a source's rows are read: the data's kind, the columns' names, and the
/// columns left out. (Instruction data makes a row an example with it:
/// `instruct::shape`.)
#[derive(Debug, Clone)]
pub struct Shaper {
    pub kind: DataKind,
    pub columns: ColumnMap,
    pub ignore: Vec<String>,
}

/// Rows read and encoded at a time (each batch is spread over the cores).
const BATCH_ROWS: usize = 2048;

/// Where a source's rows are and how to read them.
#[derive(Debug, Clone)]
pub struct SourceSpec {
    pub name: String,
    pub path: String,
    pub format: DataFormat,
    pub shaper: Shaper,
}

impl SourceSpec {
    /// The settings that change the rows, for the cache key.
    fn key(&self) -> String {
        let s = &self.shaper;
        format!("{}\0{:?}\0{}\0{}", self.format.name(), s.kind, serde_json::to_string(&s.columns).expect("columns serialize"), s.ignore.join("\0"))
    }

    /// The cache file's name: the data file's, or the directory's.
    fn stem(&self) -> String {
        let path = Path::new(&self.path);
        let name = if reader::is_pattern(&self.path) { path.parent().and_then(Path::file_name) } else { path.file_name() };
        let name = name.and_then(|n| n.to_str()).unwrap_or("data");
        name.split('.').next().unwrap_or(name).to_string()
    }
}

/// Every source the configuration names, in order: `data.path` ("train"), each
/// `[[data.datasets]]` entry, then `data.val_path` ("val").
pub fn sources(config: &Config) -> Vec<SourceSpec> {
    let data = &config.data;
    let spec = |name: &str, path: &str, d: Option<&crate::config::DatasetSpec>| SourceSpec {
        name: name.into(),
        path: path.into(),
        format: d.and_then(|d| d.format).unwrap_or(data.format),
        shaper: Shaper {
            kind: data.kind,
            columns: d.and_then(|d| d.columns.clone()).unwrap_or_else(|| data.columns.clone()),
            ignore: d.and_then(|d| d.ignore_columns.clone()).unwrap_or_else(|| data.ignore_columns.clone()),
        },
    };
    let mut out = Vec::new();
    if !data.path.is_empty() {
        out.push(spec("train", &data.path, None));
    }
    out.extend(data.datasets.iter().map(|d| spec(&d.name, &d.path, Some(d))));
    if !data.val_path.is_empty() {
        out.push(spec("val", &data.val_path, None));
    }
    out
}

/// The shards of `spec` and the cache file their encoding goes to (with extension
/// `ext`): a key over `key_parts` (the settings besides the files and the reading
/// that change the result), the reading's settings and the files' contents.
pub fn cache_file(spec: &SourceSpec, key_parts: &[&str], dir: &Path, ext: &str) -> Result<(Vec<reader::Shard>, PathBuf)> {
    let shards = reader::locate(&spec.path, spec.format)?;
    let files: Vec<PathBuf> = shards.iter().map(|s| s.path.clone()).collect();
    let own = spec.key();
    let parts: Vec<&str> = key_parts.iter().copied().chain([own.as_str()]).collect();
    let file = keyed_file(dir, &spec.stem(), &parts, &files)?.with_extension(ext);
    Ok((shards, file))
}

/// The cache file for a source (no extension yet): its name, and a key over
/// `parts` and the contents of `files`.
fn keyed_file(dir: &Path, stem: &str, parts: &[&str], files: &[PathBuf]) -> Result<PathBuf> {
    let mut key = Sha256::new();
    for part in [TOKENIZERS_VERSION].iter().chain(parts) {
        key.update(part.as_bytes());
        key.update([0]);
    }
    for file in files {
        let mut reader = std::fs::File::open(file).map_err(|source| Error::Io { path: file.clone(), source })?;
        std::io::copy(&mut reader, &mut key).map_err(|source| Error::Io { path: file.clone(), source })?;
        key.update(file.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
        key.update([0]);
    }
    let stem: String = stem.chars().filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c)).collect();
    Ok(dir.join(format!("{}-{}", if stem.is_empty() { "data" } else { &stem }, &hex(&key.finalize())[..16])))
}

/// Every row of `rows` through `encode` (on every core) then `push` (in order);
/// returns the rows read. The first bad row is the error, naming its file and line
/// (or row). `name` labels the progress shown on a terminal.
pub fn encode_all<T: Send>(
    name: &str,
    mut rows: Rows,
    encode: impl Fn(&Record) -> std::result::Result<T, String> + Sync,
    mut push: impl FnMut(T, &Place) -> Result<()>,
) -> Result<u64> {
    let bar = progress(name);
    let (tx, rx) = mpsc::sync_channel(2);
    std::thread::scope(|scope| {
        // Reading (decompressing, parsing) overlaps encoding.
        scope.spawn(move || loop {
            let batch = rows.next_batch(BATCH_ROWS);
            let done = !matches!(&batch, Ok(b) if !b.is_empty());
            if tx.send(batch).is_err() || done {
                return;
            }
        });
        let mut read = 0u64;
        for batch in rx {
            let batch = batch?;
            if batch.is_empty() {
                break;
            }
            let encoded: Vec<Result<T>> = batch.par_iter().map(|record| encode(record).map_err(|m| record.place.error(m))).collect();
            for (record, row) in batch.iter().zip(encoded) {
                push(row?, &record.place)?;
            }
            read += batch.len() as u64;
            bar.set_position(read);
        }
        bar.finish_and_clear();
        Ok(read)
    })
}

/// Rows encoded so far, on a terminal (stderr); nothing elsewhere.
fn progress(name: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    let style = indicatif::ProgressStyle::with_template("{msg} {human_pos} rows ({per_sec}, {elapsed})").expect("a valid template");
    bar.set_style(style);
    bar.set_message(format!("encoding {name}:"));
    bar
}
