//! What a run holds between set-up and its summary, grouped by who owns it.

use std::{path::PathBuf, sync::Arc};

use ptrain_plugin_api::PhaseTimes;
use tch::{nn, Device, Tensor};

use super::{batches::Staged, debug::Faults, metrics::MetricsProcessor, nonfinite::NonFinite, stop::StopControl, summary::EvalPoint};
use crate::{
    config::Config,
    data::{Batch, Dataset, Loader},
    dist::DataParallel,
    error::{Error, Result},
    host::{PluginHost, RunData},
    model::{Model, ModelInput, ModelOutput, Returns},
    objective::{add_metrics, Forward, Metrics, Objective},
    optim::{LrSchedule, Optimizer},
    schedule::RunSchedule,
};

/// One training run: set up by [`Run::setup`](super::setup), driven by
/// [`Run::train`](super::step), ended by [`Run::finish`](super::finish).
pub(super) struct Run {
    pub env: RunEnv,
    pub learner: Learner,
    /// What training minimises, chosen at set-up.
    pub objective: Box<dyn Objective>,
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

/// The model, run under autocast when the run is in bf16 (the objective computes
/// its loss in float32: see [`crate::objective::cross_entropy`]). The one place the
/// trainer calls the model.
impl Forward for Learner {
    /// A language model's hidden states and output projection (see
    /// [`Returns::Hidden`]), under autocast like [`Forward::forward`]; `None` when
    /// the model has no such split (the loss is then computed from the logits).
    fn forward_hidden(&mut self, batch: &Batch, train: bool) -> Result<Option<(Tensor, Tensor)>> {
        if !self.model.supports().hidden {
            return Ok(None);
        }
        match self.output(batch, train, Returns::Hidden)? {
            ModelOutput::Hidden { states, head } => Ok(Some((states, head))),
            ModelOutput::Logits(_) => Err(Error::Other(format!("model {:?} returned logits when asked for hidden states", self.model.kind()))),
        }
    }

    /// The logits of a batch (its packed rows included).
    fn forward(&mut self, batch: &Batch, train: bool) -> Result<Tensor> {
        self.output(batch, train, Returns::Logits)?.logits()
    }
}

impl Learner {
    /// The model's forward over a batch (its packed rows included), under autocast
    /// when the run is in bf16.
    pub fn output(&mut self, batch: &Batch, train: bool, returns: Returns) -> Result<ModelOutput> {
        let model = &mut self.model;
        if batch.segments.is_some() && !model.supports().segments {
            return Err(Error::Other(format!("model.kind {:?} cannot train on packed sequences (data.packing = true)", model.kind())));
        }
        let mut run = || model.forward(ModelInput::new(&batch.inputs, train).segments(batch.segments.as_ref()).returns(returns));
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
    /// Instruction data: trained tokens (the units its objective counts) on this rank.
    pub trained_tokens: u64,
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
    /// Sums of the objective's step metrics on the device since the last
    /// emission (empty for objectives without any).
    pub metric_sums: Metrics,
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

    /// The objective's metrics since the last emission, each summed over the steps
    /// (device scalars, not read here), and the sums started again.
    pub fn take_metric_sums(&mut self) -> Metrics {
        std::mem::take(&mut self.metric_sums)
    }

    /// Counts one finished optimizer step over `world` ranks.
    pub fn count_step(&mut self, world: u64, phases: &PhaseTimes, hooks_s: f64, loss: Tensor, metrics: Metrics) {
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
        if !metrics.is_empty() {
            // As the loss: a failed add shows as a wrong mean.
            drop(add_metrics(&mut self.metric_sums, metrics));
        }
        self.last_loss = Some(loss);
    }
}
