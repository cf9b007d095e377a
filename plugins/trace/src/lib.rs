//! `trace`: libtorch's Kineto profiler over windows of steps on a schedule like
//! `torch.profiler.schedule` (`wait`, `warmup`, `active`, `repeat`, `every`; by
//! default steps 10-12, then every 1000 steps). Each window becomes
//! `<run-dir>/traces/step-<N>.rank<R>.pt.trace.json` (N: its first recorded step),
//! the Chrome trace `torch.profiler`'s `export_chrome_trace` writes: CPU operators
//! with their input shapes, `ProfilerStep#<step>` spans, CUDA kernels on CUDA,
//! memory events with `record_memory`, and on CUDA with `memory_snapshot` the
//! caching allocator's `_snapshot()` pickle next to it.
//!
//! The plugin declares its windows to the host ([`Plugin::step_windows`]), so it
//! is called only on the steps inside them: a step outside costs nothing. The
//! training thread starts and stops the profiler; the host's deferred-work thread
//! writes the files (`HostApi::defer`). See docs/plugins/trace.md.

mod save;
mod schedule;

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use ptrain_plugin_api::{
    export_plugin, parse_options, Attachment, Cadence, Descriptor, DeviceKind, Hook, HostApi, LogLevel, Outbox, Plugin, PluginResult, RunEnd,
    RunInfo, StepContext, StepWindows, Threading,
};
use ptrain_torch_ext::trace::{self, Span};
use serde::Deserialize;

use save::{Window, Written};
use schedule::{Phase, Schedule};

pub(crate) const NAME: &str = "trace";
/// Allocation events the CUDA caching allocator keeps for a memory snapshot.
const MEMORY_HISTORY_ENTRIES: i64 = 100_000;

/// The schedule's keys are spelled out here rather than flattened from
/// [`Schedule`], so that a wrong value is reported with its key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Options {
    wait: u64,
    warmup: u64,
    active: u64,
    every: u64,
    repeat: u64,
    record_shapes: bool,
    record_memory: bool,
    memory_snapshot: bool,
    /// Default `<run-dir>/traces`.
    dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        let Schedule { wait, warmup, active, every, repeat } = Schedule::default();
        Options { wait, warmup, active, every, repeat, record_shapes: true, record_memory: false, memory_snapshot: false, dir: None }
    }
}

const ATTACHMENTS: &[Attachment] = &[
    // First, so that the table's `every` is this plugin's option (the cycle
    // length), not a cadence: the steps come from the windows.
    Attachment::new("start", Hook::RunStart, Cadence::NEVER),
    Attachment::new("step_start", Hook::StepStart, Cadence::NEVER),
    Attachment::new("step_end", Hook::StepEnd, Cadence::NEVER),
];

pub struct Trace {
    options: Options,
    schedule: Schedule,
    host: HostApi,
    profile: trace::Options,
    dir: PathBuf,
    rank: u32,
    world: u32,
    /// The CUDA device the run trains on (when `profile.cuda`).
    device_index: i32,
    snapshot: bool,
    /// What the deferred saves wrote.
    written: Arc<Mutex<Written>>,
    prepared: bool,
    /// The first recorded step of the window being recorded.
    recording: Option<u64>,
    span: Option<Span>,
    windows: u64,
}

impl Trace {
    fn step_start(&mut self, step: u64) -> PluginResult {
        let Some(phase) = self.schedule.phase(step) else { return Ok(()) };
        if !self.prepared {
            trace::prepare(self.profile)?;
            self.prepared = true;
            if self.snapshot {
                trace::cuda_memory_history(true, MEMORY_HISTORY_ENTRIES)?;
            }
        }
        if matches!(phase, Phase::Active { .. }) && self.recording.is_none() {
            trace::start(self.profile)?;
            // As torch.profiler writes them; HTA finds the rank as `"rank": N`.
            trace::metadata("distributedInfo", &format!("{{\"rank\": {}, \"world_size\": {}}}", self.rank, self.world))?;
            for (key, on) in [("record_shapes", self.profile.shapes), ("profile_memory", self.profile.memory)] {
                if on {
                    trace::metadata(key, "1")?;
                }
            }
            self.recording = Some(step);
        }
        if self.recording.is_some() {
            self.span = Some(Span::begin(&format!("ProfilerStep#{step}"))?);
        }
        Ok(())
    }

    fn step_end(&mut self, step: u64) -> PluginResult {
        if let Some(span) = self.span.take() {
            span.end()?;
        }
        if let Some(Phase::Active { last: true }) = self.schedule.phase(step) {
            self.finish_window()?;
        }
        Ok(())
    }

    /// Stops the profiler and hands the window to the host's deferred-work thread.
    fn finish_window(&mut self) -> PluginResult {
        self.span = None;
        let Some(first) = self.recording.take() else { return Ok(()) };
        self.prepared = false;
        // Waits for the GPU first: the window's last step is still running there.
        let recorded = trace::stop(self.profile.cuda.then_some(self.device_index))?;
        let snapshot = if self.snapshot {
            let bytes = trace::cuda_memory_snapshot()?;
            trace::cuda_memory_history(false, 0)?;
            Some((bytes, self.path(first, "memory.pickle")))
        } else {
            None
        };
        self.windows += 1;
        save::defer(self.host, Window { trace: recorded, path: self.path(first, "pt.trace.json"), snapshot }, &self.written);
        Ok(())
    }

    fn path(&self, step: u64, suffix: &str) -> PathBuf {
        self.dir.join(format!("step-{step}.rank{}.{suffix}", self.rank))
    }
}

impl Plugin for Trace {
    const DESCRIPTOR: Descriptor = Descriptor::new(
        NAME,
        env!("CARGO_PKG_VERSION"),
        "Kineto profiler traces (Chrome trace JSON) over windows of steps; its step hooks are due only inside them \
         (default: records steps 10-12, then every 1000)",
        Threading::Inline,
        ATTACHMENTS,
    );

    fn new(options: serde_json::Value, host: HostApi) -> PluginResult<Self> {
        let options: Options = parse_options(options)?;
        let schedule =
            Schedule { wait: options.wait, warmup: options.warmup, active: options.active, every: options.every, repeat: options.repeat }.check()?;
        let profile = trace::Options { cuda: false, shapes: options.record_shapes, memory: options.record_memory };
        Ok(Trace {
            options,
            schedule,
            host,
            profile,
            dir: PathBuf::new(),
            rank: 0,
            world: 1,
            device_index: 0,
            snapshot: false,
            written: Arc::default(),
            prepared: false,
            recording: None,
            span: None,
            windows: 0,
        })
    }

    fn step_windows(&self) -> PluginResult<StepWindows> {
        Ok(self.schedule.windows())
    }

    fn on_run_start(&mut self, run: &RunInfo<'_>) -> PluginResult {
        self.rank = run.rank;
        self.world = run.world_size;
        self.dir = self.options.dir.clone().unwrap_or_else(|| Path::new(run.run_dir.as_str()).join("traces"));
        self.profile.cuda = run.device.kind == DeviceKind::Cuda;
        self.device_index = run.device.index;
        self.snapshot = self.options.memory_snapshot && self.profile.cuda;
        if self.options.memory_snapshot && !self.profile.cuda && run.rank == 0 {
            self.host.log(LogLevel::Warn, NAME, "memory_snapshot needs CUDA: no memory snapshots on this device");
        }
        Ok(())
    }

    fn on_step(&mut self, ctx: &StepContext<'_>, _out: &mut Outbox) -> PluginResult {
        match ctx.hook {
            Hook::StepStart => self.step_start(ctx.step),
            Hook::StepEnd => self.step_end(ctx.step),
            _ => Ok(()),
        }
    }

    fn on_run_end(&mut self, _end: &RunEnd<'_>) -> PluginResult<Option<serde_json::Value>> {
        // A run that ends inside a window keeps what was recorded.
        let partial = self.recording.is_some();
        self.finish_window()?;
        if !self.host.wait_deferred(NAME) {
            self.host.log(LogLevel::Warn, NAME, "some traces were not written in time (run.shutdown_timeout_s): not listed");
        }
        let written = std::mem::take(&mut *self.written.lock().expect("trace lock"));
        Ok(Some(serde_json::json!({
            "dir": self.dir.display().to_string(),
            "windows": self.windows,
            "partial_last_window": partial,
            "files": written.files,
            "failed": written.failed,
        })))
    }
}

export_plugin!(Trace);

#[cfg(test)]
mod tests;
