//! The counter-based random generator behind `bernoulli_mask`: element `index` of a tensor
//! gets the same draw for the same seed on every device, thread count and chunking.

/// SplitMix64 finaliser: a bijective mix of 64 bits.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform draw in [0, 1) for element `index` under `seed` (53 random bits).
pub fn uniform(seed: u64, index: u64) -> f64 {
    uniform_mixed(mix64(seed), index)
}

/// [`uniform`] with `mix64(seed)` computed once by the caller (for whole-tensor draws).
pub fn uniform_mixed(mixed_seed: u64, index: u64) -> f64 {
    let bits = mix64(mixed_seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03));
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Whether element `index` is kept by a Bernoulli mask with P(keep) = `keep_probability`.
pub fn bernoulli_keep(seed: u64, index: u64, keep_probability: f64) -> bool {
    uniform(seed, index) < keep_probability
}

/// FNV-1a hash of a string, for deriving per-tensor seeds.
pub fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
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
    fn edges_and_determinism() {
        assert!((0..1000).all(|i| !bernoulli_keep(7, i, 0.0)));
        assert!((0..1000).all(|i| bernoulli_keep(7, i, 1.0)));
        assert_eq!(uniform(1, 5), uniform(1, 5));
        assert_ne!(uniform(1, 5), uniform(2, 5));
    }
}
