//! Naming an unknown key as the user wrote it, with the name they likely meant:
//! the configuration's checks and plugins' [`crate::parse_options`] both report
//! serde's "unknown field" errors through here.

/// The key an error at `path` is about, for serde's `message`. serde reports an
/// unknown field at its parent's path or (depending on the deserializer) at the
/// field itself; either way this names the field: `optim.minlr`.
pub fn key(path: &str, message: &str) -> String {
    match message.strip_prefix("unknown field `").and_then(|m| m.split('`').next()) {
        Some(field) if path == "." || path.is_empty() => field.to_string(),
        Some(field) if path == field || path.ends_with(&format!(".{field}")) => path.to_string(),
        Some(field) => format!("{path}.{field}"),
        None => path.to_string(),
    }
}

/// serde's "unknown field `minlr`, expected one of `lr`, `min_lr`, ..." with the
/// nearest expected name first: "did you mean `min_lr`?".
pub fn with_suggestion(message: String) -> String {
    let Some(rest) = message.strip_prefix("unknown field `") else { return message };
    let Some((field, expected)) = rest.split_once('`') else { return message };
    let names: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    match closest(field, names.iter().copied()) {
        Some(near) => {
            let all: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            format!("unknown field `{field}`: did you mean `{near}`? (expected one of {})", all.join(", "))
        }
        None => message,
    }
}

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
    fn an_unknown_field_is_named_whatever_path_serde_reports_it_at() {
        let message = "unknown field `colour`, expected `every`";
        assert_eq!(key(".", message), "colour");
        assert_eq!(key("", message), "colour");
        assert_eq!(key("log.colour", message), "log.colour");
        assert_eq!(key("log", message), "log.colour");
        assert_eq!(key("log.every", "invalid type"), "log.every");
    }

    #[test]
    fn a_suggestion_puts_the_nearest_expected_name_first() {
        let message = "unknown field `minlr`, expected one of `lr`, `min_lr`".to_string();
        assert_eq!(with_suggestion(message), "unknown field `minlr`: did you mean `min_lr`? (expected one of `lr`, `min_lr`)");
        let far = "unknown field `colour`, expected one of `lr`".to_string();
        assert_eq!(with_suggestion(far.clone()), far);
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
