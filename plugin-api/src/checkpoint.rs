//! A checkpoint as handed to a checkpoint-writing plugin: host copies of every
//! tensor plus the run state, owned by the payload so it can be written on the
//! plugin's worker thread while training goes on.

use abi_stable::{
    std_types::{RString, RVec},
    StableAbi,
};

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

impl DType {
    pub const fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::U8 => 1,
        }
    }

    /// The dtype name used by the safetensors format.
    pub const fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F64 => "F64",
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::U8 => "U8",
        }
    }

    pub fn from_safetensors_name(name: &str) -> Option<DType> {
        Some(match name {
            "F32" => DType::F32,
            "F64" => DType::F64,
            "BF16" => DType::BF16,
            "F16" => DType::F16,
            "I64" => DType::I64,
            "I32" => DType::I32,
            "U8" => DType::U8,
            _ => return None,
        })
    }
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
