//! The plugin driven as the host drives it, with a host whose collective counts
//! its calls and doubles the tensor (two ranks that saw the same batches).

use std::sync::atomic::{AtomicUsize, Ordering};

use abi_stable::std_types::{RResult, RSlice, RStr, RString};
use ptrain_plugin_api::{testing, Hook, HostApi, LogLevel, ModelInfo, Outbox, Plugin, RunInfo, StepContext, StepTensors, Task, TensorRef};
use tch::Tensor;

use super::DatasetMetrics;

#[derive(Default)]
struct Calls {
    reduces: AtomicUsize,
    warnings: AtomicUsize,
}

extern "C" fn log(ctx: *const (), level: LogLevel, _: RStr<'_>, _: RStr<'_>) {
    // SAFETY: `ctx` is the `Calls` this test's host API was built with, alive for the test.
    let calls = unsafe { &*(ctx as *const Calls) };
    if level == LogLevel::Warn {
        calls.warnings.fetch_add(1, Ordering::SeqCst);
    }
}

extern "C" fn double(ctx: *const (), tensor: TensorRef) -> RResult<(), RString> {
    // SAFETY: `ctx` is the `Calls` this test's host API was built with, alive for the test.
    let calls = unsafe { &*(ctx as *const Calls) };
    calls.reduces.fetch_add(1, Ordering::SeqCst);
    tensor.with(|t| {
        let _ = t.shallow_clone().g_mul_scalar_(2.0);
    });
    RResult::ROk(())
}

fn host(calls: &'static Calls) -> HostApi {
    HostApi { ctx: calls as *const Calls as *const (), log, all_reduce_sum: double, ..HostApi::standalone() }
}

fn run_info(datasets: &[RStr<'static>], task: Task, f: impl FnOnce(&RunInfo<'_>)) {
    let model = ModelInfo { kind: "mlp".into(), task, n_params: 0, layers: RSlice::EMPTY };
    f(&RunInfo { world_size: 2, model, datasets: datasets.into(), batch_size: 4, ..testing::run_info() })
}

fn step(hook: Hook, step: u64, tensors: StepTensors) -> StepContext<'static> {
    StepContext { step_samples: 4, step_tokens: 4, world_size: 2, tensors, ..testing::step(hook, step) }
}

fn value(metrics: &[(String, f64)], name: &str) -> f64 {
    testing::scalar(metrics, name).unwrap_or_else(|| panic!("{name} missing from {metrics:?}"))
}

#[test]
fn a_report_all_reduces_once_and_emits_window_means() {
    let calls: &'static Calls = Box::leak(Box::default());
    let mut plugin = DatasetMetrics::new(serde_json::json!({}), host(calls)).unwrap();
    run_info(&["a".into(), "b".into()], Task::Classification, |info| plugin.on_run_start(info).unwrap());
    // Dataset a: one confident hit (loss ~0), one sure miss; b: one uniform guess.
    let logits = Tensor::from_slice(&[50.0f32, 0.0, 0.0, 50.0, 0.0, 0.0]).view([3, 2]);
    let labels = Tensor::from_slice(&[0i64, 0, 1]);
    let ids = Tensor::from_slice(&[0i64, 0, 1]);
    let mut out = Outbox::new();
    for s in 1..=2 {
        let tensors =
            StepTensors { logits: TensorRef::of(&logits), labels: TensorRef::of(&labels), dataset_ids: TensorRef::of(&ids), ..StepTensors::NONE };
        plugin.on_step(&step(Hook::AfterForward, s, tensors), &mut out).unwrap();
    }
    assert_eq!(calls.reduces.load(Ordering::SeqCst), 0, "accumulating communicates nothing");
    assert!(out.is_empty());
    plugin.on_step(&step(Hook::StepEnd, 2, StepTensors::NONE), &mut out).unwrap();
    assert_eq!(calls.reduces.load(Ordering::SeqCst), 1, "one collective per report");
    let m = testing::scalars(&mut out);
    assert!((value(&m, "dataset/a/loss") - 25.0).abs() < 1e-4, "{m:?}");
    assert_eq!(value(&m, "dataset/a/accuracy"), 0.5);
    assert_eq!(value(&m, "dataset/a/samples"), 8.0, "2 steps x 2 samples x 2 ranks");
    assert!((value(&m, "dataset/b/loss") - std::f64::consts::LN_2).abs() < 1e-6, "{m:?}");
    assert_eq!(value(&m, "dataset/b/samples"), 4.0);

    plugin.on_step(&step(Hook::StepEnd, 3, StepTensors::NONE), &mut out).unwrap();
    assert!(testing::scalars(&mut out).is_empty(), "an empty window emits nothing");
}

#[test]
fn data_without_datasets_is_skipped_with_one_warning() {
    let calls: &'static Calls = Box::leak(Box::default());
    let mut plugin = DatasetMetrics::new(serde_json::json!({}), host(calls)).unwrap();
    run_info(&[], Task::LanguageModel, |info| plugin.on_run_start(info).unwrap());
    let logits = Tensor::zeros([2, 4, 8], (tch::Kind::Float, tch::Device::Cpu));
    let mut out = Outbox::new();
    for s in 1..=3 {
        let tensors = StepTensors { logits: TensorRef::of(&logits), ..StepTensors::NONE };
        plugin.on_step(&step(Hook::AfterForward, s, tensors), &mut out).unwrap();
        plugin.on_step(&step(Hook::StepEnd, s, StepTensors::NONE), &mut out).unwrap();
    }
    assert!(out.is_empty());
    assert_eq!(calls.warnings.load(Ordering::SeqCst), 1);
    assert_eq!(calls.reduces.load(Ordering::SeqCst), 0);
}

#[test]
fn a_batch_without_ids_stops_the_plugin_with_one_warning() {
    let calls: &'static Calls = Box::leak(Box::default());
    let mut plugin = DatasetMetrics::new(serde_json::json!({}), host(calls)).unwrap();
    run_info(&["a".into()], Task::Classification, |info| plugin.on_run_start(info).unwrap());
    let logits = Tensor::zeros([2, 3], (tch::Kind::Float, tch::Device::Cpu));
    let labels = Tensor::from_slice(&[0i64, 1]);
    let mut out = Outbox::new();
    for s in 1..=2 {
        let tensors = StepTensors { logits: TensorRef::of(&logits), labels: TensorRef::of(&labels), ..StepTensors::NONE };
        plugin.on_step(&step(Hook::AfterForward, s, tensors), &mut out).unwrap();
    }
    plugin.on_step(&step(Hook::StepEnd, 2, StepTensors::NONE), &mut out).unwrap();
    assert!(out.is_empty());
    assert_eq!(calls.warnings.load(Ordering::SeqCst), 1);
}

#[test]
fn unknown_options_are_rejected_by_name() {
    let error = DatasetMetrics::new(serde_json::json!({"loss_only": true}), HostApi::standalone()).err().expect("rejected");
    assert!(error.message().contains("loss_only"), "{}", error.message());
}
