//! The flat index space of sharded training: every trainable parameter flattened
//! and concatenated in the trainer's order (sorted by name). Rank r of W owns the
//! contiguous slice `[r*chunk, (r+1)*chunk) ∩ [0, numel)`, chunk = ceil(numel / W);
//! the flat buffers are padded to `chunk * W` so every rank's slice has one size,
//! as reduce-scatter and all-gather want.

use std::ops::Range;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatLayout {
    /// Each parameter's `(offset, numel)`, in order.
    pub params: Vec<(u64, u64)>,
    pub numel: u64,
    pub world: u32,
    pub chunk: u64,
}

/// The part of one parameter inside a slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub param: usize,
    /// Where the piece starts inside the flattened parameter.
    pub param_offset: u64,
    /// Where it starts in the flat index space.
    pub flat_offset: u64,
    pub len: u64,
}

impl FlatLayout {
    pub fn new(numels: &[u64], world: u32) -> FlatLayout {
        let mut params = Vec::with_capacity(numels.len());
        let mut offset = 0;
        for &n in numels {
            params.push((offset, n));
            offset += n;
        }
        let world = world.max(1);
        FlatLayout { params, numel: offset, world, chunk: offset.div_ceil(world as u64) }
    }

    /// Elements of a padded flat buffer.
    pub fn padded(&self) -> u64 {
        self.chunk * self.world as u64
    }

    /// Rank `rank`'s slice of the flat index space (empty past the end).
    pub fn range(&self, rank: u32) -> Range<u64> {
        let start = (rank as u64 * self.chunk).min(self.numel);
        start..(start + self.chunk).min(self.numel)
    }

    pub fn ranges(&self) -> Vec<Range<u64>> {
        (0..self.world).map(|r| self.range(r)).collect()
    }

    /// The non-empty parameter pieces inside `range`, in order.
    pub fn pieces(&self, range: Range<u64>) -> Vec<Piece> {
        self.params
            .iter()
            .enumerate()
            .filter_map(|(param, &(offset, n))| {
                let start = offset.max(range.start);
                let end = (offset + n).min(range.end);
                (start < end).then_some(Piece { param, param_offset: start - offset, flat_offset: start, len: end - start })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_tile_the_index_space_and_pieces_cut_parameters_at_their_edges() {
        // 3 + 5 + 2 = 10 elements over 3 ranks: chunk 4, slices [0,4) [4,8) [8,10).
        let l = FlatLayout::new(&[3, 5, 2], 3);
        assert_eq!((l.numel, l.chunk, l.padded()), (10, 4, 12));
        assert_eq!(l.ranges(), vec![0..4, 4..8, 8..10]);
        let p = |param, param_offset, flat_offset, len| Piece { param, param_offset, flat_offset, len };
        assert_eq!(l.pieces(l.range(0)), vec![p(0, 0, 0, 3), p(1, 0, 3, 1)]);
        assert_eq!(l.pieces(l.range(1)), vec![p(1, 1, 4, 4)]);
        assert_eq!(l.pieces(l.range(2)), vec![p(2, 0, 8, 2)]);
    }

    #[test]
    fn more_ranks_than_elements_leaves_some_slices_empty() {
        let l = FlatLayout::new(&[2, 0, 1], 4);
        assert_eq!(l.ranges(), vec![0..1, 1..2, 2..3, 3..3]);
        assert!(l.pieces(l.range(3)).is_empty());
        assert_eq!(l.pieces(0..3).len(), 2, "an empty parameter has no piece");
    }
}
