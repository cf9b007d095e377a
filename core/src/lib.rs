//! ptrain's core: configuration, data, models, the optimizer, the training loop and
//! the hook points plugins attach to.
//!
//! The loop never pays for what is not due: every periodic action (core or plugin)
//! is scheduled behind one step gate (see [`schedule`]), the loss stays on the device
//! until something reads it, and I/O happens on plugin worker threads.

pub mod config;
pub use ptrain_checkpoint as checkpoint;
pub mod data;
pub mod device;
pub mod dist;
pub mod error;
pub mod host;
pub mod model;
pub mod objective;
pub mod optim;
pub mod panic;
mod resolve;
pub mod rng;
pub mod rollout;
pub mod schedule;
pub mod trainer;

pub use config::{Config, ConfigBuilder};
pub use error::{ConfigError, Error, Result};
pub use trainer::{Outcome, Resume, Summary, Trainer};
