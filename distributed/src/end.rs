//! The end of a run, agreed through the rendezvous store rather than a collective:
//! a collective waits at most `dist.timeout_s`, and rank 0 reaches the end only
//! after waiting for its final save and its plugins' drain, which may take longer
//! (a large checkpoint on a slow disk). These waits have their own timeout,
//! `dist.end_timeout_s`, and poll the store, so a signal ends them too.
//!
//! Two stages: [`arrive`] returns once every rank has finished its end (saves
//! waited for, plugins ended), so rank 0 knows the run's outcome before it writes
//! the summary; [`release`] then lets the other ranks go, and keeps rank 0 (which
//! serves the store, unless torchrun's agent does) until they have read that.

use std::time::{Duration, Instant};

use crate::group::Group;

const ARRIVED: &str = "ptrain/end/arrived";
const ALL_ARRIVED: &str = "ptrain/end/all-arrived";
const RELEASED: &str = "ptrain/end/released";
const LEFT: &str = "ptrain/end/left";
const ALL_LEFT: &str = "ptrain/end/all-left";

/// How often a wait asks the store.
const POLL: Duration = Duration::from_millis(50);

/// Counts this rank at `counter`; the rank that completes the count (`expected`) sets `done`.
fn count_in(group: &Group, counter: &str, done: &str, expected: i64) -> Result<(), String> {
    if group.store_add(counter, 1)? == expected {
        group.store_set(done)?;
    }
    Ok(())
}

/// Why a wait ended without its key.
enum Unmet {
    TimedOut,
    Signalled,
    Store(String),
}

/// Waits until the store holds `key`, at most `timeout`, or until `cancelled`.
fn wait_for(group: &Group, key: &str, timeout: Duration, cancelled: &dyn Fn() -> bool) -> Result<(), Unmet> {
    let deadline = Instant::now() + timeout;
    loop {
        if group.store_check(key).map_err(Unmet::Store)? {
            return Ok(());
        }
        if cancelled() {
            return Err(Unmet::Signalled);
        }
        if Instant::now() >= deadline {
            return Err(Unmet::TimedOut);
        }
        std::thread::sleep(POLL);
    }
}

/// Waits until every rank has arrived here, at most `timeout`, or until `cancelled`.
pub fn arrive(group: &Group, timeout: Duration, cancelled: &dyn Fn() -> bool) -> Result<(), String> {
    let spec = group.spec();
    let world = i64::from(spec.world_size);
    count_in(group, ARRIVED, ALL_ARRIVED, world).map_err(|e| format!("rank {} could not reach the rendezvous store: {e}", spec.rank))?;
    wait_for(group, ALL_ARRIVED, timeout, cancelled).map_err(|unmet| {
        let arrived = group.store_add(ARRIVED, 0).map_or_else(|_| "not all".to_string(), |n| n.to_string());
        match unmet {
            Unmet::TimedOut => format!(
                "{arrived} of {world} ranks reached the end of the run within dist.end_timeout_s = {} (another rank exited or \
                 stopped answering)",
                timeout.as_secs()
            ),
            Unmet::Signalled => format!("a signal ended the wait for the other ranks ({arrived} of {world} had reached the end of the run)"),
            Unmet::Store(e) => format!("rank {} lost the rendezvous store (rank 0 exited?): {e}", spec.rank),
        }
    })
}

/// Rank 0 lets the others go and waits (at most `timeout`, or until `cancelled`)
/// until they have; the others wait for rank 0 to let them go.
pub fn release(group: &Group, timeout: Duration, cancelled: &dyn Fn() -> bool) -> Result<(), String> {
    let spec = group.spec();
    let unmet = |what: &str, unmet| match unmet {
        Unmet::TimedOut => format!("{what} within dist.end_timeout_s = {}", timeout.as_secs()),
        Unmet::Signalled => format!("{what}: a signal ended the wait"),
        Unmet::Store(e) => format!("{what}: {e}"),
    };
    if spec.rank == 0 {
        group.store_set(RELEASED)?;
        return wait_for(group, ALL_LEFT, timeout, cancelled).map_err(|u| unmet("the other ranks did not leave the end of the run", u));
    }
    wait_for(group, RELEASED, timeout, cancelled).map_err(|u| unmet("rank 0 did not finish the run", u))?;
    count_in(group, LEFT, ALL_LEFT, i64::from(spec.world_size) - 1)
}
