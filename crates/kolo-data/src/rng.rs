//! A small deterministic PRNG and the shuffles built on it.
//!
//! Determinism matters more than quality here: every rank of a distributed
//! job must compute the *same* permutation from the same seed, on any
//! platform and with any build of this crate. The algorithms below are
//! therefore fixed and documented; changing them changes every shuffle.

/// SplitMix64 (Steele, Lea & Flood 2014): a 64-bit state advanced by the
/// golden-ratio increment and passed through a bijective mixer.
///
/// Fast, statistically solid for shuffling and data generation, and fully
/// specified by its seed. Not cryptographic.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose whole output is determined by `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..bound` (unbiased: Lemire's multiply-shift
    /// with rejection). Returns 0 when `bound` is 0.
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            return 0;
        }
        let threshold = bound.wrapping_neg() % bound;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(bound);
            // Truncation intended: the low 64 bits decide rejection.
            let low = m as u64;
            if low >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// A uniform `f64` in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A standard normal sample (Box–Muller; one of the pair is discarded
    /// to keep the generator stateless beyond its seed).
    pub fn next_gaussian(&mut self) -> f64 {
        // 1 - u is in (0, 1], so the logarithm is finite.
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Shuffles `items` in place with Fisher–Yates (Durstenfeld): for `i`
    /// from `len - 1` down to 1, swap `items[i]` with `items[below(i + 1)]`.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            // `i + 1 <= len`, which fits in u64, and `below` returns < i + 1,
            // which fits back into usize.
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// A permutation of `0..len` determined by `seed` alone.
pub fn permutation(len: usize, seed: u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..len).collect();
    SplitMix64::new(seed).shuffle(&mut idx);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_reference_values() {
        // Reference output of SplitMix64 seeded with 1234567
        // (from the public-domain C implementation by Vigna).
        let mut r = SplitMix64::new(1_234_567);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
        assert_eq!(r.next_u64(), 9_817_491_932_198_370_423);
    }

    #[test]
    fn below_stays_in_range_and_hits_everything() {
        let mut r = SplitMix64::new(7);
        let mut seen = [0usize; 7];
        for _ in 0..7000 {
            let x = r.below(7);
            assert!(x < 7);
            seen[x as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800), "{seen:?}");
        assert_eq!(r.below(0), 0);
        assert_eq!(r.below(1), 0);
    }

    #[test]
    fn permutation_is_a_permutation_and_seeded() {
        let p = permutation(1000, 3);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_eq!(p, permutation(1000, 3));
        assert_ne!(p, permutation(1000, 4));
        assert_ne!(p, sorted);
        assert!(permutation(0, 1).is_empty());
        assert_eq!(permutation(1, 1), vec![0]);
    }

    #[test]
    fn gaussian_has_roughly_unit_moments() {
        let mut r = SplitMix64::new(11);
        let n = 20_000;
        let xs: Vec<f64> = (0..n).map(|_| r.next_gaussian()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "var {var}");
        assert!(xs.iter().all(|x| x.is_finite()));
    }
}
