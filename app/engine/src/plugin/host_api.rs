//! The host side of the ABI: the core tensor table plugins call back into
//! ([`HostApiV1`]), implemented over candle, and the lookup of host extensions by id. Every
//! function body runs under [`with_ctx`], so nothing unwinds into the plugin.

use crate::plugin::call::{
    CallCtx, HResult, HostError, bounded_text, slice_arg, to_f32_vec, with_cpu_f32, with_cpu_slices, with_ctx,
};
use crate::plugin::host_ext::{self, linalg, random, sign_consensus};
use candle_core::{DType, Tensor};
use mergescope_plugin_api::abi::{self, HostApiV1, Status, Str, TensorHandle};
use mergescope_plugin_api::sdk::sums;
use std::ffi::c_void;
use std::sync::atomic::Ordering;

impl CallCtx<'_> {
    /// The host table for this call. The returned table points at `self`: keep `self` alive
    /// and unmoved while the plugin runs.
    pub fn table(&mut self) -> HostApiV1 {
        HostApiV1 {
            struct_size: std::mem::size_of::<HostApiV1>(),
            abi_major: abi::ABI_MAJOR,
            abi_minor: abi::ABI_MINOR,
            ctx: (self as *mut Self).cast::<c_void>(),
            log: h_log,
            report_progress: h_report_progress,
            is_cancelled: h_is_cancelled,
            set_error: h_set_error,
            get_extension: h_get_extension,
            shape: h_shape,
            numel: h_numel,
            read_f32: h_read_f32,
            from_f32: h_from_f32,
            full_like: h_full_like,
            binary: h_binary,
            unary: h_unary,
            affine: h_affine,
            compare_scalar: h_compare_scalar,
            select: h_select,
            reduce: h_reduce,
            dot: h_dot,
            kth_largest_abs: h_kth_largest_abs,
            weighted_sum: h_weighted_sum,
            reduce_stack: h_reduce_stack,
            bernoulli_mask: random::h_bernoulli_mask,
            matmul: h_matmul,
            transpose: h_transpose,
            reshape: h_reshape,
            svd: linalg::h_svd,
            low_rank: linalg::h_low_rank,
            release: h_release,
            trim_abs: sign_consensus::h_trim_abs,
            elect_sign: sign_consensus::h_elect_sign,
            disjoint_merge: sign_consensus::h_disjoint_merge,
        }
    }
}

unsafe extern "C" fn h_log(ctx: *mut c_void, level: abi::LogLevel, message: Str) {
    with_ctx(ctx, |c| {
        // SAFETY: the plugin passes a string valid for the call.
        let m = unsafe { message.as_str() }.unwrap_or("<log message is not UTF-8>");
        (c.log())(level, &bounded_text(m));
        Ok(())
    });
}

unsafe extern "C" fn h_report_progress(ctx: *mut c_void, fraction: f64) {
    with_ctx(ctx, |c| {
        c.progress = fraction.clamp(0.0, 1.0);
        Ok(())
    });
}

unsafe extern "C" fn h_is_cancelled(ctx: *mut c_void) -> i32 {
    let mut r = 0;
    with_ctx(ctx, |c| {
        r = i32::from(c.cancel_flag().load(Ordering::Relaxed));
        Ok(())
    });
    r
}

unsafe extern "C" fn h_set_error(ctx: *mut c_void, message: Str) {
    with_ctx(ctx, |c| {
        // SAFETY: the plugin passes a string valid for the call; we copy it.
        let m = unsafe { message.as_str() }.unwrap_or("<error message is not UTF-8>");
        c.error = Some(bounded_text(m));
        Ok(())
    });
}

unsafe extern "C" fn h_get_extension(_ctx: *mut c_void, id: Str) -> *const c_void {
    // SAFETY: the plugin passes a string valid for the call.
    match unsafe { id.as_str() } {
        Ok(id) => host_ext::lookup(id),
        Err(_) => std::ptr::null(),
    }
}

unsafe extern "C" fn h_shape(
    ctx: *mut c_void,
    t: TensorHandle,
    dims: *mut usize,
    max_rank: usize,
    rank: *mut usize,
) -> Status {
    with_ctx(ctx, |c| {
        let d = c.tensor(t)?.dims().to_vec();
        if rank.is_null() {
            return Err(HostError::Invalid("null rank pointer".into()));
        }
        // SAFETY: checked for null.
        unsafe { *rank = d.len() };
        if !dims.is_null() {
            for (i, v) in d.iter().take(max_rank).enumerate() {
                // SAFETY: the plugin provides room for `max_rank` dims.
                unsafe { *dims.add(i) = *v };
            }
        }
        Ok(())
    })
}

unsafe extern "C" fn h_numel(ctx: *mut c_void, t: TensorHandle, out: *mut usize) -> Status {
    with_ctx(ctx, |c| {
        let n = c.tensor(t)?.elem_count();
        if out.is_null() {
            return Err(HostError::Invalid("null output pointer".into()));
        }
        // SAFETY: checked for null.
        unsafe { *out = n };
        Ok(())
    })
}

unsafe extern "C" fn h_read_f32(ctx: *mut c_void, t: TensorHandle, dst: *mut f32, len: usize) -> Status {
    with_ctx(ctx, |c| {
        let t = c.tensor(t)?;
        if len != t.elem_count() {
            return Err(HostError::Invalid(format!(
                "read_f32: buffer of {len} for a tensor of {}",
                t.elem_count()
            )));
        }
        if dst.is_null() && len > 0 {
            return Err(HostError::Invalid("read_f32: null destination".into()));
        }
        // SAFETY: the plugin provides `len` writable floats; the sources have `len` values.
        let copy = |src: &[f32]| unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, len) };
        if with_cpu_f32(t, copy).is_none() {
            copy(&to_f32_vec(t)?);
        }
        Ok(())
    })
}

unsafe extern "C" fn h_from_f32(
    ctx: *mut c_void,
    data: *const f32,
    len: usize,
    dims: *const usize,
    rank: usize,
    out: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        let data = slice_arg(data, len, "data")?;
        let dims = slice_arg(dims, rank, "dims")?.to_vec();
        if dims.iter().product::<usize>() != len {
            return Err(HostError::Invalid(format!(
                "from_f32: shape {dims:?} does not hold {len} values"
            )));
        }
        let t = Tensor::from_slice(data, dims, c.device())?;
        c.put(t, out)
    })
}

unsafe extern "C" fn h_full_like(ctx: *mut c_void, like: TensorHandle, value: f64, out: *mut TensorHandle) -> Status {
    with_ctx(ctx, |c| {
        let like = c.tensor(like)?;
        let t = Tensor::full(value as f32, like.shape(), c.device())?.contiguous()?;
        c.put(t, out)
    })
}

unsafe extern "C" fn h_binary(
    ctx: *mut c_void,
    op: abi::BinaryOp,
    a: TensorHandle,
    b: TensorHandle,
    out: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        let (a, b) = (c.tensor(a)?, c.tensor(b)?);
        let mask = |m: Tensor| m.to_dtype(DType::F32);
        let t = match op {
            abi::BINARY_ADD => a.broadcast_add(b)?,
            abi::BINARY_SUB => a.broadcast_sub(b)?,
            abi::BINARY_MUL => a.broadcast_mul(b)?,
            abi::BINARY_DIV => a.broadcast_div(b)?,
            abi::BINARY_MAXIMUM => a.broadcast_maximum(b)?,
            abi::BINARY_MINIMUM => a.broadcast_minimum(b)?,
            abi::BINARY_GT => mask(a.broadcast_gt(b)?)?,
            abi::BINARY_GE => mask(a.broadcast_ge(b)?)?,
            abi::BINARY_LT => mask(a.broadcast_lt(b)?)?,
            abi::BINARY_LE => mask(a.broadcast_le(b)?)?,
            abi::BINARY_EQ => mask(a.broadcast_eq(b)?)?,
            other => return Err(HostError::Unsupported(format!("unknown binary operation {other}"))),
        };
        c.put(t, out)
    })
}

unsafe extern "C" fn h_unary(ctx: *mut c_void, op: abi::UnaryOp, a: TensorHandle, out: *mut TensorHandle) -> Status {
    with_ctx(ctx, |c| {
        let a = c.tensor(a)?;
        let t = match op {
            abi::UNARY_NEG => a.neg()?,
            abi::UNARY_ABS => a.abs()?,
            abi::UNARY_SIGN => a.sign()?,
            abi::UNARY_SQRT => a.sqrt()?,
            abi::UNARY_SQUARE => a.sqr()?,
            abi::UNARY_EXP => a.exp()?,
            abi::UNARY_LOG => a.log()?,
            other => return Err(HostError::Unsupported(format!("unknown unary operation {other}"))),
        };
        c.put(t, out)
    })
}

unsafe extern "C" fn h_affine(ctx: *mut c_void, a: TensorHandle, mul: f64, add: f64, out: *mut TensorHandle) -> Status {
    with_ctx(ctx, |c| {
        let t = c.tensor(a)?.affine(mul, add)?;
        c.put(t, out)
    })
}

unsafe extern "C" fn h_compare_scalar(
    ctx: *mut c_void,
    op: abi::BinaryOp,
    a: TensorHandle,
    scalar: f64,
    out: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        let a = c.tensor(a)?;
        let s = scalar as f32;
        let m = match op {
            abi::BINARY_GT => a.gt(s)?,
            abi::BINARY_GE => a.ge(s)?,
            abi::BINARY_LT => a.lt(s)?,
            abi::BINARY_LE => a.le(s)?,
            abi::BINARY_EQ => a.eq(s)?,
            other => {
                return Err(HostError::Unsupported(format!(
                    "compare_scalar: {other} is not a comparison"
                )));
            }
        };
        let t = m.to_dtype(DType::F32)?;
        c.put(t, out)
    })
}

unsafe extern "C" fn h_select(
    ctx: *mut c_void,
    mask: TensorHandle,
    on_true: TensorHandle,
    on_false: TensorHandle,
    out: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        let (m, t, f) = (c.tensor(mask)?, c.tensor(on_true)?, c.tensor(on_false)?);
        if m.dims() != t.dims() || t.dims() != f.dims() {
            return Err(HostError::Invalid(format!(
                "select: shapes differ (mask {:?}, on_true {:?}, on_false {:?})",
                m.dims(),
                t.dims(),
                f.dims()
            )));
        }
        let r = m.ne(0f32)?.where_cond(t, f)?;
        c.put(r, out)
    })
}

/// A reduction of f32 values; sums are f64 in the one lane order of every sum
/// ([`mergescope_plugin_api::sdk::sums`]), so a plugin's fused loop gives the same bits.
fn reduce_values(op: abi::ReduceOp, v: &[f32]) -> HResult<f64> {
    let it = v.iter().map(|x| f64::from(*x));
    Ok(match op {
        abi::REDUCE_SUM => sums::sum(v),
        abi::REDUCE_SUM_SQUARES => sums::sum_squares(v),
        abi::REDUCE_SUM_ABS => sums::sum_abs(v),
        abi::REDUCE_MAX_ABS => it.map(f64::abs).fold(0.0, f64::max),
        abi::REDUCE_COUNT_NONZERO => v.iter().filter(|x| **x != 0.0).count() as f64,
        abi::REDUCE_MEAN => {
            if v.is_empty() {
                0.0
            } else {
                sums::sum(v) / v.len() as f64
            }
        }
        abi::REDUCE_MIN => it.fold(f64::INFINITY, f64::min),
        abi::REDUCE_MAX => it.fold(f64::NEG_INFINITY, f64::max),
        other => return Err(HostError::Unsupported(format!("unknown reduction {other}"))),
    })
}

fn write_f64(out: *mut f64, v: f64) -> HResult<()> {
    if out.is_null() {
        return Err(HostError::Invalid("null output pointer".into()));
    }
    // SAFETY: checked for null.
    unsafe { *out = v };
    Ok(())
}

unsafe extern "C" fn h_reduce(ctx: *mut c_void, op: abi::ReduceOp, a: TensorHandle, out: *mut f64) -> Status {
    with_ctx(ctx, |c| {
        let a = c.tensor(a)?;
        let v = match with_cpu_f32(a, |s| reduce_values(op, s)) {
            Some(r) => r?,
            None => reduce_values(op, &to_f32_vec(a)?)?,
        };
        write_f64(out, v)
    })
}

unsafe extern "C" fn h_dot(ctx: *mut c_void, a: TensorHandle, b: TensorHandle, out: *mut f64) -> Status {
    with_ctx(ctx, |c| {
        let (a, b) = (c.tensor(a)?, c.tensor(b)?);
        if a.elem_count() != b.elem_count() {
            return Err(HostError::Invalid(format!(
                "dot: {} vs {} elements",
                a.elem_count(),
                b.elem_count()
            )));
        }
        // Read in place where both are f32 on the CPU (no copies); the same lane-order sum either way.
        let d = match with_cpu_slices(&[a, b], |s| sums::dot(s[0], s[1])) {
            Some(d) => d,
            None => sums::dot(&to_f32_vec(a)?, &to_f32_vec(b)?),
        };
        write_f64(out, d)
    })
}

/// The k-th largest |x| (1-based) by introselect: O(n), no sort.
pub fn kth_largest_abs(values: &[f32], k: usize) -> Option<f32> {
    let n = values.len();
    if k == 0 || k > n {
        return None;
    }
    let mut mags: Vec<f32> = values.iter().map(|x| x.abs()).collect();
    let (_, kth, _) = mags.select_nth_unstable_by(n - k, f32::total_cmp);
    Some(*kth)
}

unsafe extern "C" fn h_kth_largest_abs(ctx: *mut c_void, a: TensorHandle, k: usize, out: *mut f64) -> Status {
    with_ctx(ctx, |c| {
        let a = c.tensor(a)?;
        let n = a.elem_count();
        let v = match with_cpu_f32(a, |s| kth_largest_abs(s, k)) {
            Some(r) => r,
            None => kth_largest_abs(&to_f32_vec(a)?, k),
        }
        .ok_or_else(|| HostError::Invalid(format!("kth_largest_abs: k = {k} must be in 1..={n}")))?;
        write_f64(out, f64::from(v))
    })
}

mergescope_plugin_api::avx2_dispatch! {
    /// Σ_i w_i·x_i over same-length slices, blocked so each block stays in cache.
    fn weighted_sum_cpu(inputs: &[&[f32]], weights: &[f64]) -> Vec<f32> {
        const BLOCK: usize = 4096;
        let w: Vec<f32> = weights.iter().map(|w| *w as f32).collect();
        let (Some(first), Some(w0)) = (inputs.first(), w.first()) else {
            return Vec::new();
        };
        // The first term initialises the output: `0 + w0·x0` is `w0·x0 + 0` (which also turns a
        // -0 into +0, as the sum from zero does), so no zero-filled buffer is written first.
        // Block by block, the first term and then the others, so that a block of the output
        // is written and added to while it is in L1 (a first pass over the whole output sent it
        // to L3 and back); each element's sum is the same, in the same order.
        let mut out: Vec<f32> = Vec::with_capacity(first.len());
        for start in (0..first.len()).step_by(BLOCK) {
            let end = (start + BLOCK).min(first.len());
            out.extend(first[start..end].iter().map(|s| w0 * s + 0.0));
            let block = &mut out[start..end];
            for (x, wj) in inputs.iter().zip(&w).skip(1) {
                for (o, s) in block.iter_mut().zip(&x[start..end]) {
                    *o += wj * s;
                }
            }
        }
        out
    }
}

unsafe extern "C" fn h_weighted_sum(
    ctx: *mut c_void,
    ts: *const TensorHandle,
    weights: *const f64,
    n: usize,
    out: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        if n == 0 {
            return Err(HostError::Invalid("weighted_sum of no tensors".into()));
        }
        let handles = slice_arg(ts, n, "tensor array")?;
        let w: Vec<f64> = if weights.is_null() {
            vec![1.0; n]
        } else {
            slice_arg(weights, n, "weights")?.to_vec()
        };
        let tensors: Vec<&Tensor> = handles.iter().map(|h| c.tensor(*h)).collect::<HResult<_>>()?;
        let shape = tensors[0].shape().clone();
        if let Some(bad) = tensors.iter().find(|t| t.shape() != &shape) {
            return Err(HostError::Invalid(format!(
                "weighted_sum: shapes differ ({shape:?} vs {:?})",
                bad.shape()
            )));
        }
        let result = if c.device().is_cpu() {
            let summed = match with_cpu_slices(&tensors, |slices| weighted_sum_cpu(slices, &w)) {
                Some(v) => v,
                None => {
                    let vecs: Vec<Vec<f32>> = tensors
                        .iter()
                        .map(|t| to_f32_vec(t))
                        .collect::<candle_core::Result<_>>()?;
                    let slices: Vec<&[f32]> = vecs.iter().map(Vec::as_slice).collect();
                    weighted_sum_cpu(&slices, &w)
                }
            };
            Tensor::from_vec(summed, shape, c.device())?
        } else {
            let mut acc = tensors[0].affine(w[0], 0.0)?;
            for (t, wi) in tensors.iter().zip(&w).skip(1) {
                acc = (acc + t.affine(*wi, 0.0)?)?;
            }
            acc
        };
        c.put(result, out)
    })
}

unsafe extern "C" fn h_reduce_stack(
    ctx: *mut c_void,
    op: abi::StackOp,
    ts: *const TensorHandle,
    n: usize,
    out: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        if n == 0 {
            return Err(HostError::Invalid("reduce_stack of no tensors".into()));
        }
        let handles = slice_arg(ts, n, "tensor array")?;
        let tensors: Vec<Tensor> = handles.iter().map(|h| c.tensor(*h).cloned()).collect::<HResult<_>>()?;
        let s = Tensor::stack(&tensors, 0)?;
        let t = match op {
            abi::STACK_SUM => s.sum(0)?,
            abi::STACK_MEAN => s.mean(0)?,
            abi::STACK_MAX => s.max(0)?,
            abi::STACK_MIN => s.min(0)?,
            other => return Err(HostError::Unsupported(format!("unknown stack reduction {other}"))),
        };
        c.put(t, out)
    })
}

unsafe extern "C" fn h_matmul(ctx: *mut c_void, a: TensorHandle, b: TensorHandle, out: *mut TensorHandle) -> Status {
    with_ctx(ctx, |c| {
        let t = c.tensor(a)?.matmul(c.tensor(b)?)?;
        c.put(t, out)
    })
}

unsafe extern "C" fn h_transpose(ctx: *mut c_void, a: TensorHandle, out: *mut TensorHandle) -> Status {
    with_ctx(ctx, |c| {
        let a = c.tensor(a)?;
        if a.rank() != 2 {
            return Err(HostError::Invalid(format!(
                "transpose needs a 2-D tensor, got shape {:?}",
                a.dims()
            )));
        }
        let t = a.t()?.contiguous()?;
        c.put(t, out)
    })
}

unsafe extern "C" fn h_reshape(
    ctx: *mut c_void,
    a: TensorHandle,
    dims: *const usize,
    rank: usize,
    out: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        let dims = slice_arg(dims, rank, "dims")?.to_vec();
        let t = c.tensor(a)?.reshape(dims)?;
        c.put(t, out)
    })
}

unsafe extern "C" fn h_release(ctx: *mut c_void, t: TensorHandle) -> Status {
    with_ctx(ctx, |c| {
        let slot = (t as usize).checked_sub(1).and_then(|i| c.tensors.get_mut(i));
        match slot {
            Some(s @ Some(_)) => {
                *s = None;
                Ok(())
            }
            _ => Err(HostError::Invalid(format!(
                "release: unknown or already released tensor handle {t}"
            ))),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kth_largest_abs_golden() {
        let v = [0.5f32, -0.2, 0.1, 0.0, 0.9, -0.7, 0.05, 0.3, -0.4, 0.6];
        assert_eq!(kth_largest_abs(&v, 1), Some(0.9));
        assert_eq!(kth_largest_abs(&v, 2), Some(0.7));
        assert_eq!(kth_largest_abs(&v, 3), Some(0.6));
        assert_eq!(kth_largest_abs(&v, 10), Some(0.0));
        assert_eq!(kth_largest_abs(&v, 0), None);
        assert_eq!(kth_largest_abs(&v, 11), None);
    }

    #[test]
    fn weighted_sum_blocks_match_naive() {
        let a: Vec<f32> = (0..10_000).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..10_000).map(|i| -(i as f32) * 0.5).collect();
        let r = weighted_sum_cpu(&[&a, &b], &[0.25, 2.0]);
        for i in [0usize, 4095, 4096, 9999] {
            assert_eq!(r[i], 0.25 * a[i] + 2.0 * b[i]);
        }
        // Every element, bit for bit, is the sum in input order from the first term (a −0 first
        // term becoming +0), over lengths that end inside a block.
        let value = |k: usize, s: usize| ((k * 7919 + s * 104_729) % 2003) as f32 * 1.3e-3 - 1.1;
        let w = [0.7f64, -1.0 / 3.0, 1.0 / 3.0];
        for len in [0, 1, 4095, 4097, 10_001] {
            let xs: Vec<Vec<f32>> = (0..3).map(|s| (0..len).map(|k| value(k, s)).collect()).collect();
            let mut first = xs[0].clone();
            if len > 0 {
                first[0] = -0.0;
            }
            let r = weighted_sum_cpu(&[&first, &xs[1], &xs[2]], &w);
            assert_eq!(r.len(), len);
            let wf = w.map(|w| w as f32);
            for k in 0..len {
                let want = ((wf[0] * first[k] + 0.0) + wf[1] * xs[1][k]) + wf[2] * xs[2][k];
                assert_eq!(r[k].to_bits(), want.to_bits(), "length {len}, element {k}");
            }
        }
    }
}
