//! What the host tells a plugin: one event type for every call, and the one
//! function that turns an event into a call of the plugin's ABI methods. Inline
//! plugins get events on the training thread; worker plugins get the queued ones
//! (see [`Event::queued`]) on their own thread, through the same [`call`].

use std::sync::Arc;
use std::time::Duration;

use abi_stable::std_types::{RResult, RSlice};
use ptrain_plugin_api::{CheckpointPayload, Hook, MetricBatch, Needs, Outbox, PluginBox, StepContext, StepTensors, TensorRef};

use super::{
    reward::RewardRequest,
    run_data::{RunData, RunEndData},
};

/// One call to a plugin.
pub enum Event<'a> {
    /// Before the first step. Every plugin gets it, declared or not.
    RunStart(Arc<RunData>),
    /// A step hook or [`Hook::Eval`] (`ctx.hook` says which). Inline plugins only.
    Step(&'a StepContext<'a>),
    /// Metrics emitted at a step, for sinks.
    Metrics(Arc<MetricBatch>),
    /// A checkpoint to write, for checkpoint plugins.
    Checkpoint(Arc<CheckpointPayload>),
    /// After the last step. Every plugin gets it, declared or not.
    RunEnd(Arc<RunEndData>),
    /// The plugin's state, for a checkpoint at `step`. `wait`: how long a worker busy
    /// in a call of its own is waited for (zero during training: a save never waits
    /// for a sink; the end-of-run save, which no step follows, waits a little).
    SaveState { step: u64, wait: Duration },
    /// The state the plugin saved in the checkpoint being resumed.
    LoadState { step: u64, state: &'a [u8] },
    /// A timer tick of a worker plugin, made by its own thread (never queued); `step`
    /// is that of the last event it handled, for a failure's report.
    Timer { step: u64 },
    /// A micro-batch of completions for a reward plugin to score (queued to its worker;
    /// the answer goes back on the request's channel).
    Reward(Arc<RewardRequest>),
}

/// An event on its way to a worker thread: only the owned kinds (run start and
/// end, metrics, checkpoints), made by [`Event::queued`].
pub struct Queued(pub Event<'static>);

// SAFETY: `Event::queued` makes only the variants that own their data through
// `Arc`s of `Send + Sync` types (a reward request's reply sender is behind a mutex); the step context, whose tensor handles are raw
// pointers valid on the training thread only, is never queued.
unsafe impl Send for Queued {}

/// What a call answered besides success.
pub enum Reply {
    Done,
    /// `on_run_end`'s summary fragment (JSON), empty for none.
    Summary(String),
    /// `save_state`'s bytes.
    State(Vec<u8>),
    /// `score`'s scores, one per completion (NaN: none).
    Scores(Vec<f64>),
}

impl Event<'_> {
    /// The hook whose attachments select the receivers, or `None` for the
    /// lifecycle events every plugin receives (run start and end, state).
    pub fn scheduled_hook(&self) -> Option<Hook> {
        match self {
            Event::Step(ctx) => Some(ctx.hook),
            Event::Metrics(_) => Some(Hook::Metrics),
            Event::Checkpoint(_) => Some(Hook::Checkpoint),
            Event::RunStart(_) | Event::RunEnd(_) | Event::SaveState { .. } | Event::LoadState { .. } | Event::Timer { .. } | Event::Reward(_) => {
                None
            }
        }
    }

    /// The name a failure is reported under.
    pub fn name(&self) -> &'static str {
        match self {
            Event::RunStart(_) => "run_start",
            Event::Step(ctx) => ctx.hook.name(),
            Event::Metrics(_) => "metrics",
            Event::Checkpoint(_) => "checkpoint",
            Event::RunEnd(_) => "run_end",
            Event::SaveState { .. } => "save_state",
            Event::LoadState { .. } => "load_state",
            Event::Timer { .. } => "timer",
            Event::Reward(_) => "reward",
        }
    }

    /// The step the event belongs to, so a failure is reported at the step that failed.
    pub fn step(&self) -> u64 {
        match self {
            Event::RunStart(run) => run.start_step,
            Event::Step(ctx) => ctx.step,
            Event::Metrics(batch) => batch.step,
            Event::Checkpoint(payload) => payload.step,
            Event::RunEnd(end) => end.step,
            Event::SaveState { step, .. } | Event::LoadState { step, .. } | Event::Timer { step } => *step,
            Event::Reward(request) => request.batch.step,
        }
    }

    /// An owned copy for a worker's queue; `None` for the events a worker plugin
    /// gets synchronously (state) or not at all (step hooks).
    pub fn queued(&self) -> Option<Queued> {
        Some(Queued(match self {
            Event::RunStart(run) => Event::RunStart(run.clone()),
            Event::Metrics(batch) => Event::Metrics(batch.clone()),
            Event::Checkpoint(payload) => Event::Checkpoint(payload.clone()),
            Event::RunEnd(end) => Event::RunEnd(end.clone()),
            Event::Reward(request) => Event::Reward(request.clone()),
            Event::Step(_) | Event::SaveState { .. } | Event::LoadState { .. } | Event::Timer { .. } => return None,
        }))
    }

    /// Metrics batches may be dropped from a full queue; nothing else ever is.
    pub fn droppable(&self) -> bool {
        matches!(self, Event::Metrics(_))
    }
}

/// The step context with only the tensors `needs` asked for.
fn masked<'a>(ctx: &StepContext<'a>, needs: Needs) -> StepContext<'a> {
    let keep = |flag: Needs, t: &TensorRef| {
        if needs.contains(flag) {
            // SAFETY: the handle comes from `ctx`, whose tensors the host keeps alive for
            // the whole call the masked context is made for.
            unsafe { TensorRef::from_raw(t.as_raw()) }
        } else {
            TensorRef::NULL
        }
    };
    let t = &ctx.tensors;
    StepContext {
        tensors: StepTensors {
            loss: keep(Needs::LOSS, &t.loss),
            logits: keep(Needs::LOGITS, &t.logits),
            labels: keep(Needs::LABELS, &t.labels),
            dataset_ids: keep(Needs::DATASET_IDS, &t.dataset_ids),
            inputs: keep(Needs::INPUTS, &t.inputs),
        },
        params: if needs.contains(Needs::PARAMS) { ctx.params } else { RSlice::EMPTY },
        grads: if needs.contains(Needs::GRADS) { ctx.grads } else { RSlice::EMPTY },
        ..*ctx
    }
}

/// Calls `plugin` with `event`: the one place a plugin method is called. `needs`
/// masks a step context's tensors; what the plugin emits goes to `out`.
pub fn call(plugin: &mut PluginBox, event: &Event<'_>, needs: Needs, out: &mut Outbox) -> Result<Reply, String> {
    let done = |r: RResult<(), _>| r.into_result().map(|()| Reply::Done);
    let result = match event {
        Event::RunStart(run) => run.with_view(|info| done(plugin.on_run_start(info))),
        Event::Step(ctx) => done(plugin.on_step(&masked(ctx, needs), out)),
        Event::Metrics(batch) => done(plugin.on_metrics(batch)),
        Event::Checkpoint(payload) => done(plugin.on_checkpoint(payload)),
        Event::RunEnd(end) => end.with_view(|end| plugin.on_run_end(end).into_result().map(|s| Reply::Summary(s.into_string()))),
        Event::SaveState { .. } => plugin.save_state().into_result().map(|bytes| Reply::State(bytes.into_vec())),
        Event::LoadState { state, .. } => done(plugin.load_state((*state).into())),
        Event::Timer { .. } => done(plugin.on_timer()),
        Event::Reward(request) => request.batch.view(|batch| plugin.score(batch)).into_result().map(|s| Reply::Scores(s.into_vec())),
    };
    result.map_err(|e| e.into_string())
}
