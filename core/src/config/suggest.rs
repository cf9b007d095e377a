//! "Did you mean": the closest of the names a misspelt one may have meant.

/// The candidate closest to `word`, if it is close enough to be a likely typo: at most
/// two edits, and fewer than the candidate's length (`ab` is not a typo of `xy`).
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, c)| *d <= 2 && *d < c.chars().count())
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance, in characters.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_insertions_deletions_and_substitutions() {
        assert_eq!(edit_distance("gradwach", "gradwatch"), 1);
        assert_eq!(edit_distance("jsnol", "jsonl"), 2);
        assert_eq!(edit_distance("", "perf"), 4);
        assert_eq!(edit_distance("flops", "flops"), 0);
    }

    #[test]
    fn only_a_likely_typo_has_a_closest_name() {
        let keys = ["every", "every_secs", "queue"];
        assert_eq!(closest("evry", keys), Some("every"));
        assert_eq!(closest("every_sec", keys), Some("every_secs"));
        assert_eq!(closest("colour", keys), None);
        assert_eq!(closest("ab", ["xy"]), None);
    }
}
