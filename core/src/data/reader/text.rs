//! Text forms: a file, decompressed when its magic bytes say gzip or zstd, past a
//! UTF-8 byte-order mark (as Python's `utf-8-sig`), read as JSON Lines here (the
//! arrays are `json_array`'s). Lines are checked for UTF-8 one by one, so a bad
//! byte is reported by its line.

use std::{
    fs::File,
    io::{BufRead, BufReader, Read},
    path::Path,
    sync::Arc,
};

use super::{parse_object, At, Batches, Place, Record};
use crate::error::{Error, Result};

const BOM: &[u8] = b"\xEF\xBB\xBF";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_owned(), source }
}

/// A failed read of `path` after `line` lines: an error of the system is one of
/// I/O; any other comes from the decompressor (a `.gz` or `.zst` cut short or
/// damaged), a bad input named by the line it broke in (exit 2).
fn read_error(path: &Path, line: u64, source: std::io::Error) -> Error {
    match source.raw_os_error() {
        Some(_) => Error::Io { path: path.to_owned(), source },
        None => Error::Data { path: path.to_owned(), message: format!("line {}: the compressed data is damaged or cut short ({source})", line + 1) },
    }
}

/// The file's text as a buffered stream: decompressed, past a byte-order mark.
pub fn open(path: &Path) -> Result<Box<dyn BufRead + Send>> {
    let mut raw = BufReader::with_capacity(1 << 20, File::open(path).map_err(io(path))?);
    let head = raw.fill_buf().map_err(io(path))?;
    let mut reader: Box<dyn BufRead + Send> = if head.starts_with(&[0x1F, 0x8B]) {
        Box::new(BufReader::with_capacity(1 << 20, flate2::bufread::MultiGzDecoder::new(raw)))
    } else if head.starts_with(&[0x28, 0xB5, 0x2F, 0xFD]) {
        let decoder = zstd::stream::read::Decoder::with_buffer(raw).map_err(io(path))?;
        Box::new(BufReader::with_capacity(1 << 20, decoder))
    } else {
        Box::new(raw)
    };
    let head = reader.fill_buf().map_err(|e| read_error(path, 0, e))?;
    if head.starts_with(BOM) {
        reader.consume(BOM.len());
    }
    Ok(reader)
}

/// The first non-whitespace byte of the file's text, if any.
pub fn first_char(path: &Path) -> Result<Option<u8>> {
    let mut reader = open(path)?;
    let mut buf = [0u8; 4096];
    loop {
        let n = reader.read(&mut buf).map_err(|e| read_error(path, 0, e))?;
        if n == 0 {
            return Ok(None);
        }
        if let Some(&b) = buf[..n].iter().find(|b| !b.is_ascii_whitespace()) {
            return Ok(Some(b));
        }
    }
}

/// `bytes` as UTF-8, or where it is not: the column (in characters, from 1).
pub fn utf8(bytes: &[u8]) -> std::result::Result<&str, String> {
    std::str::from_utf8(bytes).map_err(|e| {
        let column = String::from_utf8_lossy(&bytes[..e.valid_up_to()]).chars().count() + 1;
        format!("not UTF-8 text: an invalid byte (0x{:02X}) at column {column}", bytes[e.valid_up_to()])
    })
}

/// A whole text (a memory-mapped file) as UTF-8, past a byte-order mark; the
/// error names the line and column of the first invalid byte.
pub fn whole_utf8(bytes: &[u8]) -> std::result::Result<&str, String> {
    let bytes = bytes.strip_prefix(BOM).unwrap_or(bytes);
    std::str::from_utf8(bytes).map_err(|e| {
        let before = &bytes[..e.valid_up_to()];
        let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let end = bytes[line_start..].iter().position(|&b| b == b'\n').map_or(bytes.len(), |i| line_start + i);
        format!("line {line}: {}", utf8(&bytes[line_start..end]).err().unwrap_or_default())
    })
}

/// The lines of a text file (decompressed, past a byte-order mark), numbered
/// from 1, each checked for UTF-8; line ends are taken off.
pub fn lines(path: &Path) -> Result<impl Iterator<Item = Result<(u64, String)>>> {
    let mut reader = open(path)?;
    let path = path.to_owned();
    let mut number = 0u64;
    Ok(std::iter::from_fn(move || {
        let mut buf = Vec::new();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) => None,
            Err(e) => Some(Err(read_error(&path, number, e))),
            Ok(_) => {
                number += 1;
                let line = utf8(&buf).map(|t| t.trim_end_matches(['\n', '\r']).to_string());
                Some(line.map(|l| (number, l)).map_err(|m| Error::Data { path: path.clone(), message: format!("line {number}: {m}") }))
            }
        }
    }))
}

/// One JSON object per line; blank lines are skipped.
pub struct JsonLines {
    file: Arc<Path>,
    reader: Box<dyn BufRead + Send>,
    line: u64,
    buf: Vec<u8>,
}

impl JsonLines {
    pub fn open(file: Arc<Path>) -> Result<JsonLines> {
        Ok(JsonLines { reader: open(&file)?, file, line: 0, buf: Vec::new() })
    }
}

impl Batches for JsonLines {
    fn next_batch(&mut self, max: usize) -> Result<Vec<Record>> {
        let mut out = Vec::with_capacity(max.min(4096));
        while out.len() < max {
            self.buf.clear();
            let n = self.reader.read_until(b'\n', &mut self.buf).map_err(|e| read_error(&self.file, self.line, e))?;
            if n == 0 {
                break;
            }
            self.line += 1;
            let place = Place { file: self.file.clone(), at: At::Line(self.line) };
            let text = utf8(&self.buf).map_err(|m| place.error(m))?;
            let text = text.trim_end_matches(['\n', '\r']);
            if text.trim().is_empty() {
                continue;
            }
            let columns = parse_object(text).map_err(|m| place.error(m))?;
            out.push(Record { place, columns });
        }
        Ok(out)
    }
}
