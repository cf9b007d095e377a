//! Micro-benchmarks of what plugins cost the training thread.
//!
//! - `dispatch/none_due`: one step's dispatch with five real plugins loaded
//!   (jsonl, tensorboard, wandb, perf, checkpoint) and none of them due: the gate
//!   check plus the hook-point tests the loop makes (`core/src/trainer/step.rs`).
//! - `dispatch/due_plan`: the same when something is due (the scheduler's plan).
//! - `bus/emit`: handing a 16-scalar metrics batch to a worker sink (jsonl).
//!
//! Needs the workspace built (`cargo build --release --workspace`): it loads the
//! plugin libraries from target/release.

use std::{collections::BTreeMap, hint::black_box, path::PathBuf, sync::Arc, time::Duration};

use abi_stable::std_types::RVec;
use criterion::{criterion_group, criterion_main, Criterion};
use ptrain_core::{
    host::{Event, HostServices, PluginHost, Reach, RunData},
    schedule::{Gate, Hook, Needs, RunSchedule, StepPlan},
};
use ptrain_plugin_api::{DeviceKind, Metric, MetricBatch, Task};

fn plugin_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release");
    assert!(dir.join("libptrain_plugin_jsonl.so").exists(), "build the workspace first: cargo build --release --workspace");
    dir
}

/// Five plugins loaded, with cadences that make none due in the measured range,
/// and the run's schedule of their attachments.
fn loaded(plugins: &[&str], every: i64) -> (PluginHost, RunSchedule) {
    let dir = plugin_dir();
    let requests: Vec<String> = plugins.iter().map(|p| dir.join(format!("libptrain_plugin_{p}.so")).display().to_string()).collect();
    // Every attachment of every plugin gets the cadence, not only the first.
    let mut tables = BTreeMap::new();
    for path in &requests {
        let library = ptrain_core::host::loader::load(std::path::Path::new(path)).expect("plugin loads");
        let mut t = toml::Table::new();
        for a in library.descriptor.attachments.iter().filter(|a| a.hook.is_scheduled()) {
            let mut cadence = toml::Table::new();
            cadence.insert("every".into(), toml::Value::Integer(every));
            for flag in ["first_step", "at_end", "at_eval", "at_checkpoint"] {
                cadence.insert(flag.into(), toml::Value::Boolean(false));
            }
            cadence.insert("every_secs".into(), toml::Value::Float(0.0));
            t.insert(a.name.as_str().into(), toml::Value::Table(cadence));
        }
        tables.insert(library.descriptor.name.as_str().to_string(), t);
    }
    let gate = Arc::new(Gate::new(0));
    let services = HostServices::new(gate.clone(), Arc::new(ptrain_core::dist::SingleRank), Duration::from_secs(60));
    let (host, slots) = PluginHost::load(&requests, &tables, &Default::default(), services, 0).expect("plugins load");
    (host, RunSchedule::new(slots, 1, u64::MAX - 1, 0, gate, false))
}

/// The loop's per-step dispatch: the gate, then the hook-point tests.
#[inline(always)]
fn step_dispatch(host: &mut PluginHost, schedule: &mut RunSchedule, step: u64) -> u32 {
    let plan = if schedule.is_due(step) { schedule.plan(step, || host.take_departed(step)) } else { StepPlan::NONE };
    let mut calls = 0;
    for hook in [Hook::StepStart, Hook::AfterForward, Hook::AfterBackward] {
        calls += plan.has(hook) as u32;
    }
    calls += plan.needs.contains(Needs::DETAILED_METRICS) as u32;
    calls += !plan.is_empty() as u32;
    calls
}

fn dispatch(c: &mut Criterion) {
    let five = ["jsonl", "tensorboard", "wandb", "perf", "checkpoint"];
    let (mut host, mut schedule) = loaded(&five, 1_000_000_000);
    let mut step = 1u64;
    c.bench_function("dispatch/none_due (5 plugins loaded)", |b| {
        b.iter(|| {
            step += 1;
            black_box(step_dispatch(&mut host, &mut schedule, black_box(step)))
        })
    });
    let (mut host, mut schedule) = loaded(&five, 1);
    let mut step = 1u64;
    c.bench_function("dispatch/due_plan (5 plugins due every step)", |b| {
        b.iter(|| {
            step += 1;
            black_box(step_dispatch(&mut host, &mut schedule, black_box(step)))
        })
    });
}

fn bus(c: &mut Criterion) {
    let (mut host, mut schedule) = loaded(&["jsonl"], 1);
    let dir = tempfile::tempdir().unwrap();
    host.run_start(&Arc::new(RunData {
        run_dir: dir.path().display().to_string(),
        run_name: "bench".into(),
        config_toml: String::new(),
        seed: 0,
        start_step: 0,
        total_steps: u64::MAX,
        rank: 0,
        world_size: 1,
        device_kind: DeviceKind::Cpu,
        device_index: -1,
        device_name: "cpu".into(),
        model_kind: "bench".into(),
        task: Task::LanguageModel,
        n_params: 0,
        layers: Vec::new(),
        datasets: Vec::new(),
        batch_size: 1,
        seq_len: 1,
        accum_steps: 1,
        precision: "fp32".into(),
        start_time: 0.0,
        collective_timeout_s: 60.0,
        debug: Default::default(),
    }));
    let names: Vec<String> = (0..16).map(|i| format!("train/metric_{i}")).collect();
    let mut step = 0u64;
    c.bench_function("bus/emit (16 scalars to one worker sink)", |b| {
        b.iter(|| {
            step += 1;
            schedule.plan(step, || host.take_departed(step));
            let metrics: RVec<Metric> = names.iter().enumerate().map(|(i, n)| Metric::scalar(n.as_str(), i as f64)).collect();
            let batch = MetricBatch { step, wall_time: 0.0, elapsed_s: 0.0, metrics };
            host.dispatch(Event::Metrics(Arc::new(batch)), Reach::Due(schedule.due()));
        })
    });
}

criterion_group!(benches, dispatch, bus);
criterion_main!(benches);
