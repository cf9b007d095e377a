//! A JSON file holding one array of rows (`[{..}, {..}]`, as LLaMA-Factory's and
//! many published sets are), read an element at a time: a small scanner finds
//! where each top-level element ends (tracking strings, escapes and nesting) and
//! serde_json parses it, so a bad row is reported by the line it starts on and the
//! file is never held whole.

use std::{io::BufRead, path::Path, sync::Arc};

use super::{parse_object, text, At, Batches, Place, Record};
use crate::error::{Error, Result};

pub struct JsonArray {
    file: Arc<Path>,
    reader: Box<dyn BufRead + Send>,
    /// The line the scanner is on, from 1.
    line: u64,
    state: State,
    element: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the opening `[`.
    Start,
    /// Inside the array, before an element (or the closing `]`).
    BeforeElement,
    /// After an element, before `,` or `]`.
    AfterElement,
    /// After a `,`: an element must follow (`[{..},]` is refused, as Python's `json` does).
    AfterComma,
    Done,
}

impl JsonArray {
    pub fn open(file: Arc<Path>) -> Result<JsonArray> {
        Ok(JsonArray { reader: text::open(&file)?, file, line: 1, state: State::Start, element: Vec::new() })
    }

    fn error(&self, message: impl std::fmt::Display) -> Error {
        Place { file: self.file.clone(), at: At::Line(self.line) }.error(message)
    }

    fn io(file: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
        move |source| Error::Io { path: file.to_path_buf(), source }
    }

    /// The next byte that is not whitespace (counting lines), consumed; `None` at
    /// the end of the file.
    fn next_token(&mut self) -> Result<Option<u8>> {
        loop {
            let buf = self.reader.fill_buf().map_err(Self::io(&self.file))?;
            if buf.is_empty() {
                return Ok(None);
            }
            let mut used = 0;
            let mut found = None;
            for &b in buf {
                used += 1;
                if b == b'\n' {
                    self.line += 1;
                } else if !b.is_ascii_whitespace() {
                    found = Some(b);
                    break;
                }
            }
            self.reader.consume(used);
            if found.is_some() {
                return Ok(found);
            }
        }
    }

    /// Reads the rest of an object whose `{` was consumed into `self.element`.
    fn read_object(&mut self) -> Result<()> {
        self.element.clear();
        self.element.push(b'{');
        let (mut depth, mut in_string, mut escaped) = (1usize, false, false);
        loop {
            let buf = self.reader.fill_buf().map_err(Self::io(&self.file))?;
            if buf.is_empty() {
                return Err(self.error("the file ends inside a row (a missing `}` or `]`)"));
            }
            let mut used = 0;
            let mut closed = false;
            for &b in buf {
                used += 1;
                if b == b'\n' {
                    self.line += 1;
                }
                if in_string {
                    match (escaped, b) {
                        (true, _) => escaped = false,
                        (false, b'\\') => escaped = true,
                        (false, b'"') => in_string = false,
                        _ => {}
                    }
                    continue;
                }
                match b {
                    b'"' => in_string = true,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            closed = true;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            self.element.extend_from_slice(&buf[..used]);
            self.reader.consume(used);
            if closed {
                return Ok(());
            }
        }
    }
}

impl Batches for JsonArray {
    fn next_batch(&mut self, max: usize) -> Result<Vec<Record>> {
        let mut out = Vec::new();
        while out.len() < max && self.state != State::Done {
            let token = self.next_token()?;
            match (self.state, token) {
                (State::Start, Some(b'[')) => self.state = State::BeforeElement,
                (State::Start, _) => {
                    return Err(self.error("a JSON file of rows must hold one array (`[{..}, {..}]`); for one object per line, use JSON Lines"))
                }
                (State::BeforeElement | State::AfterElement, Some(b']')) => {
                    self.state = State::Done;
                    if let Some(b) = self.next_token()? {
                        return Err(self.error(format!("text after the array's closing `]` (`{}`)", b as char)));
                    }
                }
                (State::AfterElement, Some(b',')) => self.state = State::AfterComma,
                (State::AfterComma, Some(b']')) => {
                    return Err(self.error("a comma before the array's closing `]` (a trailing comma: JSON, and Python's json, refuse it)"))
                }
                (State::BeforeElement | State::AfterComma, Some(b'{')) => {
                    let place = Place { file: self.file.clone(), at: At::Line(self.line) };
                    self.read_object()?;
                    let text = text::utf8(&self.element).map_err(|m| {
                        // The line of the bad byte, not of the row's start.
                        let valid = std::str::from_utf8(&self.element).map_or_else(|e| e.valid_up_to(), |s| s.len());
                        let line = self.element[..valid].iter().filter(|&&b| b == b'\n').count() as u64;
                        Place { at: At::Line(place_line(&place) + line), ..place.clone() }.error(m)
                    })?;
                    let columns = parse_object(text).map_err(|m| place.error(m))?;
                    out.push(Record { place, columns });
                    self.state = State::AfterElement;
                }
                (_, None) => return Err(self.error("the file ends inside the array (no closing `]`)")),
                (State::BeforeElement | State::AfterComma, Some(b)) => {
                    return Err(self.error(format!("an array element that is not a JSON object (starts with `{}`)", b as char)))
                }
                (_, Some(b)) => return Err(self.error(format!("expected `,` or `]` after a row, found `{}`", b as char))),
            }
        }
        Ok(out)
    }
}

fn place_line(place: &Place) -> u64 {
    match place.at {
        At::Line(n) | At::Row(n) => n,
    }
}
