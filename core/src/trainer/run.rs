//! What a run holds between set-up and its summary, grouped by who owns it. Each
//! part is a component with its own file and tests; `Run`'s methods (in `setup`,
//! `step` and `finish` only) wire them together.

use std::{path::PathBuf, sync::Arc};

use tch::Device;

use super::{
    batches::StepBatches,
    debug::{Faults, TensorDump},
    eval::Evaluator,
    learner::Learner,
    metrics::MetricsProcessor,
    nonfinite::NonFinite,
    stop::StopControl,
    tally::Tally,
};
use crate::{
    config::Config,
    dist::DataParallel,
    host::{PluginHost, RunData},
    objective::Objective,
    schedule::RunSchedule,
};

/// One training run: set up by [`Run::setup`](super::setup), driven by
/// [`Run::train`](super::step), ended by [`Run::finish`](super::finish).
pub(super) struct Run {
    pub env: RunEnv,
    pub learner: Learner,
    /// What training minimises, chosen at set-up.
    pub objective: Box<dyn Objective>,
    /// The step's micro-batches, from the data loader.
    pub batches: StepBatches,
    pub evaluator: Evaluator,
    /// When each periodic thing is due: the plugins' attachments and the core's
    /// own work. The run plans its steps; the host delivers what is due.
    pub schedule: RunSchedule,
    pub host: PluginHost,
    /// This process's part in data-parallel training ([`crate::dist::SingleRank`] alone).
    pub dist: Box<dyn DataParallel>,
    pub tally: Tally,
    pub metrics: MetricsProcessor,
    pub nonfinite: NonFinite,
    pub stop: StopControl,
    /// `[debug]` faults injected into the loop, and tensors dumped.
    pub faults: Faults,
    pub dump: TensorDump,
}

/// What the run is: fixed at set-up.
pub(super) struct RunEnv {
    pub config: Config,
    pub run_dir: PathBuf,
    pub rank: u32,
    pub world: u32,
    pub device: Device,
    /// The step the run resumes after (0 for a fresh run) and its last step.
    pub start_step: u64,
    pub total_steps: u64,
    /// The run as plugins are told about it.
    pub run_data: Arc<RunData>,
    pub resumed_from: Option<String>,
    /// LoRA: the hash of the frozen base weights, kept in every checkpoint.
    pub lora_base: Option<String>,
    /// Every parameter, trainable or frozen (LoRA's base).
    pub all_params: u64,
    pub setup_s: f64,
    /// Unix time when training (not set-up) started.
    pub unix_start: f64,
    /// Rank 0's lock on the run directory, released when the run is dropped.
    pub _lock: Option<super::run_dir::RunLock>,
}
