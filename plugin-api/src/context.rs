//! What the host hands a plugin when it calls it.

use abi_stable::{
    std_types::{RSlice, RStr},
    StableAbi,
};

use crate::{attachment::Hook, metrics::Scalar};

/// A borrowed handle to a host tensor (a libtorch `at::Tensor*`), valid only for the
/// duration of the call it was passed to. Null when the tensor was not asked for or
/// does not exist (for example dataset ids of a language-model batch). With the `tch`
/// feature, [`TensorRef::with`] borrows it as a `tch::Tensor`.
///
/// Neither `Copy` nor `Clone`: a plugin sees handles only inside the `&StepContext` of
/// its call and can borrow them, not keep them, so safe code cannot read a tensor
/// after the host freed it (`shallow_clone` gives a tensor of its own to keep).
#[repr(transparent)]
#[derive(StableAbi, Debug)]
pub struct TensorRef {
    pub(crate) ptr: *mut (),
}

impl TensorRef {
    pub const NULL: TensorRef = TensorRef { ptr: std::ptr::null_mut() };

    /// # Safety
    /// `ptr` must be a live `at::Tensor*` (as from `tch::Tensor::as_ptr`) that
    /// outlives every use of the returned handle.
    pub const unsafe fn from_raw(ptr: *mut ()) -> TensorRef {
        TensorRef { ptr }
    }

    pub fn as_raw(&self) -> *mut () {
        self.ptr
    }

    pub fn is_null(&self) -> bool {
        self.ptr.is_null()
    }
}

/// A parameter or gradient with its name in the model (`transformer.h.0.attn.c_attn.weight`).
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct NamedTensor<'a> {
    pub name: RStr<'a>,
    pub tensor: TensorRef,
}

impl<'a> NamedTensor<'a> {
    /// A named handle, as a test builds them:
    /// `let grads = [NamedTensor::new("w", TensorRef::of(&g))];` then
    /// `StepContext { grads: grads.as_slice().into(), ..testing::step(Hook::AfterBackward, 1) }`.
    pub const fn new(name: &'a str, tensor: TensorRef) -> NamedTensor<'a> {
        NamedTensor { name: RStr::from_str(name), tensor }
    }
}

/// Tensors of the current batch. Each is null unless the attachment asked for it.
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct StepTensors {
    /// A scalar on the device. At `AfterForward`: this micro-batch's mean loss
    /// (divided by `accum_steps` when accumulating), still in the autograd graph
    /// (`detach()` it). At `AfterBackward`: the step's loss, detached.
    pub loss: TensorRef,
    /// `[batch, classes]` for classifiers, `[batch, seq, vocab]` for language models.
    pub logits: TensorRef,
    /// `[batch]` class ids or `[batch, seq]` next tokens.
    pub labels: TensorRef,
    /// `[batch]` int64 index into [`RunInfo::datasets`].
    pub dataset_ids: TensorRef,
    /// The model input of the batch: `[batch, seq]` int64 token ids for language
    /// models, `[batch, features]` for classifiers.
    pub inputs: TensorRef,
}

impl StepTensors {
    pub const NONE: StepTensors = StepTensors {
        loss: TensorRef::NULL,
        logits: TensorRef::NULL,
        labels: TensorRef::NULL,
        dataset_ids: TensorRef::NULL,
        inputs: TensorRef::NULL,
    };
}

/// Host-measured phase times in seconds. On CUDA, steps where a plugin asked for
/// detailed metrics synchronise at phase boundaries, so their times are exact; on
/// other steps they are launch times (the data wait is always exact).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseTimes {
    pub data_s: f64,
    pub forward_s: f64,
    pub backward_s: f64,
    pub optimizer_s: f64,
    /// The whole step, including time spent in inline plugins' step hooks.
    pub step_s: f64,
}

impl PhaseTimes {
    fn zip(&self, other: &PhaseTimes, f: impl Fn(f64, f64) -> f64) -> PhaseTimes {
        PhaseTimes {
            data_s: f(self.data_s, other.data_s),
            forward_s: f(self.forward_s, other.forward_s),
            backward_s: f(self.backward_s, other.backward_s),
            optimizer_s: f(self.optimizer_s, other.optimizer_s),
            step_s: f(self.step_s, other.step_s),
        }
    }

    /// `self + other`, phase by phase: running totals from per-step times.
    pub fn plus(&self, other: &PhaseTimes) -> PhaseTimes {
        self.zip(other, |a, b| a + b)
    }

    /// Mean per-step times between these cumulative totals and `before`, `steps`
    /// steps earlier (as [`StepContext::phases_total`] gives them).
    pub fn per_step_since(&self, before: &PhaseTimes, steps: u64) -> PhaseTimes {
        let n = steps.max(1) as f64;
        self.zip(before, |now, then| (now - then) / n)
    }
}

#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct DeviceInfo<'a> {
    pub kind: DeviceKind,
    pub index: i32,
    /// `cpu` or the CUDA device name (`NVIDIA H100 80GB HBM3`).
    pub name: RStr<'a>,
}

/// The context of a scheduled hook call (and of [`Hook::Eval`]).
///
/// The counters, in one place: `step_*` are this rank's and this step's, known from
/// the step's start (every hook of step N sees step N's). `*_seen` and `epoch` are
/// over every rank (and include the steps before a resume); they and `phases_total`
/// count the *finished* steps: at `StepStart`, `AfterForward` and `AfterBackward` of step N,
/// the steps before N; at `StepEnd` and `Eval`, step N too. Tokens are positions of
/// the batch as configured, padding included (`batch_size x accum_steps x seq_len` a
/// step on each rank); the tokens the loss is computed on are `step_trained_tokens`.
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct StepContext<'a> {
    pub hook: Hook,
    /// The optimizer step, from 1.
    pub step: u64,
    /// The micro-batch within the step (from 0): `AfterForward` is called for each
    /// of the `accum_steps` micro-batches of a due step.
    pub micro_batch: u64,
    /// Whole passes over the training samples: `samples_seen / (training samples)`,
    /// rounded down.
    pub epoch: u64,
    /// The learning rate this step's update uses (the schedule's value at `step`).
    pub lr: f64,
    /// Samples of every rank in the finished steps (resumed runs count from the start
    /// of training).
    pub samples_seen: u64,
    /// Token positions of every rank in the finished steps: the positions the
    /// model computed, padding included (instruction rows padded to the longest of
    /// their micro-batch count that length, not `seq_len`; a classifier's sample
    /// counts as one). Exact as of the last progress line or metrics emission; in
    /// between, other ranks are counted as this one (the same unless padding differs).
    pub tokens_seen: u64,
    /// Samples in this optimizer step on this rank: `batch_size x accum_steps`
    /// (multiply by `world_size` for the global batch).
    pub step_samples: u64,
    /// Token positions this optimizer step computes on this rank, padding included
    /// (the micro-batches' own lengths; a classifier's sample counts as one): this
    /// step's from `AfterBackward` on, the previous step's before it.
    pub step_tokens: u64,
    /// Instruction data: the tokens of this step on this rank that the loss is
    /// computed on (targets that are not the ignore index: assistant turns, no
    /// padding), known from the step's start. 0 for other data.
    pub step_trained_tokens: u64,
    /// Phase times of this step so far (at `StepEnd`: the whole step's).
    pub phases: PhaseTimes,
    /// Phase times summed over this process's finished steps: difference two calls
    /// to get a window.
    pub phases_total: PhaseTimes,
    /// Steps run by this process so far, this one included (excludes steps before a
    /// resume): `step - start_step`.
    pub steps_run: u64,
    /// Seconds since training started (set-up excluded), at the call.
    pub elapsed_s: f64,
    pub rank: u32,
    pub world_size: u32,
    pub device: DeviceInfo<'a>,
    /// At `Eval`, the evaluation's scalars (`eval/loss`, and `eval/accuracy` for
    /// classifiers). Empty at the step hooks: the loss is a device tensor, and
    /// reading it is a sync the loop does not pay for plugins that did not ask
    /// (ask for `Needs::LOSS` and read `tensors.loss`).
    pub scalars: RSlice<'a, Scalar<'a>>,
    /// The batch's tensors an attachment asked for (`Needs::LOSS`, `LOGITS`, ...).
    pub tensors: StepTensors,
    /// Every trainable parameter by name, sorted, with `Needs::PARAMS`; empty otherwise.
    pub params: RSlice<'a, NamedTensor<'a>>,
    /// The gradient of each parameter (same order and names as `params`) with
    /// `Needs::GRADS`; empty otherwise. At `AfterBackward`: the step's gradients,
    /// accumulated over its micro-batches, before clipping and (in a distributed run)
    /// before the all-reduce, so this rank's own.
    pub grads: RSlice<'a, NamedTensor<'a>>,
}

impl StepContext<'_> {
    /// A scalar by name (`eval/loss`, `eval/accuracy` at `Eval`), if there is one.
    pub fn scalar(&self, name: &str) -> Option<f64> {
        self.scalars.iter().find(|s| s.name.as_str() == name).map(|s| s.value)
    }
}

#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    LanguageModel,
    Classification,
}

#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    Linear,
    Embedding,
    /// Scaled dot-product attention over `seq_len` positions.
    Attention,
    Conv2d,
    Norm,
}

/// One layer of the model, enough to count its FLOPs exactly.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct LayerSpec<'a> {
    pub name: RStr<'a>,
    pub kind: LayerKind,
    pub in_features: u64,
    pub out_features: u64,
    /// How many times the layer is applied per sample (sequence positions for a
    /// token-wise linear layer, 1 for a classifier's).
    pub positions: u64,
    pub heads: u64,
    pub head_dim: u64,
    pub seq_len: u64,
    /// Whether the layer's input needs a gradient (false for a first layer on data).
    pub input_grad: bool,
}

#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct ModelInfo<'a> {
    pub kind: RStr<'a>,
    pub task: Task,
    pub n_params: u64,
    /// Empty when the model cannot describe itself (TorchScript).
    pub layers: RSlice<'a, LayerSpec<'a>>,
}

/// ptrain's `[debug]` keys that a plugin acts on: fault injection for ptrain's own
/// tests (other plugins ignore it). All zero in a normal run.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DebugFaults {
    /// `debug.pause_save_at_step`: the checkpoint plugin's save of this step stops for
    /// good after its `pause_save_after_files`-th file (0: never).
    pub pause_save_at_step: u64,
    /// `debug.pause_save_after_files` (at least 1).
    pub pause_save_after_files: u64,
    /// `debug.late_save_at_step`: the checkpoint plugin's save of this step, staged,
    /// waits before its commit until the test says to go on (0: never). Added in 0.6.0.
    pub late_save_at_step: u64,
}

/// What a plugin learns once at the start of the run.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct RunInfo<'a> {
    /// The run directory, absolute (`run.run_dir`, or the name ptrain gave it).
    pub run_dir: RStr<'a>,
    /// `run.name`.
    pub run_name: RStr<'a>,
    /// The fully resolved configuration, as TOML, as recorded in `<run_dir>/config.toml`
    /// (for showing it: a value ptrain passes a plugin has a field of its own here).
    pub config_toml: RStr<'a>,
    /// `run.seed`.
    pub seed: u64,
    /// The step the run resumes after (0 for a fresh run) and the last step.
    pub start_step: u64,
    pub total_steps: u64,
    /// This process in a distributed run (0 and 1 alone).
    pub rank: u32,
    pub world_size: u32,
    pub device: DeviceInfo<'a>,
    pub model: ModelInfo<'a>,
    /// Dataset names; a batch's `dataset_ids` index into this.
    pub datasets: RSlice<'a, RStr<'a>>,
    /// Samples in one micro-batch on one rank (`data.batch_size`).
    pub batch_size: u64,
    /// Positions per sample (the data's sequence length; 1 for classifiers).
    pub seq_len: u64,
    /// Micro-batches per optimizer step (`optim.accum_steps`).
    pub accum_steps: u64,
    /// `fp32` or `bf16`.
    pub precision: RStr<'a>,
    /// Unix time of the run start, seconds.
    pub start_time: f64,
    /// `dist.timeout_s`: how long a rank waits for the others (in a collective, or for
    /// their part of a sharded checkpoint) before giving up.
    pub collective_timeout_s: f64,
    /// `[debug]` fault injection (ptrain's tests).
    pub debug: DebugFaults,
}

/// What a plugin learns at the end; it may answer with a JSON summary fragment.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct RunEnd<'a> {
    pub step: u64,
    /// 0 on success, 130/143 when interrupted, 1 on failure.
    pub exit_code: i32,
    pub wall_s: f64,
    /// Final core scalars (`train/loss`, `eval/loss`, ...).
    pub scalars: RSlice<'a, Scalar<'a>>,
}

#[cfg(test)]
mod tests {
    use std::marker::PhantomData;

    use super::*;

    // Whether `T` is Copy / Clone, decided at compile time: the inherent constant
    // exists only when the bound holds and then wins over the trait's default.
    struct Probe<T>(PhantomData<T>);
    trait Fallback {
        const COPY: bool = false;
        const CLONE: bool = false;
    }
    impl<T> Fallback for Probe<T> {}
    impl<T: Copy> Probe<T> {
        const COPY: bool = true;
    }
    struct CloneProbe<T>(PhantomData<T>);
    impl<T> Fallback for CloneProbe<T> {}
    impl<T: Clone> CloneProbe<T> {
        const CLONE: bool = true;
    }

    #[test]
    fn a_tensor_handle_cannot_be_copied_out_of_its_call() {
        // Checked when the tests compile: a Copy or Clone handle fails the build.
        const { assert!(!Probe::<TensorRef>::COPY && !CloneProbe::<TensorRef>::CLONE) };
        const { assert!(!Probe::<StepTensors>::COPY && !CloneProbe::<StepContext<'static>>::CLONE) };
        // The probe itself tells a Copy type apart.
        const { assert!(Probe::<u64>::COPY && CloneProbe::<String>::CLONE) };
    }
}
