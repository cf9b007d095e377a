use serde::{Deserialize, Serialize};

/// `[debug]`: fault injection, for testing the fault handling itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DebugConfig {
    /// Steps whose loss is replaced by NaN (exercises `train.nan_policy`).
    pub nonfinite_loss_at: Vec<u64>,
    /// Every rank writes its final parameters to `<run-dir>/params-rank<r>.safetensors`
    /// (checks that data-parallel ranks stayed identical).
    #[serde(default)]
    pub dump_params: bool,
    /// Steps whose gradients are multiplied by `grad_spike_factor` (the loss is
    /// scaled before backward; the reported loss is not): a gradient spike, for the
    /// health plugin's anomaly detector.
    #[serde(default)]
    pub grad_spike_at: Vec<u64>,
    #[serde(default = "default_spike_factor")]
    pub grad_spike_factor: f64,
    /// Steps at which `<run-dir>/tensors-step<N>.rank<r>.safetensors` receives the
    /// parameters before the update (`param/<name>`), the gradients after backward,
    /// before clipping (`grad/<name>`), and the parameters after the update
    /// (`updated/<name>`): for checking plugins against a reference.
    #[serde(default)]
    pub dump_tensors_at: Vec<u64>,
    /// A libtorch error (a failing `f_` op) in this step's forward pass: the run
    /// fails (exit 1, `summary.json` status `failed`). 0 = never.
    #[serde(default)]
    pub fail_at_step: u64,
    /// An allocation of `alloc_bytes` on the run's device in this step: out of
    /// memory, as a too-large model or batch would be. 0 = never.
    #[serde(default)]
    pub alloc_at_step: u64,
    #[serde(default = "default_alloc_bytes")]
    pub alloc_bytes: u64,
    /// An allocation of `alloc_bytes` through tch's panicking API as the run ends,
    /// after its last step (where the last losses are read): a libtorch failure on
    /// the finish path, which must fail the run (exit 1, summary written), never
    /// panic out of the process (exit 101).
    #[serde(default)]
    pub alloc_at_finish: bool,
    /// A data worker (or, with `data.num_workers = 0`, the loop itself) panics
    /// producing this step's batch. 0 = never.
    #[serde(default)]
    pub data_panic_at_step: u64,
    /// Packed rows attend to every earlier position of their sequence, the rows
    /// before them included (positions still restart at each row): the cross-talk
    /// `data.packing` exists to prevent, for showing that the tests detect it.
    #[serde(default)]
    pub packing_cross_talk: bool,
    /// The checkpoint plugin's save of this step stops for good after its
    /// `pause_save_after_files`-th file is written and fsync'ed, and
    /// `<run-dir>/save-paused.rank<r>.json` says so (the process id, the step, the
    /// file): tests kill the process then, inside the save. 0 = never.
    #[serde(default)]
    pub pause_save_at_step: u64,
    #[serde(default = "default_pause_files")]
    pub pause_save_after_files: u64,
    /// The checkpoint plugin's save of this step, once staged, says so in
    /// `<run-dir>/save-late.rank<r>.json` and waits until `<run-dir>/save-release`
    /// exists before it asks to commit; `<run-dir>/save-late-done.rank<r>.json` then
    /// says whether it did: tests make a save finish after the host gave it up. 0 = never.
    #[serde(default)]
    pub late_save_at_step: u64,
}

fn default_pause_files() -> u64 {
    1
}

/// 1 PiB: more than any machine has, and more than a 47-bit address space maps.
fn default_alloc_bytes() -> u64 {
    1 << 50
}

fn default_spike_factor() -> f64 {
    1e3
}
