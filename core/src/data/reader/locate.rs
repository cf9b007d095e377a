//! What a data path names: a file, a glob of shards, a directory of shards, or a
//! `datasets.save_to_disk` directory (a `Dataset`, or a `DatasetDict`'s `train`
//! split); and each file's form, from `data.format` or detected.

use std::{
    fs::File,
    io::Read,
    path::{Path, PathBuf},
};

pub use crate::config::is_pattern;
use crate::{
    config::DataFormat,
    error::{Error, Result},
};

/// One file of a source, with its form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub path: PathBuf,
    pub format: DataFormat,
}

fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::Data { path: path.to_owned(), message: message.into() }
}

/// The files `path` names, in order, each with its form.
pub fn locate(path: &str, format: DataFormat) -> Result<Vec<Shard>> {
    let files = if is_pattern(path) {
        let paths = glob::glob(path).map_err(|e| bad(Path::new(path), format!("not a valid glob pattern: {e}")))?;
        let mut files: Vec<PathBuf> = paths.filter_map(std::result::Result::ok).filter(|p| p.is_file()).collect();
        files.sort();
        if files.is_empty() {
            return Err(bad(Path::new(path), "no file matches this pattern"));
        }
        files
    } else {
        let p = Path::new(path);
        if p.is_dir() {
            return directory(p, format);
        }
        if !p.exists() {
            return Err(Error::MissingFile { what: "data file", path: p.to_owned() });
        }
        vec![p.to_owned()]
    };
    files.into_iter().map(|path| Ok(Shard { format: form(&path, format)?, path })).collect()
}

/// A directory: `save_to_disk`'s (state.json lists its Arrow files), a
/// `DatasetDict`'s (its `train` split), or a folder of shards.
fn directory(dir: &Path, format: DataFormat) -> Result<Vec<Shard>> {
    if dir.join("dataset_dict.json").is_file() {
        let train = dir.join("train");
        if !train.join("state.json").is_file() {
            let splits = subdirs(dir).join(", ");
            return Err(bad(
                dir,
                format!("a DatasetDict without a `train` split (it has: {splits}); name the split's folder, e.g. {}/<split>", dir.display()),
            ));
        }
        tracing::info!("data: {} is a DatasetDict: reading its train split", dir.display());
        return directory(&train, format);
    }
    let state = dir.join("state.json");
    if state.is_file() {
        return saved_dataset(dir, &state);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::Io { path: dir.to_owned(), source: e })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && data_extension(p))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(bad(dir, "a directory with no data files (.parquet, .jsonl, .json, .arrow, compressed .gz/.zst), no state.json (datasets.save_to_disk) and no dataset_dict.json"));
    }
    // Hub layout: data/train-00000-of-00004.parquet beside test-* and validation-*.
    let name = |p: &PathBuf| p.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    let train: Vec<PathBuf> = files.iter().filter(|p| name(p).starts_with("train")).cloned().collect();
    if !train.is_empty() && train.len() < files.len() {
        let others: Vec<String> = files.iter().filter(|p| !name(p).starts_with("train")).map(name).collect();
        tracing::info!(
            "data: {}: reading the {} train* files; not the others ({}): name them in data.val_path or a glob",
            dir.display(),
            train.len(),
            others.join(", ")
        );
        files = train;
    }
    let shards: Vec<Shard> = files.into_iter().map(|path| Ok(Shard { format: form(&path, format)?, path })).collect::<Result<_>>()?;
    if shards.iter().any(|s| !same_family(s.format, shards[0].format)) {
        let forms: Vec<String> = shards.iter().map(|s| format!("{} ({})", s.path.display(), s.format.name())).collect();
        return Err(bad(dir, format!("the directory mixes forms: {}", forms.join(", "))));
    }
    Ok(shards)
}

fn same_family(a: DataFormat, b: DataFormat) -> bool {
    let text = |f| matches!(f, DataFormat::Jsonl | DataFormat::Json);
    a == b || (text(a) && text(b))
}

fn subdirs(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok()).filter(|e| e.path().is_dir()).filter_map(|e| e.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// `datasets.save_to_disk`: the Arrow files state.json lists, in order.
fn saved_dataset(dir: &Path, state: &Path) -> Result<Vec<Shard>> {
    let text = std::fs::read_to_string(state).map_err(|e| Error::Io { path: state.to_owned(), source: e })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(state, format!("not JSON: {e}")))?;
    let listed = json
        .get("_data_files")
        .and_then(|f| f.as_array())
        .ok_or_else(|| bad(state, "no `_data_files` list (not a datasets.save_to_disk state.json?)"))?;
    let mut shards = Vec::new();
    for entry in listed {
        let name = entry.get("filename").and_then(|f| f.as_str()).ok_or_else(|| bad(state, "a `_data_files` entry without a `filename`"))?;
        let path = dir.join(name);
        if !path.is_file() {
            return Err(Error::MissingFile { what: "Arrow file listed in state.json", path });
        }
        shards.push(Shard { path, format: DataFormat::Arrow });
    }
    if json.get("_indices_data_files").is_some_and(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty())) {
        return Err(bad(
            state,
            "the dataset was saved with an indices mapping (a select or shuffle not flattened): save it after `.flatten_indices()`",
        ));
    }
    if shards.is_empty() {
        return Err(bad(state, "lists no data files"));
    }
    Ok(shards)
}

fn data_extension(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_ascii_lowercase();
    let name = name.trim_end_matches(".gz").trim_end_matches(".zst");
    [".parquet", ".jsonl", ".json", ".ndjson", ".arrow"].iter().any(|ext| name.ends_with(ext))
}

/// A file's form: `format` when set; else its magic bytes (Parquet, Arrow), else
/// its extension, else its first character (`[`: a JSON array).
fn form(path: &Path, format: DataFormat) -> Result<DataFormat> {
    if format != DataFormat::Auto {
        return Ok(format);
    }
    let mut head = [0u8; 8];
    let n = File::open(path).and_then(|mut f| f.read(&mut head)).map_err(|e| Error::Io { path: path.to_owned(), source: e })?;
    let head = &head[..n];
    if head.starts_with(b"PAR1") {
        return Ok(DataFormat::Parquet);
    }
    if head.starts_with(b"ARROW1") || head.starts_with(&[0xFF, 0xFF, 0xFF, 0xFF]) {
        return Ok(DataFormat::Arrow);
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_ascii_lowercase();
    let name = name.trim_end_matches(".gz").trim_end_matches(".zst");
    if name.ends_with(".jsonl") || name.ends_with(".ndjson") {
        return Ok(DataFormat::Jsonl);
    }
    // `.json` is either (datasets' to_json writes JSON Lines): by the content.
    Ok(match super::text::first_char(path)? {
        Some(b'[') => DataFormat::Json,
        _ => DataFormat::Jsonl,
    })
}
