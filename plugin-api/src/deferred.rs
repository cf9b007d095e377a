// sabi_trait expands to impls inside consts.
#![allow(non_local_definitions)]

//! Deferred work: a job an inline plugin hands the host to run off the training
//! thread ([`crate::HostApi::defer`]), so that no plugin starts a thread of its own.
//! Added in 0.3.0.

use abi_stable::{
    sabi_trait,
    std_types::{RBox, RResult, RString},
};

use crate::{plugin::guard, PluginResult};

/// A job as it crosses the boundary: the host calls `run` once, on its deferred-work
/// thread. Plugins build one through [`crate::HostApi::defer`], which guards it (an error
/// or a panic comes back as an error string, never as an unwind).
#[sabi_trait]
pub trait FfiDeferred: Send {
    fn run(&mut self) -> RResult<(), RString>;
}

pub type DeferredBox = FfiDeferred_TO<'static, RBox<()>>;

/// A closure run at most once: what [`crate::HostApi::defer`] hands over.
pub(crate) struct RunOnce<F>(pub(crate) Option<F>);

impl<F: FnOnce() -> PluginResult + Send> FfiDeferred for RunOnce<F> {
    fn run(&mut self) -> RResult<(), RString> {
        match self.0.take() {
            Some(job) => guard(job),
            None => RResult::ROk(()),
        }
    }
}
