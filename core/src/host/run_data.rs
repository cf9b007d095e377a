//! Owned copies of what plugins are told at the start and end of a run, and the
//! borrowed stable-ABI views built from them for each call.

use abi_stable::std_types::{RSlice, RStr};
use ptrain_plugin_api::{DebugFaults, DeviceInfo, DeviceKind, LayerSpec, ModelInfo, RunEnd, RunInfo, Scalar, Task};

use crate::model::Layer;

#[derive(Debug, Clone)]
pub struct RunData {
    pub run_dir: String,
    pub run_name: String,
    pub config_toml: String,
    pub seed: u64,
    pub start_step: u64,
    pub total_steps: u64,
    pub rank: u32,
    pub world_size: u32,
    pub device_kind: DeviceKind,
    pub device_index: i32,
    pub device_name: String,
    pub model_kind: String,
    pub task: Task,
    pub n_params: u64,
    pub layers: Vec<Layer>,
    pub datasets: Vec<String>,
    pub batch_size: u64,
    pub seq_len: u64,
    pub accum_steps: u64,
    pub precision: String,
    pub start_time: f64,
    pub collective_timeout_s: f64,
    pub debug: DebugFaults,
}

impl RunData {
    pub fn device(&self) -> DeviceInfo<'_> {
        DeviceInfo { kind: self.device_kind, index: self.device_index, name: RStr::from_str(&self.device_name) }
    }

    pub fn with_view<R>(&self, f: impl FnOnce(&RunInfo<'_>) -> R) -> R {
        let layers: Vec<LayerSpec<'_>> = self
            .layers
            .iter()
            .map(|l| LayerSpec {
                name: RStr::from_str(&l.name),
                kind: l.kind,
                in_features: l.in_features,
                out_features: l.out_features,
                positions: l.positions,
                heads: l.heads,
                head_dim: l.head_dim,
                seq_len: l.seq_len,
                input_grad: l.input_grad,
            })
            .collect();
        let datasets: Vec<RStr<'_>> = self.datasets.iter().map(|d| RStr::from_str(d)).collect();
        let info = RunInfo {
            run_dir: RStr::from_str(&self.run_dir),
            run_name: RStr::from_str(&self.run_name),
            config_toml: RStr::from_str(&self.config_toml),
            seed: self.seed,
            start_step: self.start_step,
            total_steps: self.total_steps,
            rank: self.rank,
            world_size: self.world_size,
            device: self.device(),
            model: ModelInfo {
                kind: RStr::from_str(&self.model_kind),
                task: self.task,
                n_params: self.n_params,
                layers: RSlice::from_slice(&layers),
            },
            datasets: RSlice::from_slice(&datasets),
            batch_size: self.batch_size,
            seq_len: self.seq_len,
            accum_steps: self.accum_steps,
            precision: RStr::from_str(&self.precision),
            start_time: self.start_time,
            collective_timeout_s: self.collective_timeout_s,
            debug: self.debug,
        };
        f(&info)
    }
}

#[derive(Debug, Clone)]
pub struct RunEndData {
    pub step: u64,
    pub exit_code: i32,
    pub wall_s: f64,
    pub scalars: Vec<(String, f64)>,
}

impl RunEndData {
    pub fn with_view<R>(&self, f: impl FnOnce(&RunEnd<'_>) -> R) -> R {
        let scalars: Vec<Scalar<'_>> = self.scalars.iter().map(|(n, v)| Scalar { name: RStr::from_str(n), value: *v }).collect();
        f(&RunEnd { step: self.step, exit_code: self.exit_code, wall_s: self.wall_s, scalars: RSlice::from_slice(&scalars) })
    }
}
