//! Helpers for plugins' own tests.

/// A deterministic pseudo-random vector (xorshift32 from `seed`) of small values with the cases
/// elementwise kernels get wrong mixed in: exact zeros, negative zeros and repeated values (ties).
/// Kernel tests compare a fused loop with the host operations it replaces on these.
pub fn awkward_values(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            match x % 11 {
                0 => 0.0,
                1 => -0.0,
                2 => 0.25,
                _ => (x as f32 / u32::MAX as f32 - 0.5) * 0.02,
            }
        })
        .collect()
}
