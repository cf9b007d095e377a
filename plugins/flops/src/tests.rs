//! The plugin driven as the host drives it: report arithmetic on given clocks,
//! and the distributed hand-off through a host whose broadcast is counted.

use std::sync::atomic::{AtomicUsize, Ordering};

use abi_stable::std_types::{RResult, RStr, RString};
use ptrain_plugin_api::{testing, Hook, HostApi, LayerKind, LayerSpec, ModelInfo, Outbox, Plugin, RunInfo, StepContext, Task, TensorRef};

use super::Flops;

/// What rank 0 holds in the broadcast test: FLOPs per step, peak FLOP/s, and the
/// positions of the step it profiled.
const RANK0: [f64; 3] = [1.5e9, 2.0e12, 8.0];

static BROADCASTS: AtomicUsize = AtomicUsize::new(0);
static LOGS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn count_log(_: *const (), _: ptrain_plugin_api::LogLevel, _: RStr<'_>, _: RStr<'_>) {
    LOGS.fetch_add(1, Ordering::SeqCst);
}

extern "C" fn broadcast_from_rank0(_: *const (), tensor: TensorRef, root: u32) -> RResult<(), RString> {
    assert_eq!(root, 0);
    BROADCASTS.fetch_add(1, Ordering::SeqCst);
    tensor.with(|t| t.shallow_clone().copy_(&tch::Tensor::from_slice(&RANK0)));
    RResult::ROk(())
}

fn linear(inp: u64, out: u64, input_grad: bool) -> LayerSpec<'static> {
    LayerSpec {
        name: "l".into(),
        kind: LayerKind::Linear,
        in_features: inp,
        out_features: out,
        positions: 1,
        heads: 0,
        head_dim: 0,
        seq_len: 0,
        input_grad,
    }
}

fn start(plugin: &mut Flops, layers: &[LayerSpec<'static>], rank: u32, world_size: u32, accum_steps: u64) -> ptrain_plugin_api::PluginResult {
    let model = ModelInfo { kind: "mlp".into(), task: Task::Classification, n_params: 0, layers: layers.into() };
    plugin.on_run_start(&RunInfo { rank, world_size, model, batch_size: 8, accum_steps, ..testing::run_info() })
}

/// A report after `steps_run` steps of `positions` token positions each on every
/// one of `world` ranks.
fn report_of(plugin: &mut Flops, steps_run: u64, elapsed_s: f64, positions: u64, world: u64) -> Vec<(String, f64)> {
    let tokens_seen = steps_run * positions * world;
    let ctx = StepContext { step_samples: 8, step_tokens: positions, tokens_seen, elapsed_s, ..testing::step(Hook::StepEnd, steps_run) };
    let mut out = Outbox::new();
    plugin.on_step(&ctx, &mut out).unwrap();
    testing::scalars(&mut out)
}

/// Full steps: 16 positions (8 samples x 2 micro-batches of one position), one rank.
fn report(plugin: &mut Flops, steps_run: u64, elapsed_s: f64) -> Vec<(String, f64)> {
    report_of(plugin, steps_run, elapsed_s, 16, 1)
}

fn get(metrics: &[(String, f64)], name: &str) -> Option<f64> {
    testing::scalar(metrics, name)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs()
}

#[test]
fn reports_count_per_optimizer_step_and_rate_over_each_window() {
    let mut plugin = Flops::new(serde_json::json!({"peak_tflops": 1.0}), HostApi::standalone()).unwrap();
    // 16 -> 32 -> 4 with no input gradient at the first layer; 8 samples x 2 micro-batches.
    start(&mut plugin, &[linear(16, 32, false), linear(32, 4, true)], 0, 1, 2).unwrap();
    let per_step = (3 * 2 * (16 * 32 + 32 * 4) - 2 * 16 * 32) as f64 * 16.0;

    let first = report(&mut plugin, 1, 5.0);
    assert_eq!(get(&first, "flops/step"), Some(per_step));
    assert_eq!(get(&first, "flops/achieved_tflops"), None, "the warm-up step alone is no rate");

    let second = report(&mut plugin, 11, 7.0);
    let achieved = per_step * 10.0 / 2.0;
    assert!(close(get(&second, "flops/achieved_tflops").unwrap(), achieved / 1e12), "{second:?}");
    assert!(close(get(&second, "perf/mfu").unwrap(), achieved / 1e12), "peak 1 TFLOP/s");

    let third = report(&mut plugin, 21, 12.0);
    assert!(close(get(&third, "flops/achieved_tflops").unwrap(), per_step * 10.0 / 5.0 / 1e12), "{third:?}");
}

#[test]
fn steps_that_compute_fewer_positions_count_fewer_flops() {
    let mut plugin = Flops::new(serde_json::json!({"peak_tflops": 1.0}), HostApi::standalone()).unwrap();
    start(&mut plugin, &[linear(16, 32, false), linear(32, 4, true)], 0, 1, 2).unwrap();
    let per_step = (3 * 2 * (16 * 32 + 32 * 4) - 2 * 16 * 32) as f64 * 16.0;
    // Rows padded to the longest of their micro-batch: a quarter of the configured shape.
    let first = report_of(&mut plugin, 1, 5.0, 4, 1);
    assert_eq!(get(&first, "flops/step"), Some(per_step / 4.0));
    let second = report_of(&mut plugin, 11, 7.0, 4, 1);
    assert!(close(get(&second, "flops/achieved_tflops").unwrap(), per_step / 4.0 * 10.0 / 2.0 / 1e12), "{second:?}");
}

#[test]
fn other_ranks_take_rank_zeros_figures_from_one_broadcast() {
    let host = HostApi { broadcast: broadcast_from_rank0, log: count_log, ..HostApi::standalone() };
    // No layers: the count comes from rank 0's profile.
    let mut plugin = Flops::new(serde_json::json!({}), host).unwrap();
    start(&mut plugin, &[], 1, 2, 1).unwrap();
    assert_eq!(LOGS.load(Ordering::SeqCst), 0, "rank 1 measured no peak of its own");
    let first = report_of(&mut plugin, 1, 1.0, 8, 2);
    assert_eq!(get(&first, "flops/step"), Some(RANK0[0]));
    let later = report_of(&mut plugin, 5, 3.0, 8, 2);
    assert!(close(get(&later, "perf/mfu").unwrap(), RANK0[0] * 4.0 / 2.0 / RANK0[1]), "{later:?}");
    report_of(&mut plugin, 9, 5.0, 8, 2);
    assert_eq!(BROADCASTS.load(Ordering::SeqCst), 1, "one broadcast, once");
}

#[test]
fn count_without_layers_and_bad_options_are_errors() {
    let mut plugin = Flops::new(serde_json::json!({"method": "count"}), HostApi::standalone()).unwrap();
    let error = start(&mut plugin, &[], 0, 1, 1).expect_err("a model without layers cannot be counted");
    assert!(error.message().contains("count"), "{}", error.message());
    for (options, key) in [(serde_json::json!({"every_step": 1}), "every_step"), (serde_json::json!({"peak_tflops": -3.0}), "peak_tflops")] {
        let error = Flops::new(options, HostApi::standalone()).err().expect("rejected");
        assert!(error.message().contains(key), "{}", error.message());
    }
}
