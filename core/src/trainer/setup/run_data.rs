//! Set-up's last stages: what plugins are told about the run ([`RunData`]), and
//! the loader of the training batches, drawing from the step after the resumed one.

use std::{path::Path, sync::Arc};

use ptrain_plugin_api::{DebugFaults, DeviceKind};
use tch::Device;

use super::super::{batches::StepBatches, clock::unix_now, debug::PanicAt, learner::Learner};
use crate::{
    config::Config,
    data::{loader::DrawPlan, Dataset, Loader},
    device,
    host::RunData,
};

/// The run as plugins are told about it.
pub(in crate::trainer) fn run_data(
    config: &Config,
    run_dir: &Path,
    learner: &Learner,
    (start_step, total_steps): (u64, u64),
    (rank, world): (u32, u32),
) -> RunData {
    let device = learner._vs.device();
    let dataset = &learner.dataset;
    RunData {
        // Absolute: a plugin may change its working directory, or hand the path on.
        run_dir: std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.to_owned()).display().to_string(),
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
        model_kind: learner.model.kind().to_string(),
        task: learner.model.task(),
        n_params: learner.params.iter().map(|(_, p)| p.numel() as u64).sum(),
        layers: learner.model.layers(dataset.seq_len()),
        datasets: dataset.dataset_names(),
        batch_size: config.data.batch_size as u64,
        seq_len: dataset.seq_len() as u64,
        accum_steps: config.optim.accum_steps,
        precision: format!("{:?}", config.train.precision).to_lowercase(),
        start_time: unix_now(),
        collective_timeout_s: config.dist.timeout_s as f64,
        debug: DebugFaults {
            pause_save_at_step: config.debug.pause_save_at_step,
            pause_save_after_files: config.debug.pause_save_after_files.max(1),
            late_save_at_step: config.debug.late_save_at_step,
        },
    }
}

/// The step's micro-batches from a loader drawing this rank's share of the steps
/// after `start_step` (pinned for asynchronous copies to a GPU when asked).
pub(in crate::trainer) fn batches(
    config: &Config,
    dataset: &Arc<dyn Dataset>,
    start_step: u64,
    (rank, world): (u32, u32),
    device: Device,
) -> StepBatches {
    let accum = config.optim.accum_steps;
    let pin = config.data.pin_memory && device.is_cuda();
    let draws = DrawPlan {
        first_step: start_step + 1,
        accum_steps: accum,
        batch_size: config.data.batch_size as u64,
        rank: rank as u64,
        world: world as u64,
    };
    let drawn: Arc<dyn Dataset> = match config.debug.data_panic_at_step {
        0 => dataset.clone(),
        step => Arc::new(PanicAt { inner: dataset.clone(), step }),
    };
    let loader = Loader::new(drawn, draws, config.data.num_workers, config.data.prefetch, pin.then_some(device));
    StepBatches::new(loader, device, accum)
}
