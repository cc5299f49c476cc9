//! Host extension `mergescope.host.random.v1`: seeded counter-based Bernoulli masks (DARE's
//! drops), the same draws whatever the device or chunking.

use crate::plugin::call::{HostError, with_ctx};
use crate::rng;
use candle_core::Tensor;
use mergescope_plugin_api::abi::{HostRandomV1, Status, TensorHandle};
use std::ffi::c_void;

/// The extension's static table.
pub(crate) static TABLE: HostRandomV1 = HostRandomV1 {
    struct_size: std::mem::size_of::<HostRandomV1>(),
    bernoulli_mask: h_bernoulli_mask,
};

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
        // Same draws as `rng::bernoulli_keep(seed, offset + i, p)`, with the key computed once per
        // 2³² elements.
        let threshold = rng::keep_threshold(keep_probability);
        let n = like.elem_count() as u64;
        let mut mask: Vec<f32> = Vec::with_capacity(n as usize);
        let mut i = 0u64;
        while i < n {
            let index = offset + i;
            let key = rng::stream_key(seed, index);
            let run = (n - i).min((1u64 << 32) - (index & 0xFFFF_FFFF));
            mask.extend((index..index + run).map(|j| f32::from(u8::from(u64::from(rng::bits32(key, j)) < threshold))));
            i += run;
        }
        let t = Tensor::from_vec(mask, shape, c.device())?;
        c.put(t, out)
    })
}
