//! A checkpoint as handed to a checkpoint-writing plugin: host copies of every
//! tensor plus the run state, owned by the payload so it can be written on the
//! plugin's worker thread while training goes on.

use abi_stable::{
    std_types::{RString, RVec},
    StableAbi,
};

/// The element type of a [`TensorBlob`]; its sizes, names and kinds are in `dtype.rs`.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    F32,
    F64,
    BF16,
    F16,
    I64,
    I32,
    U8,
}

/// A tensor copied to host memory, little-endian, row-major.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct TensorBlob {
    pub name: RString,
    pub dtype: DType,
    pub shape: RVec<i64>,
    pub data: RVec<u8>,
}

/// Opaque bytes with a name, such as a plugin's saved state.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct NamedBlob {
    pub name: RString,
    pub data: RVec<u8>,
}

#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointReason {
    /// Due by the plugin's cadence.
    Scheduled,
    /// The run reached its last step.
    End,
    /// SIGINT or SIGTERM: saved before exiting.
    Interrupted,
    /// Too many non-finite losses in a row: the last good state before stopping.
    NonFinite,
}

#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct CheckpointPayload {
    pub step: u64,
    pub reason: CheckpointReason,
    /// Model weights, by parameter name.
    pub model: RVec<TensorBlob>,
    /// Optimizer state tensors (`exp_avg.<param>`, ...).
    pub optimizer: RVec<TensorBlob>,
    /// Step, sample counters, data position, RNG scheme and optimizer scalars, as JSON.
    pub state_json: RString,
    /// The resolved configuration, as TOML.
    pub config_toml: RString,
    /// Each plugin's own state, by plugin name.
    pub plugin_states: RVec<NamedBlob>,
}
