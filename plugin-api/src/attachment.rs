//! What a plugin declares about itself: which hooks it attaches to and how often.

use abi_stable::{
    std_types::{RSlice, RStr},
    StableAbi,
};

/// A point in the run where the host can call plugins.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    /// Not an attachment point: `Plugin::on_run_start` reaches every plugin, once,
    /// before the first step. An attachment to it is ignored. (Kept so the enum's
    /// layout, and the ABI, stay as they are; failures are reported under its name.)
    RunStart,
    /// Before the batch of a due step is fetched.
    StepStart,
    /// After the forward pass of each micro-batch: loss, logits, labels and dataset
    /// ids are alive.
    AfterForward,
    /// After the backward pass, before gradient clipping: gradients are alive.
    AfterBackward,
    /// After the optimizer step.
    StepEnd,
    /// After an evaluation pass, with `eval/*` scalars: due at every step that
    /// evaluates, whatever the attachment's cadence.
    Eval,
    /// A checkpoint payload to persist (worker plugins), at the attachment's cadence
    /// and on emergencies (signals, non-finite stop).
    Checkpoint,
    /// A batch of emitted metrics (sinks).
    Metrics,
    /// Not an attachment point: `Plugin::on_run_end` reaches every plugin that has
    /// not failed, once, at the end. An attachment to it is ignored.
    RunEnd,
}

impl Hook {
    pub const ALL: [Hook; 9] = [
        Hook::RunStart,
        Hook::StepStart,
        Hook::AfterForward,
        Hook::AfterBackward,
        Hook::StepEnd,
        Hook::Eval,
        Hook::Checkpoint,
        Hook::Metrics,
        Hook::RunEnd,
    ];

    /// Hooks whose calls are selected by a cadence; `Eval` fires at evaluations, and
    /// `RunStart`/`RunEnd` are no attachment points at all.
    pub const fn is_scheduled(self) -> bool {
        matches!(self, Hook::StepStart | Hook::AfterForward | Hook::AfterBackward | Hook::StepEnd | Hook::Checkpoint | Hook::Metrics)
    }

    /// `RunStart` and `RunEnd`: their methods reach every plugin, attached or not.
    pub const fn is_lifecycle(self) -> bool {
        matches!(self, Hook::RunStart | Hook::RunEnd)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Hook::RunStart => "run_start",
            Hook::StepStart => "step_start",
            Hook::AfterForward => "after_forward",
            Hook::AfterBackward => "after_backward",
            Hook::StepEnd => "step_end",
            Hook::Eval => "eval",
            Hook::Checkpoint => "checkpoint",
            Hook::Metrics => "metrics",
            Hook::RunEnd => "run_end",
        }
    }

    /// The bit of this hook in a per-step due mask.
    pub const fn bit(self) -> u32 {
        1 << (self as u8)
    }
}

/// Which steps a scheduled attachment is due on. Steps are numbered from 1; the
/// predicates are OR-ed. `every_steps = 0` and `every_secs = 0.0` switch those off.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq)]
pub struct Cadence {
    pub every_steps: u64,
    pub every_secs: f64,
    pub first_step: bool,
    pub at_eval: bool,
    pub at_checkpoint: bool,
    pub at_end: bool,
}

impl Cadence {
    pub const NEVER: Cadence = Cadence { every_steps: 0, every_secs: 0.0, first_step: false, at_eval: false, at_checkpoint: false, at_end: false };

    pub const fn every(steps: u64) -> Cadence {
        Cadence { every_steps: steps, ..Cadence::NEVER }
    }

    pub const fn every_secs(secs: f64) -> Cadence {
        Cadence { every_secs: secs, ..Cadence::NEVER }
    }

    pub const fn with_first_step(self) -> Cadence {
        Cadence { first_step: true, ..self }
    }

    pub const fn with_end(self) -> Cadence {
        Cadence { at_end: true, ..self }
    }

    pub const fn with_eval(self) -> Cadence {
        Cadence { at_eval: true, ..self }
    }

    pub const fn with_checkpoint(self) -> Cadence {
        Cadence { at_checkpoint: true, ..self }
    }

    pub fn is_never(&self) -> bool {
        self.every_steps == 0 && self.every_secs <= 0.0 && !self.first_step && !self.at_eval && !self.at_checkpoint && !self.at_end
    }
}

impl std::fmt::Display for Cadence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if self.every_steps > 0 {
            parts.push(format!("every {} steps", self.every_steps));
        }
        if self.every_secs > 0.0 {
            parts.push(format!("every {}s", self.every_secs));
        }
        for (on, what) in [(self.first_step, "first step"), (self.at_eval, "at eval"), (self.at_checkpoint, "at checkpoint"), (self.at_end, "at end")]
        {
            if on {
                parts.push(what.to_string());
            }
        }
        if parts.is_empty() {
            f.write_str("never")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// Windows of consecutive steps on which a plugin's step hooks are due, on top of
/// their cadences, as `torch.profiler.schedule` lays out profiling windows: `length`
/// steps from step `first`, then again every `every` steps (0: one window),
/// `repeat` windows in all (0: until the run ends). A plugin derives them from its
/// options and answers them from [`crate::Plugin::step_windows`]; the host puts them
/// into the schedule once, so a step outside every window costs nothing.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepWindows {
    pub first: u64,
    pub length: u64,
    pub every: u64,
    pub repeat: u64,
}

impl StepWindows {
    pub const NONE: StepWindows = StepWindows { first: 0, length: 0, every: 0, repeat: 0 };

    pub fn is_none(&self) -> bool {
        self.length == 0 || self.first == 0
    }

    /// The window holding `step` and the step's offset in it (from 0).
    pub fn position(&self, step: u64) -> Option<(u64, u64)> {
        if self.is_none() || step < self.first {
            return None;
        }
        let since = step - self.first;
        let (window, offset) = match (since.checked_div(self.every), since.checked_rem(self.every)) {
            (Some(window), Some(offset)) => (window, offset),
            _ => (0, since),
        };
        let counted = self.repeat == 0 || window < self.repeat;
        (offset < self.length && counted).then_some((window, offset))
    }

    /// The first step after `step` inside a window, if there is one.
    pub fn next_after(&self, step: u64) -> Option<u64> {
        if self.is_none() {
            return None;
        }
        let next = step.checked_add(1)?;
        if next <= self.first {
            return Some(self.first);
        }
        if self.position(next).is_some() {
            return Some(next);
        }
        if self.every == 0 {
            return None;
        }
        let window = (next - self.first) / self.every + 1;
        if self.repeat != 0 && window >= self.repeat {
            return None;
        }
        self.first.checked_add(window.checked_mul(self.every)?)
    }
}

/// What an attachment asks the host to provide when it is due. Tensors are only
/// handed over when asked for; core metrics are only computed when some sink asks.
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Needs(pub u32);

impl Needs {
    pub const NONE: Needs = Needs(0);
    pub const LOSS: Needs = Needs(1 << 0);
    pub const LOGITS: Needs = Needs(1 << 1);
    pub const LABELS: Needs = Needs(1 << 2);
    pub const DATASET_IDS: Needs = Needs(1 << 3);
    pub const INPUTS: Needs = Needs(1 << 4);
    pub const PARAMS: Needs = Needs(1 << 5);
    pub const GRADS: Needs = Needs(1 << 6);
    /// `train/loss`, `train/lr`, `train/tokens_per_s`, ... in the metrics batch.
    pub const BASIC_METRICS: Needs = Needs(1 << 8);
    /// `train/grad_norm`, phase times and memory in the metrics batch.
    pub const DETAILED_METRICS: Needs = Needs(1 << 9);
    /// Parameter and gradient histograms in the metrics batch.
    pub const HISTOGRAMS: Needs = Needs(1 << 10);

    pub const fn union(self, other: Needs) -> Needs {
        Needs(self.0 | other.0)
    }

    pub const fn contains(self, other: Needs) -> bool {
        self.0 & other.0 == other.0
    }

    pub const fn intersects(self, other: Needs) -> bool {
        self.0 & other.0 != 0
    }
}

impl std::ops::BitOr for Needs {
    type Output = Needs;
    fn bitor(self, rhs: Needs) -> Needs {
        self.union(rhs)
    }
}

/// One hook a plugin attaches to, with its default cadence. `name` identifies the
/// attachment in configuration: `[plugins.<plugin>.<name>] every = 100`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct Attachment {
    pub name: RStr<'static>,
    pub hook: Hook,
    pub cadence: Cadence,
    pub needs: Needs,
}

impl Attachment {
    pub const fn new(name: &'static str, hook: Hook, cadence: Cadence) -> Attachment {
        Attachment { name: RStr::from_str(name), hook, cadence, needs: Needs::NONE }
    }

    pub const fn needs(self, needs: Needs) -> Attachment {
        Attachment { needs, ..self }
    }
}

/// Where a plugin's calls run.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threading {
    /// On the training thread, synchronously. For cheap device-side work only:
    /// such plugins may read tensors but must not do I/O.
    Inline,
    /// On the plugin's own worker thread behind a bounded queue. For I/O. Workers
    /// never see tensors; they get metrics batches and checkpoint payloads.
    Worker,
}

/// What a plugin says about itself. All of it is static data in the plugin library.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct Descriptor {
    pub name: RStr<'static>,
    pub version: RStr<'static>,
    pub description: RStr<'static>,
    pub threading: Threading,
    /// Runs on every rank of a distributed run, not only rank 0.
    pub per_rank: bool,
    /// Critical unless its table says `critical = false`: its failure, stall or
    /// abandonment fails the run (a guard's), as `[plugins.<name>] critical = true`.
    pub critical: bool,
    /// A reward function for GRPO (0.6.0): [`crate::Plugin::score`] answers
    /// `[[grpo.rewards]] kind = "plugin"` entries that name it. Worker plugins only; it
    /// runs on every rank of a distributed run (each rank scores its own completions).
    pub reward: bool,
    pub attachments: RSlice<'static, Attachment>,
}

impl Descriptor {
    /// A descriptor for `Plugin::DESCRIPTOR`; pass `env!("CARGO_PKG_VERSION")` as version.
    pub const fn new(
        name: &'static str,
        version: &'static str,
        description: &'static str,
        threading: Threading,
        attachments: &'static [Attachment],
    ) -> Descriptor {
        Descriptor {
            name: RStr::from_str(name),
            version: RStr::from_str(version),
            description: RStr::from_str(description),
            threading,
            per_rank: false,
            critical: false,
            reward: false,
            attachments: RSlice::from_slice(attachments),
        }
    }

    /// Runs on every rank of a distributed run (worker plugins default to rank 0).
    pub const fn per_rank(self) -> Descriptor {
        Descriptor { per_rank: true, ..self }
    }

    /// Critical by default (plugin-api 0.5.0): a guard whose failure must stop the
    /// run says so itself; a user's `[plugins.<name>] critical = false` still wins.
    pub const fn critical(self) -> Descriptor {
        Descriptor { critical: true, ..self }
    }

    /// Scores GRPO's completions ([`crate::Plugin::score`], plugin-api 0.6.0): a
    /// `[[grpo.rewards]] kind = "plugin", plugin = "<name>"` entry names it.
    pub const fn reward(self) -> Descriptor {
        Descriptor { reward: true, ..self }
    }
}
