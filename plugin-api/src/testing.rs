//! Fixtures for unit-testing a plugin without the host: a run, a step, a metrics
//! batch and a run's end as a single-process CPU run would describe them. Change
//! what a test is about with struct-update syntax:
//! `StepContext { elapsed_s: 2.0, ..testing::step(Hook::StepEnd, 10) }`; hand tensors
//! over with `StepTensors { logits: TensorRef::of(&t), ..StepTensors::NONE }` and
//! gradients with `grads: named.as_slice().into()` (see [`crate::NamedTensor::new`]).
//! A [`RecordingHost`] stands in for the host and records what the plugin asked of it.

use abi_stable::std_types::RSlice;

pub use crate::host::{HostCall, RecordingHost};
use crate::{
    attachment::Hook,
    context::{DebugFaults, DeviceInfo, DeviceKind, ModelInfo, PhaseTimes, RunEnd, RunInfo, StepContext, StepTensors, Task},
    metrics::{Metric, MetricBatch, Outbox},
};

pub fn cpu() -> DeviceInfo<'static> {
    DeviceInfo { kind: DeviceKind::Cpu, index: -1, name: "cpu".into() }
}

/// A fresh 10-step run of a language model with one sample per step.
pub fn run_info() -> RunInfo<'static> {
    RunInfo {
        run_dir: "".into(),
        run_name: "test".into(),
        config_toml: "".into(),
        seed: 0,
        start_step: 0,
        total_steps: 10,
        rank: 0,
        world_size: 1,
        device: cpu(),
        model: ModelInfo { kind: "gpt".into(), task: Task::LanguageModel, n_params: 1, layers: RSlice::EMPTY },
        datasets: RSlice::EMPTY,
        batch_size: 1,
        seq_len: 1,
        accum_steps: 1,
        precision: "fp32".into(),
        start_time: 0.0,
        collective_timeout_s: 60.0,
        debug: DebugFaults::default(),
    }
}

/// The first call of `hook` at `step` of a fresh run, with no tensors and no scalars.
pub fn step(hook: Hook, step: u64) -> StepContext<'static> {
    StepContext {
        hook,
        step,
        micro_batch: 0,
        epoch: 0,
        lr: 0.0,
        samples_seen: 0,
        tokens_seen: 0,
        step_samples: 1,
        step_tokens: 1,
        step_trained_tokens: 0,
        phases: PhaseTimes::default(),
        phases_total: PhaseTimes::default(),
        steps_run: step,
        elapsed_s: 0.0,
        rank: 0,
        world_size: 1,
        device: cpu(),
        scalars: RSlice::EMPTY,
        tensors: StepTensors::NONE,
        params: RSlice::EMPTY,
        grads: RSlice::EMPTY,
    }
}

/// The scalars a plugin put in `out`, by name, emptying it; panics on a histogram.
pub fn scalars(out: &mut Outbox) -> Vec<(String, f64)> {
    let mut metrics: Vec<Metric> = Vec::new();
    out.drain_into(&mut metrics);
    metrics.iter().map(|m| (m.name.to_string(), m.as_scalar().expect("a scalar metric"))).collect()
}

/// The value of the scalar `name` among `scalars`.
pub fn scalar(scalars: &[(String, f64)], name: &str) -> Option<f64> {
    scalars.iter().find(|(n, _)| n == name).map(|s| s.1)
}

/// A metrics batch at `step`, as a sink receives it: `metric_batch(10, vec![Metric::scalar("train/loss", 2.5)])`.
pub fn metric_batch(step: u64, metrics: Vec<Metric>) -> MetricBatch {
    MetricBatch { step, wall_time: 0.0, elapsed_s: 0.0, metrics: metrics.into() }
}

/// The end of a run that completed at `step`.
pub fn run_end(step: u64) -> RunEnd<'static> {
    RunEnd { step, exit_code: 0, wall_s: 0.0, scalars: RSlice::EMPTY }
}
