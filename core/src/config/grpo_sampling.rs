//! `[grpo]`'s checks when the run samples its completions (`data.kind = "prompts"`):
//! a built-in reward for each `[[grpo.rewards]]`. Sampling runs under every rank count,
//! ZeRO stage, LoRA and precision (docs/rl.md, "Ranks, ZeRO, LoRA, bf16").

use super::{combinations::bad, grpo::RewardKind, Config};
use crate::error::Error;

impl Config {
    pub(super) fn validate_sampling(&self) -> Result<(), Error> {
        // The keys' ranges (config/ranges.rs) are checked already.
        let grpo = &self.grpo;
        if grpo.rewards.is_empty() {
            return Err(bad(
                "grpo.rewards",
                "sampled completions need at least one [[grpo.rewards]] with a kind (regex, exact, length, command, plugin)",
            ));
        }
        for reward in &grpo.rewards {
            self.validate_reward(reward)?;
        }
        Ok(())
    }

    fn validate_reward(&self, reward: &super::RewardSpec) -> Result<(), Error> {
        let name = &reward.name;
        let pattern = |p: &Option<String>| match p {
            Some(p) => regex::Regex::new(p).map(|_| ()).map_err(|e| bad("grpo.rewards.pattern", format!("{name:?}: {e}"))),
            None => Ok(()),
        };
        match reward.kind {
            None => Err(bad(
                "grpo.rewards.kind",
                format!("{name:?} needs a kind when the run samples: \"regex\", \"exact\", \"length\", \"command\" or \"plugin\""),
            )),
            Some(RewardKind::Regex) if reward.pattern.is_none() => {
                Err(bad("grpo.rewards.pattern", format!("{name:?}: a regex reward needs a pattern")))
            }
            Some(RewardKind::Length) if reward.target.is_none_or(|t| t == 0) => {
                Err(bad("grpo.rewards.target", format!("{name:?}: a length reward needs a target length of at least 1 token")))
            }
            Some(RewardKind::Regex | RewardKind::Exact) => pattern(&reward.pattern),
            Some(RewardKind::Length) => Ok(()),
            Some(RewardKind::Command) if reward.command.as_ref().is_none_or(|c| c.is_empty()) => Err(bad(
                "grpo.rewards.command",
                format!("{name:?}: a command reward needs its program and arguments, e.g. command = [\"python3\", \"reward.py\"]"),
            )),
            Some(RewardKind::Plugin) if reward.plugin.as_ref().is_none_or(|p| p.is_empty()) => {
                Err(bad("grpo.rewards.plugin", format!("{name:?}: a plugin reward names its plugin, e.g. plugin = \"my-reward\"")))
            }
            Some(RewardKind::Command | RewardKind::Plugin) if reward.timeout_s.is_some_and(|t| !(t > 0.0 && t.is_finite())) => {
                Err(bad("grpo.rewards.timeout_s", format!("{name:?}: must be a positive number of seconds")))
            }
            Some(RewardKind::Command) => {
                let program = reward.command.as_ref().and_then(|c| c.first()).map_or("", String::as_str);
                runnable(program).map_err(|why| bad("grpo.rewards.command", format!("{name:?}: `{program}` {why}")))
            }
            // Loaded, and a reward plugin: checked when the plugins are (`reward::plugin::check`).
            Some(RewardKind::Plugin) => Ok(()),
        }
    }
}

/// Whether `program` can be started as `Command::new` would find it (a path, or a name
/// on `PATH`): checked with the configuration, so a reward command that cannot start is
/// refused before the run directory is claimed.
fn runnable(program: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if program.contains('/') {
        let path = std::path::Path::new(program);
        return match path.exists() {
            false => Err("does not exist".into()),
            true if executable(path) => Ok(()),
            true => Err("is not an executable file (chmod +x it, or name its interpreter first)".into()),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    match std::env::split_paths(&path).any(|dir| executable(&dir.join(program))) {
        true => Ok(()),
        false => Err("is not found on PATH".into()),
    }
}
