//! Host extension `mergescope.host.views.v1` (ABI 1.4): lends a plugin a tensor's f32 values in
//! place, so a method reads its inputs without copying each one out (`read_f32`). The tensor is
//! kept alive in the call's context until the call returns, even when the plugin releases it
//! first, so a lent pointer never dangles during the call.

use crate::plugin::call::{HostError, with_cpu_f32, with_ctx};
use mergescope_plugin_api::abi::{HostViewsV1, Status, TensorHandle};
use std::ffi::c_void;

/// The static table of `mergescope.host.views.v1`.
pub(crate) static TABLE: HostViewsV1 = HostViewsV1 {
    struct_size: std::mem::size_of::<HostViewsV1>(),
    view_f32: h_view_f32,
};

unsafe extern "C" fn h_view_f32(ctx: *mut c_void, t: TensorHandle, data: *mut *const f32, len: *mut usize) -> Status {
    with_ctx(ctx, |c| {
        if data.is_null() || len.is_null() {
            return Err(HostError::Invalid("view_f32: null output pointer".into()));
        }
        let tensor = c.tensor(t)?;
        let (ptr, n) = with_cpu_f32(tensor, |v| (v.as_ptr(), v.len())).ok_or_else(|| {
            HostError::Unsupported(format!(
                "view_f32: tensor {t} is not contiguous f32 in host memory; copy it out with read_f32"
            ))
        })?;
        // The values live in the tensor's storage, which no host operation writes in place; the
        // clone keeps that storage alive until the call's context is dropped.
        let keep = tensor.clone();
        c.keep_alive(keep);
        // SAFETY: both checked for null; the plugin passes writable pointers.
        unsafe {
            *data = ptr;
            *len = n;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::call::CallCtx;
    use candle_core::{DType, Device, Tensor};
    use std::sync::atomic::AtomicBool;

    #[test]
    fn a_view_reads_the_values_and_outlives_a_release() {
        let cancel = AtomicBool::new(false);
        let log = |_: mergescope_plugin_api::abi::LogLevel, _: &str| {};
        let mut ctx = CallCtx::new(&Device::Cpu, &cancel, &log);
        let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
        let t = Tensor::from_vec(values.clone(), (3, 4), &Device::Cpu).unwrap();
        let h = ctx.insert(t);
        let cptr = std::ptr::from_mut(&mut ctx).cast::<c_void>();
        let (mut data, mut n) = (std::ptr::null(), 0usize);
        // SAFETY: a live context and writable outputs.
        let status = unsafe { h_view_f32(cptr, h, &mut data, &mut n) };
        assert_eq!(status, mergescope_plugin_api::abi::STATUS_OK);
        ctx.tensors[h as usize - 1] = None; // what `release` does
        // SAFETY: the host promised the values until the context is dropped.
        let lent = unsafe { std::slice::from_raw_parts(data, n) };
        assert_eq!(lent, values.as_slice());

        // A non-contiguous (transposed) or non-f32 tensor is refused: the plugin copies instead.
        let tt = Tensor::from_vec(values, (3, 4), &Device::Cpu).unwrap().t().unwrap();
        let h2 = ctx.insert(tt);
        let h3 = ctx.insert(Tensor::zeros(4, DType::F64, &Device::Cpu).unwrap());
        let cptr = std::ptr::from_mut(&mut ctx).cast::<c_void>();
        for h in [h2, h3] {
            // SAFETY: as above.
            let status = unsafe { h_view_f32(cptr, h, &mut data, &mut n) };
            assert_eq!(status, mergescope_plugin_api::abi::STATUS_UNSUPPORTED, "handle {h}");
        }
    }
}
