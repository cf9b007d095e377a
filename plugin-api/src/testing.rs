//! Fixtures for unit-testing a plugin without the host: a run and a step as a
//! single-process CPU run would describe them. Change what a test is about with
//! struct-update syntax: `StepContext { elapsed_s: 2.0, ..testing::step(Hook::StepEnd, 10) }`.

use abi_stable::std_types::RSlice;

use crate::{
    context::{DeviceInfo, DeviceKind, ModelInfo, PhaseTimes, RunInfo, StepContext, StepTensors, Task},
    metrics::{Metric, Outbox},
    schedule::Hook,
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
