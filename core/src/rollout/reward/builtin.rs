//! The built-in rewards (`[[grpo.rewards]] kind`), each a function of a completion's
//! text and its prompt row's columns to one score, or NaN where it gives none (TRL's
//! `None`: left out of the weighted sum):
//! - `regex`: 1.0 when `pattern` matches the completion anywhere (anchor it with `^`
//!   and `$`, as TRL's format rewards do), else 0.0;
//! - `exact`: the answer `pattern` extracts (its first group, else its whole match,
//!   of the last match: the final answer; no pattern: the whole completion), trimmed,
//!   equals the row's `column` (a string, or a number written as JSON writes it):
//!   1.0, else 0.0; NaN when the row has no such column;
//! - `length`: `-|target - characters|`, TRL's quickstart length reward (`reward_len`).

use regex::Regex;

use crate::{
    config::{RewardKind, RewardSpec},
    error::{Error, Result},
};

#[derive(Clone, Copy)]
enum Rule {
    Regex,
    Exact,
    Length,
}

/// One configured built-in reward.
pub struct BuiltIn {
    kind: Rule,
    pattern: Option<Regex>,
    column: String,
    target: f64,
}

impl BuiltIn {
    pub fn new(spec: &RewardSpec) -> Result<BuiltIn> {
        let bad = |m: String| Error::Other(format!("[[grpo.rewards]] {:?}: {m}", spec.name));
        let kind = match spec.kind {
            Some(RewardKind::Regex) => Rule::Regex,
            Some(RewardKind::Exact) => Rule::Exact,
            Some(RewardKind::Length) => Rule::Length,
            other => return Err(bad(format!("{other:?} is not a built-in reward"))),
        };
        let pattern = spec.pattern.as_deref().map(Regex::new).transpose().map_err(|e| bad(e.to_string()))?;
        Ok(BuiltIn { kind, pattern, column: spec.column.clone(), target: spec.target.unwrap_or(0) as f64 })
    }

    /// The reward of `completion` (decoded) for the prompt row `columns`.
    pub fn score(&self, completion: &str, columns: &serde_json::Map<String, serde_json::Value>) -> f64 {
        match self.kind {
            Rule::Regex => self.pattern.as_ref().is_some_and(|p| p.is_match(completion)) as u8 as f64,
            Rule::Length => -(self.target - completion.chars().count() as f64).abs(),
            Rule::Exact => {
                let Some(expected) = columns.get(&self.column).and_then(answer_text) else { return f64::NAN };
                (self.extract(completion).is_some_and(|got| got.trim() == expected.trim())) as u8 as f64
            }
        }
    }

    /// The final answer in `completion`: the last match's first group (or whole match).
    fn extract<'a>(&self, completion: &'a str) -> Option<&'a str> {
        let Some(pattern) = &self.pattern else { return Some(completion) };
        let found = pattern.captures_iter(completion).last()?;
        found.get(1).or_else(|| found.get(0)).map(|m| m.as_str())
    }
}

/// A column's value as an answer: a string as it is, a number as JSON writes it.
fn answer_text(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn reward(kind: RewardKind, pattern: Option<&str>, target: Option<u32>) -> BuiltIn {
        let spec = RewardSpec {
            name: "r".into(),
            weight: 1.0,
            kind: Some(kind),
            pattern: pattern.map(String::from),
            column: "answer".into(),
            target,
            command: None,
            plugin: None,
            timeout_s: None,
        };
        BuiltIn::new(&spec).unwrap()
    }

    #[test]
    fn built_in_rewards_score_as_documented() {
        let row = json!({"prompt": "2+2?", "answer": 4}).as_object().unwrap().clone();
        let format = reward(RewardKind::Regex, Some(r"^<a>.*</a>$"), None);
        assert_eq!(format.score("<a>4</a>", &row), 1.0);
        assert_eq!(format.score("so <a>4</a>", &row), 0.0, "anchored");
        let exact = reward(RewardKind::Exact, Some(r"<a>(.*?)</a>"), None);
        assert_eq!(exact.score("<a>3</a> no, <a> 4 </a>", &row), 1.0, "the last answer, trimmed, against a number");
        assert_eq!(exact.score("<a>3</a>", &row), 0.0);
        assert_eq!(exact.score("4", &row), 0.0, "nothing extracted");
        let no_answer = json!({"prompt": "?"}).as_object().unwrap().clone();
        assert!(exact.score("<a>4</a>", &no_answer).is_nan(), "no column: no reward (TRL's None)");
        assert_eq!(reward(RewardKind::Length, None, Some(5)).score("héllo!!", &row), -2.0, "characters, not bytes");
    }
}
