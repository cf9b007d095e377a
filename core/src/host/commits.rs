//! Whether a worker plugin may still commit a checkpoint (`HostApi::commit_checkpoint`):
//! once the host gives a plugin's save up, nothing it staged may become a checkpoint,
//! so the summary, written after, never misses one that lands late.

use std::{
    collections::HashMap,
    sync::{Condvar, Mutex},
    time::{Duration, Instant},
};

#[derive(Default)]
struct Commits {
    /// The host gave this plugin's saves up: no commit may begin.
    closed: bool,
    /// The step whose commit is running now.
    running: Option<u64>,
}

/// Per plugin, by name: its commits, opened by `begin`, ended by `end`, closed for
/// good by `close`.
#[derive(Default)]
pub struct CommitGates {
    plugins: Mutex<HashMap<String, Commits>>,
    ended: Condvar,
}

impl CommitGates {
    /// Whether `plugin` may commit `step` now; if so its commit counts as running
    /// until [`CommitGates::end`].
    pub fn begin(&self, plugin: &str, step: u64) -> bool {
        let mut plugins = self.plugins.lock().expect("commit gates");
        let commits = plugins.entry(plugin.to_string()).or_default();
        if commits.closed {
            return false;
        }
        commits.running = Some(step);
        true
    }

    pub fn end(&self, plugin: &str) {
        if let Some(commits) = self.plugins.lock().expect("commit gates").get_mut(plugin) {
            commits.running = None;
        }
        self.ended.notify_all();
    }

    /// No commit of `plugin` may begin from now on. A commit already running is
    /// waited for at most `wait` (a rename and two fsyncs: it ends at once unless
    /// the filesystem hangs); its step is returned if it was still running then,
    /// for the summary to say it may land after.
    pub fn close(&self, plugin: &str, wait: Duration) -> Option<u64> {
        let deadline = Instant::now() + wait;
        let mut plugins = self.plugins.lock().expect("commit gates");
        plugins.entry(plugin.to_string()).or_default().closed = true;
        loop {
            let running = plugins.get(plugin).and_then(|c| c.running);
            let now = Instant::now();
            if running.is_none() || now >= deadline {
                return running;
            }
            plugins = self.ended.wait_timeout(plugins, deadline - now).expect("commit gates").0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_gate_refuses_commits_and_reports_one_still_running() {
        let gates = CommitGates::default();
        assert!(gates.begin("checkpoint", 5));
        gates.end("checkpoint");
        assert_eq!(gates.close("checkpoint", Duration::ZERO), None);
        assert!(!gates.begin("checkpoint", 10), "closed: no commit may begin");
        assert!(gates.begin("other", 10), "gates are per plugin");
        assert_eq!(gates.close("other", Duration::from_millis(20)), Some(10), "still running after the wait");
    }

    #[test]
    fn closing_waits_for_a_commit_that_ends() {
        let gates = std::sync::Arc::new(CommitGates::default());
        assert!(gates.begin("checkpoint", 5));
        let ender = {
            let gates = gates.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                gates.end("checkpoint");
            })
        };
        assert_eq!(gates.close("checkpoint", Duration::from_secs(60)), None);
        ender.join().unwrap();
    }
}
