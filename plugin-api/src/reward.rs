//! Reward plugins (plugin-api 0.6.0): GRPO's reward functions as plugins. A worker
//! plugin whose descriptor says [`crate::Descriptor::reward`] is named by a
//! `[[grpo.rewards]] kind = "plugin"` entry; the host hands it each sampled
//! micro-batch ([`RewardBatch`]) on its worker thread and waits for one score per
//! completion ([`crate::Plugin::score`]) before the step's advantages are computed,
//! as TRL calls a `reward_funcs` entry.

use abi_stable::{
    std_types::{RSlice, RStr},
    StableAbi,
};

/// A micro-batch's completions, one entry per completion in each list, as TRL passes
/// them to a reward function: `prompts`, `completions`, `completion_ids` and each of
/// the rows' other columns as a keyword (here [`RewardBatch::columns`]). The
/// `num_generations` completions of one prompt are consecutive.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct RewardBatch<'a> {
    /// The step that sampled them (TRL's `trainer_state.global_step`).
    pub step: u64,
    /// Each completion's prompt as the row gave it, as JSON text: a string
    /// (`"\"What is 2 + 2?\""`) or a list of chat messages. See [`RewardBatch::prompt`].
    pub prompts: RSlice<'a, RStr<'a>>,
    /// The decoded completions (special tokens skipped), as text.
    pub completions: RSlice<'a, RStr<'a>>,
    /// The completions' token ids (the EOS that ended one included).
    pub completion_ids: RSlice<'a, RSlice<'a, u32>>,
    /// The rows' other columns (`answer`, `solution`, ...) as one JSON object: each name
    /// to a list of one value per completion (`null` where a row has none).
    pub columns_json: RStr<'a>,
}

impl<'a> RewardBatch<'a> {
    /// How many completions (and scores to answer).
    pub fn len(&self) -> usize {
        self.completions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.completions.is_empty()
    }

    /// The `i`th completion's text.
    pub fn completion(&self, i: usize) -> &'a str {
        self.completions[i].as_str()
    }

    /// The `i`th completion's token ids.
    pub fn ids(&self, i: usize) -> &'a [u32] {
        self.completion_ids[i].as_slice()
    }

    /// The `i`th completion's prompt as the row gave it: a JSON string, or a list of
    /// messages (`[{"role": "user", "content": ...}]`).
    pub fn prompt(&self, i: usize) -> serde_json::Value {
        serde_json::from_str(self.prompts[i].as_str()).unwrap_or(serde_json::Value::Null)
    }

    /// The rows' other columns by name, each a list of one value per completion, as
    /// TRL's reward functions get them as keywords (`answer=[...]`).
    pub fn columns(&self) -> serde_json::Map<String, serde_json::Value> {
        match serde_json::from_str(self.columns_json.as_str()) {
            Ok(serde_json::Value::Object(columns)) => columns,
            _ => serde_json::Map::new(),
        }
    }

    /// One column's values, one per completion (`None` when no row has it).
    pub fn column(&self, name: &str) -> Option<Vec<serde_json::Value>> {
        match self.columns().remove(name)? {
            serde_json::Value::Array(values) => Some(values),
            _ => None,
        }
    }
}

/// An owned [`RewardBatch`], for unit tests of a reward plugin (and the host): the
/// lists with one entry per completion; borrow it with [`OwnedRewardBatch::view`].
#[derive(Debug, Clone, Default)]
pub struct OwnedRewardBatch {
    pub step: u64,
    /// Each prompt as JSON text (see [`RewardBatch::prompts`]).
    pub prompts: Vec<String>,
    pub completions: Vec<String>,
    pub completion_ids: Vec<Vec<u32>>,
    /// The columns as one JSON object (see [`RewardBatch::columns_json`]).
    pub columns_json: String,
}

impl OwnedRewardBatch {
    /// Text prompts and completions, no token ids or columns: the ids are empty
    /// lists, the columns `{}`.
    pub fn texts(prompts: &[&str], completions: &[&str]) -> OwnedRewardBatch {
        OwnedRewardBatch {
            step: 1,
            prompts: prompts.iter().map(|p| serde_json::Value::from(*p).to_string()).collect(),
            completions: completions.iter().map(|c| c.to_string()).collect(),
            completion_ids: vec![Vec::new(); completions.len()],
            columns_json: "{}".into(),
        }
    }

    /// Calls `f` with the batch as the host hands it over.
    pub fn view<T>(&self, f: impl FnOnce(&RewardBatch<'_>) -> T) -> T {
        let prompts: Vec<RStr<'_>> = self.prompts.iter().map(|p| RStr::from_str(p)).collect();
        let completions: Vec<RStr<'_>> = self.completions.iter().map(|c| RStr::from_str(c)).collect();
        let ids: Vec<RSlice<'_, u32>> = self.completion_ids.iter().map(|i| RSlice::from_slice(i)).collect();
        f(&RewardBatch {
            step: self.step,
            prompts: RSlice::from_slice(&prompts),
            completions: RSlice::from_slice(&completions),
            completion_ids: RSlice::from_slice(&ids),
            columns_json: RStr::from_str(&self.columns_json),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::OwnedRewardBatch;

    #[test]
    fn the_batch_reads_back_prompts_columns_and_ids() {
        let owned = OwnedRewardBatch {
            completion_ids: vec![vec![1, 2], vec![3]],
            columns_json: r#"{"answer": ["4", null]}"#.into(),
            ..OwnedRewardBatch::texts(&["2+2?", "3+3?"], &["4", "six"])
        };
        owned.view(|batch| {
            assert_eq!((batch.len(), batch.completion(1), batch.ids(0)), (2, "six", &[1, 2][..]));
            assert_eq!(batch.prompt(0), serde_json::json!("2+2?"));
            assert_eq!(batch.column("answer"), Some(vec![serde_json::json!("4"), serde_json::Value::Null]));
            assert_eq!(batch.column("solution"), None);
        });
    }
}
