//! Counter-based randomness for data: every sample's RNG is derived from
//! (seed, split, step, micro-batch, sample index), so batches do not depend on
//! worker count, rank count or where a run resumed.

/// SplitMix64: tiny, fast, and good enough to pick windows and rows.
#[derive(Debug, Clone)]
pub struct Rng(u64);

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(mix(seed.wrapping_add(GOLDEN)))
    }

    /// A stream keyed by several integers (order matters).
    pub fn keyed(seed: u64, keys: &[u64]) -> Rng {
        let mut state = mix(seed ^ 0x5052_5452_4149_4E00);
        for &k in keys {
            state = mix(state.wrapping_add(GOLDEN) ^ k);
        }
        Rng(state)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix(self.0)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, n); `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        // Lemire's multiply-shift: unbiased enough for n far below 2^64.
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.next_f64().max(f64::MIN_POSITIVE);
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i as u64 + 1) as usize);
        }
    }

    /// An index drawn with probability proportional to `weights`.
    pub fn weighted(&mut self, cumulative: &[f64]) -> usize {
        let total = *cumulative.last().expect("non-empty weights");
        let x = self.next_f64() * total;
        cumulative.partition_point(|&c| c <= x).min(cumulative.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4).map(|_| Rng::keyed(7, &[1, 2]).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(Rng::keyed(7, &[1, 2]).next_u64(), Rng::keyed(7, &[2, 1]).next_u64());
        assert_ne!(Rng::keyed(7, &[1, 2]).next_u64(), Rng::keyed(8, &[1, 2]).next_u64());
    }

    #[test]
    fn below_and_weighted_stay_in_range_and_follow_weights() {
        let mut rng = Rng::new(1);
        let cumulative = [1.0, 4.0]; // weights 1 and 3
        let mut counts = [0usize; 2];
        for _ in 0..40_000 {
            assert!(rng.below(10) < 10);
            counts[rng.weighted(&cumulative)] += 1;
        }
        let share = counts[1] as f64 / 40_000.0;
        assert!((share - 0.75).abs() < 0.02, "{share}");
    }
}
