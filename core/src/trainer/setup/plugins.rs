//! Set-up's plugin stages: the host with the plugins loaded (their attachments as
//! schedule slots), the run directory's first records once every usage error is
//! ruled out, and the run's schedule of everything periodic, the core's own work
//! included.

use std::{path::Path, sync::Arc, time::Duration};

use ptrain_plugin_api::{Hook, Needs};
use tch::Device;

use super::super::{learner::Learner, sharding};
use crate::{
    config::{Config, ShardMode},
    dist::DataParallel,
    error::{Error, Result},
    host::{HostServices, PluginHost},
    schedule::{Cadence, CoreTask, Gate, Owner, RunSchedule, SlotSpec, StepWindows},
};

/// The plugin host with the configured plugins loaded, its services (through which
/// other threads lower the run's gate), and the plugins' attachments as slots.
pub(in crate::trainer) fn host(
    config: &Config,
    dist: &dyn DataParallel,
    learner: &Learner,
) -> Result<(PluginHost, Arc<HostServices>, Vec<SlotSpec>)> {
    // The run's gate: its schedule raises it, requests from other threads
    // (through the host's services and the signal handlers) lower it.
    let gate = Arc::new(Gate::new(0));
    let services = HostServices::new(gate, dist.collectives(), Duration::from_secs_f64(config.run.shutdown_timeout_s));
    let (host, slots) = PluginHost::load(&config.plugins_to_load(), &config.plugins, &config.origins, services.clone(), dist.rank())?;
    if learner.optimizer.shard_mode() == ShardMode::Parameters {
        let reads_params = slots.iter().any(|s| s.needs.intersects(Needs::PARAMS.union(Needs::GRADS).union(Needs::HISTOGRAMS)));
        sharding::refuse_unsupported(config, reads_params)?;
    }
    // Before the run leaves any record: a reward naming a plugin that scores nothing.
    crate::rollout::reward::plugin::check(config, &host)?;
    Ok((host, services, slots))
}

/// The run directory's first records (rank 0): the configuration as resolved and
/// the files it names that a later run needs. Only now, with every usage error
/// ruled out, does the run leave traces.
pub(in crate::trainer) fn record(config: &Config, run_dir: &Path, rank: u32) -> Result<()> {
    if rank != 0 {
        return Ok(());
    }
    std::fs::create_dir_all(run_dir).map_err(Error::writing(run_dir))?;
    let config_path = run_dir.join("config.toml");
    std::fs::write(&config_path, config.to_recorded_toml()).map_err(Error::writing(&config_path))?;
    crate::config::keep_sources(config, run_dir)
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

/// The run's schedule of the steps after `start_step`: the plugins' slots and the
/// core's, behind the services' gate.
pub(in crate::trainer) fn schedule(
    config: &Config,
    mut slots: Vec<SlotSpec>,
    services: &HostServices,
    (start_step, total_steps): (u64, u64),
    device: Device,
    world: u32,
) -> RunSchedule {
    slots.extend(core_slots(config, device));
    RunSchedule::new(slots, start_step + 1, total_steps, config.train.eval_every, services.gate(), world > 1)
}
