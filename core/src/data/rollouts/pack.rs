//! The prompt once per group (`data.packing = true`): a group is one sequence, its
//! prompt but the last token (row 1), then each completion in a row of its own (rows 2,
//! 3, ...) that starts with the prompt's last token, whose output predicts the
//! completion's first token. Each completion's positions continue from the prompt's
//! end, and it attends to the prompt's row and to itself, never to a sibling
//! ([`crate::data::Segments::prefix`]), as DPO's packed pairs do
//! ([`crate::data::preference::pack`]): the log-probabilities equal those of separate
//! rows, and the prompt is run once instead of `G` times.
//!
//! GRPO's loss is per completion, so the batch also says where each completion's
//! tokens lie in its group's sequence ([`PackedRows`]): the objective reads its
//! per-token values back as one row per completion.

use tch::Tensor;

use super::{rows::Group, PackedRows, Scoring};
use crate::{
    data::{
        text::grid::{Grid, Place},
        Segments,
    },
    error::{Error, Result},
    objective::IGNORE_INDEX,
};

/// The prompt's row within a group's sequence; completion `k` is row `FIRST + k`.
const PROMPT: i64 = 1;
const FIRST: i64 = 2;

/// `groups` packed: the grids (one sequence per group, right-padded to the longest),
/// their segments, where each completion's tokens are, and the targets trained.
pub(super) struct Packed {
    pub grid: Grid,
    pub segments: Segments,
    pub rows: PackedRows,
    pub trained: i64,
}

pub(super) fn pack(groups: &[&Group], scoring: &Scoring) -> Result<Packed> {
    // Every token but the prompt's last is an input once; each completion adds its own.
    let len = |g: &&Group| g.prompt.len().saturating_sub(1) + g.completions.iter().map(Vec::len).sum::<usize>();
    let t = groups.iter().map(len).max().unwrap_or(1).max(1);
    let longest = groups.iter().flat_map(|g| g.completions.iter().map(Vec::len)).max().unwrap_or(1).max(1);
    let completions = groups.iter().map(|g| g.completions.len()).sum::<usize>();
    let mut grid = Grid::new(groups.len(), t);
    let mut prefix = vec![0i64; groups.len() * t];
    let mut index = vec![0i64; completions * longest];
    let mut targets = vec![IGNORE_INDEX; completions * longest];
    let (mut trained, mut r) = (0, 0);
    for (i, group) in groups.iter().enumerate() {
        let (prompt, start) = (&group.prompt, i * t);
        let Some(&last) = prompt.last() else {
            return Err(Error::Other("GRPO with data.packing: a group's prompt is empty".into()));
        };
        // The prompt but its last token: inputs only, nothing trained.
        let (mut at, _) = grid.write_row(start, prompt.len(), |p| prompt[p], |_| false, Place { position: 0, row: PROMPT });
        for (k, completion) in group.completions.iter().enumerate() {
            let train = scoring.trains(completion);
            let id = |p: usize| if p == 0 { last } else { completion[p - 1] };
            let place = Place { position: prompt.len() as i64 - 1, row: FIRST + k as i64 };
            let (end, n) = grid.write_row(at, completion.len() + 1, id, |_| train, place);
            for (j, &token) in completion.iter().enumerate() {
                index[r * longest + j] = (at + j) as i64;
                if train {
                    targets[r * longest + j] = token as i64;
                }
            }
            (trained, r, at) = (trained + n, r + 1, end);
        }
        // Every token of the group sees the prompt's row (the prompt's own are in it).
        prefix[start..at].fill(PROMPT);
        grid.pad(i, at);
    }
    let shape = [completions as i64, longest as i64];
    let rows = PackedRows { index: Tensor::f_from_slice(&index)?.f_view(shape)?, targets: Tensor::f_from_slice(&targets)?.f_view(shape)? };
    Ok(Packed { segments: grid.segments(Some(&prefix))?, grid, rows, trained })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ScaleRewards;

    #[test]
    fn a_group_is_its_prompt_once_then_each_completion_after_the_prompts_last_token() {
        let group = Group { prompt: vec![5, 6, 7], completions: vec![vec![8, 9], vec![10, 2]], rewards: vec![vec![0.0, 1.0]] };
        let scoring = Scoring { generations: 2, weights: vec![1.0], scale: ScaleRewards::Group, mask_truncated: true, eos: 2, packed: true };
        let p = pack(&[&group], &scoring).unwrap();
        let ints = |t: &Tensor| Vec::<i64>::try_from(t.view([-1])).unwrap();
        // [5 6] [7 8] [7 10]: the first completion ends without EOS and is masked.
        assert_eq!(ints(&p.grid.tensor(&p.grid.inputs).unwrap()), [5, 6, 7, 8, 7, 10]);
        assert_eq!(ints(&p.grid.tensor(&p.grid.targets).unwrap()), [IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, 10, 2]);
        assert_eq!(ints(&p.segments.positions), [0, 1, 2, 3, 2, 3], "both completions continue the prompt's positions");
        assert_eq!(ints(&p.segments.ids), [1, 1, 2, 2, 3, 3]);
        assert_eq!(ints(p.segments.prefix.as_ref().unwrap()), [1, 1, 1, 1, 1, 1]);
        assert_eq!(ints(&p.rows.index), [2, 3, 4, 5]);
        assert_eq!(ints(&p.rows.targets), [IGNORE_INDEX, IGNORE_INDEX, 10, 2]);
        assert_eq!(p.trained, 2);
        let mask = p.segments.mask().unwrap();
        let sees = |q: i64, k: i64| mask.get(0).get(0).get(q).get(k).int64_value(&[]) == 1;
        assert!(sees(4, 0) && sees(4, 1) && sees(4, 4), "the second completion sees the prompt and itself");
        assert!(!sees(4, 2) && !sees(5, 3), "never its sibling");
    }
}
