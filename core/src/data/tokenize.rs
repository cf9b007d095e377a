//! Tokenizing text with a Hugging Face `tokenizer.json` (the `tokenizers` crate,
//! the Rust library the Python package wraps), in parallel pieces.
//!
//! A text file is one token stream: its ids are `encode(text).ids`. To encode it in
//! parallel and in bounded memory, it is cut into pieces at line starts where the
//! usual pre-tokenizers split anyway (a newline between two non-space characters),
//! and the tokenizer's special tokens are added once around the whole. Before that,
//! every cut is checked: the two lines around it, encoded together and apart, must
//! give the same ids. A tokenizer for which one does not (one that prefixes each
//! input with a space, say) gets the file encoded in one piece, which is exact but
//! slow and memory-hungry.

use std::path::Path;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokenizers::Tokenizer;

use crate::error::{Error, Result};

/// The `tokenizers` crate version, for messages and cache keys.
pub const TOKENIZERS_VERSION: &str = "0.23.2";

/// Target size of one piece of a text file.
const PIECE_BYTES: usize = 128 * 1024;
/// Text handed to the tokenizer's thread pool at once (bounds the memory of the
/// `Encoding`s in flight: about 70 bytes per token).
const BATCH_BYTES: usize = 8 * 1024 * 1024;

/// Reads a `tokenizer.json`, with its truncation and padding turned off: training
/// data is one stream.
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    if !path.is_file() {
        return Err(Error::MissingFile { what: "data.tokenizer", path: path.to_owned() });
    }
    let mut tokenizer = Tokenizer::from_file(path).map_err(|e| Error::Data {
        path: path.to_owned(),
        message: format!("not a tokenizer.json the tokenizers library ({TOKENIZERS_VERSION}) can read: {e}"),
    })?;
    tokenizer.with_padding(None);
    tokenizer.with_truncation(None).map_err(|e| Error::Data { path: path.to_owned(), message: e.to_string() })?;
    Ok(tokenizer)
}

/// One more than the largest id the tokenizer can produce.
pub fn vocab_size(tokenizer: &Tokenizer) -> usize {
    tokenizer.get_vocab(true).values().max().map_or(0, |&m| m as usize + 1)
}

pub fn progress_bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if len < 4 * 1024 * 1024 {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    let style = ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})")
        .expect("a valid template")
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(format!("tokenizing {what}"));
    bar
}

fn failed(source: &Path) -> impl Fn(tokenizers::Error) -> Error + '_ {
    move |e| Error::Data { path: source.to_owned(), message: format!("the tokenizer failed: {e}") }
}

/// Piece boundaries of `text`: `[0, c1, ..., len]`, each cut right after a newline
/// that sits between two non-whitespace characters.
pub fn cuts(text: &str, piece: usize) -> Vec<usize> {
    let bytes = text.as_bytes();
    let mut out = vec![0];
    let mut next = piece;
    while next < bytes.len() {
        let Some(found) = bytes[next..].iter().position(|&b| b == b'\n').map(|i| next + i) else { break };
        let at = found + 1;
        let before = text[..found].chars().next_back();
        let after = text[at..].chars().next();
        match (before, after) {
            (Some(b), Some(a)) if !b.is_whitespace() && !a.is_whitespace() => {
                out.push(at);
                next = at + piece;
            }
            (_, None) => break,
            _ => next = at,
        }
    }
    out.push(bytes.len());
    out
}

/// The line of `text` ending at `cut`, and the one starting there.
fn lines_around(text: &str, cut: usize) -> (&str, &str) {
    let start = text[..cut - 1].rfind('\n').map_or(0, |i| i + 1);
    let end = text[cut..].find('\n').map_or(text.len(), |i| cut + i + 1);
    (&text[start..cut], &text[cut..end])
}

/// Whether every cut leaves the ids as they are.
fn cuts_are_exact(tokenizer: &Tokenizer, text: &str, cuts: &[usize], source: &Path) -> Result<bool> {
    let inner = &cuts[1..cuts.len() - 1];
    let mut inputs = Vec::with_capacity(inner.len() * 3);
    for &cut in inner {
        let (a, b) = lines_around(text, cut);
        inputs.extend([&text[cut - a.len()..cut + b.len()], a, b]);
    }
    let encodings = tokenizer.encode_batch_fast(inputs, false).map_err(failed(source))?;
    Ok(encodings.chunks(3).all(|e| {
        let apart: Vec<u32> = e[1].get_ids().iter().chain(e[2].get_ids()).copied().collect();
        e[0].get_ids() == apart.as_slice()
    }))
}

/// The special tokens `encode(.., add_special_tokens = true)` puts before and after
/// a text, or `None` if the post-processor does more than wrap it.
fn special_tokens_around(tokenizer: &Tokenizer, source: &Path) -> Result<Option<(Vec<u32>, Vec<u32>)>> {
    let sample = "ptrain tokenizes text";
    let with = tokenizer.encode_fast(sample, true).map_err(failed(source))?;
    let without = tokenizer.encode_fast(sample, false).map_err(failed(source))?;
    let (with, without) = (with.get_ids(), without.get_ids());
    if without.is_empty() || with.len() < without.len() {
        return Ok(None);
    }
    Ok(with.windows(without.len()).position(|w| w == without).map(|at| (with[..at].to_vec(), with[at + without.len()..].to_vec())))
}

/// Encodes one text file as `encode(text).ids`, handing ids to `sink` in order.
pub fn encode_text(tokenizer: &Tokenizer, text: &str, source: &Path, sink: &mut dyn FnMut(&[u32]) -> Result<()>) -> Result<()> {
    let bar = progress_bar(text.len() as u64, &source.display().to_string());
    let cuts = cuts(text, PIECE_BYTES);
    let around = if cuts.len() > 2 { special_tokens_around(tokenizer, source)? } else { None };
    let exact = match around {
        Some(_) => cuts_are_exact(tokenizer, text, &cuts, source)?,
        None => false,
    };
    let Some((prefix, suffix)) = around.filter(|_| exact) else {
        if cuts.len() > 2 {
            tracing::warn!(
                "{}: the tokenizer's ids change where a line starts a new input, so the file is encoded in one piece (slow, and memory-hungry for large files)",
                source.display()
            );
        }
        let encoding = tokenizer.encode_fast(text, true).map_err(failed(source))?;
        bar.finish_and_clear();
        return sink(encoding.get_ids());
    };
    sink(&prefix)?;
    let pieces: Vec<&str> = cuts.windows(2).map(|w| &text[w[0]..w[1]]).collect();
    let per_batch = (BATCH_BYTES / PIECE_BYTES).max(1);
    for batch in pieces.chunks(per_batch) {
        for encoding in tokenizer.encode_batch_fast(batch.to_vec(), false).map_err(failed(source))? {
            sink(encoding.get_ids())?;
        }
        bar.inc(batch.iter().map(|p| p.len() as u64).sum());
    }
    bar.finish_and_clear();
    sink(&suffix)
}

/// Encodes JSONL rows: each row's `field` as its own input, with the tokenizer's
/// special tokens, followed by `eos` when given.
pub fn encode_jsonl(
    tokenizer: &Tokenizer,
    text: &str,
    field: &str,
    eos: Option<u32>,
    source: &Path,
    sink: &mut dyn FnMut(&[u32]) -> Result<()>,
) -> Result<()> {
    let bar = progress_bar(text.len() as u64, &source.display().to_string());
    let mut rows: Vec<String> = Vec::new();
    let mut bytes = 0;
    let mut flush = |rows: &mut Vec<String>, bytes: &mut usize| -> Result<()> {
        for encoding in tokenizer.encode_batch_fast(std::mem::take(rows), true).map_err(failed(source))? {
            sink(encoding.get_ids())?;
            if let Some(id) = eos {
                sink(&[id])?;
            }
        }
        bar.inc(*bytes as u64);
        *bytes = 0;
        Ok(())
    };
    for (i, line) in text.lines().enumerate() {
        bytes += line.len() + 1;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| Error::Data { path: source.to_owned(), message: format!("line {}: {message}", i + 1) };
        let row: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
        let value = row.get(field).and_then(|v| v.as_str()).ok_or_else(|| bad(format!("no string field `{field}` (data.text_field)")))?;
        rows.push(value.to_string());
        if bytes >= BATCH_BYTES {
            flush(&mut rows, &mut bytes)?;
        }
    }
    flush(&mut rows, &mut bytes)?;
    bar.finish_and_clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_fall_after_a_newline_between_two_words() {
        let text = "aaaa\n\nbbbb\n cccc\ndddd\neeee";
        let c = cuts(text, 3);
        assert_eq!(c.first(), Some(&0));
        assert_eq!(c.last(), Some(&text.len()));
        for &cut in &c[1..c.len() - 1] {
            assert_eq!(&text[cut - 1..cut], "\n");
            assert!(!text[..cut - 1].ends_with(char::is_whitespace) && !text[cut..].starts_with(char::is_whitespace), "cut at {cut}");
        }
        assert_eq!(c, vec![0, 17, 22, text.len()]);
        let (a, b) = lines_around(text, 17);
        assert_eq!((a, b), (" cccc\n", "dddd\n"));
    }

    #[test]
    fn text_without_a_safe_newline_is_one_piece() {
        assert_eq!(cuts("one long line with no newline", 4), vec![0, 29]);
        assert_eq!(cuts("é\n\u{a0}x\n", 1), vec![0, 7], "a no-break space is whitespace");
        assert_eq!(cuts("", 4), vec![0, 0]);
    }
}
