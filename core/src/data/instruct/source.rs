//! One source of instruction data (`data.path`, a `[[data.datasets]]` entry, or
//! `data.val_path`) into its cached rows, through the text layer's reading and
//! encoding on every core ([`encode_all`]), written in order as they come.

use std::path::{Path, PathBuf};

use super::cache::{Meta, RowStore, Writer};
use crate::{
    data::{
        reader::Rows,
        text::{
            encode::Encoder,
            sources::{cache_file, encode_all, SourceSpec},
        },
    },
    error::{Error, Result},
};

/// The encoded rows of `spec`, encoding them first unless cached.
pub fn prepare(spec: &SourceSpec, encoder: &Encoder, key_parts: &[&str], dir: &Path) -> Result<RowStore> {
    let parts: Vec<&str> = [super::cache::SCHEME].into_iter().chain(key_parts.iter().copied()).collect();
    let (shards, file) = cache_file(spec, &parts, dir, "rows")?;
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
