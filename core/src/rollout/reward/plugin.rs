//! `kind = "plugin"`: a reward computed by a reward plugin (`Descriptor::reward`,
//! `Plugin::score` in plugin-api), loaded by the reward itself (`Config::plugins_to_load`).
//! Each sampled micro-batch is queued to the plugin's worker thread when it is submitted
//! (right after sampling, so the plugin scores while the next micro-batch samples) and
//! its answer waited for when collected, at most `timeout_s`: the advantages need it.
//!
//! A plugin that returns an error or panics (then disabled, as any failing plugin, and
//! listed under `plugin_failures`), answers no scores in time, or a wrong count fails
//! the run (exit 1, summary.json naming the reward and what happened), critical or
//! not: advantages without one of the rewards would train on other numbers than the
//! ones asked for, as a raising reward function fails TRL's run. `critical` adds the
//! plugin rules' stop to that (its failure or stall anywhere, in any hook, ends the run).

use std::{
    collections::VecDeque,
    sync::mpsc::{Receiver, RecvTimeoutError},
    time::{Duration, Instant},
};

use ptrain_plugin_api::OwnedRewardBatch;

use super::ScoreBatch;
use crate::{
    config::{Config, DataKind, RewardKind, RewardSpec},
    error::{ConfigError, Error, Result},
    host::{PluginHost, RewardClient, Scores},
};

pub struct PluginReward {
    name: String,
    plugin: String,
    client: RewardClient,
    timeout: Duration,
    /// The answers of the batches submitted and not collected yet, oldest first.
    pending: VecDeque<Receiver<Scores>>,
}

/// Refuses, before any record of the run is written, a `kind = "plugin"` reward whose
/// plugin is not a loaded worker plugin with a reward hook (exit 2).
pub fn check(config: &Config, host: &PluginHost) -> Result<()> {
    if config.data.kind != DataKind::Prompts {
        return Ok(());
    }
    for spec in config.grpo.rewards.iter().filter(|r| r.kind == Some(RewardKind::Plugin)) {
        PluginReward::connect(spec, host, 0.0)?;
    }
    Ok(())
}

impl PluginReward {
    /// The reward `spec` on its plugin in `host`; `timeout_s`: the longest wait for an answer.
    pub fn connect(spec: &RewardSpec, host: &PluginHost, timeout_s: f64) -> Result<PluginReward> {
        let plugin = spec.plugin.clone().unwrap_or_default();
        let client = host.reward_client(&plugin).map_err(|why| {
            Error::from(ConfigError { origin: "configuration".into(), key: "grpo.rewards.plugin".into(), message: format!("{:?}: {why}", spec.name) })
        })?;
        let timeout = Duration::from_secs_f64(timeout_s);
        Ok(PluginReward { name: spec.name.clone(), plugin, client, timeout, pending: VecDeque::new() })
    }

    /// Queues `batch` to the plugin's worker thread.
    pub fn submit(&mut self, batch: &ScoreBatch) {
        let owned = OwnedRewardBatch {
            step: batch.step,
            prompts: batch.prompts.iter().map(|p| p.to_string()).collect(),
            completions: batch.texts.clone(),
            completion_ids: batch.completion_ids.clone(),
            columns_json: serde_json::Value::Object(batch.columns.clone()).to_string(),
        };
        let answer = self.client.submit(owned);
        self.pending.push_back(answer);
    }

    /// The scores of the oldest batch submitted (`expected` completions), waited for at
    /// most `timeout_s`.
    pub fn collect(&mut self, expected: usize) -> Result<Vec<f64>> {
        let Some(answer) = self.pending.pop_front() else {
            return Err(self.failed("no batch was submitted".into()));
        };
        let started = Instant::now();
        match answer.recv_timeout(self.timeout) {
            Ok(Ok(scores)) if scores.len() == expected => Ok(scores),
            Ok(Ok(scores)) => Err(self.failed(format!("{} scores for {expected} completions", scores.len()))),
            Ok(Err(error)) => Err(self.failed(format!("failed: {error}"))),
            Err(RecvTimeoutError::Disconnected) => Err(self.failed("gave no answer: its worker was given up on".into())),
            Err(RecvTimeoutError::Timeout) => {
                let waited = started.elapsed().as_secs_f64();
                Err(self.failed(format!("no answer within timeout_s = {} s (waited {waited:.1} s)", self.timeout.as_secs_f64())))
            }
        }
    }

    fn failed(&self, what: String) -> Error {
        Error::Other(format!("[[grpo.rewards]] {:?} (plugin `{}`): {what}", self.name, self.plugin))
    }
}
