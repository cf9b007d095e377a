//! One source of instruction data (`data.path`, a `[[data.datasets]]` entry, or
//! `data.val_path`) into its cached rows: read a batch at a time on a reader
//! thread, shaped and encoded on every core (rayon), written in order as they
//! come. The file is never held whole; a terminal shows the rows going by.
//! Preference pairs are read, encoded and keyed the same way ([`encode_all`],
//! [`cache_file`]).

use std::{
    path::{Path, PathBuf},
    sync::mpsc,
};

use rayon::prelude::*;

use super::{
    cache::{self, Meta, RowStore, Writer},
    encode::Encoder,
    shape::Shaper,
};
use crate::{
    config::DataFormat,
    data::reader::{self, Place, Record, Rows},
    error::{Error, Result},
};

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

/// The shards of `spec` and the cache file their encoding goes to (with extension
/// `ext`): a key over `key_parts` (the settings besides the files and the reading
/// that change the result), the reading's settings and the files' contents.
pub fn cache_file(spec: &SourceSpec, key_parts: &[&str], dir: &Path, ext: &str) -> Result<(Vec<reader::Shard>, PathBuf)> {
    let shards = reader::locate(&spec.path, spec.format)?;
    let files: Vec<PathBuf> = shards.iter().map(|s| s.path.clone()).collect();
    let own = spec.key();
    let parts: Vec<&str> = key_parts.iter().copied().chain([own.as_str()]).collect();
    let file = cache::cache_file(dir, &spec.stem(), &parts, &files)?.with_extension(ext);
    Ok((shards, file))
}

/// The encoded rows of `spec`, encoding them first unless cached.
pub fn prepare(spec: &SourceSpec, encoder: &Encoder, key_parts: &[&str], dir: &Path) -> Result<RowStore> {
    let (shards, file) = cache_file(spec, key_parts, dir, "rows")?;
    if let Some(store) = RowStore::open(&file) {
        tracing::info!("data: reusing {} for {} ({} rows)", file.display(), spec.path, store.len());
        return Ok(store);
    }
    let meta = Meta {
        source: spec.path.clone(),
        files: shards.iter().map(|s| s.path.display().to_string()).collect(),
        tokenizers_version: crate::data::tokenize::TOKENIZERS_VERSION.into(),
        ..Meta::default()
    };
    let mut writer = Writer::create(&file, meta)?;
    let read = encode_all(
        &spec.name,
        Rows::shards(shards, &spec.shaper.ignore),
        |record| spec.shaper.shape(record).and_then(|example| encoder.encode(&example)),
        |row, place| writer.push(&row, place),
    )?;
    if read == 0 {
        return Err(Error::Data { path: PathBuf::from(&spec.path), message: "the file holds no rows".into() });
    }
    let store = writer.finish()?;
    let seconds = store.encoded.unwrap_or_default().max(1e-9);
    tracing::info!(
        "data: encoded {read} rows ({} tokens) of {} in {seconds:.2}s ({:.0} rows/s, {:.0} tokens/s) into {}",
        store.meta.tokens,
        spec.path,
        read as f64 / seconds,
        store.meta.tokens as f64 / seconds,
        file.display()
    );
    Ok(store)
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
