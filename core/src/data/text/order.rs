//! The order an epoch of text samples visits them in, the same for every form of
//! text data (instruction rows or packed sequences, preference pairs).

use std::sync::{Arc, Mutex};

use crate::rng::Rng;

/// Which sample the n-th of the run's stream is: epoch `n / len` visits every
/// sample once in an order drawn from (seed, epoch). The last two epochs' orders
/// are kept (workers may straddle an epoch's end).
pub struct EpochOrder {
    seed: u64,
    len: usize,
    recent: Mutex<Vec<(u64, Arc<Vec<u32>>)>>,
}

impl EpochOrder {
    pub fn new(seed: u64, len: usize) -> EpochOrder {
        EpochOrder { seed, len, recent: Mutex::new(Vec::new()) }
    }

    pub fn sample(&self, n: u64) -> usize {
        let (epoch, at) = (n / self.len as u64, (n % self.len as u64) as usize);
        self.order(epoch)[at] as usize
    }

    fn order(&self, epoch: u64) -> Arc<Vec<u32>> {
        let mut recent = self.recent.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, order)) = recent.iter().find(|(e, _)| *e == epoch) {
            return order.clone();
        }
        let mut order: Vec<u32> = (0..self.len as u32).collect();
        Rng::keyed(self.seed, &[0xE70C, epoch]).shuffle(&mut order);
        let order = Arc::new(order);
        if recent.len() == 2 {
            recent.remove(0);
        }
        recent.push((epoch, order.clone()));
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_epoch_visits_every_sample_once_in_its_own_order() {
        let order = EpochOrder::new(7, 10);
        let first: Vec<usize> = (0..10).map(|n| order.sample(n)).collect();
        let second: Vec<usize> = (10..20).map(|n| order.sample(n)).collect();
        let mut sorted = first.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        assert_ne!(first, second);
        assert_eq!(first, (0..10).map(|n| EpochOrder::new(7, 10).sample(n)).collect::<Vec<_>>());
    }
}
