//! What a due call of a Python plugin costs the training thread, next to a Rust
//! plugin doing the same, on the CPU (BENCHMARKS.md, "Python plugins"):
//! - a sink's `on_metrics` with a batch of 10 scalars: the training thread's part
//!   (the dict's data copied, a queue push) and the whole call (until the interpreter
//!   has run it: N calls drained by `on_run_end`, divided by N);
//! - a guard's `on_step_end` returning nothing: the round trip to the interpreter.
//!
//! Rounds alternate Python and Rust back to back; each figure is the median of the
//! rounds' means. `cargo build --release --workspace --example python_overhead`, then
//! `target/release/examples/python_overhead` with scripts/env.sh sourced.

use std::time::Instant;

use ptrain_plugin_api::{testing, Hook, HostApi, Metric, MetricBatch, Outbox, Plugin, PluginResult, StepContext};
use ptrain_plugin_python::PythonPlugin;

const MODULE: &str = "EVERY = {\"on_step_end\": 1}\n\ndef on_step_end(ctx):\n    return None\n\ndef on_metrics(step, metrics):\n    pass\n";

/// The Rust comparison: reads every scalar of the batch (as a dict's construction
/// does) and returns.
struct RustSink {
    seen: f64,
}

impl RustSink {
    fn on_metrics(&mut self, batch: &MetricBatch) -> PluginResult {
        self.seen += batch.scalars().map(|(_, v)| v).sum::<f64>();
        Ok(())
    }

    fn on_step(&mut self, ctx: &StepContext<'_>, _out: &mut Outbox) -> PluginResult {
        self.seen += ctx.lr;
        Ok(())
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn per_call(calls: u32, f: impl FnMut(u32)) -> f64 {
    let mut f = f;
    let start = Instant::now();
    (0..calls).for_each(&mut f);
    start.elapsed().as_secs_f64() / f64::from(calls) * 1e6
}

fn main() {
    let dir = std::env::temp_dir().join(format!("ptrain-python-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("overhead_module.py"), MODULE).unwrap();
    let options = serde_json::json!({ "module": "overhead_module", "path": dir, "sink_queue": 100_000 });
    let mut python = PythonPlugin::new(options, HostApi::standalone()).expect("the module loads");
    let mut rust = RustSink { seen: 0.0 };
    let names = ["train/loss", "train/lr", "train/tokens_per_s", "train/samples_per_s", "train/epoch", "a/b", "a/c", "a/d", "a/e", "a/f"];
    let batch = testing::metric_batch(10, names.iter().map(|n| Metric::scalar(*n, 1.5)).collect());
    let ctx = testing::step(Hook::StepEnd, 10);
    let (calls, rounds) = (2_000, 15);
    let mut figures: [Vec<f64>; 5] = Default::default();
    for _ in 0..rounds {
        // The sink's call as the training thread sees it, then until the interpreter ran them all.
        let start = Instant::now();
        figures[0].push(per_call(calls, |_| python.on_metrics(&batch).unwrap()));
        python.on_run_end(&testing::run_end(10)).unwrap();
        figures[1].push(start.elapsed().as_secs_f64() / f64::from(calls) * 1e6);
        figures[2].push(per_call(calls, |_| rust.on_metrics(&batch).unwrap()));
        let mut out = Outbox::new();
        figures[3].push(per_call(calls / 4, |_| python.on_step(&ctx, &mut out).unwrap()));
        figures[4].push(per_call(calls / 4, |_| rust.on_step(&ctx, &mut out).unwrap()));
    }
    let [sink_push, sink_whole, rust_sink, guard, rust_guard] = figures.map(median);
    println!("per due call, median of {rounds} rounds (us):");
    println!("  on_metrics, 10 scalars: python {sink_push:.2} on the training thread, {sink_whole:.2} until run; rust {rust_sink:.3}");
    println!("  on_step_end, nothing returned: python {guard:.2} (a round trip); rust {rust_guard:.3}");
    println!("(checksum {})", rust.seen);
    std::fs::remove_dir_all(&dir).ok();
}
