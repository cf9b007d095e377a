//! Rows of data files as people have them, whatever the row means: JSON Lines
//! (plain, gzip or zstd), JSON arrays, Parquet (a file, a directory or a glob of
//! shards) and `datasets.save_to_disk` directories (Arrow IPC). Each row comes as
//! its columns, in the file's order, holding JSON-like values (minijinja's, which a
//! chat template takes as they are), with the place it came from for messages.
//!
//! This layer knows nothing of conversations: `instruct::shape` makes chat and
//! prompt/completion rows out of [`Record`]s, and other row kinds (preference
//! pairs) can do the same. Rows are read in batches, streaming: a file is never
//! held in memory whole.

mod arrow_values;
mod columnar;
mod json_array;
mod locate;
mod text;

use std::{fmt, path::Path, sync::Arc};

use minijinja::Value;

pub use self::{
    locate::{is_pattern, locate, Shard},
    text::{lines, whole_utf8},
};
use crate::{
    config::DataFormat,
    error::{Error, Result},
};

/// Where a row is: its file, and its line (text forms, from 1) or its row index
/// (Parquet and Arrow, from 0, as `datasets` counts them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub file: Arc<Path>,
    pub at: At,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    Line(u64),
    Row(u64),
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::Line(n) => write!(f, "line {n}"),
            At::Row(n) => write!(f, "row {n}"),
        }
    }
}

impl Place {
    /// An error about this row: the file, then `line N: message`.
    pub fn error(&self, message: impl fmt::Display) -> Error {
        Error::Data { path: self.file.to_path_buf(), message: format!("{}: {message}", self.at) }
    }
}

/// One row: its columns in the file's order.
#[derive(Debug, Clone)]
pub struct Record {
    pub place: Place,
    pub columns: Vec<(Arc<str>, Value)>,
}

impl Record {
    /// The value of `column`, if the row has it.
    pub fn get(&self, column: &str) -> Option<&Value> {
        self.columns.iter().find(|(name, _)| &**name == column).map(|(_, v)| v)
    }

    /// The row's column names, for messages: `a, b, c`.
    pub fn column_names(&self) -> String {
        let names: Vec<&str> = self.columns.iter().map(|(n, _)| &**n).collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    }
}

/// Rows of one shard, a batch at a time.
trait Batches: Send {
    /// Up to `max` rows; an empty batch at the end.
    fn next_batch(&mut self, max: usize) -> Result<Vec<Record>>;
}

/// The rows of a data source (one or more shards, in order), a batch at a time.
pub struct Rows {
    shards: std::vec::IntoIter<Shard>,
    current: Option<Box<dyn Batches>>,
    /// Columns not to read (tabular forms leave them out of the projection).
    skip: Arc<[String]>,
}

impl Rows {
    /// Opens `path` (a file, a directory, a glob) read as `format`. Columns in
    /// `skip` are left out where the form allows it.
    pub fn open(path: &str, format: DataFormat, skip: &[String]) -> Result<Rows> {
        Ok(Rows::shards(locate(path, format)?, skip))
    }

    /// Reads `shards` in order.
    pub fn shards(shards: Vec<Shard>, skip: &[String]) -> Rows {
        Rows { shards: shards.into_iter(), current: None, skip: skip.into() }
    }

    /// The next batch of at most `max` rows; empty at the end.
    pub fn next_batch(&mut self, max: usize) -> Result<Vec<Record>> {
        loop {
            if let Some(current) = self.current.as_mut() {
                let batch = current.next_batch(max)?;
                if !batch.is_empty() {
                    return Ok(batch);
                }
                self.current = None;
            }
            let Some(shard) = self.shards.next() else { return Ok(Vec::new()) };
            self.current = Some(open_shard(&shard, &self.skip)?);
        }
    }
}

fn open_shard(shard: &Shard, skip: &[String]) -> Result<Box<dyn Batches>> {
    let file: Arc<Path> = shard.path.as_path().into();
    Ok(match shard.format {
        DataFormat::Parquet => Box::new(columnar::Columnar::parquet(file, skip)?),
        DataFormat::Arrow => Box::new(columnar::Columnar::arrow(file, skip)?),
        DataFormat::Json => Box::new(json_array::JsonArray::open(file)?),
        DataFormat::Jsonl | DataFormat::Auto => Box::new(text::JsonLines::open(file)?),
    })
}

/// One JSON text as a row's columns (an object), in the text's key order.
fn parse_object(text: &str) -> std::result::Result<Vec<(Arc<str>, Value)>, String> {
    use serde::de::{Deserializer, MapAccess, Visitor};
    struct Columns;
    impl<'de> Visitor<'de> for Columns {
        type Value = Vec<(Arc<str>, Value)>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object (a row)")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
            let mut out: Vec<(Arc<str>, Value)> = Vec::new();
            while let Some((key, value)) = map.next_entry::<String, Value>()? {
                // A repeated key: the last wins, as in Python's json.loads.
                match out.iter_mut().find(|(k, _)| **k == *key) {
                    Some(slot) => slot.1 = value,
                    None => out.push((key.into(), value)),
                }
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let columns = de.deserialize_map(Columns).and_then(|c| de.end().map(|_| c)).map_err(|e| json_error(&e))?;
    Ok(columns)
}

/// serde_json's message without its `at line 1 column N` (one row is one line):
/// the column instead.
fn json_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let message = text.rsplit_once(" at line ").map_or(text.as_str(), |(m, _)| m);
    match e.classify() {
        serde_json::error::Category::Data => format!("not a JSON object: {message}"),
        _ => format!("not a JSON object: {message} (column {})", e.column()),
    }
}

/// For other modules' tests: a JSON object as a row's columns.
#[cfg(test)]
pub(crate) mod tests_support {
    pub fn parse(text: &str) -> Vec<(std::sync::Arc<str>, minijinja::Value)> {
        super::parse_object(text).expect("a JSON object")
    }
}

#[cfg(test)]
mod tests;
