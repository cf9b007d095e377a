//! Set-up, in the order a run needs it: the checkpoint to resume (so a bad path
//! fails first), the device, the data and the model, the optimizer and restored
//! state, the plugins and the schedule, the loader. Every usage error surfaces
//! here, before the run directory is created.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use ptrain_plugin_api::{DebugFaults, DeviceKind, Hook, Needs};
use tch::{nn, Device};

use super::{
    batches::StepBatches,
    clock::{stamp, stamp_at, unix_now},
    debug::{Faults, PanicAt, TensorDump},
    eval::Evaluator,
    forced::ForcedRecord,
    learner::Learner,
    metrics::MetricsProcessor,
    nonfinite::NonFinite,
    progress::Progress,
    run::{Run, RunEnv},
    run_dir::RunLock,
    signals::Signals,
    state::{self, TrainState},
    stop::StopControl,
    tally::Tally,
    Trainer,
};
use crate::{
    config::{Config, Precision, ShardMode},
    data::{loader::DrawPlan, Loader},
    device,
    error::{Error, Result},
    host::{HostServices, PluginHost, RunData},
    model, objective,
    optim::{GradMemory, ParamSharding, ShardSpec},
    schedule::{Cadence, CoreTask, Gate, Owner, RunSchedule, SlotSpec, StepWindows},
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

/// A training set smaller than one step's global batch is repeated within every
/// step, silently unless said: names the samples (rows, or packed sequences), the
/// step and the epochs the run makes of it.
fn warn_repeats(config: &Config, dataset: &dyn crate::data::Dataset, world: u32, total_steps: u64) {
    let (b, accum) = (config.data.batch_size as u64, config.optim.accum_steps);
    let global = b * accum * world as u64;
    let samples = dataset.train_len();
    if samples >= global || samples == 0 {
        return;
    }
    let what = match dataset.row_counts() {
        Some(rows) if config.data.packing => format!("{samples} packed sequences (data.packing: {} rows read)", rows.rows),
        Some(_) => format!("{samples} rows"),
        None => format!("{samples} samples"),
    };
    tracing::warn!(
        "data: the training set holds {what}, fewer than one step takes ({global} = data.batch_size {b} x optim.accum_steps {accum} x {world} \
         rank(s)): every step holds the same samples more than once (an epoch is shorter than a step), and the {total_steps} steps are {:.1} epochs; \
         lower data.batch_size or optim.accum_steps, or add rows",
        (total_steps * global) as f64 / samples as f64
    );
}

impl Run {
    pub fn setup(trainer: Trainer) -> Result<Run> {
        let started = Instant::now();
        let Trainer { config, model: model_factory, dataset, resume, overwrite, allow_batch_change, handle_signals, progress, dist } = trainer;
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
        let guarded = super::run_dir::guard(&run_dir, resume.as_ref(), overwrite, rank == 0);
        if world > 1 {
            // Every rank checks the directory before rank 0 writes its config.toml there:
            // this sum is the collective between the two (parameter sharding has no
            // start-up broadcast), and it makes every rank refuse when one does.
            let mut refused = [f64::from(u8::from(guarded.is_err()))];
            dist.sum_host(&mut refused).map_err(Error::Dist)?;
            if refused[0] > 0.0 && guarded.is_ok() {
                return Err(Error::RunDir {
                    path: run_dir.clone(),
                    message: "another rank refused this run directory (its message says why)".into(),
                });
            }
        }
        guarded?;
        let shards_params = shard.as_ref().is_some_and(|s| s.mode == ShardMode::Parameters);
        super::sharding::refuse_unblocked_kind(&config, shards_params && model_factory.is_none())?;
        let located = state::locate(resume.as_ref(), &run_dir, !config.run.run_dir.is_empty())?;
        let checkpoint = located.map(|p| state::read(&p, shards_params)).transpose()?;
        if let (Some(ckpt), None) = (&checkpoint, &model_factory) {
            state::check_model(ckpt, &config)?;
        }
        if let Some(ckpt) = &checkpoint {
            state::check_global_batch(ckpt, &config, world, allow_batch_change)?;
        }
        // A misspelt [plugins.<name>] table is refused before tokenizing or loading weights.
        crate::host::loader::check_tables(&config.run.plugins, &config.plugins)?;

        if config.run.threads > 0 {
            tch::set_num_threads(config.run.threads as i32);
        }
        crate::device::set_cpu_matmul(config.run.cpu_matmul)?;
        tch::manual_seed(config.run.seed as i64);
        let device = dist.device(&config)?;

        let dataset = match dataset {
            Some(d) => d,
            None => crate::data::from_config(&config)?,
        };
        let evaluator = Evaluator::new(&config, dataset.val_len(), rank, world, device)?;
        match (evaluator.enabled(), rank) {
            (false, 0) => tracing::info!("nothing is held out (data.val_fraction = 0, no data.val_path): no evaluation"),
            (true, 0) => tracing::info!("each evaluation covers {} held-out samples", evaluator.covers()),
            _ => {}
        }
        let vs = nn::VarStore::new(device);
        let (mut cut, mut streamed_base_hash) = (None, None);
        let mut model = match model_factory {
            Some(factory) => factory(&vs.root(), dataset.as_ref())?,
            None => {
                // The checkpoint has every weight: model.init_from's may be gone. A LoRA
                // checkpoint has only the adapters: the base comes from model.init_from.
                let mut built = config.clone();
                if checkpoint.is_some() && config.lora().is_none() {
                    built.model.init_from.clear();
                }
                // Under `parameters`: a gpt or llama (refuse_unblocked_kind), cut while built.
                match shard.as_ref().filter(|s| s.mode == ShardMode::Parameters) {
                    Some(spec) => {
                        let (model, whole, base_hash) = super::sharding::build_cut(&built, &vs, spec)?;
                        (cut, streamed_base_hash) = (Some(whole), base_hash);
                        model
                    }
                    None => model::build(&built, &vs, dataset.as_ref())?,
                }
            }
        };
        let bf16 = config.train.precision == Precision::Bf16;
        let lora_base = config.lora().map(|_| model::lora::settle_base(&vs, model.as_ref(), bf16, streamed_base_hash)).transpose()?;
        let all_params = vs.variables().values().map(|t| t.numel() as u64).sum();
        let total_steps = match config.train.epochs {
            e if e > 0.0 => {
                let global = config.data.batch_size as u64 * config.optim.accum_steps * world as u64;
                let steps = (e * dataset.train_len() as f64 / global as f64).ceil().max(1.0) as u64;
                tracing::info!("train.epochs = {e}: {steps} steps of {global} samples over {} training samples", dataset.train_len());
                steps
            }
            _ => config.train.steps,
        };
        if rank == 0 {
            warn_repeats(&config, dataset.as_ref(), world, total_steps);
        }
        let objective = objective::build(&config, model.as_mut(), &vs, dataset.as_ref())?;
        let (model_kind, task, layers) = (model.kind().to_string(), model.task(), model.layers(dataset.seq_len()));
        if shard.as_ref().is_some_and(|s| s.mode == ShardMode::Parameters) {
            super::sharding::refuse_unsupported(&config, false)?;
        }
        let shard = shard.map(|spec| (spec, super::sharding::param_sharding(&config, dist.as_ref()).map(|with| ParamSharding { cut, ..with })));
        // One rank releases its gradients between steps; data parallelism keeps them
        // for the all-reduce buckets bound to them.
        let grads = if world == 1 { GradMemory::Released } else { GradMemory::Kept };
        let mut learner = Learner::new(vs, model, dataset.clone(), &config, shard, grads, total_steps)?;
        if let Some(ckpt) = &checkpoint {
            // Resuming on another model.init_from (other weights of the same shapes),
            // or a LoRA run without [lora], or the other way round, is refused.
            model::adapters::same_base(&ckpt.path, &ckpt.state, std::path::Path::new(&config.model.init_from), lora_base.as_deref())?;
        }
        let restored = match &checkpoint {
            Some(ckpt) => state::restore(ckpt, &mut learner.params, learner.optimizer.as_mut())?,
            None => TrainState::new(0, config.run.seed, world),
        };
        let start_step = restored.step;
        if let Some(ckpt) = &checkpoint {
            if start_step >= total_steps {
                tracing::warn!("the run is already at step {start_step}, at or past train.steps = {total_steps}: nothing to train");
            }
            tracing::info!("resuming from {} (step {start_step})", ckpt.path.display());
        }
        // (Sharded parameters were broadcast before they were cut.)
        if learner.optimizer.block_wrap().is_none() {
            dist.broadcast_params(&learner.params.iter().map(|(_, t)| t.shallow_clone()).collect::<Vec<_>>()).map_err(Error::Dist)?;
        }

        // The run's gate: its schedule raises it, requests from other threads
        // (through the host's services and the signal handlers) lower it.
        let gate = Arc::new(Gate::new(0));
        let services = HostServices::new(gate.clone(), dist.collectives(), Duration::from_secs_f64(config.run.shutdown_timeout_s));
        let (mut host, mut slots) = PluginHost::load(&config.run.plugins, &config.plugins, &config.origins, services.clone(), rank)?;
        if learner.optimizer.shard_mode() == ShardMode::Parameters {
            let reads_params = slots.iter().any(|s| s.needs.intersects(Needs::PARAMS.union(Needs::GRADS).union(Needs::HISTOGRAMS)));
            super::sharding::refuse_unsupported(&config, reads_params)?;
        }
        // Only now, with every usage error ruled out, does the run leave traces.
        if rank == 0 {
            std::fs::create_dir_all(&run_dir).map_err(Error::writing(&run_dir))?;
            let config_path = run_dir.join("config.toml");
            std::fs::write(&config_path, config.to_recorded_toml()).map_err(Error::writing(&config_path))?;
            crate::config::keep_sources(&config, &run_dir)?;
        }
        slots.extend(core_slots(&config, device));
        let schedule = RunSchedule::new(slots, start_step + 1, total_steps, config.train.eval_every, gate, world > 1);
        let signals = if handle_signals {
            // What a second signal during a hung inline hook writes (see `forced`).
            let summary = (rank == 0).then(|| run_dir.join("summary.json"));
            let record = ForcedRecord { calls: host.calls(), path: summary, start_step, total_steps, world_size: world, started };
            Some(Signals::install(services.clone(), record)?)
        } else {
            None
        };

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
        let batches = StepBatches::new(loader, device, accum);
        let run_data = Arc::new(RunData {
            // Absolute: a plugin may change its working directory, or hand the path on.
            run_dir: std::path::absolute(&run_dir).unwrap_or_else(|_| run_dir.clone()).display().to_string(),
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
            model_kind,
            task,
            n_params: learner.params.iter().map(|(_, p)| p.numel() as u64).sum(),
            layers,
            datasets: dataset.dataset_names(),
            batch_size: b,
            seq_len: seq_len as u64,
            accum_steps: accum,
            precision: format!("{:?}", config.train.precision).to_lowercase(),
            start_time: unix_now(),
            collective_timeout_s: config.dist.timeout_s as f64,
            debug: DebugFaults {
                pause_save_at_step: config.debug.pause_save_at_step,
                pause_save_after_files: config.debug.pause_save_after_files.max(1),
            },
        });
        if let Some(ckpt) = &checkpoint {
            host.load_states(&ckpt.plugin_states, start_step);
        }
        let nonfinite_counts = (restored.nonfinite_run, restored.nonfinite_total);
        let nonfinite = NonFinite::new(&config.train, device, start_step, nonfinite_counts);
        let tally = Tally::new(b * accum, restored.samples_seen, restored.tokens_seen);
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
        tracing::info!("{}", learner.lr_schedule.describe());
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
            stop: StopControl::new(signals, services, env.config.train.nonfinite_check_every, total_steps),
            faults: Faults::new(&env.config.debug, device),
            dump: TensorDump::new(&env.config.debug),
            evaluator,
            env,
            learner,
            objective,
            batches,
            schedule,
            host,
            dist,
            tally,
            nonfinite,
        })
    }
}
