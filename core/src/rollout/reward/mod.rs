//! The reward functions of sampled completions (`[[grpo.rewards]]`), as TRL calls its
//! `reward_funcs`: each gets a micro-batch's completions at once ([`ScoreBatch`]: the
//! prompts, the completions, their token ids and the rows' other columns, one entry per
//! completion) and gives one score per completion, or none (NaN, TRL's `None`).
//! Built-in ones ([`builtin`]) are computed on the training thread when collected;
//! commands ([`command`]) and plugins ([`plugin`]) get the batch when it is submitted,
//! right after sampling, and score it on their own while the next micro-batch samples.

pub mod builtin;
pub mod command;
pub mod plugin;

use std::sync::Arc;

use serde::Serialize;

use self::{builtin::BuiltIn, command::CommandReward, plugin::PluginReward};
use crate::{
    config::{RewardKind, RewardSpec},
    data::prompts::PromptRow,
    error::Result,
    host::PluginHost,
};

/// `timeout_s`'s default: the longest a command or plugin may take over a micro-batch.
pub const DEFAULT_TIMEOUT_S: f64 = 120.0;

/// A micro-batch's completions, one entry per completion in each list, as TRL passes
/// them to a reward function (`prompts`, `completions`, `completion_ids`, and each other
/// column of the rows as a keyword); this is a command's request line.
#[derive(Debug, Serialize)]
pub struct ScoreBatch {
    /// The step that sampled them (TRL's `trainer_state.global_step`).
    pub step: u64,
    /// Each completion's prompt as the row gave it: a text, or a message list.
    pub prompts: Vec<serde_json::Value>,
    /// The decoded completion (special tokens skipped): a text, or for a message-list
    /// prompt TRL's conversational form `[{"role": "assistant", "content": text}]`.
    pub completions: Vec<serde_json::Value>,
    pub completion_ids: Vec<Vec<u32>>,
    /// The rows' other columns by name, one value per completion (`null` where a row
    /// has none).
    pub columns: serde_json::Map<String, serde_json::Value>,
    /// The decoded texts and rows, for the built-in rewards.
    #[serde(skip)]
    pub texts: Vec<String>,
    #[serde(skip)]
    pub rows: Vec<Arc<PromptRow>>,
}

impl ScoreBatch {
    /// The batch of `rows[i]`'s completions `texts[i]` (and `ids[i]`), in that order.
    pub fn new(step: u64, rows: &[Arc<PromptRow>], texts: Vec<Vec<String>>, ids: Vec<Vec<Vec<u32>>>) -> ScoreBatch {
        let per: Vec<Arc<PromptRow>> = rows.iter().zip(&texts).flat_map(|(r, t)| std::iter::repeat_n(r.clone(), t.len())).collect();
        let texts: Vec<String> = texts.into_iter().flatten().collect();
        let prompt = |r: &PromptRow| r.columns.get("prompt").cloned().unwrap_or(serde_json::Value::Null);
        let completions = per
            .iter()
            .zip(&texts)
            .map(|(r, t)| match prompt(r).is_array() {
                true => serde_json::json!([{"role": "assistant", "content": t}]),
                false => serde_json::Value::String(t.clone()),
            })
            .collect();
        let mut names: Vec<&String> = rows.iter().flat_map(|r| r.columns.keys()).filter(|k| *k != "prompt").collect();
        names.sort();
        names.dedup();
        let columns = names.into_iter().map(|n| (n.clone(), per.iter().map(|r| r.columns.get(n).cloned().unwrap_or_default()).collect())).collect();
        ScoreBatch {
            step,
            prompts: per.iter().map(|r| prompt(r)).collect(),
            completions,
            completion_ids: ids.into_iter().flatten().collect(),
            columns,
            texts,
            rows: per,
        }
    }
}

enum Function {
    BuiltIn(BuiltIn),
    Command(CommandReward),
    Plugin(PluginReward),
}

/// The configured reward functions, in `[[grpo.rewards]]`'s order.
pub struct Rewards {
    functions: Vec<Function>,
    pub names: Vec<String>,
}

impl Rewards {
    /// Compiles the built-in rewards, starts the commands (exit 2 when one cannot start)
    /// and finds the plugins in `host` (exit 2 when one is no reward plugin).
    pub fn from_config(specs: &[RewardSpec], host: &PluginHost) -> Result<Rewards> {
        let functions = specs
            .iter()
            .map(|spec| {
                let timeout_s = spec.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S);
                match (spec.kind, &spec.command) {
                    (Some(RewardKind::Command), Some(argv)) => Ok(Function::Command(CommandReward::start(&spec.name, argv, timeout_s)?)),
                    (Some(RewardKind::Plugin), _) => Ok(Function::Plugin(PluginReward::connect(spec, host, timeout_s)?)),
                    _ => Ok(Function::BuiltIn(BuiltIn::new(spec)?)),
                }
            })
            .collect::<Result<_>>()?;
        Ok(Rewards { functions, names: specs.iter().map(|s| s.name.clone()).collect() })
    }

    /// Hands `batch` to the functions that score on their own.
    pub fn submit(&mut self, batch: &Arc<ScoreBatch>) {
        for function in &mut self.functions {
            match function {
                Function::Command(command) => command.submit(batch),
                Function::Plugin(plugin) => plugin.submit(batch),
                Function::BuiltIn(_) => {}
            }
        }
    }

    /// Each function's scores of the oldest batch submitted (`batch`), in order.
    pub fn collect(&mut self, batch: &ScoreBatch) -> Result<Vec<Vec<f64>>> {
        self.functions
            .iter_mut()
            .map(|function| match function {
                Function::BuiltIn(reward) => Ok(batch.texts.iter().zip(&batch.rows).map(|(t, r)| reward.score(t, &r.columns)).collect()),
                Function::Command(command) => command.collect(),
                Function::Plugin(plugin) => plugin.collect(batch.texts.len()),
            })
            .collect()
    }
}
