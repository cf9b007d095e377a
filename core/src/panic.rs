//! Panics in the core turned into values: the training loop and the data workers
//! run under [`catching`], so a panic (a tch op that failed in libtorch, a bug)
//! ends the run through its normal end (summary, sinks drained, exit 1) instead of
//! ending the process with exit 101 and nothing written.
//!
//! A panic hook, installed once, records the message and location of a panic on a
//! thread inside [`catching`] and logs them as an error line instead of the
//! default `thread '...' panicked` text; panics elsewhere go to the previous hook.

use std::{
    any::Any,
    cell::{Cell, RefCell},
    panic::{self, AssertUnwindSafe},
    sync::Once,
};

/// A caught panic: its message and where it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Panic {
    pub message: String,
    /// `file:line:column`, when the hook saw it.
    pub location: Option<String>,
}

impl std::fmt::Display for Panic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.location {
            Some(at) => write!(f, "panic at {at}: {}", self.message),
            None => write!(f, "panic: {}", self.message),
        }
    }
}

thread_local! {
    /// Whether this thread is inside [`catching`].
    static CATCHING: Cell<bool> = const { Cell::new(false) };
    /// The last panic the hook saw on this thread inside [`catching`].
    static LAST: RefCell<Option<Panic>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

fn install_hook() {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !CATCHING.with(Cell::get) {
                return previous(info);
            }
            let caught = Panic { message: message(info.payload()), location: info.location().map(|l| l.to_string()) };
            let thread = std::thread::current();
            tracing::error!("{caught} (thread {})", thread.name().unwrap_or("unnamed"));
            LAST.with(|last| *last.borrow_mut() = Some(caught));
        }));
    });
}

fn message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with no message".into()
    }
}

/// Runs `f`, returning a panic in it as a [`Panic`]. What `f` touched may be left
/// half-updated: callers only read counters afterwards and end the run.
pub fn catching<T>(f: impl FnOnce() -> T) -> Result<T, Panic> {
    install_hook();
    let outer = CATCHING.with(|c| c.replace(true));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(outer));
    result
        .map_err(|payload| LAST.with(|last| last.borrow_mut().take()).unwrap_or_else(|| Panic { message: message(payload.as_ref()), location: None }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_value_with_its_location() {
        let caught = catching(|| -> u32 { panic!("boom {}", 7) }).unwrap_err();
        assert_eq!(caught.message, "boom 7");
        assert!(caught.location.as_deref().is_some_and(|l| l.contains("panic.rs")), "{caught:?}");
        assert_eq!(catching(|| 3), Ok(3));
    }

    #[test]
    fn nested_catching_restores_the_outer_state() {
        let outer = catching(|| {
            let inner = catching(|| panic!("inner"));
            assert_eq!(inner.unwrap_err().message, "inner");
            panic!("outer")
        });
        assert_eq!(outer.map(|_: ()| ()).unwrap_err().message, "outer");
        assert!(!CATCHING.with(Cell::get));
    }
}
