//! `python`: monitors, guards and sinks written in Python. One embedded interpreter
//! (the venv's, or `PTRAIN_PYTHON`'s `sys.path`) imports the module named by
//! `plugins.python.module` and calls its functions at the cadences it declares
//! (`EVERY`), which the host's schedule enforces: a step where none is due never
//! reaches the plugin. Calls run on the interpreter's own thread: sinks' queued,
//! the others waited for at most `timeout_s`.

mod call;
mod describe;
mod dlpack;
mod host_module;
mod interpreter;
mod python;
mod step;

use std::{path::PathBuf, time::Duration};

use ptrain_plugin_api::{
    bail, parse_options, CheckpointPayload, CheckpointReason, Descriptor, Hook, HostApi, MetricBatch, MetricValue, Outbox, Plugin, PluginResult,
    RunEnd, RunInfo, StepContext,
};

use crate::{
    call::{Args, Function, Returned},
    interpreter::Interpreter,
};

/// `path`: one directory or several.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Paths {
    One(PathBuf),
    Many(Vec<PathBuf>),
}

fn default_timeout() -> f64 {
    60.0
}

fn default_queue() -> usize {
    1024
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    /// The module to import (`my_monitor`, or `pkg.monitor`).
    module: Option<String>,
    /// Directories searched first for it (relative to the working directory).
    path: Option<Paths>,
    /// How long a call the training thread waits for (every call but a sink's) may
    /// take, and a sink's call may run, before the plugin fails and its interpreter
    /// is abandoned.
    #[serde(default = "default_timeout")]
    timeout_s: f64,
    /// Sink calls (`on_metrics`, `on_checkpoint`) waiting for the interpreter; more are
    /// dropped and counted.
    #[serde(default = "default_queue")]
    sink_queue: usize,
}

pub struct PythonPlugin {
    interpreter: Interpreter,
    module: String,
}

impl Plugin for PythonPlugin {
    const DESCRIPTOR: Descriptor = describe::BEFORE_LOADING;

    fn new(options: serde_json::Value, host: HostApi) -> PluginResult<Self> {
        let options: Options = parse_options(options)?;
        let Some(module) = options.module else {
            bail!("option `module` is required: the Python module to import (--set plugins.python.module=my_monitor)");
        };
        if !(options.timeout_s > 0.0 && options.timeout_s.is_finite()) {
            bail!("timeout_s = {}: must be > 0", options.timeout_s);
        }
        if options.sink_queue == 0 {
            bail!("sink_queue = 0: must be >= 1");
        }
        let paths = match options.path {
            None => Vec::new(),
            Some(Paths::One(p)) => vec![p],
            Some(Paths::Many(ps)) => ps,
        };
        let cwd = std::env::current_dir()?;
        let paths: Vec<PathBuf> = paths.into_iter().map(|p| cwd.join(p)).collect();
        if let Some(missing) = paths.iter().find(|p| !p.is_dir()) {
            bail!("path = {}: not a directory", missing.display());
        }
        host_module::set_host(host);
        let timeout = Duration::from_secs_f64(options.timeout_s);
        let (interpreter, declared) =
            Interpreter::start(module.clone(), paths, options.sink_queue, timeout).map_err(|e| format!("module `{module}`: {e}"))?;
        describe::after_loading(&declared);
        Ok(PythonPlugin { interpreter, module })
    }

    fn on_run_start(&mut self, run: &RunInfo<'_>) -> PluginResult {
        self.interpreter.call(Function::RunStart, run.start_step, Args::Json(step::run_info(run)))?;
        Ok(())
    }

    fn on_step(&mut self, ctx: &StepContext<'_>, out: &mut Outbox) -> PluginResult {
        let function = match ctx.hook {
            Hook::StepStart => Function::StepStart,
            Hook::AfterForward => Function::AfterForward,
            Hook::AfterBackward => Function::AfterBackward,
            Hook::StepEnd => Function::StepEnd,
            Hook::Eval => Function::Eval,
            _ => return Ok(()),
        };
        if let Returned::Scalars(scalars) = self.interpreter.call(function, ctx.step, Args::Step(Box::new(step::step_args(ctx))))? {
            for (name, value) in scalars {
                out.scalar(name, value);
            }
        }
        Ok(())
    }

    fn on_metrics(&mut self, batch: &MetricBatch) -> PluginResult {
        let (mut scalars, mut texts) = (Vec::with_capacity(batch.metrics.len()), Vec::new());
        for metric in batch.metrics.iter() {
            match &metric.value {
                MetricValue::Scalar(v) => scalars.push((metric.name.to_string(), *v)),
                MetricValue::Text(t) => texts.push((metric.name.to_string(), t.to_string())),
                MetricValue::Histogram(_) => {}
            }
        }
        self.interpreter.send(Function::Metrics, batch.step, Args::Metrics { step: batch.step, scalars, texts })?;
        Ok(())
    }

    fn on_checkpoint(&mut self, payload: &CheckpointPayload) -> PluginResult {
        let reason = match payload.reason {
            CheckpointReason::Scheduled => "scheduled",
            CheckpointReason::End => "end",
            CheckpointReason::Interrupted => "interrupted",
            CheckpointReason::NonFinite => "non_finite",
        };
        self.interpreter.send(Function::Checkpoint, payload.step, Args::Checkpoint { step: payload.step, reason })?;
        Ok(())
    }

    fn on_run_end(&mut self, end: &RunEnd<'_>) -> PluginResult<Option<serde_json::Value>> {
        // Waits for the sinks' queue to drain too: the call runs after them.
        let returned = self.interpreter.call(Function::RunEnd, end.step, Args::Json(step::run_end(end)))?;
        let mut summary = serde_json::json!({ "module": self.module, "sink_drops": self.interpreter.dropped() });
        if let Returned::Json(Some(value)) = returned {
            summary["returned"] = value;
        }
        Ok(Some(summary))
    }
}
