//! The host's contexts as the owned arguments of a Python call.

use ptrain_plugin_api::{RunEnd, RunInfo, StepContext, TensorRef};
use tch::Tensor;

use crate::call::StepArgs;

/// A handle's tensor as a reference of our own (`None`: not offered, or undefined).
fn owned(t: &TensorRef) -> Option<Tensor> {
    t.with(|t| t.defined().then(|| t.shallow_clone())).flatten()
}

pub fn step_args(ctx: &StepContext<'_>) -> StepArgs {
    let counters = vec![
        ("step", ctx.step),
        ("micro_batch", ctx.micro_batch),
        ("epoch", ctx.epoch),
        ("samples_seen", ctx.samples_seen),
        ("tokens_seen", ctx.tokens_seen),
        ("step_samples", ctx.step_samples),
        ("step_tokens", ctx.step_tokens),
        ("steps_run", ctx.steps_run),
        ("rank", u64::from(ctx.rank)),
        ("world_size", u64::from(ctx.world_size)),
    ];
    let t = &ctx.tensors;
    let tensors = [("loss", &t.loss), ("logits", &t.logits), ("labels", &t.labels), ("inputs", &t.inputs), ("dataset_ids", &t.dataset_ids)];
    let named = |list: &[ptrain_plugin_api::NamedTensor]| list.iter().map(|n| (n.name.to_string(), owned(&n.tensor))).collect();
    StepArgs {
        hook: ctx.hook.name(),
        numbers: vec![("lr", ctx.lr), ("elapsed_s", ctx.elapsed_s)],
        counters,
        scalars: ctx.scalars.iter().map(|s| (s.name.to_string(), s.value)).collect(),
        tensors: tensors.into_iter().filter_map(|(name, t)| Some((name, owned(t)?))).collect(),
        params: named(ctx.params.as_slice()),
        grads: named(ctx.grads.as_slice()),
    }
}

pub fn run_info(run: &RunInfo<'_>) -> serde_json::Value {
    serde_json::json!({
        "run_dir": run.run_dir.as_str(),
        "run_name": run.run_name.as_str(),
        "seed": run.seed,
        "start_step": run.start_step,
        "total_steps": run.total_steps,
        "rank": run.rank,
        "world_size": run.world_size,
        "device": run.device.name.as_str(),
        "datasets": run.datasets.iter().map(|d| d.as_str()).collect::<Vec<_>>(),
        "batch_size": run.batch_size,
        "seq_len": run.seq_len,
        "accum_steps": run.accum_steps,
        "precision": run.precision.as_str(),
        "config_toml": run.config_toml.as_str(),
    })
}

pub fn run_end(end: &RunEnd<'_>) -> serde_json::Value {
    let scalars: serde_json::Map<String, serde_json::Value> = end.scalars.iter().map(|s| (s.name.to_string(), s.value.into())).collect();
    serde_json::json!({ "step": end.step, "exit_code": end.exit_code, "wall_s": end.wall_s, "scalars": scalars })
}
