//! The prompt once per pair (`data.packing = true`): a pair is one sequence,
//! the prompt but its last token (row 1), then the chosen answer (row 2), then the
//! rejected one (row 3). Each answer row starts with the prompt's last token, whose
//! output predicts the answer's first token, so both answers are scored from the
//! same context as in their own sequences; their positions continue from the end of
//! the prompt's row, and each attends to the prompt's row and to itself, never to
//! the other answer ([`crate::data::Segments::prefix`]). The log-probabilities equal those of
//! the two separate rows; the prompt is run once instead of twice.

use super::PreferenceData;
use crate::{
    data::{
        text::grid::{Grid, Place},
        Batch, Split,
    },
    error::Result,
};

/// Row ids within a pair's sequence.
pub const PROMPT: i64 = 1;
pub const CHOSEN: i64 = 2;
pub const REJECTED: i64 = 3;

impl PreferenceData {
    /// An answer's row: the prompt's last token (none for an empty prompt) and the
    /// completion, cut so that prompt + completion keep at most `seq_len + 1` tokens.
    fn answer(&self, prompt: &[u32], completion: &[u32]) -> Vec<u32> {
        let room = (self.seq_len + 1).saturating_sub(prompt.len());
        prompt.last().into_iter().chain(&completion[..completion.len().min(room)]).copied().collect()
    }

    /// `picks`' pairs, one sequence each, right-padded to the longest.
    pub(super) fn collate_packed(&self, split: Split, picks: &[usize]) -> Result<Batch> {
        let pairs = self.pairs(split);
        let b = picks.len();
        let layouts: Vec<(&[u32], Vec<u32>, Vec<u32>)> = picks
            .iter()
            .map(|&p| {
                let pair = &pairs[p];
                let shared = &pair.prompt[..pair.prompt.len().saturating_sub(1)];
                (shared, self.answer(&pair.prompt, &pair.chosen), self.answer(&pair.prompt, &pair.rejected))
            })
            .collect();
        // Every token of the shared part is an input; an answer's last token is only a target.
        let len = |(shared, c, r): &(&[u32], Vec<u32>, Vec<u32>)| shared.len() + c.len().saturating_sub(1) + r.len().saturating_sub(1);
        let t = layouts.iter().map(len).max().unwrap_or(1).max(1);
        let mut g = Grid::new(b, t);
        let mut prefix = vec![0i64; b * t];
        let cross_talk = self.cross_talk;
        for (i, (shared, chosen, rejected)) in layouts.iter().enumerate() {
            let mut at = i * t;
            for (p, &id) in shared.iter().enumerate() {
                (g.inputs[at], g.positions[at], g.rows[at], prefix[at]) = (id as i64, p as i64, PROMPT, PROMPT);
                at += 1;
            }
            // debug.packing_cross_talk: the rejected answer sees the chosen one (in
            // place of the prompt's row): a test shows it is caught.
            let rejected_sees = if cross_talk { CHOSEN } else { PROMPT };
            for (answer, row, sees) in [(chosen, CHOSEN, PROMPT), (rejected, REJECTED, rejected_sees)] {
                // Every answer token but the prompt's is the completion's.
                let (end, _) = g.write_row(at, answer.len(), |k| answer[k], |_| true, Place { position: shared.len() as i64, row });
                prefix[at..end].fill(sees);
                at = end;
            }
            g.pad(i, at);
        }
        let segments = g.segments(Some(&prefix))?;
        g.batch(b, Some(segments), None, self.pair_ids(split, picks)?)
    }
}
