//! What the training thread hands the interpreter thread: owned data only (numbers,
//! names, tensors sharing the host's memory), made on the training thread at a due
//! call, turned into Python objects on the interpreter's thread.

use tch::Tensor;

/// The module's functions the plugin calls, in the order of its attachments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Function {
    Metrics,
    StepStart,
    AfterForward,
    AfterBackward,
    StepEnd,
    Eval,
    Checkpoint,
    RunStart,
    RunEnd,
}

impl Function {
    /// The functions a module may define that are called through attachments.
    pub const SCHEDULED: [Function; 7] = [
        Function::Metrics,
        Function::StepStart,
        Function::AfterForward,
        Function::AfterBackward,
        Function::StepEnd,
        Function::Eval,
        Function::Checkpoint,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Function::Metrics => "on_metrics",
            Function::StepStart => "on_step_start",
            Function::AfterForward => "on_after_forward",
            Function::AfterBackward => "on_after_backward",
            Function::StepEnd => "on_step_end",
            Function::Eval => "on_eval",
            Function::Checkpoint => "on_checkpoint",
            Function::RunStart => "on_run_start",
            Function::RunEnd => "on_run_end",
        }
    }

    /// Hooks whose calls hand tensors over (the module then needs torch).
    pub const fn takes_tensors(self) -> bool {
        matches!(self, Function::AfterForward | Function::AfterBackward)
    }
}

/// A step hook's context, as the module's `ctx` dict.
pub struct StepArgs {
    /// `step_end`, `eval`, ...: the hook's name.
    pub hook: &'static str,
    pub numbers: Vec<(&'static str, f64)>,
    pub counters: Vec<(&'static str, u64)>,
    /// `eval/loss` and the like, at `on_eval`.
    pub scalars: Vec<(String, f64)>,
    /// `loss`, `logits`, `labels`, `inputs`, `dataset_ids`: those the hook offers.
    pub tensors: Vec<(&'static str, Tensor)>,
    /// By name; `None` for an undefined gradient (a parameter this step did not reach).
    pub params: Vec<(String, Option<Tensor>)>,
    pub grads: Vec<(String, Option<Tensor>)>,
}

/// A call's arguments.
pub enum Args {
    /// `on_run_start(run)`, `on_run_end(end)`: a dict from JSON.
    Json(serde_json::Value),
    /// A step hook or `on_eval(ctx)`.
    Step(Box<StepArgs>),
    /// `on_metrics(step, metrics)`: scalars as floats, texts as str.
    Metrics { step: u64, scalars: Vec<(String, f64)>, texts: Vec<(String, String)> },
    /// `on_checkpoint(step, reason)`.
    Checkpoint { step: u64, reason: &'static str },
}

/// What a waited-for call answered: the scalars its returned dict holds (emitted as
/// the plugin's metrics; a summary fragment from `on_run_end`), or the exception.
pub type Answer = Result<Returned, String>;

/// The return value of a call, read on the interpreter's thread.
pub enum Returned {
    Scalars(Vec<(String, f64)>),
    Json(Option<serde_json::Value>),
}

pub struct Job {
    pub function: Function,
    pub step: u64,
    pub args: Args,
    /// Where a waited-for call's answer goes; `None` for a sink's call.
    pub reply: Option<std::sync::mpsc::SyncSender<Answer>>,
}
