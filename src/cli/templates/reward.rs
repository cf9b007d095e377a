//! `{{name}}`: a ptrain reward plugin (made by `ptrain plugins new {{name}} --reward`).
//!
//! A reward function for GRPO, as a TRL `reward_funcs` entry: it gets a micro-batch
//! of sampled completions (their prompts, texts, token ids and the rows' other
//! columns) and answers one score per completion, or `None` for a completion it does
//! not score (TRL's `None`). It runs on its own worker thread, while the next
//! micro-batch samples. As written, it is TRL's quickstart reward (`reward_len`):
//! `-abs(target - characters)`, option `target` (default 20).
//!
//! ```text
//! cargo build --release        # target/release/libptrain_plugin_{{lib}}.so
//! cargo test --release         # the unit tests below
//! ```
//!
//! and in the run's configuration (the reward loads the plugin; no `--plugins` needed):
//!
//! ```toml
//! [data]
//! kind = "prompts"
//!
//! [[grpo.rewards]]
//! name = "{{name}}"
//! kind = "plugin"
//! plugin = "{{name}}"
//!
//! [plugins.{{name}}]
//! target = 20
//! ```
//!
//! `PTRAIN_PLUGIN_PATH=$PWD/target/release ptrain run --config grpo.toml`

use ptrain_plugin_api::{
    bail, export_plugin, parse_options, Descriptor, HostApi, Plugin, PluginResult, RewardBatch, Threading,
};
use serde::Deserialize;

/// Options: the keys of `[plugins.{{name}}]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Options {
    /// The completion length, in characters, that scores 0 (the best).
    target: u32,
}

impl Default for Options {
    fn default() -> Options {
        Options { target: 20 }
    }
}

pub struct {{Type}} {
    target: f64,
}

impl Plugin for {{Type}} {
    // A worker plugin (its own thread) with no attachments: `.reward()` is what makes
    // `[[grpo.rewards]] kind = "plugin"` call `score`.
    const DESCRIPTOR: Descriptor = Descriptor::new(
        "{{name}}",
        env!("CARGO_PKG_VERSION"),
        "a GRPO reward: -abs(target - characters) per completion",
        Threading::Worker,
        &[],
    )
    .reward();

    fn new(options: serde_json::Value, _host: HostApi) -> PluginResult<Self> {
        let options: Options = parse_options(options)?;
        // A bad option is refused here: the run stops before training (exit 2).
        if options.target == 0 {
            bail!("target = 0: must be at least 1 character");
        }
        Ok({{Type}} { target: options.target as f64 })
    }

    /// One score per completion, in the batch's order. Also at hand:
    /// `batch.prompt(i)` (a JSON string, or a list of chat messages),
    /// `batch.ids(i)` (the token ids), `batch.column("answer")` (a column of the
    /// prompts' rows, one value per completion), `batch.step`. An error (or panic)
    /// fails the run, as a raising reward function fails TRL's.
    fn score(&mut self, batch: &RewardBatch<'_>) -> PluginResult<Vec<Option<f64>>> {
        let scores = (0..batch.len())
            .map(|i| {
                let characters = batch.completion(i).chars().count() as f64;
                Some(-(self.target - characters).abs())
            })
            .collect();
        Ok(scores)
    }
}

export_plugin!({{Type}});

#[cfg(test)]
mod tests {
    use ptrain_plugin_api::OwnedRewardBatch;

    use super::*;

    #[test]
    fn scores_each_completion_by_its_length() {
        let options = serde_json::json!({ "target": 5 });
        let mut plugin = {{Type}}::new(options, HostApi::standalone()).unwrap();
        let batch = OwnedRewardBatch::texts(&["2+2?", "2+2?"], &["four!", "héllo world"]);
        let scores = batch.view(|batch| plugin.score(batch)).unwrap();
        assert_eq!(scores, vec![Some(0.0), Some(-6.0)]);
    }

    #[test]
    fn a_zero_target_is_refused() {
        let err = {{Type}}::new(serde_json::json!({ "target": 0 }), HostApi::standalone()).err().unwrap();
        assert!(err.message().starts_with("target = 0"), "{err}");
    }
}
