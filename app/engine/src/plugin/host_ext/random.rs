//! Host extensions `mergescope.host.random.v1` and `mergescope.host.random.v2` (ABI 1.3):
//! seeded counter-based Bernoulli masks (DARE's drops; DELLA's per-element probabilities), the
//! same draws whatever the device or chunking.

use crate::plugin::call::{HostError, to_f32_vec, with_ctx};
use crate::rng;
use candle_core::Tensor;
use mergescope_plugin_api::abi::{HostRandomV1, HostRandomV2, Status, TensorHandle};
use std::ffi::c_void;
use std::mem::MaybeUninit;

/// The static table of `mergescope.host.random.v1`.
pub(crate) static TABLE: HostRandomV1 = HostRandomV1 {
    struct_size: std::mem::size_of::<HostRandomV1>(),
    bernoulli_mask: h_bernoulli_mask,
};

/// The static table of `mergescope.host.random.v2`.
pub(crate) static TABLE_V2: HostRandomV2 = HostRandomV2 {
    struct_size: std::mem::size_of::<HostRandomV2>(),
    bernoulli_mask: h_bernoulli_mask,
    bernoulli_mask_p: h_bernoulli_mask_p,
};

/// The 0/1 mask of `n` elements starting at element `offset` of the full tensor: element i is 1
/// iff `rng::bits32` for (seed, offset + i) is below `threshold(i)`. Same draws as
/// `rng::bernoulli_keep(seed, offset + i, p)`, with the stream key computed once per 2³²
/// elements.
fn counter_mask(n: u64, seed: u64, offset: u64, threshold: impl Fn(usize) -> u64) -> Vec<f32> {
    let mut mask: Vec<f32> = Vec::with_capacity(n as usize);
    let mut i = 0u64;
    while i < n {
        let index = offset + i;
        let key = rng::stream_key(seed, index);
        let run = (n - i).min((1u64 << 32) - (index & 0xFFFF_FFFF));
        mask.extend((index..index + run).map(|j| {
            let local = (j - offset) as usize;
            f32::from(u8::from(u64::from(rng::bits32(key, j)) < threshold(local)))
        }));
        i += run;
    }
    mask
}

/// [`counter_mask`] with one threshold for every element (`bernoulli_mask`), the same values:
/// within a run the lower 32 bits of the index are a `u32` counter and the comparison is one of
/// `u32`s, so the loop vectorises; with AVX2 where the CPU has it (the draws are integer
/// arithmetic, so every instruction set gives the same bits).
fn counter_mask_uniform(n: u64, seed: u64, offset: u64, threshold: u64) -> Vec<f32> {
    let len = n as usize;
    let mut mask: Vec<f32> = Vec::with_capacity(len);
    let mut i = 0u64;
    while i < n {
        let index = offset + i;
        let key = rng::stream_key(seed, index);
        let run = (n - i).min((1u64 << 32) - (index & 0xFFFF_FFFF));
        let out = &mut mask.spare_capacity_mut()[i as usize..(i + run) as usize];
        match u32::try_from(threshold) {
            // bits32 < 2³² always: every element kept.
            Err(_) => out.fill(MaybeUninit::new(1.0)),
            Ok(t) => mask_run(out, key, index as u32, t),
        }
        i += run;
    }
    // SAFETY: the runs tile 0..n, and each run wrote every element of its range above (no
    // zero-fill first: the masks of a DARE merge are as large as its inputs).
    unsafe { mask.set_len(len) };
    mask
}

mergescope_plugin_api::avx2_dispatch! {
    /// Element k of `out` = [bits32(key, lo + k) < threshold] (the index's lower 32 bits; `out`
    /// never crosses a multiple of 2³²). Integer arithmetic: the same bits on every path.
    fn mask_run(out: &mut [MaybeUninit<f32>], key: u64, lo: u32, threshold: u32) {
        for (k, o) in out.iter_mut().enumerate() {
            let j = lo.wrapping_add(k as u32);
            o.write(f32::from(u8::from(rng::bits32(key, u64::from(j)) < threshold)));
        }
    }
}

pub(crate) unsafe extern "C" fn h_bernoulli_mask(
    ctx: *mut c_void,
    like: TensorHandle,
    keep_probability: f64,
    seed: u64,
    offset: u64,
    out: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        if !(0.0..=1.0).contains(&keep_probability) {
            return Err(HostError::Invalid(format!(
                "bernoulli_mask: probability {keep_probability} not in [0, 1]"
            )));
        }
        let like = c.tensor(like)?;
        let shape = like.shape().clone();
        let threshold = rng::keep_threshold(keep_probability);
        let mask = counter_mask_uniform(like.elem_count() as u64, seed, offset, threshold);
        let t = Tensor::from_vec(mask, shape, c.device())?;
        c.put(t, out)
    })
}

pub(crate) unsafe extern "C" fn h_bernoulli_mask_p(
    ctx: *mut c_void,
    probabilities: TensorHandle,
    seed: u64,
    offset: u64,
    out: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        let probabilities = c.tensor(probabilities)?;
        let shape = probabilities.shape().clone();
        let p = to_f32_vec(probabilities)?;
        if let Some((j, bad)) = p
            .iter()
            .enumerate()
            .find(|(_, v)| !(v.is_finite() && (0.0..=1.0).contains(*v)))
        {
            return Err(HostError::Invalid(format!(
                "bernoulli_mask_p: element {j} has probability {bad}; probabilities must be finite and in [0, 1]"
            )));
        }
        // Each probability widened to f64, then the same threshold bernoulli_mask uses.
        let thresholds: Vec<u64> = p.iter().map(|v| rng::keep_threshold(f64::from(*v))).collect();
        let mask = counter_mask(p.len() as u64, seed, offset, |i| thresholds[i]);
        let t = Tensor::from_vec(mask, shape, c.device())?;
        c.put(t, out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_thresholds_give_the_bernoulli_keep_draws() {
        let (seed, offset, p) = (11u64, 5u64, 0.3f64);
        let t = rng::keep_threshold(p);
        let mask = counter_mask(1000, seed, offset, |_| t);
        for (i, m) in mask.iter().enumerate() {
            assert_eq!(
                *m == 1.0,
                rng::bernoulli_keep(seed, offset + i as u64, p),
                "element {i}"
            );
        }
    }

    #[test]
    fn uniform_masks_equal_the_general_loop_on_every_path() {
        // Runs crossing 2³² (a key change), thresholds 0, 2³² (p = 1) and in between, and the
        // per-element loop against the dispatched (AVX2 where the CPU has it) one.
        for (seed, offset) in [(11u64, 5u64), (3, (1u64 << 32) - 700), (7, 3 << 32)] {
            for p in [0.0, 0.2, 0.5, 0.8, 1.0] {
                let t = rng::keep_threshold(p);
                let want = counter_mask(1500, seed, offset, |_| t);
                assert_eq!(
                    counter_mask_uniform(1500, seed, offset, t),
                    want,
                    "seed {seed} offset {offset} p {p}"
                );
            }
        }
    }

    #[test]
    fn per_element_thresholds_use_each_elements_draw() {
        let (seed, offset) = (3u64, 1u64 << 32); // a key change exactly at the start
        let p: Vec<f64> = (0..500).map(|i| f64::from(i) / 499.0).collect();
        let thresholds: Vec<u64> = p.iter().map(|v| rng::keep_threshold(*v)).collect();
        let mask = counter_mask(500, seed, offset - 250, |i| thresholds[i]);
        for (i, m) in mask.iter().enumerate() {
            let j = offset - 250 + i as u64;
            assert_eq!(*m == 1.0, rng::bernoulli_keep(seed, j, p[i]), "element {i}");
        }
        assert_eq!(mask[0], 0.0);
        assert_eq!(mask[499], 1.0);
    }
}
