//! The run's waits on checkpoint saves handed to worker plugins, each bounded: a
//! writer stuck in I/O is given up rather than holding the run.

use std::{
    sync::{Condvar, Mutex},
    time::{Duration, Instant},
};

use super::{PluginHost, Runner};

/// How long giving a save up waits for a commit already running (a rename and two
/// fsyncs) to end.
const COMMIT_WAIT: Duration = Duration::from_secs(1);

/// Saves handed to the worker and not yet finished; the host waits on it before
/// starting the next save, so saves never overlap and none is dropped.
#[derive(Default)]
pub struct SaveTracker {
    in_flight: Mutex<u64>,
    done: Condvar,
}

impl SaveTracker {
    pub(super) fn begin(&self) {
        *self.in_flight.lock().expect("tracker lock") += 1;
    }

    pub(super) fn end(&self) {
        *self.in_flight.lock().expect("tracker lock") -= 1;
        self.done.notify_all();
    }

    /// Waits until no save is in flight, `deadline` passes or `interrupted` says to
    /// stop waiting; returns whether none is in flight.
    pub fn wait_idle_until(&self, deadline: Instant, interrupted: &dyn Fn() -> bool) -> bool {
        let mut n = self.in_flight.lock().expect("tracker lock");
        while *n > 0 {
            let now = Instant::now();
            if now >= deadline || interrupted() {
                return false;
            }
            // Short waits, so a signal is noticed at once.
            n = self.done.wait_timeout(n, (deadline - now).min(Duration::from_millis(50))).expect("tracker lock").0;
        }
        true
    }
}

impl PluginHost {
    /// Waits for the checkpoints handed to worker plugins to be written: each
    /// plugin for at most its `finish_timeout_s`, all for at most `shutdown`, with a
    /// warning at its `hook_warn_s`. A save still being written then (a writer stuck
    /// in I/O: a frozen mount, a hung NFS server) is abandoned: the plugin is
    /// disabled (listed in `plugin_failures`, its unhandled events in
    /// `abandoned_plugins`) and gets no more saves; the run goes on. `step`: the
    /// step whose save is about to be handed over, or the run's last. `interrupted`
    /// (a signal at the end of the run) ends the wait without giving the save up: the
    /// summary is written first, and the plugins' end waits for the rest.
    pub fn wait_saves(&mut self, step: u64, shutdown: Duration, interrupted: &dyn Fn() -> bool) {
        let started = Instant::now();
        for index in 0..self.instances.len() {
            let instance = &self.instances[index];
            let Runner::Worker(worker) = &instance.runner else { continue };
            if instance.failed {
                continue;
            }
            let limit = instance.finish_timeout.min(shutdown);
            if worker.wait_saves_until(started + instance.hook_warn.min(limit), interrupted) {
                continue;
            }
            let name = instance.info.name.clone();
            if interrupted() {
                tracing::warn!("a signal: no longer waiting for plugin `{name}`'s save here; the summary is written first");
                return;
            }
            if instance.hook_warn < limit {
                tracing::warn!(
                    "waiting for plugin `{name}` to finish writing a checkpoint ({:.0}s so far; stuck in I/O?): \
                     training waits at most {:.0}s (plugins.{name}.finish_timeout_s, run.shutdown_timeout_s), then gives the save up",
                    started.elapsed().as_secs_f64(),
                    limit.as_secs_f64()
                );
                if worker.wait_saves_until(started + limit, interrupted) {
                    continue;
                }
                if interrupted() {
                    tracing::warn!("a signal: no longer waiting for plugin `{name}`'s save here; the summary is written first");
                    return;
                }
            }
            let Runner::Worker(worker) = &mut self.instances[index].runner else { continue };
            let unhandled = worker.abandon();
            // What it staged may no longer become a checkpoint: the summary, written
            // after this, would not know of it.
            let late = match self.services.commits.close(&name, COMMIT_WAIT) {
                Some(step) => format!("; its commit of step {step} was still running and may yet land"),
                None => String::new(),
            };
            let why = format!(
                "a checkpoint save did not finish within {:.0}s (plugins.{name}.finish_timeout_s, run.shutdown_timeout_s): \
                 abandoned, with {unhandled} event(s) never handled{late}",
                limit.as_secs_f64()
            );
            tracing::error!("plugin `{name}`: {why}; the plugin is disabled and takes no more saves");
            *self.abandoned.entry(name).or_default() += unhandled;
            self.record_failure(index, "checkpoint", step, why);
        }
    }
}
