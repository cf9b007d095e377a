//! One training run: everything alive between set-up and the summary.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use abi_stable::std_types::{RSlice, RStr, RVec};
use ptrain_plugin_api::{
    CheckpointPayload, CheckpointReason, DeviceKind, Histogram, Hook, Metric, MetricBatch, NamedTensor, Needs, PhaseTimes, Scalar, StepContext,
    StepTensors, Task, TensorRef,
};
use tch::{nn, Device, Kind, Tensor};

use super::{
    payload, progress,
    summary::{EvalPoint, PhaseSummary, Summary},
    timing::PhaseClock,
    Resume, Trainer,
};
use crate::{
    config::{Config, NanPolicy, Precision},
    data::{loader::DrawPlan, BatchKey, Dataset, Loader, Split},
    device,
    dist::DataParallel,
    error::{Error, Result},
    hooks::{Cadence, CoreTask, Gate, Owner, Scheduler, SlotSpec, StepPlan, Ticker},
    host::{HostServices, PluginHost, RunData, RunEndData},
    model::{self, Model},
    optim::{LrSchedule, Optimizer},
    signals::Signals,
};

/// How a run ended.
#[derive(Debug)]
pub struct Outcome {
    pub summary: Summary,
    pub run_dir: PathBuf,
    /// 0 completed, 130 SIGINT, 143 SIGTERM, 1 stopped on non-finite losses.
    pub exit_code: i32,
}

/// Device-side non-finite bookkeeping: one flag per step in a ring, read every
/// `nonfinite_check_every` steps.
struct NonFinite {
    ring: Tensor,
    slots: Vec<Tensor>,
    one: Tensor,
    last_checked: u64,
    run: u64,
    total: u64,
    inject: Vec<u64>,
}

enum Stop {
    Signal(i32),
    Requested(String),
    NonFinite(String),
}

pub struct Run {
    config: Config,
    run_dir: PathBuf,
    rank: u32,
    world: u32,
    device: Device,
    device_name: String,
    dataset: Arc<dyn Dataset>,
    task: Task,
    _vs: nn::VarStore,
    model: Box<dyn Model>,
    params: Vec<(String, Tensor)>,
    optimizer: Optimizer,
    schedule: LrSchedule,
    loader: Option<Loader>,
    gate: Arc<Gate>,
    scheduler: Scheduler,
    host: PluginHost,
    services: &'static HostServices,
    signals: Option<Signals>,
    _ticker: Option<Ticker>,
    dist: Option<Box<dyn DataParallel>>,
    progress: progress::Progress,
    start_step: u64,
    total_steps: u64,
    autocast: bool,
    reseed: bool,
    nonfinite: NonFinite,
    resumed_from: Option<String>,
    /// A stop request seen by this rank, not yet agreed with the others.
    pending_stop: Option<Stop>,
    // Counters and measurements.
    step_samples: u64,
    step_tokens: u64,
    samples_seen: u64,
    tokens_seen: u64,
    phases_total: PhaseTimes,
    /// Time spent in step hooks (inline plugins), kept out of the phases.
    hooks_total_s: f64,
    last_emit: (Instant, u64, PhaseTimes),
    last_progress: (Instant, u64),
    first_loss: Option<Tensor>,
    last_loss: Option<Tensor>,
    last_grad_norm: Option<Tensor>,
    evals: Vec<EvalPoint>,
    checkpoint_wait_s: f64,
    run_data: Arc<RunData>,
    setup_s: f64,
    unix_start: f64,
    emitted: Vec<Metric>,
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn core_slot(task: CoreTask, cadence: Cadence) -> SlotSpec {
    SlotSpec { owner: Owner::Core(task), hook: Hook::StepEnd, cadence, needs: Needs::NONE }
}

fn run_dir(config: &Config) -> PathBuf {
    if !config.run.run_dir.is_empty() {
        return PathBuf::from(&config.run.run_dir);
    }
    let stamp = chrono_like_stamp();
    PathBuf::from("runs").join(format!("{}-{stamp}", config.run.name))
}

/// `YYYYmmdd-HHMMSS` in UTC, without a date-time dependency.
pub fn chrono_like_stamp() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}", rem / 3600, (rem % 3600) / 60, rem % 60)
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

impl NonFinite {
    /// Sets this step's flag to 1.0 when `loss` is NaN or infinite, in one kernel
    /// (libtorch's AMP check, which only ever sets it: the ring is zeroed when read,
    /// and each slot is used once between reads).
    fn flag(&mut self, step: u64, loss: &mut Tensor) -> &Tensor {
        let i = (step % self.slots.len() as u64) as usize;
        // Also multiplies the (detached) loss by one, in place.
        loss.internal_amp_non_finite_check_and_unscale(&mut self.slots[i], &self.one);
        &self.slots[i]
    }
}

/// Everything a hook's context says besides the tensors, copied out of the run so
/// the context does not borrow the run itself.
#[derive(Clone, Copy)]
struct Counters {
    epoch: u64,
    samples_seen: u64,
    tokens_seen: u64,
    step_samples: u64,
    step_tokens: u64,
    phases_total: PhaseTimes,
    steps_run: u64,
    elapsed_s: f64,
    rank: u32,
    world_size: u32,
}

/// Where in the run a hook is called.
#[derive(Clone, Copy)]
struct At {
    hook: Hook,
    step: u64,
    micro_batch: u64,
    lr: f64,
    phases: PhaseTimes,
}

fn context<'a>(run_data: &'a RunData, c: Counters, at: At, tensors: StepTensors, scalars: &'a [Scalar<'a>]) -> StepContext<'a> {
    let At { hook, step, micro_batch, lr, phases } = at;
    StepContext {
        hook,
        step,
        micro_batch,
        epoch: c.epoch,
        lr,
        samples_seen: c.samples_seen,
        tokens_seen: c.tokens_seen,
        step_samples: c.step_samples,
        step_tokens: c.step_tokens,
        phases,
        phases_total: c.phases_total,
        steps_run: c.steps_run,
        elapsed_s: c.elapsed_s,
        rank: c.rank,
        world_size: c.world_size,
        device: run_data.device(),
        scalars: RSlice::from_slice(scalars),
        tensors,
        params: RSlice::EMPTY,
        grads: RSlice::EMPTY,
    }
}

fn named<'a>(tensors: impl Iterator<Item = (&'a String, &'a Tensor)>) -> Vec<NamedTensor<'a>> {
    tensors.map(|(n, t)| NamedTensor { name: RStr::from_str(n), tensor: TensorRef::of(t) }).collect()
}

fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_owned(), source }
}

impl Run {
    pub fn setup(trainer: Trainer) -> Result<Run> {
        let started = Instant::now();
        let Trainer { config, model: model_factory, dataset, resume, handle_signals, progress: show_progress, dist } = trainer;
        let (rank, world, local_rank) = dist.as_ref().map_or((0, 1, 0), |d| (d.rank(), d.world_size(), d.local_rank()));
        let run_dir = run_dir(&config);
        if resume == Some(Resume::Auto) && config.run.run_dir.is_empty() {
            return Err(Error::Config(crate::error::ConfigError {
                origin: "--auto-resume".into(),
                key: "run.run_dir".into(),
                message: "auto-resume looks in the run directory: pass --run-dir".into(),
            }));
        }
        let resume_path = match &resume {
            Some(Resume::Path(p)) => Some(resolve_resume(p)?),
            Some(Resume::Auto) => {
                let (found, warnings) = ptrain_checkpoint::find_resumable(&ptrain_checkpoint::checkpoints_dir(&run_dir));
                for w in warnings {
                    tracing::warn!("{w}");
                }
                if found.is_none() {
                    tracing::info!("auto-resume: no checkpoint in {}, starting fresh", run_dir.display());
                }
                found
            }
            None => None,
        };
        let checkpoint = resume_path
            .as_deref()
            .map(ptrain_checkpoint::read)
            .transpose()
            .map_err(|e| Error::Checkpoint { path: resume_path.clone().unwrap_or_default(), message: e.to_string() })?;

        if config.run.threads > 0 {
            tch::set_num_threads(config.run.threads as i32);
        }
        tch::manual_seed(config.run.seed as i64);
        let device = device::select(config.run.device, local_rank as usize)?;
        let autocast = config.train.precision == Precision::Bf16 && device.is_cuda();
        if autocast {
            ptrain_torch_ext::cuda::autocast_bf16().map_err(|e| Error::Device { device: device::label(device), message: e.to_string() })?;
        } else if config.train.precision == Precision::Bf16 {
            tracing::warn!("precision = \"bf16\" autocasts on CUDA only; training in fp32 on the CPU");
        }

        let dataset = match dataset {
            Some(d) => d,
            None => crate::data::from_config(&config)?,
        };
        let vs = nn::VarStore::new(device);
        let model = match model_factory {
            Some(factory) => factory(&vs.root(), dataset.as_ref())?,
            None => model::from_config(&config, &vs.root(), dataset.as_ref())?,
        };
        let task = model.task();
        let mut params: Vec<(String, Tensor)> = vs.variables().into_iter().filter(|(_, t)| t.requires_grad()).collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        if params.is_empty() {
            return Err(Error::Other("the model has no trainable parameters".into()));
        }
        let mut optimizer = Optimizer::new(&config.optim, &params)?;

        let total_steps = config.train.steps;
        let mut start_step = 0;
        let mut counters = (0u64, 0u64, 0u64, 0u64);
        if let Some(ckpt) = &checkpoint {
            for (name, live) in params.iter_mut() {
                let saved =
                    ckpt.model.get(name).ok_or_else(|| Error::Checkpoint { path: ckpt.path.clone(), message: format!("no weights for `{name}`") })?;
                payload::restore(name, live, saved)?;
            }
            optimizer.load_state(|name| {
                ckpt.optimizer
                    .get(name)
                    .and_then(|t| Tensor::f_from_data_size(&t.data, &t.shape, payload::kind_of(t.dtype)).ok())
                    .map(|t| t.to_device(device))
            })?;
            let state = &ckpt.state;
            start_step = state["step"].as_u64().unwrap_or(0);
            counters = (
                state["samples_seen"].as_u64().unwrap_or(0),
                state["tokens_seen"].as_u64().unwrap_or(0),
                state["nonfinite_total"].as_u64().unwrap_or(0),
                state["nonfinite_run"].as_u64().unwrap_or(0),
            );
            if start_step >= total_steps {
                tracing::warn!("checkpoint is at step {start_step}, at or past train.steps = {total_steps}: nothing to train");
            }
            tracing::info!("resuming from {} (step {start_step})", ckpt.path.display());
        }
        if let Some(d) = &dist {
            d.broadcast_params(&params.iter().map(|(_, t)| t.shallow_clone()).collect::<Vec<_>>()).map_err(Error::Dist)?;
        }

        let gate = Arc::new(Gate::new(0));
        let services = HostServices::leak(gate.clone(), dist.as_ref().map(|d| d.collectives()));
        let (mut host, mut slots) = PluginHost::load(&config.run.plugins, &config.plugins, services, rank)?;
        // Only now, with every usage error ruled out, does the run leave traces.
        if rank == 0 {
            std::fs::create_dir_all(&run_dir).map_err(io_err(&run_dir))?;
            let config_path = run_dir.join("config.toml");
            std::fs::write(&config_path, config.to_toml()).map_err(io_err(&config_path))?;
        }
        let t = &config.train;
        slots.push(core_slot(CoreTask::Eval, Cadence::NEVER.with_eval()));
        if config.run.log_every > 0 {
            slots.push(core_slot(CoreTask::Progress, Cadence::every(config.run.log_every).with_end()));
        }
        slots.push(core_slot(CoreTask::NonFiniteCheck, Cadence::every(t.nonfinite_check_every.max(1)).with_end()));
        if t.empty_cache_every > 0 && device.is_cuda() {
            slots.push(core_slot(CoreTask::EmptyCache, Cadence::every(t.empty_cache_every)));
        }
        if world > 1 {
            host.keep_schedule_on_failure(true);
            // Clocks differ between ranks, and what is due must be the same on all of
            // them (emitting metrics is a collective).
            for slot in slots.iter_mut().filter(|s| s.cadence.every_secs > 0.0) {
                tracing::warn!("time-based cadences (every_secs) are ignored in distributed runs; use every = N steps");
                slot.cadence.every_secs = 0.0;
            }
        }
        let scheduler = Scheduler::new(slots, start_step + 1, total_steps, t.eval_every);
        gate.set(scheduler.next_due());
        let ticker =
            scheduler.min_period_secs().map(|secs| Ticker::start(gate.clone(), std::time::Duration::from_secs_f64((secs / 4.0).clamp(0.05, 1.0))));
        let signals = if handle_signals { Some(Signals::install(services)?) } else { None };

        let b = config.data.batch_size as u64;
        let accum = config.optim.accum_steps;
        let seq_len = dataset.seq_len();
        let pin = config.data.pin_memory && device.is_cuda();
        let loader = Loader::new(
            dataset.clone(),
            DrawPlan { first_step: start_step + 1, accum_steps: accum, batch_size: b, rank: rank as u64 },
            config.data.num_workers,
            config.data.prefetch,
            pin.then_some(device),
        );
        let k = t.nonfinite_check_every.max(1) as i64;
        let ring = Tensor::zeros([k], (Kind::Float, device));
        let nonfinite = NonFinite {
            slots: (0..k).map(|i| ring.select(0, i)).collect(),
            one: Tensor::ones([], (Kind::Float, device)),
            ring,
            last_checked: start_step,
            run: counters.3,
            total: counters.2,
            inject: config.debug.nonfinite_loss_at.clone(),
        };
        let n_params = params.iter().map(|(_, p)| p.numel() as u64).sum();
        let device_name = device::name(device);
        let layers = model.layers(seq_len);
        let run_data = Arc::new(RunData {
            run_dir: run_dir.display().to_string(),
            run_name: config.run.name.clone(),
            config_toml: config.to_toml(),
            seed: config.run.seed,
            start_step,
            total_steps,
            rank,
            world_size: world,
            device_kind: if device.is_cuda() { DeviceKind::Cuda } else { DeviceKind::Cpu },
            device_index: match device {
                Device::Cuda(i) => i as i32,
                _ => -1,
            },
            device_name: device_name.clone(),
            model_kind: model.kind().to_string(),
            task,
            n_params,
            layers,
            datasets: dataset.dataset_names(),
            batch_size: b,
            seq_len: seq_len as u64,
            accum_steps: accum,
            precision: format!("{:?}", config.train.precision).to_lowercase(),
            start_time: unix_now(),
        });
        if let Some(ckpt) = &checkpoint {
            host.load_states(&ckpt.plugin_states, start_step);
        }
        // Dropout draws from torch's generator: reseeding it from (seed, step) each
        // step makes a resumed run draw what the uninterrupted one drew.
        let reseed = config.model.dropout > 0.0 || model.kind() == "torchscript";
        Ok(Run {
            step_samples: b * accum,
            step_tokens: b * accum * seq_len.max(1) as u64,
            samples_seen: counters.0,
            tokens_seen: counters.1,
            schedule: LrSchedule::new(&config.optim, total_steps),
            progress: progress::Progress::new(start_step, total_steps, show_progress && rank == 0),
            resumed_from: checkpoint.as_ref().map(|c| c.path.display().to_string()),
            pending_stop: None,
            unix_start: unix_now(),
            setup_s: started.elapsed().as_secs_f64(),
            config,
            run_dir,
            rank,
            world,
            device,
            device_name,
            dataset,
            task,
            _vs: vs,
            model,
            params,
            optimizer,
            loader: Some(loader),
            gate,
            scheduler,
            host,
            services,
            signals,
            _ticker: ticker,
            dist,
            start_step,
            total_steps,
            autocast,
            reseed,
            nonfinite,
            phases_total: PhaseTimes::default(),
            hooks_total_s: 0.0,
            last_emit: (Instant::now(), start_step, PhaseTimes::default()),
            last_progress: (Instant::now(), start_step),
            first_loss: None,
            last_loss: None,
            last_grad_norm: None,
            evals: Vec::new(),
            checkpoint_wait_s: 0.0,
            run_data,
            emitted: Vec::with_capacity(64),
        })
    }

    fn counters(&self, step: u64) -> Counters {
        Counters {
            epoch: self.samples_seen / self.dataset.train_len().max(1),
            samples_seen: self.samples_seen,
            tokens_seen: self.tokens_seen,
            step_samples: self.step_samples,
            step_tokens: self.step_tokens,
            phases_total: self.phases_total,
            steps_run: step - self.start_step,
            elapsed_s: unix_now() - self.unix_start,
            rank: self.rank,
            world_size: self.world,
        }
    }

    fn stop_reason(&self) -> Option<Stop> {
        if let Some(sig) = self.signals.as_ref().and_then(Signals::received) {
            return Some(Stop::Signal(sig));
        }
        self.services.stop_requested().map(Stop::Requested)
    }

    /// The plan of a step: called only when the gate is open.
    fn plan(&mut self, step: u64) -> StepPlan {
        self.host.apply_detaches(step, &mut self.scheduler, &self.gate);
        self.scheduler.plan(step, &self.gate)
    }

    pub fn train(mut self) -> Result<Outcome> {
        // Plugins' start-up (opening files, the flops plugin's peak measurement) is
        // set-up, not training.
        let plugins_started = Instant::now();
        self.host.run_start(&self.run_data);
        self.setup_s += plugins_started.elapsed().as_secs_f64();
        let started = Instant::now();
        let accum = self.config.optim.accum_steps;
        let mut stop: Option<Stop> = None;
        let mut last_done = self.start_step;
        let debug_nan = !self.nonfinite.inject.is_empty();
        for step in self.start_step + 1..=self.total_steps {
            let plan = if self.gate.is_due(step) {
                if let Some(reason) = self.stop_reason() {
                    if self.world == 1 {
                        stop = Some(reason);
                        break;
                    }
                    // Ranks must stop at the same step: agreed at the next check.
                    self.pending_stop.get_or_insert(reason);
                }
                self.plan(step)
            } else {
                StepPlan::NONE
            };
            if self.reseed {
                tch::manual_seed(self.config.run.seed.wrapping_add(step.wrapping_mul(0x9E37_79B9)) as i64);
            }
            let lr = self.schedule.lr(step);
            let detailed = plan.needs.contains(Needs::DETAILED_METRICS);
            let mut clock = PhaseClock::start(self.device, detailed);
            let mut phases = PhaseTimes::default();
            let at = |hook, micro_batch, phases| At { hook, step, micro_batch, lr, phases };
            // Time in step hooks is its own lap, so it never inflates a phase.
            let mut hooks_s = 0.0;
            if plan.has(Hook::StepStart) {
                self.call_hook(at(Hook::StepStart, 0, phases), StepTensors::NONE);
                hooks_s += clock.lap();
            }
            self.optimizer.zero_grad()?;
            let mut step_loss: Option<Tensor> = None;
            for micro in 0..accum {
                let batch = self.loader.as_mut().expect("loader").next_batch().to_device(self.device, true);
                phases.data_s += clock.lap();
                let logits = if self.autocast {
                    tch::autocast(true, || self.model.forward(&batch.inputs, true))
                } else {
                    self.model.forward(&batch.inputs, true)
                };
                let mut loss = model::loss(self.task, &logits, &batch.targets);
                if debug_nan && self.nonfinite.inject.contains(&step) {
                    loss *= f64::NAN;
                }
                if accum > 1 {
                    loss /= accum as f64;
                }
                phases.forward_s += clock.lap();
                if plan.has(Hook::AfterForward) {
                    let tensors = StepTensors {
                        loss: TensorRef::of(&loss),
                        logits: TensorRef::of(&logits),
                        labels: TensorRef::of(&batch.targets),
                        dataset_ids: batch.dataset_ids.as_ref().map_or(TensorRef::NULL, TensorRef::of),
                        inputs: TensorRef::of(&batch.inputs),
                    };
                    self.call_hook(at(Hook::AfterForward, micro, phases), tensors);
                    hooks_s += clock.lap();
                }
                loss.backward();
                phases.backward_s += clock.lap();
                let detached = loss.detach();
                step_loss = Some(match step_loss {
                    None => detached,
                    Some(sum) => sum + detached,
                });
            }
            let mut step_loss = step_loss.expect("at least one micro-batch");
            if plan.has(Hook::AfterBackward) {
                self.call_hook(at(Hook::AfterBackward, accum - 1, phases), StepTensors { loss: TensorRef::of(&step_loss), ..StepTensors::NONE });
                hooks_s += clock.lap();
            }
            let found_inf = self.nonfinite.flag(step, &mut step_loss);
            if let Some(dist) = self.dist.as_mut() {
                dist.all_reduce_grads(&self.optimizer, found_inf).map_err(Error::Dist)?;
            }
            if self.config.optim.grad_clip > 0.0 || detailed {
                self.last_grad_norm = Some(self.optimizer.clip_grad_norm()?);
            }
            self.optimizer.step(lr, Some(found_inf))?;
            phases.optimizer_s += clock.lap();
            phases.step_s = phases.data_s + phases.forward_s + phases.backward_s + phases.optimizer_s + hooks_s;
            self.phases_total = self.phases_total.plus(&phases);
            self.hooks_total_s += hooks_s;
            self.samples_seen += self.step_samples * self.world as u64;
            self.tokens_seen += self.step_tokens * self.world as u64;
            if self.first_loss.is_none() {
                self.first_loss = Some(step_loss.shallow_clone());
            }
            self.last_loss = Some(step_loss);
            last_done = step;
            if !plan.is_empty() {
                if let Some(reason) = self.after_step(step, lr, phases, plan)? {
                    stop = Some(reason);
                    break;
                }
            }
        }
        if stop.is_none() && last_done < self.total_steps {
            stop = self.stop_reason();
        }
        self.finish(last_done, stop, started)
    }

    fn call_hook(&mut self, at: At, tensors: StepTensors) {
        let (hook, step) = (at.hook, at.step);
        let mut emitted = std::mem::take(&mut self.emitted);
        let run_data = self.run_data.clone();
        let mut ctx = context(&run_data, self.counters(step), at, tensors, &[]);
        let wants_params = self.scheduler.due().any(|(_, s)| s.hook == hook && s.needs.intersects(Needs::PARAMS.union(Needs::GRADS)));
        // Parameter handles are only gathered for the (rare) calls that asked.
        let grads: Vec<Tensor> = if wants_params { self.params.iter().map(|(_, t)| t.grad()).collect() } else { Vec::new() };
        let param_refs = if wants_params { named(self.params.iter().map(|(n, t)| (n, t))) } else { Vec::new() };
        let grad_refs = if wants_params { named(self.params.iter().map(|(n, _)| n).zip(&grads)) } else { Vec::new() };
        ctx.params = RSlice::from_slice(&param_refs);
        ctx.grads = RSlice::from_slice(&grad_refs);
        self.host.step_hook(hook, &mut self.scheduler, &self.gate, &ctx, &mut emitted);
        self.emitted = emitted;
    }

    /// Everything a due step does after the update. Returns a reason to stop.
    fn after_step(&mut self, step: u64, lr: f64, phases: PhaseTimes, plan: StepPlan) -> Result<Option<Stop>> {
        if plan.has(Hook::StepEnd) {
            let at = At { hook: Hook::StepEnd, step, micro_batch: self.config.optim.accum_steps - 1, lr, phases };
            self.call_hook(at, StepTensors { loss: self.last_loss.as_ref().map_or(TensorRef::NULL, TensorRef::of), ..StepTensors::NONE });
        }
        let mut stop = None;
        if plan.core(CoreTask::NonFiniteCheck) {
            stop = self.check_nonfinite(step);
            if stop.is_none() && self.world > 1 {
                stop = self.agree_stop()?;
            }
        }
        if plan.core(CoreTask::Eval) && stop.is_none() {
            self.evaluate(step, lr, phases)?;
        }
        if plan.core(CoreTask::EmptyCache) {
            let _ = ptrain_torch_ext::cuda::empty_cache();
        }
        // Metrics first: a checkpoint plugin scores this step's checkpoint by them.
        if plan.has(Hook::Metrics) || !self.emitted.is_empty() {
            self.emit_metrics(step, lr, plan);
        }
        if plan.has(Hook::Checkpoint) && stop.is_none() {
            self.save(step, if step == self.total_steps { CheckpointReason::End } else { CheckpointReason::Scheduled })?;
        }
        if plan.core(CoreTask::Progress) {
            self.show_progress(step, lr);
        }
        Ok(stop)
    }

    /// Distributed runs: one all-reduce of "does any rank want to stop", at a step
    /// every rank checks (the non-finite check is step-based, so ranks agree on it).
    fn agree_stop(&mut self) -> Result<Option<Stop>> {
        let Some(dist) = &self.dist else { return Ok(None) };
        let mut flag = Tensor::from(if self.pending_stop.is_some() { 1.0f64 } else { 0.0 }).to_device(self.device);
        dist.collectives().all_reduce_sum(&mut flag).map_err(Error::Dist)?;
        if flag.double_value(&[]) < 0.5 {
            return Ok(None);
        }
        Ok(Some(self.pending_stop.take().unwrap_or_else(|| Stop::Requested("another rank asked to stop".into()))))
    }

    fn check_nonfinite(&mut self, step: u64) -> Option<Stop> {
        let nf = &mut self.nonfinite;
        let k = nf.slots.len() as u64;
        let flags: Vec<f32> = Vec::try_from(nf.ring.to_device(Device::Cpu)).unwrap_or_default();
        let _ = nf.ring.zero_();
        let mut found_now = 0;
        for s in nf.last_checked + 1..=step {
            if flags.get((s % k) as usize).copied().unwrap_or(0.0) > 0.5 {
                nf.run += 1;
                nf.total += 1;
                found_now += 1;
            } else {
                nf.run = 0;
            }
        }
        nf.last_checked = step;
        if found_now > 0 {
            tracing::warn!("{found_now} non-finite loss(es) by step {step}: those updates were skipped ({} in a row, {} in all)", nf.run, nf.total);
        }
        let policy = self.config.train.nan_policy;
        let limit = self.config.train.max_nonfinite_in_row.max(1);
        match policy {
            NanPolicy::Stop if found_now > 0 => Some(Stop::NonFinite(format!("non-finite loss by step {step} (nan_policy = \"stop\")"))),
            NanPolicy::Skip if nf.run >= limit => Some(Stop::NonFinite(format!("{} non-finite losses in a row by step {step}", nf.run))),
            _ => None,
        }
    }

    fn evaluate(&mut self, step: u64, lr: f64, phases: PhaseTimes) -> Result<()> {
        let b = self.config.data.batch_size as u64;
        let (mut loss_sum, mut correct, mut count) = (0.0, 0.0, 0.0);
        let batches = self.config.train.eval_batches.max(1);
        let sums = tch::no_grad(|| {
            let mut acc = Tensor::zeros([3], (Kind::Double, self.device));
            for i in 0..batches {
                let key = BatchKey { step: i, micro: 0, first_sample: self.rank as u64 * b, count: b };
                let batch = self.dataset.batch(Split::Val, key).to_device(self.device, true);
                let logits = if self.autocast {
                    tch::autocast(true, || self.model.forward(&batch.inputs, false))
                } else {
                    self.model.forward(&batch.inputs, false)
                };
                let loss = model::loss(self.task, &logits, &batch.targets).to_kind(Kind::Double);
                let right = match self.task {
                    Task::Classification => logits.argmax(-1, false).eq_tensor(&batch.targets).sum(Kind::Double),
                    Task::LanguageModel => Tensor::zeros([], (Kind::Double, self.device)),
                };
                acc += Tensor::stack(&[loss, right, Tensor::from(batch.targets.size()[0] as f64).to_device(self.device)], 0);
            }
            acc
        });
        let mut sums = sums;
        if let Some(d) = &self.dist {
            d.collectives().all_reduce_sum(&mut sums).map_err(Error::Dist)?;
        }
        if let Ok(v) = Vec::<f64>::try_from(sums.to_device(Device::Cpu)) {
            loss_sum = v[0];
            correct = v[1];
            count = v[2];
        }
        let loss = loss_sum / (batches * self.world as u64) as f64;
        let accuracy = (self.task == Task::Classification).then(|| correct / count.max(1.0));
        self.evals.push(EvalPoint { step, loss, accuracy });
        self.progress.println(&format!("eval at step {step}: loss {loss:.4}{}", accuracy.map(|a| format!(", accuracy {a:.3}")).unwrap_or_default()));
        let mut metrics = vec![Metric::scalar("eval/loss", loss)];
        if let Some(a) = accuracy {
            metrics.push(Metric::scalar("eval/accuracy", a));
        }
        let scalars: Vec<Scalar<'_>> = metrics.iter().filter_map(|m| Some(Scalar { name: m.name.as_rstr(), value: m.as_scalar()? })).collect();
        let mut emitted = std::mem::take(&mut self.emitted);
        let run_data = self.run_data.clone();
        let at = At { hook: Hook::Eval, step, micro_batch: 0, lr, phases };
        let ctx = context(&run_data, self.counters(step), at, StepTensors::NONE, &scalars);
        self.host.eval(&ctx, &mut self.scheduler, &self.gate, &mut emitted);
        emitted.extend(metrics);
        self.emitted = emitted;
        Ok(())
    }

    /// Core metrics for sinks: produced only here, when a sink is due (or other
    /// metrics are going out anyway).
    fn emit_metrics(&mut self, step: u64, lr: f64, plan: StepPlan) {
        let mut metrics = std::mem::take(&mut self.emitted);
        let plugin_metrics = !metrics.is_empty();
        let wants = plan.needs;
        if wants.intersects(Needs::BASIC_METRICS.union(Needs::DETAILED_METRICS).union(Needs::HISTOGRAMS)) {
            let (since, since_step, phases_before) = self.last_emit;
            let steps = step - since_step;
            let secs = since.elapsed().as_secs_f64().max(1e-9);
            let mut local = vec![self.last_loss.as_ref().map_or(f64::NAN, |l| l.double_value(&[]))];
            let mut names = vec!["train/loss"];
            if let Some(d) = &self.dist {
                let mut t = Tensor::from_slice(&local).to_device(self.device);
                if d.collectives().all_reduce_sum(&mut t).is_ok() {
                    local = Vec::<f64>::try_from(t.to_device(Device::Cpu)).unwrap_or(local).iter().map(|v| v / self.world as f64).collect();
                }
            }
            let tokens = self.step_tokens * self.world as u64 * steps;
            let samples = self.step_samples * self.world as u64 * steps;
            local.extend([lr, tokens as f64 / secs, samples as f64 / secs, self.samples_seen as f64 / self.dataset.train_len().max(1) as f64]);
            names.extend(["train/lr", "train/tokens_per_s", "train/samples_per_s", "train/epoch"]);
            if wants.contains(Needs::DETAILED_METRICS) {
                if let Some(norm) = &self.last_grad_norm {
                    local.push(norm.double_value(&[]));
                    names.push("train/grad_norm");
                }
                let p = self.phases_total.per_step_since(&phases_before, steps);
                local.extend([p.data_s, p.forward_s, p.backward_s, p.optimizer_s, p.step_s]);
                names.extend(["time/data_s", "time/forward_s", "time/backward_s", "time/optimizer_s", "time/step_s"]);
                local.extend([device::current_memory(self.device) as f64, device::peak_memory(self.device) as f64]);
                names.extend(["memory/current_bytes", "memory/peak_bytes"]);
            }
            metrics.extend(names.into_iter().zip(local).map(|(n, v)| Metric::scalar(n, v)));
            if wants.contains(Needs::HISTOGRAMS) {
                metrics.extend(self.histograms());
            }
            self.last_emit = (Instant::now(), step, self.phases_total);
        }
        let batch = MetricBatch { step, wall_time: unix_now(), elapsed_s: unix_now() - self.unix_start, metrics: RVec::from(metrics) };
        self.host.deliver(batch, &mut self.scheduler, &self.gate, plugin_metrics);
        self.emitted = Vec::with_capacity(64);
    }

    /// Histograms of every parameter and gradient, bucketed on the device.
    fn histograms(&self) -> Vec<Metric> {
        const BUCKETS: i64 = 30;
        let mut out = Vec::new();
        for (name, p) in &self.params {
            for (prefix, t) in [("params", p.detach()), ("grads", p.grad())] {
                if !t.defined() {
                    continue;
                }
                let t = t.to_kind(Kind::Float).flatten(0, -1);
                let stats = Tensor::stack(&[t.min(), t.max(), t.sum(Kind::Float), t.square().sum(Kind::Float)], 0);
                let stats: Vec<f32> = Vec::try_from(stats.to_device(Device::Cpu)).unwrap_or_default();
                let counts: Vec<f32> = Vec::try_from(t.histc(BUCKETS).to_device(Device::Cpu)).unwrap_or_default();
                if stats.len() < 4 || !stats.iter().all(|v| v.is_finite()) {
                    continue;
                }
                let (min, max) = (stats[0] as f64, stats[1] as f64);
                let width = (max - min) / BUCKETS as f64;
                let limits: Vec<f64> = (1..=BUCKETS).map(|i| if i == BUCKETS { max } else { min + width * i as f64 }).collect();
                out.push(Metric::histogram(
                    format!("{prefix}/{name}"),
                    Histogram {
                        min,
                        max,
                        num: t.numel() as f64,
                        sum: stats[2] as f64,
                        sum_squares: stats[3] as f64,
                        bucket_limits: limits.into(),
                        bucket_counts: counts.iter().map(|&c| c as f64).collect(),
                    },
                ));
            }
        }
        out
    }

    fn show_progress(&mut self, step: u64, lr: f64) {
        let loss = self.last_loss.as_ref().map_or(f64::NAN, |l| l.double_value(&[]));
        let (since, since_step) = self.last_progress;
        let secs = since.elapsed().as_secs_f64().max(1e-9);
        let steps = (step - since_step).max(1);
        let tokens_per_s = (self.step_tokens * self.world as u64 * steps) as f64 / secs;
        let eta_s = secs / steps as f64 * (self.total_steps - step) as f64;
        self.progress.update(&progress::Line { step, loss, lr, tokens_per_s, eta_s });
        self.last_progress = (Instant::now(), step);
    }

    /// Builds a payload (the loop waits only for the device-to-host copies) and
    /// hands it to the checkpoint plugins. Rank 0 only.
    fn save(&mut self, step: u64, reason: CheckpointReason) -> Result<()> {
        if self.rank != 0 || !self.host.has_checkpointer() {
            return Ok(());
        }
        let waited = Instant::now();
        self.host.wait_saves();
        self.checkpoint_wait_s += waited.elapsed().as_secs_f64();
        let model = self.params.iter().map(|(n, t)| payload::to_blob(n, t)).collect::<Result<Vec<_>>>()?;
        let optimizer = self.optimizer.state().iter().map(|(n, t)| payload::to_blob(n, t)).collect::<Result<Vec<_>>>()?;
        let state = serde_json::json!({
            "step": step,
            "samples_seen": self.samples_seen,
            "tokens_seen": self.tokens_seen,
            "seed": self.config.run.seed,
            "world_size": self.world,
            "data": {"next_step": step + 1, "scheme": "keyed by (seed, step, micro-batch, sample)"},
            "rng": {"scheme": "torch generator reseeded from (seed, step) each step when the model is random", "seed": self.config.run.seed},
            "nonfinite_total": self.nonfinite.total,
            "nonfinite_run": self.nonfinite.run,
            "eval": self.evals.last().map(|e| serde_json::json!({"step": e.step, "loss": e.loss})),
            "ptrain_version": env!("CARGO_PKG_VERSION"),
        });
        let plugin_states = self.host.save_states(step);
        self.host.checkpoint(CheckpointPayload {
            step,
            reason,
            model: model.into(),
            optimizer: optimizer.into(),
            state_json: state.to_string().into(),
            config_toml: self.run_data.config_toml.as_str().into(),
            plugin_states,
        });
        Ok(())
    }

    fn finish(mut self, last_step: u64, stop: Option<Stop>, started: Instant) -> Result<Outcome> {
        let (status, exit_code, stop_reason) = match &stop {
            None => ("completed", 0, None),
            Some(Stop::Signal(sig)) => ("interrupted", 128 + sig, Some(format!("signal {sig}"))),
            Some(Stop::Requested(r)) => ("stopped", 1, Some(r.clone())),
            Some(Stop::NonFinite(r)) => ("nonfinite", 1, Some(r.clone())),
        };
        if let Some(reason) = &stop_reason {
            self.progress.println(&format!("stopping after step {last_step}: {reason}"));
        }
        let emergency = match stop {
            Some(Stop::Signal(_)) => Some(CheckpointReason::Interrupted),
            Some(Stop::NonFinite(_)) => Some(CheckpointReason::NonFinite),
            Some(Stop::Requested(_)) => Some(CheckpointReason::Interrupted),
            None => None,
        };
        if let Some(reason) = emergency {
            if last_step > self.start_step {
                self.save(last_step, reason)?;
            }
        }
        if stop.is_some() && !self.emitted.is_empty() {
            let plan = StepPlan::NONE;
            self.emit_metrics(last_step, self.schedule.lr(last_step), plan);
        }
        self.host.wait_saves();
        self.loader = None;
        let wall_s = started.elapsed().as_secs_f64();
        // Every distributed stop is agreed (see `agree_stop`), so all ranks end at
        // the same step and can meet in one more collective.
        let (first_loss, final_loss) = self.mean_losses(true)?;
        self.progress.finish();
        let final_eval_loss = self.evals.last().map(|e| e.loss);
        let mut end_scalars = vec![];
        if let Some(l) = final_loss {
            end_scalars.push(("train/loss".to_string(), l));
        }
        if let Some(l) = final_eval_loss {
            end_scalars.push(("eval/loss".to_string(), l));
        }
        let plugin_summaries = self.host.run_end(&RunEndData { step: last_step, exit_code, wall_s, scalars: end_scalars });
        let steps = last_step - self.start_step;
        let samples = steps * self.step_samples * self.world as u64;
        let tokens = steps * self.step_tokens * self.world as u64;
        let p = &self.phases_total;
        let summary = Summary {
            status: status.into(),
            exit_code,
            stop_reason,
            steps,
            start_step: self.start_step,
            last_step,
            total_steps: self.total_steps,
            samples,
            tokens,
            wall_s,
            setup_s: self.setup_s,
            steps_per_s: steps as f64 / wall_s.max(1e-9),
            samples_per_s: samples as f64 / wall_s.max(1e-9),
            tokens_per_s: tokens as f64 / wall_s.max(1e-9),
            first_loss,
            final_loss,
            final_eval_loss,
            evals: self.evals.clone(),
            phase_times: PhaseSummary {
                data_s: p.data_s,
                forward_s: p.forward_s,
                backward_s: p.backward_s,
                optimizer_s: p.optimizer_s,
                hooks_s: self.hooks_total_s,
            },
            peak_memory_bytes: device::peak_memory(self.device),
            device: device::label(self.device),
            device_name: self.device_name.clone(),
            precision: self.run_data.precision.clone(),
            world_size: self.world,
            collective_s: self.dist.as_ref().map_or(0.0, |d| d.collective_secs()),
            model: self.run_data.model_kind.clone(),
            parameters: self.run_data.n_params,
            nonfinite_steps: self.nonfinite.total,
            resumed_from: self.resumed_from.clone(),
            checkpoint_wait_s: self.checkpoint_wait_s,
            plugins_loaded: self.host.loaded(),
            plugin_failures: self.host.failures().to_vec(),
            detached_plugins: self.host.detached(),
            queue_drops: self.host.queue_drops(),
            plugins: plugin_summaries,
        };
        if self.config.debug.dump_params {
            self.dump_params()?;
        }
        if self.rank == 0 {
            let path = self.run_dir.join("summary.json");
            summary.write(&path).map_err(io_err(&path))?;
        }
        // A barrier: launchers tear the job down when any rank exits non-zero (an
        // interrupted one exits 130), so no rank leaves before rank 0 has written
        // its checkpoint and summary.
        if let Some(d) = &self.dist {
            let mut done = Tensor::zeros([1], (Kind::Float, self.device));
            d.collectives().all_reduce_sum(&mut done).map_err(Error::Dist)?;
        }
        Ok(Outcome { summary, run_dir: self.run_dir.clone(), exit_code })
    }
}

impl Run {
    /// The first and last training loss, averaged over the ranks when `together`
    /// (otherwise this rank's own).
    fn mean_losses(&self, together: bool) -> Result<(Option<f64>, Option<f64>)> {
        let (Some(first), Some(last)) = (&self.first_loss, &self.last_loss) else {
            return Ok((None, None));
        };
        let mut both = Tensor::stack(&[first.to_kind(Kind::Double), last.to_kind(Kind::Double)], 0);
        if let (Some(d), true) = (&self.dist, together) {
            d.collectives().all_reduce_sum(&mut both).map_err(Error::Dist)?;
            both /= self.world as f64;
        }
        let v = Vec::<f64>::try_from(both.to_device(Device::Cpu)).unwrap_or_default();
        Ok((v.first().copied(), v.get(1).copied()))
    }

    /// `[debug] dump_params`: this rank's final parameters, so tests can compare ranks.
    fn dump_params(&self) -> Result<()> {
        std::fs::create_dir_all(&self.run_dir).map_err(io_err(&self.run_dir))?;
        let path = self.run_dir.join(format!("params-rank{}.safetensors", self.rank));
        let host: Vec<(&str, Tensor)> = self.params.iter().map(|(n, t)| (n.as_str(), t.to_device(Device::Cpu))).collect();
        Tensor::write_safetensors(&host, &path)?;
        Ok(())
    }
}

/// A checkpoint directory, or a run/checkpoints directory holding some.
fn resolve_resume(path: &std::path::Path) -> Result<PathBuf> {
    if !path.exists() {
        return Err(Error::MissingFile { what: "checkpoint", path: path.to_owned() });
    }
    if path.join(ptrain_checkpoint::MANIFEST_FILE).exists() {
        return Ok(path.to_owned());
    }
    for dir in [ptrain_checkpoint::checkpoints_dir(path), path.to_owned()] {
        let (found, warnings) = ptrain_checkpoint::find_resumable(&dir);
        for w in warnings {
            tracing::warn!("{w}");
        }
        if let Some(found) = found {
            return Ok(found);
        }
    }
    Err(Error::Checkpoint { path: path.to_owned(), message: "no valid checkpoint here".into() })
}
