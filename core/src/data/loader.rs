//! Background batch production. Worker `w` of `n` produces draws `w, w+n, ...` in
//! order into its own bounded channel, and the loop reads the channels round-robin,
//! so the order is exactly the single-threaded order.
//!
//! A worker that fails (the dataset's error, or a panic, caught) sends the failure
//! in place of the batch and stops: the loop gets it as an error at that draw and
//! ends the run through its normal end.

use std::{
    sync::{mpsc, Arc},
    thread::JoinHandle,
};

use tch::Device;

use super::{Batch, BatchKey, Dataset, Split};
use crate::{
    error::{Error, Result},
    panic,
};

/// Maps the n-th draw (from 0) of this run to its key.
#[derive(Debug, Clone, Copy)]
pub struct DrawPlan {
    /// The first optimizer step this loader serves (1-based).
    pub first_step: u64,
    pub accum_steps: u64,
    pub batch_size: u64,
    pub rank: u64,
    pub world: u64,
}

impl DrawPlan {
    fn key(&self, draw: u64) -> BatchKey {
        let (step, micro) = (self.first_step + draw / self.accum_steps, draw % self.accum_steps);
        let first_sample = self.rank * self.batch_size;
        let stream = ((step - 1) * self.accum_steps + micro) * self.world * self.batch_size + first_sample;
        BatchKey { step, micro, first_sample, count: self.batch_size, stream }
    }
}

pub struct Loader {
    plan: DrawPlan,
    dataset: Arc<dyn Dataset>,
    pin: Option<Device>,
    receivers: Vec<mpsc::Receiver<Result<Batch>>>,
    workers: Vec<JoinHandle<()>>,
    next: u64,
}

impl Loader {
    /// `pin` is the CUDA device to page-lock batches for, if any.
    pub fn new(dataset: Arc<dyn Dataset>, plan: DrawPlan, workers: usize, prefetch: usize, pin: Option<Device>) -> Loader {
        let mut receivers = Vec::new();
        let mut handles = Vec::new();
        for w in 0..workers {
            let (tx, rx) = mpsc::sync_channel(prefetch.max(1));
            let dataset = dataset.clone();
            let handle = std::thread::Builder::new()
                .name(format!("ptrain-data-{w}"))
                .spawn(move || {
                    let mut draw = w as u64;
                    loop {
                        let batch = match panic::catching(|| produce(dataset.as_ref(), plan.key(draw), pin)) {
                            Ok(batch) => batch,
                            Err(p) => Err(Error::Other(format!("data worker {w} died producing step {}: {p}", plan.key(draw).step))),
                        };
                        let failed = batch.is_err();
                        if tx.send(batch).is_err() || failed {
                            return;
                        }
                        draw += workers as u64;
                    }
                })
                .expect("spawn data worker");
            receivers.push(rx);
            handles.push(handle);
        }
        Loader { plan, dataset, pin, receivers, workers: handles, next: 0 }
    }

    /// The next micro-batch, on the host. Blocks while the workers are behind.
    pub fn next_batch(&mut self) -> Result<Batch> {
        let draw = self.next;
        self.next += 1;
        if self.receivers.is_empty() {
            return produce(self.dataset.as_ref(), self.plan.key(draw), self.pin);
        }
        let n = self.receivers.len() as u64;
        let worker = draw % n;
        self.receivers[worker as usize]
            .recv()
            .unwrap_or_else(|_| Err(Error::Other(format!("data worker {worker} stopped without a batch for step {}", self.plan.key(draw).step))))
    }
}

/// One training batch, page-locked for `pin`'s device when given.
fn produce(dataset: &dyn Dataset, key: BatchKey, pin: Option<Device>) -> Result<Batch> {
    let batch = dataset.batch(Split::Train, key)?;
    Ok(match pin {
        Some(_) => batch.pinned(),
        None => batch,
    })
}

impl Drop for Loader {
    fn drop(&mut self) {
        // Closing the channels makes each worker's next send fail and return.
        self.receivers.clear();
        for handle in self.workers.drain(..) {
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn plan() -> DrawPlan {
        DrawPlan { first_step: 1, accum_steps: 2, batch_size: 4, rank: 0, world: 1 }
    }

    #[test]
    fn batches_do_not_depend_on_worker_count() {
        let config = Config::default();
        let dataset = crate::data::from_config(&config).unwrap();
        let collect = |workers| {
            let mut loader = Loader::new(dataset.clone(), plan(), workers, 2, None);
            (0..7).map(|_| Vec::<i64>::try_from(loader.next_batch().unwrap().inputs.view([-1])).unwrap()).collect::<Vec<_>>()
        };
        let inline = collect(0);
        assert_eq!(inline, collect(1));
        assert_eq!(inline, collect(3));
        assert_ne!(inline[0], inline[1]);
    }

    #[test]
    fn a_rank_shard_is_a_slice_of_the_global_batch() {
        let config = Config::default();
        let dataset = crate::data::from_config(&config).unwrap();
        let key = |first, count| BatchKey { step: 3, micro: 0, first_sample: first, count, stream: first };
        let global = dataset.batch(Split::Train, key(0, 8)).unwrap().inputs;
        let shard = dataset.batch(Split::Train, key(4, 4)).unwrap().inputs;
        assert!(global.narrow(0, 4, 4).equal(&shard));
    }
}
