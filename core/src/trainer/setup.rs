//! Set-up, in the order a run needs it: the checkpoint to resume (so a bad path
//! fails first), the device, the data and the model, the optimizer and restored
//! state, the plugins and the schedule, the loader. Every usage error surfaces
//! here, before the run directory is created.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use ptrain_plugin_api::{DeviceKind, Hook, Needs};
use tch::{nn, Device, Tensor};

use super::{
    clock::{stamp, stamp_at, unix_now},
    debug::{Faults, PanicAt},
    metrics::MetricsProcessor,
    nonfinite::NonFinite,
    progress::Progress,
    run::{Learner, Run, RunEnv, Tally},
    run_dir::RunLock,
    state::{self, TrainState},
    stop::StopControl,
    Trainer,
};
use crate::{
    config::{Config, Precision},
    data::{loader::DrawPlan, Loader},
    device,
    error::{Error, Result},
    host::{HostServices, PluginHost, RunData},
    model, objective,
    optim::{self, LrSchedule, ShardSpec},
    schedule::{Cadence, CoreTask, Gate, Owner, RunSchedule, SlotSpec, StepWindows},
    signals::Signals,
};

/// `run.run_dir`, or `runs/<name>-<YYYYmmdd-HHMMSS>` (UTC) when it is empty, at
/// `at` (Unix seconds: rank 0's clock, agreed by sharded ranks that all write
/// there) or now.
fn run_dir(config: &Config, at: Option<u64>) -> PathBuf {
    if config.run.run_dir.is_empty() {
        PathBuf::from("runs").join(format!("{}-{}", config.run.name, at.map_or_else(stamp, stamp_at)))
    } else {
        PathBuf::from(&config.run.run_dir)
    }
}

fn core_slot(task: CoreTask, cadence: Cadence) -> SlotSpec {
    SlotSpec { owner: Owner::Core(task), hook: Hook::StepEnd, cadence, needs: Needs::NONE, windows: StepWindows::NONE }
}

/// The core's own periodic work: evaluation, progress lines, reading the
/// non-finite flags, and CUDA's `empty_cache`.
fn core_slots(config: &Config, device: Device) -> Vec<SlotSpec> {
    let t = &config.train;
    let mut slots = vec![core_slot(CoreTask::Eval, Cadence::NEVER.with_eval())];
    if config.run.log_every > 0 {
        slots.push(core_slot(CoreTask::Progress, Cadence::every(config.run.log_every).with_end()));
    }
    slots.push(core_slot(CoreTask::NonFiniteCheck, Cadence::every(t.nonfinite_check_every.max(1)).with_end()));
    if t.empty_cache_every > 0 && device.is_cuda() {
        slots.push(core_slot(CoreTask::EmptyCache, Cadence::every(t.empty_cache_every)));
    }
    slots
}

impl Run {
    pub fn setup(trainer: Trainer) -> Result<Run> {
        let started = Instant::now();
        let Trainer { config, model: model_factory, dataset, resume, overwrite, handle_signals, progress, dist } = trainer;
        let (rank, world) = (dist.rank(), dist.world_size());
        let shard = ShardSpec::agree(config.dist.shard, dist.as_ref())?;
        let run_dir = run_dir(&config, shard.as_ref().map(|s| s.launch_secs));
        // Rank 0 holds the lock for the launch: the other ranks write under it. A
        // single run named by default takes a name no other run has.
        let (run_dir, lock) = match (rank, world, config.run.run_dir.is_empty()) {
            (0, 1, true) => RunLock::acquire_new(&run_dir).map(|(dir, lock)| (dir, Some(lock)))?,
            (0, _, _) => (run_dir.clone(), Some(RunLock::acquire(&run_dir)?)),
            _ => (run_dir, None),
        };
        super::run_dir::guard(&run_dir, resume.as_ref(), overwrite, rank == 0)?;
        let checkpoint = state::locate(resume.as_ref(), &run_dir, !config.run.run_dir.is_empty())?.map(|p| state::read(&p)).transpose()?;
        if let (Some(ckpt), None) = (&checkpoint, &model_factory) {
            state::check_model(ckpt, &config)?;
        }
        // A misspelt [plugins.<name>] table is refused before tokenizing or loading weights.
        crate::host::loader::check_tables(&config.run.plugins, &config.plugins)?;

        if config.run.threads > 0 {
            tch::set_num_threads(config.run.threads as i32);
        }
        tch::manual_seed(config.run.seed as i64);
        let device = dist.device(&config)?;
        // bf16 autocasts the forward pass on the CPU as on CUDA (libtorch supports both).
        let autocast = (config.train.precision == Precision::Bf16).then_some(device.is_cuda());

        let dataset = match dataset {
            Some(d) => d,
            None => crate::data::from_config(&config)?,
        };
        let vs = nn::VarStore::new(device);
        let model = match model_factory {
            Some(factory) => factory(&vs.root(), dataset.as_ref())?,
            // The checkpoint has every weight: model.init_from's may be gone. A LoRA
            // checkpoint has only the adapters: the base comes from model.init_from.
            None if checkpoint.is_some() && config.lora().is_none() => {
                let mut without = config.clone();
                without.model.init_from.clear();
                model::build(&without, &vs, dataset.as_ref())?
            }
            None => model::build(&config, &vs, dataset.as_ref())?,
        };
        let lora_base = match config.lora() {
            Some(_) => {
                let hash = model::lora::base_hash(&vs)?;
                if config.train.precision == Precision::Bf16 {
                    model::lora::store_base_bf16(model.as_ref())?;
                }
                Some(hash)
            }
            None => None,
        };
        let all_params = vs.variables().values().map(|t| t.numel() as u64).sum();
        let mut params: Vec<(String, Tensor)> = vs.variables().into_iter().filter(|(_, t)| t.requires_grad()).collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        if params.is_empty() {
            return Err(Error::Other("the model has no trainable parameters".into()));
        }
        let mut optimizer = optim::build(&config.optim, &params, shard)?;

        let total_steps = match config.train.epochs {
            e if e > 0.0 => {
                let global = config.data.batch_size as u64 * config.optim.accum_steps * world as u64;
                let steps = (e * dataset.train_len() as f64 / global as f64).ceil().max(1.0) as u64;
                tracing::info!("train.epochs = {e}: {steps} steps of {global} samples over {} training samples", dataset.train_len());
                steps
            }
            _ => config.train.steps,
        };
        if let Some(ckpt) = &checkpoint {
            state::check_lora_base(ckpt, lora_base.as_deref())?;
        }
        let restored = match &checkpoint {
            Some(ckpt) => state::restore(ckpt, &mut params, optimizer.as_mut())?,
            None => TrainState::new(0, config.run.seed, world),
        };
        let start_step = restored.step;
        if let Some(ckpt) = &checkpoint {
            if start_step >= total_steps {
                tracing::warn!("the run is already at step {start_step}, at or past train.steps = {total_steps}: nothing to train");
            }
            tracing::info!("resuming from {} (step {start_step})", ckpt.path.display());
        }
        dist.broadcast_params(&params.iter().map(|(_, t)| t.shallow_clone()).collect::<Vec<_>>()).map_err(Error::Dist)?;

        // The run's gate: its schedule raises it, requests from other threads
        // (through the host's services and the signal handlers) lower it.
        let gate = Arc::new(Gate::new(0));
        let services = HostServices::leak(gate.clone(), dist.collectives(), Duration::from_secs_f64(config.run.shutdown_timeout_s));
        let (mut host, mut slots) = PluginHost::load(&config.run.plugins, &config.plugins, &config.origins, services, rank)?;
        // Only now, with every usage error ruled out, does the run leave traces.
        if rank == 0 {
            let io = |path: PathBuf| move |source| Error::Io { path, source };
            std::fs::create_dir_all(&run_dir).map_err(io(run_dir.clone()))?;
            let config_path = run_dir.join("config.toml");
            std::fs::write(&config_path, config.to_recorded_toml()).map_err(io(config_path.clone()))?;
            crate::config::keep_sources(&config, &run_dir)?;
        }
        slots.extend(core_slots(&config, device));
        let schedule = RunSchedule::new(slots, start_step + 1, total_steps, config.train.eval_every, gate, world > 1);
        let signals = if handle_signals { Some(Signals::install(services)?) } else { None };

        let b = config.data.batch_size as u64;
        let accum = config.optim.accum_steps;
        let seq_len = dataset.seq_len();
        let pin = config.data.pin_memory && device.is_cuda();
        let draws = DrawPlan { first_step: start_step + 1, accum_steps: accum, batch_size: b, rank: rank as u64, world: world as u64 };
        let drawn: Arc<dyn crate::data::Dataset> = match config.debug.data_panic_at_step {
            0 => dataset.clone(),
            step => Arc::new(PanicAt { inner: dataset.clone(), step }),
        };
        let loader = Loader::new(drawn, draws, config.data.num_workers, config.data.prefetch, pin.then_some(device));
        let run_data = Arc::new(RunData {
            run_dir: run_dir.display().to_string(),
            run_name: config.run.name.clone(),
            config_toml: config.to_recorded_toml(),
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
            device_name: device::name(device),
            model_kind: model.kind().to_string(),
            task: model.task(),
            n_params: params.iter().map(|(_, p)| p.numel() as u64).sum(),
            layers: model.layers(seq_len),
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
        let nonfinite_counts = (restored.nonfinite_run, restored.nonfinite_total);
        let nonfinite = NonFinite::new(&config.train, config.debug.nonfinite_loss_at.clone(), device, start_step, nonfinite_counts);
        let tally = Tally {
            step_samples: b * accum,
            step_tokens: b * accum * seq_len.max(1) as u64,
            samples_seen: restored.samples_seen,
            tokens_seen: restored.tokens_seen,
            ..Tally::default()
        };
        if config.auto_loss_chunk() {
            tracing::info!(
                "loss computed {} positions at a time (train.loss_chunk unset, vocabulary {} >= {}: the whole logits would dominate memory; \
                 train.loss_chunk = 0 turns it off)",
                config.loss_chunk(),
                config.model.vocab_size,
                crate::config::AUTO_LOSS_CHUNK_VOCAB
            );
        }
        // What warmup_ratio and min_lr_ratio resolved to, said once.
        let lr_schedule = LrSchedule::new(&config.optim, total_steps);
        tracing::info!("{}", lr_schedule.describe());
        let objective = objective::from_config(&config, model.task());
        let learner = Learner {
            // Whether the model draws random numbers is the model's to say.
            reseed: model.uses_randomness(),
            lr_schedule,
            _vs: vs,
            model,
            params,
            optimizer,
            dataset,
            loader: Some(loader),
            autocast,
        };
        let env = RunEnv {
            _lock: lock,
            resumed_from: checkpoint.as_ref().map(|c| c.path.display().to_string()),
            lora_base,
            all_params,
            setup_s: started.elapsed().as_secs_f64(),
            unix_start: unix_now(),
            config,
            run_dir,
            rank,
            world,
            device,
            start_step,
            total_steps,
            run_data,
        };
        Ok(Run {
            metrics: MetricsProcessor::new(start_step, Progress::new(start_step, total_steps, progress, rank == 0)),
            stop: StopControl::new(signals, services),
            faults: Faults::new(&env.config.debug, device),
            staged: Default::default(),
            env,
            learner,
            objective,
            schedule,
            host,
            dist,
            tally,
            nonfinite,
        })
    }
}
