//! Per-rank memory figures for `summary.json`, measured from the tensors each rank
//! holds (distinct storages, so views count once) and gathered to every rank in
//! one all-reduce.

use tch::{Device, Kind, Tensor};

use crate::{
    dist::DataParallel,
    error::{Error, Result},
    optim::Optimizer,
};

/// One entry per rank.
#[derive(Debug, Clone, Default)]
pub(super) struct MemoryFigures {
    /// Optimizer state held.
    pub optimizer_state_bytes: Vec<u64>,
    /// Gradient held after the last step: `.grad` tensors, flat gradient
    /// buffers, the gradient shard, all-reduce buckets.
    pub gradient_bytes: Vec<u64>,
    /// Gradient held when the first step's gradient was reduced (with
    /// `gradients`, the full-size gradient from backward is still there).
    pub gradient_peak_bytes: Vec<u64>,
    /// Parameters held between steps (with `parameters`, the rank's chunks).
    pub parameter_bytes: Vec<u64>,
    /// The rank's peak memory so far: CUDA's peak allocated, or the peak RSS.
    pub peak_memory_bytes: Vec<u64>,
    /// The rank's peak memory once its model was loaded, before the optimizer's buffers.
    pub load_peak_memory_bytes: Vec<u64>,
    /// With `parameters`: the largest block's bytes while gathered (0 otherwise).
    pub gathered_block_bytes: Vec<u64>,
}

impl MemoryFigures {
    /// What `optimizer` and `dist`'s buffers hold on every rank. A collective in a
    /// distributed run: every rank calls it at the same point. Without
    /// `collective` (a failed run), only this rank's row is filled. `load_peak`: the
    /// peak memory when the model was loaded ([`Learner`](super::learner::Learner)'s).
    pub fn gather(optimizer: &dyn Optimizer, dist: &dyn DataParallel, device: Device, load_peak: u64, collective: bool) -> Result<MemoryFigures> {
        let state = optimizer.state_bytes()?;
        let gradient = optimizer.gradient_bytes()? + dist.gradient_buffer_bytes();
        let peak = optimizer.gradient_peak_bytes().unwrap_or(gradient);
        let parameters = optimizer.parameter_bytes()?;
        let memory = crate::device::peak_memory(device);
        const COLUMNS: usize = 7;
        let mut all = Tensor::f_zeros([dist.world_size() as i64, COLUMNS as i64], (Kind::Int64, device))?;
        let row = [state, gradient, peak, parameters, memory, load_peak, optimizer.gathered_block_bytes()].map(|b| b as i64);
        let mine = Tensor::from_slice(&row).f_to_device(device)?;
        all.f_select(0, dist.rank() as i64)?.f_copy_(&mine)?;
        if collective {
            dist.all_reduce_sum(&mut all).map_err(Error::Dist)?;
        }
        let rows = Vec::<i64>::try_from(all.f_to_device(Device::Cpu)?.f_flatten(0, -1)?)?;
        let column = |c: usize| rows.chunks(COLUMNS).map(|r| r[c] as u64).collect();
        Ok(MemoryFigures {
            optimizer_state_bytes: column(0),
            gradient_bytes: column(1),
            gradient_peak_bytes: column(2),
            parameter_bytes: column(3),
            peak_memory_bytes: column(4),
            load_peak_memory_bytes: column(5),
            gathered_block_bytes: column(6),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::ConfigBuilder,
        data::{BatchKey, Split},
        dist::SingleRank,
        objective::Forward,
        trainer::learner::Learner,
    };

    #[test]
    fn the_figures_are_the_bytes_of_the_optimizer_state_and_the_gradients_held() {
        let config = ConfigBuilder::default().set("model.kind=\"mlp\"").unwrap().set("data.synthetic_len=64").unwrap().build().unwrap();
        let mut learner = Learner::for_tests(&config);
        let param_bytes: u64 = learner.params.iter().map(|(_, p)| (p.numel() * 4) as u64).sum();
        let before = MemoryFigures::gather(learner.optimizer.as_ref(), &SingleRank, Device::Cpu, 0, true).unwrap();
        assert_eq!(before.gradient_bytes, [0], "one rank holds no gradient before its first backward");
        assert_eq!(before.parameter_bytes, [param_bytes], "the parameters, whole");

        let batch = learner.dataset.batch(Split::Train, BatchKey { step: 1, micro: 0, first_sample: 0, count: 4, stream: 0 }).unwrap();
        learner.runner().forward(&batch, true).unwrap().sum(Kind::Float).backward();
        learner.optimizer.step(&crate::optim::LearningRate::at(Device::Cpu, 1e-3).unwrap(), None).unwrap();
        let after = MemoryFigures::gather(learner.optimizer.as_ref(), &SingleRank, Device::Cpu, 0, true).unwrap();
        assert_eq!(after.gradient_bytes, [param_bytes], "one float gradient per parameter after a step");
        assert_eq!(after.gradient_peak_bytes, after.gradient_bytes, "what the first backward made");
        learner.optimizer.zero_grad().unwrap();
        let released = MemoryFigures::gather(learner.optimizer.as_ref(), &SingleRank, Device::Cpu, 0, true).unwrap();
        assert_eq!(released.gradient_bytes, [0], "released before the next backward");
        assert_eq!(released.gradient_peak_bytes, [param_bytes]);
        // AdamW: two moments per parameter, and its step counts.
        assert!(after.optimizer_state_bytes[0] >= 2 * param_bytes, "{:?} for {param_bytes} bytes of parameters", after.optimizer_state_bytes);
    }
}
