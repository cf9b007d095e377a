//! What a run holds between set-up and its summary, grouped by who owns it.

use std::{path::PathBuf, sync::Arc};

use ptrain_plugin_api::{PhaseTimes, Task};
use tch::{nn, Device, Tensor};

use super::{batches::Staged, debug::Faults, metrics::MetricsProcessor, nonfinite::NonFinite, stop::StopControl, summary::EvalPoint};
use crate::{
    config::Config,
    data::{Batch, Dataset, Loader},
    dist::DataParallel,
    error::{Error, Result},
    host::{PluginHost, RunData},
    model::Model,
    optim::{LrSchedule, Optimizer},
    schedule::RunSchedule,
};

/// One training run: set up by [`Run::setup`](super::setup), driven by
/// [`Run::train`](super::step), ended by [`Run::finish`](super::finish).
pub(super) struct Run {
    pub env: RunEnv,
    pub learner: Learner,
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
    /// `[debug]` failures injected into the loop.
    pub faults: Faults,
    /// Micro-batches fetched ahead within a step.
    pub staged: Staged,
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

/// The model, what it trains on and what updates it.
pub(super) struct Learner {
    pub _vs: nn::VarStore,
    pub model: Box<dyn Model>,
    /// Trainable parameters, sorted by name.
    pub params: Vec<(String, Tensor)>,
    /// Replicated or sharded across the ranks.
    pub optimizer: Box<dyn Optimizer>,
    /// The learning rate at each step (not the run's hook schedule, `Run::schedule`).
    pub lr_schedule: LrSchedule,
    pub task: Task,
    pub dataset: Arc<dyn Dataset>,
    /// Taken at the end, which stops its threads.
    pub loader: Option<Loader>,
    /// `precision = "bf16"`: the forward pass runs in autocast to bfloat16 on this
    /// device type (`Some(true)` CUDA, `Some(false)` the CPU).
    pub autocast: Option<bool>,
    /// Reseed torch's generator from (seed, step) each step (the model draws random
    /// numbers), so a resumed run draws what the uninterrupted one drew.
    pub reseed: bool,
}

impl Learner {
    /// The model's logits, under autocast when the run is in bf16. The loss is
    /// computed from them in float32 (see [`crate::model::loss`]).
    /// A language model's hidden states and output projection (see
    /// [`Model::forward_hidden`]), under autocast like [`Learner::forward`].
    pub fn forward_hidden(&mut self, batch: &Batch, train: bool) -> Result<Option<(Tensor, Tensor)>> {
        let model = &mut self.model;
        let mut run = || model.forward_hidden(&batch.inputs, batch.segments.as_ref(), train);
        match self.autocast {
            None => run(),
            Some(cuda) => ptrain_torch_ext::autocast_bf16(cuda, run).map_err(|e| Error::Other(format!("autocast: {e}")))?,
        }
    }

    /// The logits of a batch: packed sequences through `forward_packed`.
    pub fn forward(&mut self, batch: &Batch, train: bool) -> Result<Tensor> {
        let model = &mut self.model;
        let mut run = || match &batch.segments {
            None => model.forward(&batch.inputs, train),
            Some(segments) => model.forward_packed(&batch.inputs, segments, train),
        };
        match self.autocast {
            None => run(),
            Some(cuda) => ptrain_torch_ext::autocast_bf16(cuda, run).map_err(|e| Error::Other(format!("autocast: {e}")))?,
        }
    }
}

/// Running totals, read by hook contexts, metrics, checkpoints and the summary.
#[derive(Default)]
pub(super) struct Tally {
    /// Samples and tokens in one optimizer step on one rank.
    pub step_samples: u64,
    pub step_tokens: u64,
    /// Over every rank, since the start of training (resumed runs included).
    pub samples_seen: u64,
    pub tokens_seen: u64,
    /// Instruction data: trained tokens (targets that are not -100) on this rank,
    /// in all and in the current step.
    pub trained_tokens: u64,
    pub step_trained_tokens: u64,
    pub phases_total: PhaseTimes,
    /// Time spent in inline plugins' step hooks, kept out of the phases.
    pub hooks_total_s: f64,
    /// Device scalars, read only when something reports them.
    pub first_loss: Option<Tensor>,
    pub last_loss: Option<Tensor>,
    pub last_grad_norm: Option<Tensor>,
    /// Sums of the step losses on the device: [0] since the last `train/loss`,
    /// [1] since the last progress line. One in-place add a step, no sync.
    pub loss_sums: Option<Tensor>,
    pub evals: Vec<EvalPoint>,
    /// Time the loop waited for a previous save to finish.
    pub checkpoint_wait_s: f64,
    /// The step of the last checkpoint handed to the checkpoint plugins.
    pub last_save_step: Option<u64>,
}

impl Tally {
    /// The mean step loss since the last read of `slot` (see `loss_sums`) over
    /// `steps` steps, and the sum started again. A host sync; NaN before any step.
    pub fn take_mean_loss(&mut self, slot: i64, steps: u64) -> f64 {
        let Some(sums) = &self.loss_sums else { return f64::NAN };
        let mut sum = sums.get(slot);
        let value = sum.double_value(&[]);
        let _ = sum.f_zero_();
        value / steps.max(1) as f64
    }

    /// Counts one finished optimizer step over `world` ranks.
    pub fn count_step(&mut self, world: u64, phases: &PhaseTimes, hooks_s: f64, loss: Tensor) {
        self.phases_total = self.phases_total.plus(phases);
        self.hooks_total_s += hooks_s;
        self.samples_seen += self.step_samples * world;
        self.tokens_seen += self.step_tokens * world;
        if self.first_loss.is_none() {
            self.first_loss = Some(loss.shallow_clone());
        }
        match &mut self.loss_sums {
            // A failed add shows as a wrong mean, never as a failed step.
            Some(sums) => drop(sums.f_add_(&loss)),
            None => self.loss_sums = loss.f_to_kind(tch::Kind::Double).and_then(|l| l.f_repeat([2])).ok(),
        }
        self.last_loss = Some(loss);
    }
}
