//! The counter-based random generator behind `bernoulli_mask`: element `index` of a tensor
//! gets the same draw for the same seed on every device, thread count and chunking.

/// SplitMix64 finaliser: a bijective mix of 64 bits.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// MurmurHash3's 32-bit finaliser: a bijective mix of 32 bits that vectorises (32-bit
/// multiplies), unlike 64-bit mixes on most CPUs.
fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^ (h >> 16)
}

/// The per-call key of a counter stream: depends on the seed and on the upper 32 bits of the
/// element index (constant over any tensor below 4 G elements).
pub fn stream_key(seed: u64, index: u64) -> u64 {
    mix64(seed ^ mix64(index >> 32))
}

/// 32 random bits for element `index` under a key from [`stream_key`]: two keyed rounds of
/// `fmix32` over a Weyl sequence of the lower 32 bits of the index.
pub fn bits32(key: u64, index: u64) -> u32 {
    let h = fmix32((index as u32).wrapping_mul(0x9E37_79B9) ^ key as u32);
    fmix32(h ^ (key >> 32) as u32)
}

/// Threshold such that `bits32(..) < threshold` has probability `keep_probability`
/// (to 2⁻³²; 0 and 1 are exact).
pub fn keep_threshold(keep_probability: f64) -> u64 {
    (keep_probability.clamp(0.0, 1.0) * 4_294_967_296.0).ceil() as u64
}

/// Uniform draw in [0, 1) for element `index` under `seed` (32 random bits).
pub fn uniform(seed: u64, index: u64) -> f64 {
    f64::from(bits32(stream_key(seed, index), index)) / 4_294_967_296.0
}

/// Whether element `index` is kept by a Bernoulli mask with P(keep) = `keep_probability`:
/// exactly the draw the host's `bernoulli_mask` makes for element `index` of a full tensor.
pub fn bernoulli_keep(seed: u64, index: u64, keep_probability: f64) -> bool {
    u64::from(bits32(stream_key(seed, index), index)) < keep_threshold(keep_probability)
}

/// FNV-1a hash of a string, for deriving per-tensor seeds.
pub fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// A sequential SplitMix64 generator for initialisation, shuffling and augmentation: fully
/// determined by its seed, the same on every machine.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// A generator for sub-stream `stream` of `seed` (independent of the other streams).
    pub fn stream(seed: u64, stream: u64) -> SplitMix64 {
        SplitMix64::new(mix64(seed ^ mix64(stream.wrapping_add(0x5851_F42D_4C95_7F2D))))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state)
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform integer in `0..n` (`n` > 0; Lemire's multiply-shift, bias below 2⁻⁶⁴·n).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Standard normal draw (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Shuffles `v` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_rate_matches_probability() {
        let n = 200_000u64;
        for p in [0.1, 0.5, 0.9] {
            let kept = (0..n).filter(|&i| bernoulli_keep(42, i, p)).count() as f64 / n as f64;
            // Binomial standard deviation at n = 2e5 is below 0.0012; allow 5 sigma.
            assert!((kept - p).abs() < 0.006, "p={p} kept={kept}");
        }
    }

    #[test]
    fn bits_are_balanced_and_neighbours_independent() {
        // Each of the 32 bits is set about half the time, and consecutive draws are
        // uncorrelated (a Weyl counter hashed badly would fail both).
        let n = 100_000u64;
        let key = stream_key(9, 0);
        let draws: Vec<u32> = (0..n).map(|i| bits32(key, i)).collect();
        for b in 0..32 {
            let ones = draws.iter().filter(|d| *d >> b & 1 == 1).count() as f64 / n as f64;
            assert!((ones - 0.5).abs() < 0.01, "bit {b}: {ones}");
        }
        let u: Vec<f64> = draws.iter().map(|d| f64::from(*d) / 4_294_967_296.0 - 0.5).collect();
        let corr: f64 = u.windows(2).map(|w| w[0] * w[1]).sum::<f64>() / (n as f64 / 12.0);
        assert!(corr.abs() < 0.02, "lag-1 correlation {corr}");
    }

    #[test]
    fn edges_and_determinism() {
        assert!((0..1000).all(|i| !bernoulli_keep(7, i, 0.0)));
        assert!((0..1000).all(|i| bernoulli_keep(7, i, 1.0)));
        assert_eq!(uniform(1, 5), uniform(1, 5));
        assert_ne!(uniform(1, 5), uniform(2, 5));
    }
}
