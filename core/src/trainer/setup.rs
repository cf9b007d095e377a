//! Set-up, in the order a run needs it, each stage a builder of one component
//! (`setup/`): the run directory and the checkpoint to resume (`place`: so a bad path
//! fails first), the device, the data, the model and the learner (`learning`), the
//! plugins and the schedule (`plugins`), what plugins are told and the loader
//! (`run_data`). Every usage error surfaces here, before the run directory is created.

mod learning;
mod place;
mod plugins;
mod run_data;

use std::{sync::Arc, time::Instant};

use super::{
    clock::unix_now,
    debug::{Faults, TensorDump},
    failure,
    forced::ForcedRecord,
    metrics::MetricsProcessor,
    nonfinite::NonFinite,
    progress::Progress,
    run::{Run, RunEnv},
    signals::Signals,
    stop::StopControl,
    tally::Tally,
    Trainer,
};
use crate::{
    config::Config,
    data::Dataset,
    dist::DataParallel,
    error::Result,
    host::{HostServices, PluginHost},
};

/// A training set smaller than one step's global batch is repeated within every
/// step, silently unless said: names the samples (rows, or packed sequences), the
/// step and the epochs the run makes of it.
fn warn_repeats(config: &Config, dataset: &dyn Dataset, world: u32, total_steps: u64) {
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

/// The process-wide settings of the run: libtorch's threads, the CPU's matrix
/// products, the seed; and this rank's device.
fn prepare_process(config: &Config, dist: &dyn DataParallel) -> Result<tch::Device> {
    if config.run.threads > 0 {
        tch::set_num_threads(config.run.threads as i32);
    }
    crate::device::set_cpu_matmul(config.run.cpu_matmul)?;
    tch::manual_seed(config.run.seed as i64);
    dist.device(config)
}

/// What a second signal during a hung inline hook writes (see `forced`), and the
/// handlers that write it; none unless the trainer handles signals.
fn signals(services: &Arc<HostServices>, host: &PluginHost, env: &RunEnv, started: Instant, handle: bool) -> Result<Option<Signals>> {
    if !handle {
        return Ok(None);
    }
    let summary = (env.rank == 0).then(|| env.run_dir.join("summary.json"));
    let (start_step, total_steps, world_size) = (env.start_step, env.total_steps, env.world);
    let record = ForcedRecord { calls: host.calls(), path: summary, start_step, total_steps, world_size, started };
    Ok(Some(Signals::install(services.clone(), record)?))
}

/// Says once what the configuration resolved to that a user may not have asked for.
fn say_resolved(config: &Config, lr_schedule: &crate::optim::LrSchedule) {
    if config.auto_loss_chunk() {
        tracing::info!(
            "loss computed {} positions at a time (train.loss_chunk unset, vocabulary {} >= {}: the whole logits would dominate memory; \
             train.loss_chunk = 0 turns it off)",
            config.loss_chunk(),
            config.model.vocab_size,
            crate::config::AUTO_LOSS_CHUNK_VOCAB
        );
    }
    // What warmup_ratio and min_lr_ratio resolved to.
    tracing::info!("{}", lr_schedule.describe());
}

impl Run {
    pub fn setup(trainer: Trainer) -> Result<Run> {
        let started = Instant::now();
        let Trainer { config, model: factory, dataset, resume, overwrite, allow_batch_change, handle_signals, progress, dist } = trainer;
        let (rank, world) = (dist.rank(), dist.world_size());
        let place = place::claim(&config, dist.as_ref(), resume.as_ref(), overwrite)?;
        let checkpoint = place::checkpoint(&config, &place, resume.as_ref(), factory.is_some(), world, allow_batch_change)?;
        let device = prepare_process(&config, dist.as_ref())?;
        let (dataset, evaluator) = learning::data(&config, dataset, dist.as_ref(), device)?;
        let built = failure::setup_stage("building the model", device, || {
            learning::model(&config, factory, &place, checkpoint.is_some(), dataset.as_ref(), device)
        })?;
        let (lora_base, all_params) = (built.lora_base.clone(), built.all_params);
        let total_steps = learning::total_steps(&config, dataset.as_ref(), world);
        if rank == 0 {
            warn_repeats(&config, dataset.as_ref(), world, total_steps);
        }
        let (learner, objective, restored) = failure::setup_stage("building the optimizer", device, || {
            learning::learner(&config, built, dataset.clone(), &place, dist.as_ref(), checkpoint.as_ref(), total_steps)
        })?;
        let start_step = restored.step;
        let (mut host, services, slots) = plugins::host(&config, dist.as_ref(), &learner)?;
        plugins::record(&config, &place.run_dir, rank)?;
        let schedule = plugins::schedule(&config, slots, &services, (start_step, total_steps), device, world);
        let run_data = Arc::new(run_data::run_data(&config, &place.run_dir, &learner, (start_step, total_steps), (rank, world)));
        let rollout = crate::rollout::RolloutStage::from_config(&config, &place.run_dir, dist.as_ref(), device, &host)?;
        let batches = run_data::batches(&config, &dataset, start_step, (rank, world), device).with_rollout(rollout);
        if let Some(ckpt) = &checkpoint {
            host.load_states(&ckpt.plugin_states, start_step);
        }
        let nonfinite = NonFinite::new(&config.train, device, start_step, (restored.nonfinite_run, restored.nonfinite_total));
        let tally = Tally::new(config.data.batch_size as u64 * config.optim.accum_steps, restored.samples_seen, restored.tokens_seen);
        say_resolved(&config, &learner.lr_schedule);
        let env = RunEnv {
            _lock: place.lock,
            resumed_from: checkpoint.as_ref().map(|c| c.path.display().to_string()),
            lora_base,
            all_params,
            setup_s: started.elapsed().as_secs_f64(),
            unix_start: unix_now(),
            config,
            run_dir: place.run_dir,
            rank,
            world,
            device,
            start_step,
            total_steps,
            run_data,
        };
        let signals = signals(&services, &host, &env, started, handle_signals)?;
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
