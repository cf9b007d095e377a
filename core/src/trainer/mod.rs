//! The trainer: set-up, the loop, and what happens at its end. `Run` (`run`) holds
//! the run's components, each in a file of its own with its own tests, and only
//! `setup`, `step` and `finish` implement `Run`, wiring the components together:
//!
//! - `run_dir`: the run directory's lock, and the guard against starting over in
//!   a directory that holds checkpoints (`--overwrite` moves them aside);
//! - `setup`: resume, device, data, model, optimizer, plugins and their schedule;
//! - `step`: the loop (`train`), one optimizer step (`train_step`), and what a due
//!   step does after the update;
//! - `step_core`: the core of a step (micro-batches in; forward, objective, backward,
//!   the non-finite flag, the reduction, clipping and the update; losses and counters
//!   out, on the device), which is what a CUDA graph captures; `observed`: the timer,
//!   hooks and `[debug]` tools at its seams in the eager loop;
//! - `finish`, `summary`, `memory`: the end of the run, however it ended, and
//!   `summary.json` (with each rank's optimizer and gradient memory);
//!
//! and the components:
//!
//! - `learner`: the model, its data and its optimizer; the one place the model is
//!   called (`objective::Forward`), under the run's precision;
//! - `batches`: a step's micro-batches, fetched ahead when the objective counts units;
//! - `eval`: the held-out loss and metrics through the run's objective (`Evaluator`);
//! - `tally`: running totals, the step losses kept on the device;
//! - `metrics`: the core metrics, a `MetricBatch` built from the tally when due, and
//!   progress lines (`MetricsProcessor`);
//! - `save`: what a checkpoint hands to the checkpoint plugins; `state`: the typed
//!   training state, and resuming;
//! - `hooks`: the context inline plugins get at a hook point;
//! - `nonfinite`, `stop`, `signals`: skipping non-finite updates, stopping early
//!   (agreed across ranks), and SIGINT/SIGTERM;
//! - `failure`: why a failed run failed (an error, a panic, out of memory);
//! - `debug`: `[debug]` tools for tests (faults injected, tensor dumps).
//!
//! A new component is a struct in a file of its own here with its own unit tests,
//! a field of `Run` made in `setup`, and a call from `step` or `finish`: it takes
//! what it needs as arguments, not the whole run.
//!
//! ```no_run
//! use ptrain_core::{config::Config, Trainer};
//! let outcome = Trainer::new(Config::default()).run()?;
//! println!("final loss {:?}", outcome.summary.final_loss);
//! # Ok::<(), ptrain_core::Error>(())
//! ```

mod batches;
mod clock;
mod debug;
mod ending;
mod eval;
mod failure;
mod finish;
mod forced;
mod hooks;
mod late_signal;
mod learner;
mod memory;
mod metrics;
mod nonfinite;
mod observed;
pub(crate) mod payload;
mod progress;
mod run;
pub mod run_dir;
mod save;
mod setup;
mod sharding;
mod signals;
mod state;
mod step;
mod step_core;
mod stop;
mod summary;
mod summary_write;
mod tally;
mod timing;

use std::{path::PathBuf, sync::Arc};

use tch::nn;

pub use failure::RunError;
pub(crate) use progress::eprint_line;
pub use signals::GRACE_ENV;
pub use state::{DataPosition, EvalRecord, RngScheme, TrainState};
pub use summary::{EvalPoint, OnDisk, PhaseSummary, Summary};

use crate::{
    config::Config,
    data::Dataset,
    dist::{DataParallel, SingleRank},
    error::Result,
    model::Model,
};

/// Builds a model under a `VarStore` path, given the dataset it will train on.
pub type ModelFactory = Box<dyn FnOnce(&nn::Path, &dyn Dataset) -> Result<Box<dyn Model>>>;

/// How a run ended.
#[derive(Debug)]
pub struct Outcome {
    pub summary: Summary,
    pub run_dir: PathBuf,
    /// 0 completed (or ended early by a plugin's `request_stop`), 130 SIGINT, 143
    /// SIGTERM, 1 failed (an error or a panic in training: `summary.error` says
    /// which), stopped on non-finite losses or by a plugin's failure,
    /// [`EXIT_PLUGIN_FAILED`] completed with a plugin failure under `run.strict_plugins`.
    pub exit_code: i32,
    /// Why `summary.json` could not be written (a full or read-only disk): the
    /// summary then exists only here, and the run exits 1 if it would have exited 0.
    pub summary_error: Option<String>,
}

/// The exit code of a run that completed while a plugin failed or was given up on
/// at the end, with `run.strict_plugins`.
pub const EXIT_PLUGIN_FAILED: i32 = 3;

/// Where to resume from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// A checkpoint directory, or a run / checkpoints directory (newest valid one).
    Path(PathBuf),
    /// The newest valid checkpoint in the run directory, if there is one.
    Auto,
}

pub struct Trainer {
    config: Config,
    model: Option<ModelFactory>,
    dataset: Option<Arc<dyn Dataset>>,
    resume: Option<Resume>,
    overwrite: bool,
    allow_batch_change: bool,
    handle_signals: bool,
    progress: bool,
    /// How this process takes part: one rank alone unless told otherwise.
    dist: Box<dyn DataParallel>,
}

impl Trainer {
    pub fn new(config: Config) -> Trainer {
        Trainer {
            config,
            model: None,
            dataset: None,
            resume: None,
            overwrite: false,
            allow_batch_change: false,
            handle_signals: false,
            progress: true,
            dist: Box::new(SingleRank),
        }
    }

    /// Trains your own model instead of `[model]`'s.
    pub fn with_model(mut self, factory: impl FnOnce(&nn::Path, &dyn Dataset) -> Result<Box<dyn Model>> + 'static) -> Trainer {
        self.model = Some(Box::new(factory));
        self
    }

    /// Trains on your own dataset instead of `[data]`'s.
    pub fn with_dataset(mut self, dataset: Arc<dyn Dataset>) -> Trainer {
        self.dataset = Some(dataset);
        self
    }

    pub fn resume(mut self, resume: Option<Resume>) -> Trainer {
        self.resume = resume;
        self
    }

    /// Starts over in a run directory that holds an earlier run's checkpoints,
    /// moving what it holds aside (see [`run_dir::guard`]); without it such a run
    /// is refused unless it resumes.
    pub fn overwrite(mut self, on: bool) -> Trainer {
        self.overwrite = on;
        self
    }

    /// Resumes a checkpoint whose global batch (`batch_size x accum_steps x ranks`)
    /// differs from this run's, with a warning; without it that is refused.
    pub fn allow_batch_change(mut self, on: bool) -> Trainer {
        self.allow_batch_change = on;
        self
    }

    /// SIGINT/SIGTERM finish the step, save an emergency checkpoint, flush the
    /// sinks and end the run with 130/143 (the CLI turns this on).
    pub fn handle_signals(mut self, on: bool) -> Trainer {
        self.handle_signals = on;
        self
    }

    pub fn progress(mut self, on: bool) -> Trainer {
        self.progress = on;
        self
    }

    /// Data-parallel training over a process group (see [`crate::dist`]).
    pub fn data_parallel(mut self, dist: Box<dyn DataParallel>) -> Trainer {
        self.dist = dist;
        self
    }

    pub fn run(self) -> Result<Outcome> {
        run::Run::setup(self)?.train()
    }
}
