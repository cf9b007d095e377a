//! `ptrain tokenize --show N`: the first rows (instruction rows, or preference pairs)
//! as the model sees them, the trained spans marked, as axolotl's preprocessing debug
//! shows them. How a user checks a template and `train_on` before spending a GPU day.

use super::{encode::Shown, sources, sources::SourceSpec};
use crate::{
    config::Config,
    data::reader::{Place, Record, Rows},
    error::Result,
};

/// A row shown: where it is and how it encodes.
pub struct ShownRow<T = Shown> {
    pub source: String,
    pub place: Place,
    pub shown: T,
}

/// The first `n` rows of the first source through `show`; a bad row is the error
/// naming its file and line.
pub fn first<T>(config: &Config, n: usize, show: impl Fn(&SourceSpec, &Record) -> std::result::Result<T, String>) -> Result<Vec<ShownRow<T>>> {
    let Some(spec) = sources(config).into_iter().next() else { return Ok(Vec::new()) };
    let mut rows = Rows::open(&spec.path, spec.format, &spec.shaper.ignore)?;
    let mut out = Vec::new();
    while out.len() < n {
        let batch = rows.next_batch(n - out.len())?;
        if batch.is_empty() {
            break;
        }
        for record in batch {
            let shown = show(&spec, &record).map_err(|m| record.place.error(m))?;
            out.push(ShownRow { source: spec.name.clone(), place: record.place, shown });
        }
    }
    Ok(out)
}

/// How trained text is set apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marks {
    /// Green, the rest dimmed (a terminal).
    Colour,
    /// Between `[[` and `]]`.
    Brackets,
}

/// `shown`'s text with its trained tokens marked.
pub fn marked(shown: &Shown, marks: Marks) -> String {
    let text = &shown.text;
    let trained = &shown.encoded.trained;
    // Cut where a token's trained flag differs from the one before it.
    let mut cuts: Vec<(usize, bool)> = vec![(0, false)];
    for (i, &(start, _)) in shown.offsets.iter().enumerate() {
        let t = trained.get(i).copied().unwrap_or(false) && i > 0;
        if t != cuts.last().expect("one cut at least").1 {
            let mut at = start.min(text.len());
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            cuts.push((at, t));
        }
    }
    let mut out = String::with_capacity(text.len() + 16 * cuts.len());
    for (k, &(at, t)) in cuts.iter().enumerate() {
        let end = cuts.get(k + 1).map_or(text.len(), |c| c.0);
        let piece = &text[at.min(end)..end];
        if piece.is_empty() {
            continue;
        }
        match (marks, t) {
            (Marks::Brackets, true) => out.push_str(&format!("[[{piece}]]")),
            (Marks::Brackets, false) => out.push_str(piece),
            (Marks::Colour, true) => out.push_str(&format!("\x1b[1;32m{piece}\x1b[0m")),
            (Marks::Colour, false) => out.push_str(&format!("\x1b[2m{piece}\x1b[0m")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::text::encode::Encoded;

    #[test]
    fn trained_tokens_are_bracketed() {
        let text = "user: hi\nbot: yo!<end>\n".to_string();
        let offsets = vec![(0, 5), (5, 9), (9, 14), (14, 16), (16, 17), (17, 22), (22, 23)];
        let trained = vec![false, false, false, true, true, true, false];
        let shown = Shown::new(text, offsets, Encoded { ids: vec![0; 7], trained, untrained: None });
        assert_eq!(marked(&shown, Marks::Brackets), "user: hi\nbot: [[yo!<end>]]\n");
        assert!(marked(&shown, Marks::Colour).contains("\x1b[1;32myo!<end>\x1b[0m"));
    }
}
