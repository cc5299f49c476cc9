//! The host side of the ABI: the tensor table plugins call back into, implemented over candle.
//! One [`CallCtx`] lives for one call into a plugin; the handles it hands out index its arena,
//! which is dropped when the call returns (except the tensor the plugin returns).
//! No function here unwinds into the plugin: every body runs under `catch_unwind`.

use crate::rng;
use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use mergescope_plugin_api::abi::{self, HostApiV1, Status, Str, TensorHandle};
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};

/// Receives log lines of a plugin: (level, message).
pub type LogSink<'a> = &'a (dyn Fn(abi::LogLevel, &str) + Sync);

/// State of one call into a plugin.
pub struct CallCtx<'a> {
    device: &'a Device,
    tensors: Vec<Option<Tensor>>,
    /// The error text the plugin or a host function set during the call.
    pub error: Option<String>,
    cancel: &'a AtomicBool,
    log: LogSink<'a>,
    /// Last progress fraction the plugin reported inside the call.
    pub progress: f64,
}

enum HostError {
    Invalid(String),
    Failed(String),
    Unsupported(String),
}

impl From<candle_core::Error> for HostError {
    fn from(e: candle_core::Error) -> Self {
        HostError::Failed(e.to_string())
    }
}

type HResult<T> = Result<T, HostError>;

impl<'a> CallCtx<'a> {
    /// A fresh context for one call.
    pub fn new(device: &'a Device, cancel: &'a AtomicBool, log: LogSink<'a>) -> Self {
        CallCtx {
            device,
            tensors: Vec::new(),
            error: None,
            cancel,
            log,
            progress: 0.0,
        }
    }

    /// Registers a tensor and returns its handle.
    pub fn insert(&mut self, t: Tensor) -> TensorHandle {
        self.tensors.push(Some(t));
        self.tensors.len() as TensorHandle
    }

    /// The tensor behind a handle.
    pub fn get(&self, h: TensorHandle) -> Option<&Tensor> {
        (h as usize)
            .checked_sub(1)
            .and_then(|i| self.tensors.get(i))
            .and_then(Option::as_ref)
    }

    /// The handle the next `insert` will return minus one: a mark for [`CallCtx::release_since`].
    pub fn mark(&self) -> u64 {
        self.tensors.len() as u64
    }

    /// Frees every tensor made after `mark` except the handles in `keep`; unknown handles in
    /// `keep` are an error (nothing is freed then).
    pub fn release_since(&mut self, mark: u64, keep: &[TensorHandle]) -> Result<(), String> {
        if let Some(bad) = keep.iter().find(|h| self.get(**h).is_none()) {
            return Err(format!("release_since: cannot keep unknown or released handle {bad}"));
        }
        for i in (mark as usize).min(self.tensors.len())..self.tensors.len() {
            if !keep.contains(&(i as TensorHandle + 1)) {
                self.tensors[i] = None;
            }
        }
        Ok(())
    }

    /// Records an error for the plugin's current call.
    pub fn fail(&mut self, message: String) {
        self.error = Some(message);
    }

    /// The device tensors live on.
    pub fn device(&self) -> &Device {
        self.device
    }

    /// The job's cancel flag.
    pub fn cancel_flag(&self) -> &AtomicBool {
        self.cancel
    }

    fn tensor(&self, h: TensorHandle) -> HResult<&Tensor> {
        self.get(h).ok_or_else(|| {
            HostError::Invalid(format!(
                "unknown or released tensor handle {h} (handles are valid only during the call that made them)"
            ))
        })
    }

    fn put(&mut self, t: Tensor, out: *mut TensorHandle) -> HResult<()> {
        if out.is_null() {
            return Err(HostError::Invalid("null output pointer".into()));
        }
        let h = self.insert(t);
        // SAFETY: checked for null; the plugin passes a writable pointer.
        unsafe { *out = h };
        Ok(())
    }

    /// The host table for this call. The returned table points at `self`: keep `self` alive
    /// and unmoved while the plugin runs.
    pub fn table(&mut self) -> HostApiV1 {
        HostApiV1 {
            struct_size: std::mem::size_of::<HostApiV1>(),
            abi_major: abi::ABI_MAJOR,
            abi_minor: abi::ABI_MINOR,
            ctx: (self as *mut CallCtx<'a>).cast::<c_void>(),
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
            bernoulli_mask: h_bernoulli_mask,
            matmul: h_matmul,
            transpose: h_transpose,
            reshape: h_reshape,
            svd: h_svd,
            low_rank: h_low_rank,
            release: h_release,
            trim_abs: h_trim_abs,
            elect_sign: h_elect_sign,
            disjoint_merge: h_disjoint_merge,
        }
    }
}

/// Runs a host function body: resolves the context, catches panics, records errors.
fn with_ctx(ctx: *mut c_void, f: impl FnOnce(&mut CallCtx<'_>) -> HResult<()>) -> Status {
    let ptr = ctx.cast::<CallCtx<'static>>();
    if ptr.is_null() {
        return abi::STATUS_INVALID_ARGUMENT;
    }
    // SAFETY: `ctx` is the pointer `CallCtx::table` put in the table; the context outlives the call.
    let result = catch_unwind(AssertUnwindSafe(|| f(unsafe { &mut *ptr })));
    // SAFETY: as above; the closure's borrow has ended.
    let c = unsafe { &mut *ptr };
    match result {
        Ok(Ok(())) => abi::STATUS_OK,
        Ok(Err(HostError::Invalid(m))) => {
            c.error = Some(m);
            abi::STATUS_INVALID_ARGUMENT
        }
        Ok(Err(HostError::Unsupported(m))) => {
            c.error = Some(m);
            abi::STATUS_UNSUPPORTED
        }
        Ok(Err(HostError::Failed(m))) => {
            c.error = Some(m);
            abi::STATUS_ERROR
        }
        Err(_) => {
            c.error = Some("internal error in a host tensor operation".into());
            abi::STATUS_ERROR
        }
    }
}

/// Borrows a contiguous CPU f32 tensor's data without copying, when possible.
pub fn with_cpu_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    if t.dtype() != DType::F32 {
        return None;
    }
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => layout.contiguous_offsets().map(|(s, e)| f(&v[s..e])),
        _ => None,
    }
}

/// Borrows several contiguous CPU f32 tensors at once without copying, when all allow it.
pub fn with_cpu_slices<R>(ts: &[&Tensor], f: impl FnOnce(&[&[f32]]) -> R) -> Option<R> {
    let guards: Vec<_> = ts.iter().map(|t| t.storage_and_layout()).collect();
    let slices: Option<Vec<&[f32]>> = guards
        .iter()
        .map(|(s, l)| match &**s {
            Storage::Cpu(CpuStorage::F32(v)) => l.contiguous_offsets().map(|(a, b)| &v[a..b]),
            _ => None,
        })
        .collect();
    slices.map(|sl| f(&sl))
}

/// A tensor's values as a flat f32 vector (copied).
pub fn to_f32_vec(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    if let Some(v) = with_cpu_f32(t, <[f32]>::to_vec) {
        return Ok(v);
    }
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

fn slice_arg<'s, T>(ptr: *const T, len: usize, what: &str) -> HResult<&'s [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(HostError::Invalid(format!("null {what} pointer with length {len}")));
    }
    // SAFETY: the plugin promises `len` readable elements for the call.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Longest plugin message (error or log line) shown to the user, in bytes.
pub const MAX_PLUGIN_MESSAGE_BYTES: usize = 2000;

/// A plugin's text cut to [`MAX_PLUGIN_MESSAGE_BYTES`] (at a character boundary), saying how
/// much was cut: a plugin cannot flood the terminal, the log panel or an error dialog.
pub fn bounded_text(text: &str) -> String {
    if text.len() <= MAX_PLUGIN_MESSAGE_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_PLUGIN_MESSAGE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes cut)", &text[..end], text.len() - end)
}

unsafe extern "C" fn h_log(ctx: *mut c_void, level: abi::LogLevel, message: Str) {
    with_ctx(ctx, |c| {
        // SAFETY: the plugin passes a string valid for the call.
        let m = unsafe { message.as_str() }.unwrap_or("<log message is not UTF-8>");
        (c.log)(level, &bounded_text(m));
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
        r = i32::from(c.cancel.load(Ordering::Relaxed));
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

unsafe extern "C" fn h_get_extension(_ctx: *mut c_void, _id: Str) -> *const c_void {
    std::ptr::null()
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
        let t = Tensor::from_slice(data, dims, c.device)?;
        c.put(t, out)
    })
}

unsafe extern "C" fn h_full_like(ctx: *mut c_void, like: TensorHandle, value: f64, out: *mut TensorHandle) -> Status {
    with_ctx(ctx, |c| {
        let like = c.tensor(like)?;
        let t = Tensor::full(value as f32, like.shape(), c.device)?.contiguous()?;
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

fn reduce_values(op: abi::ReduceOp, v: &[f32]) -> HResult<f64> {
    let it = v.iter().map(|x| f64::from(*x));
    Ok(match op {
        abi::REDUCE_SUM => it.sum(),
        abi::REDUCE_SUM_SQUARES => it.map(|x| x * x).sum(),
        abi::REDUCE_SUM_ABS => it.map(f64::abs).sum(),
        abi::REDUCE_MAX_ABS => it.map(f64::abs).fold(0.0, f64::max),
        abi::REDUCE_COUNT_NONZERO => v.iter().filter(|x| **x != 0.0).count() as f64,
        abi::REDUCE_MEAN => {
            if v.is_empty() {
                0.0
            } else {
                it.sum::<f64>() / v.len() as f64
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
        let (va, vb) = (to_f32_vec(a)?, to_f32_vec(b)?);
        let d: f64 = va.iter().zip(&vb).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
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

/// Σ_i w_i·x_i over same-length slices, blocked so each block stays in cache.
fn weighted_sum_cpu(inputs: &[&[f32]], weights: &[f64]) -> Vec<f32> {
    const BLOCK: usize = 4096;
    let n = inputs.first().map_or(0, |s| s.len());
    let mut out = vec![0f32; n];
    let w: Vec<f32> = weights.iter().map(|w| *w as f32).collect();
    for (bi, block) in out.chunks_mut(BLOCK).enumerate() {
        let start = bi * BLOCK;
        for (x, wj) in inputs.iter().zip(&w) {
            let src = &x[start..start + block.len()];
            for (o, s) in block.iter_mut().zip(src) {
                *o += wj * s;
            }
        }
    }
    out
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
        let result = if c.device.is_cpu() {
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
            Tensor::from_vec(summed, shape, c.device)?
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

unsafe extern "C" fn h_bernoulli_mask(
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
        let t = Tensor::from_vec(mask, shape, c.device)?;
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

/// Row-major factors of a truncated SVD: (U m×k, S k, Vᵀ k×n).
pub type SvdFactors = (Vec<f64>, Vec<f64>, Vec<f64>);

/// Thin SVD of a row-major m×n matrix in f64, truncated to k.
pub fn truncated_svd(data: &[f32], m: usize, n: usize, k: usize) -> Result<SvdFactors, String> {
    let k = k.min(m.min(n));
    let a = faer::Mat::<f64>::from_fn(m, n, |i, j| f64::from(data[i * n + j]));
    let svd = a.thin_svd().map_err(|e| format!("SVD did not converge: {e:?}"))?;
    let (u, s, v) = (svd.U(), svd.S().column_vector(), svd.V());
    let mut uk = vec![0f64; m * k];
    for i in 0..m {
        for j in 0..k {
            uk[i * k + j] = u[(i, j)];
        }
    }
    let sk: Vec<f64> = (0..k).map(|j| s[j]).collect();
    let mut vt = vec![0f64; k * n];
    for j in 0..k {
        for c in 0..n {
            vt[j * n + c] = v[(c, j)];
        }
    }
    Ok((uk, sk, vt))
}

fn matrix_arg(c: &CallCtx<'_>, a: TensorHandle, what: &str) -> HResult<(Vec<f32>, usize, usize)> {
    let t = c.tensor(a)?;
    let &[m, n] = t.dims() else {
        return Err(HostError::Invalid(format!(
            "{what} needs a 2-D tensor, got shape {:?}",
            t.dims()
        )));
    };
    Ok((to_f32_vec(t)?, m, n))
}

fn to_f32_tensor(v: &[f64], dims: &[usize], device: &Device) -> candle_core::Result<Tensor> {
    let v: Vec<f32> = v.iter().map(|x| *x as f32).collect();
    Tensor::from_vec(v, dims, device)
}

unsafe extern "C" fn h_svd(
    ctx: *mut c_void,
    a: TensorHandle,
    k: usize,
    out_u: *mut TensorHandle,
    out_s: *mut TensorHandle,
    out_vt: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        let (data, m, n) = matrix_arg(c, a, "svd")?;
        let (u, s, vt) = truncated_svd(&data, m, n, k).map_err(HostError::Failed)?;
        let k = s.len();
        let dev = c.device;
        if !out_u.is_null() {
            let t = to_f32_tensor(&u, &[m, k], dev)?;
            c.put(t, out_u)?;
        }
        if !out_s.is_null() {
            let t = to_f32_tensor(&s, &[k], dev)?;
            c.put(t, out_s)?;
        }
        if !out_vt.is_null() {
            let t = to_f32_tensor(&vt, &[k, n], dev)?;
            c.put(t, out_vt)?;
        }
        Ok(())
    })
}

/// Best rank-k approximation of a row-major m×n matrix, computed in f64.
pub fn low_rank_approx(data: &[f32], m: usize, n: usize, k: usize) -> Result<Vec<f64>, String> {
    let mut r = vec![0f64; m * n];
    if k == 0 {
        return Ok(r);
    }
    let (u, s, vt) = truncated_svd(data, m, n, k)?;
    let k = s.len();
    for i in 0..m {
        for j in 0..k {
            let w = u[i * k + j] * s[j];
            if w == 0.0 {
                continue;
            }
            let row = &vt[j * n..(j + 1) * n];
            for (o, v) in r[i * n..(i + 1) * n].iter_mut().zip(row) {
                *o += w * v;
            }
        }
    }
    Ok(r)
}

unsafe extern "C" fn h_low_rank(ctx: *mut c_void, a: TensorHandle, k: usize, out: *mut TensorHandle) -> Status {
    with_ctx(ctx, |c| {
        let (data, m, n) = matrix_arg(c, a, "low_rank")?;
        let r = low_rank_approx(&data, m, n, k).map_err(HostError::Failed)?;
        let t = to_f32_tensor(&r, &[m, n], c.device)?;
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

/// `|a| ≥ threshold ? a : 0`.
pub fn trim_abs_cpu(a: &[f32], threshold: f32) -> Vec<f32> {
    a.iter().map(|x| if x.abs() >= threshold { *x } else { 0.0 }).collect()
}

unsafe extern "C" fn h_trim_abs(ctx: *mut c_void, a: TensorHandle, threshold: f64, out: *mut TensorHandle) -> Status {
    with_ctx(ctx, |c| {
        let a = c.tensor(a)?;
        let thr = threshold as f32;
        let t = match with_cpu_f32(a, |s| trim_abs_cpu(s, thr)) {
            Some(v) => Tensor::from_vec(v, a.shape(), c.device)?,
            None => a.abs()?.ge(thr)?.where_cond(a, &a.zeros_like()?)?,
        };
        c.put(t, out)
    })
}

/// Sign in {−1, 0, 1}, branch-free.
fn sign_b(x: f32) -> f32 {
    (i32::from(x > 0.0) - i32::from(x < 0.0)) as f32
}

/// Elements per block of the fused loops: small enough that a block of every input stays in
/// cache while the inputs are swept one after another.
const FUSED_BLOCK: usize = 4096;

/// Elected sign per element: of the summed values (mass) or of the summed signs (count).
/// Sums run over the tensors in order, as `Σ_t` would.
pub fn elect_sign_cpu(ts: &[&[f32]], rule: abi::ElectRule) -> Vec<f32> {
    let n = ts.first().map_or(0, |t| t.len());
    let mut total = vec![0f32; n];
    for (bi, block) in total.chunks_mut(FUSED_BLOCK).enumerate() {
        let from = bi * FUSED_BLOCK;
        for t in ts {
            let src = &t[from..from + block.len()];
            if rule == abi::ELECT_COUNT {
                block.iter_mut().zip(src).for_each(|(o, v)| *o += sign_b(*v));
            } else {
                block.iter_mut().zip(src).for_each(|(o, v)| *o += *v);
            }
        }
        block.iter_mut().for_each(|o| *o = sign_b(*o));
    }
    total
}

/// Disjoint aggregation of the entries agreeing with `sign` (zeros never agree), branch-free
/// and blocked so it vectorises.
pub fn disjoint_merge_cpu(ts: &[&[f32]], sign: &[f32], op: abi::DisjointOp) -> Vec<f32> {
    let n = sign.len();
    let mut out = vec![0f32; n];
    let mut count = vec![0f32; FUSED_BLOCK];
    let mut max_abs = vec![0f32; FUSED_BLOCK];
    for (bi, block) in out.chunks_mut(FUSED_BLOCK).enumerate() {
        let from = bi * FUSED_BLOCK;
        let len = block.len();
        let s = &sign[from..from + len];
        let (count, max_abs) = (&mut count[..len], &mut max_abs[..len]);
        count.fill(0.0);
        max_abs.fill(0.0);
        for t in ts {
            let src = &t[from..from + len];
            for i in 0..len {
                let (v, si) = (src[i], s[i]);
                // `v·s > 0` would underflow for tiny values; compare the signs instead.
                let agree = (v > 0.0 && si > 0.0) | (v < 0.0 && si < 0.0);
                let kept = if agree { v } else { 0.0 };
                block[i] += kept;
                count[i] += f32::from(u8::from(agree));
                max_abs[i] = max_abs[i].max(kept.abs());
            }
        }
        match op {
            abi::DISJOINT_SUM => {}
            abi::DISJOINT_MEAN => block.iter_mut().zip(count.iter()).for_each(|(o, c)| *o /= c.max(1.0)),
            _ => block
                .iter_mut()
                .zip(max_abs.iter().zip(s))
                .for_each(|(o, (m, si))| *o = m * sign_b(*si)),
        }
    }
    out
}

fn handles_arg<'c>(c: &'c CallCtx<'_>, ts: *const TensorHandle, n: usize) -> HResult<Vec<&'c Tensor>> {
    if n == 0 {
        return Err(HostError::Invalid("no tensors given".into()));
    }
    let handles = slice_arg(ts, n, "tensor array")?;
    let tensors: Vec<&Tensor> = handles.iter().map(|h| c.tensor(*h)).collect::<HResult<_>>()?;
    let shape = tensors[0].shape();
    if let Some(bad) = tensors.iter().find(|t| t.shape() != shape) {
        return Err(HostError::Invalid(format!(
            "shapes differ ({shape:?} vs {:?})",
            bad.shape()
        )));
    }
    Ok(tensors)
}

unsafe extern "C" fn h_elect_sign(
    ctx: *mut c_void,
    ts: *const TensorHandle,
    n: usize,
    rule: abi::ElectRule,
    out: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        if rule != abi::ELECT_MASS && rule != abi::ELECT_COUNT {
            return Err(HostError::Unsupported(format!("unknown sign-election rule {rule}")));
        }
        let tensors = handles_arg(c, ts, n)?;
        let shape = tensors[0].shape().clone();
        let t = match with_cpu_slices(&tensors, |sl| elect_sign_cpu(sl, rule)) {
            Some(v) => Tensor::from_vec(v, shape, c.device)?,
            None => {
                let owned: Vec<Tensor> = tensors.iter().map(|t| (*t).clone()).collect();
                let stacked = Tensor::stack(&owned, 0)?;
                let summed = if rule == abi::ELECT_COUNT {
                    stacked.sign()?.sum(0)?
                } else {
                    stacked.sum(0)?
                };
                summed.sign()?
            }
        };
        c.put(t, out)
    })
}

unsafe extern "C" fn h_disjoint_merge(
    ctx: *mut c_void,
    ts: *const TensorHandle,
    n: usize,
    sign: TensorHandle,
    op: abi::DisjointOp,
    out: *mut TensorHandle,
) -> Status {
    with_ctx(ctx, |c| {
        if !matches!(op, abi::DISJOINT_SUM | abi::DISJOINT_MEAN | abi::DISJOINT_MAX) {
            return Err(HostError::Unsupported(format!("unknown disjoint aggregation {op}")));
        }
        let tensors = handles_arg(c, ts, n)?;
        let sign = c.tensor(sign)?;
        if sign.shape() != tensors[0].shape() {
            return Err(HostError::Invalid(format!(
                "disjoint_merge: sign has shape {:?}, tensors {:?}",
                sign.shape(),
                tensors[0].shape()
            )));
        }
        let shape = sign.shape().clone();
        let mut all = tensors.clone();
        all.push(sign);
        let cpu = with_cpu_slices(&all, |sl| {
            let (sign, ts) = sl.split_last().map_or((&[][..], &[][..]), |(s, t)| (*s, t));
            disjoint_merge_cpu(ts, sign, op)
        });
        let t = match cpu {
            Some(v) => Tensor::from_vec(v, shape, c.device)?,
            None => {
                let sign = &sign.sign()?;
                let nonzero_sign = sign.ne(0f32)?.to_dtype(DType::F32)?;
                let mut sum = sign.zeros_like()?;
                let mut count = sign.zeros_like()?;
                let mut max_abs = sign.zeros_like()?;
                for t in &tensors {
                    let agree = (t.sign()?.eq(sign)?.to_dtype(DType::F32)? * &nonzero_sign)?;
                    let kept = (&agree * *t)?;
                    max_abs = max_abs.maximum(&kept.abs()?)?;
                    sum = (sum + kept)?;
                    count = (count + agree)?;
                }
                match op {
                    abi::DISJOINT_SUM => sum,
                    abi::DISJOINT_MEAN => (sum / count.maximum(1f32)?)?,
                    _ => (max_abs * sign)?,
                }
            }
        };
        c.put(t, out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_ops_reproduce_the_reference_golden_vectors() {
        // seeds-002-004 §4.6: trimmed rows at K = 20 %, elected signs, and dis-mean/sum/max.
        let t1 = [0.0f32, 0.0, 0.0, 0.0, 0.9, -0.7, 0.0, 0.0, 0.0, 0.6];
        let t2 = [-0.6f32, 0.0, 0.0, 0.0, -0.8, 0.7, 0.0, 0.0, 0.0, 0.0];
        let t3 = [0.4f32, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.55];
        let ts: [&[f32]; 3] = [&t1, &t2, &t3];
        let raw = elect_sign_cpu(&ts, abi::ELECT_MASS);
        assert_eq!(raw, vec![-1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
        // The reference replaces zero signs by the global majority (+1).
        let elected: Vec<f32> = raw.iter().map(|s| if *s == 0.0 { 1.0 } else { *s }).collect();
        let mean = disjoint_merge_cpu(&ts, &elected, abi::DISJOINT_MEAN);
        let sum = disjoint_merge_cpu(&ts, &elected, abi::DISJOINT_SUM);
        let max = disjoint_merge_cpu(&ts, &elected, abi::DISJOINT_MAX);
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
        assert!(
            close(&mean, &[-0.6, 0.0, 0.0, 0.0, 0.9, 0.7, 0.0, 0.0, 0.5, 0.575]),
            "{mean:?}"
        );
        assert!(
            close(&sum, &[-0.6, 0.0, 0.0, 0.0, 0.9, 0.7, 0.0, 0.0, 0.5, 1.15]),
            "{sum:?}"
        );
        assert!(
            close(&max, &[-0.6, 0.0, 0.0, 0.0, 0.9, 0.7, 0.0, 0.0, 0.5, 0.6]),
            "{max:?}"
        );
        // Count election: index 4 has one + and one −, so its sign is 0.
        assert_eq!(elect_sign_cpu(&ts, abi::ELECT_COUNT)[4], 0.0);
        let raw_t1 = [0.5f32, -0.2, 0.1, 0.0, 0.9, -0.7, 0.05, 0.3, -0.4, 0.6];
        assert_eq!(trim_abs_cpu(&raw_t1, 0.6), t1.to_vec());
    }

    #[test]
    fn cpu_and_candle_paths_agree() {
        // The candle fallback (used on GPUs) must match the CPU loops: run both on the CPU.
        let dev = Device::Cpu;
        let a = Tensor::new(&[0.5f32, -0.2, 0.0, 0.9, -0.7, 0.3], &dev).unwrap();
        let b = Tensor::new(&[-0.6f32, 0.25, 0.1, -0.8, 0.7, 0.3], &dev).unwrap();
        let s = Tensor::new(&[-1f32, 1.0, 1.0, 0.0, -1.0, 1.0], &dev).unwrap();
        let nonzero = s.ne(0f32).unwrap().to_dtype(DType::F32).unwrap();
        let (va, vb, vs) = (
            a.to_vec1::<f32>().unwrap(),
            b.to_vec1::<f32>().unwrap(),
            s.to_vec1::<f32>().unwrap(),
        );
        let cpu = disjoint_merge_cpu(&[&va, &vb], &vs, abi::DISJOINT_MEAN);
        let mut sum = s.zeros_like().unwrap();
        let mut count = s.zeros_like().unwrap();
        for t in [&a, &b] {
            let agree = (t.sign().unwrap().eq(&s).unwrap().to_dtype(DType::F32).unwrap() * &nonzero).unwrap();
            sum = (sum + (&agree * t).unwrap()).unwrap();
            count = (count + agree).unwrap();
        }
        let gpu_path = (sum / count.maximum(1f32).unwrap()).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(cpu, gpu_path);
    }

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
    fn low_rank_golden_cart_gc1() {
        // τ̄_1 = [[2,2],[1,-1]] has σ = 2√2 (v = (1,1)/√2) and √2: rank 1 keeps [[2,2],[0,0]].
        let r = low_rank_approx(&[2.0, 2.0, 1.0, -1.0], 2, 2, 1).unwrap();
        for (a, b) in r.iter().zip([2.0, 2.0, 0.0, 0.0]) {
            assert!((a - b).abs() < 1e-9, "{r:?}");
        }
        let full = low_rank_approx(&[2.0, 2.0, 1.0, -1.0], 2, 2, 5).unwrap();
        for (a, b) in full.iter().zip([2.0, 2.0, 1.0, -1.0]) {
            assert!((a - b).abs() < 1e-9);
        }
        let (_, s, _) = truncated_svd(&[2.0, 2.0, 1.0, -1.0], 2, 2, 2).unwrap();
        assert!((s[0] - 8f64.sqrt()).abs() < 1e-9 && (s[1] - 2f64.sqrt()).abs() < 1e-9);
    }

    #[test]
    fn weighted_sum_blocks_match_naive() {
        let a: Vec<f32> = (0..10_000).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..10_000).map(|i| -(i as f32) * 0.5).collect();
        let r = weighted_sum_cpu(&[&a, &b], &[0.25, 2.0]);
        for i in [0usize, 4095, 4096, 9999] {
            assert_eq!(r[i], 0.25 * a[i] + 2.0 * b[i]);
        }
    }
}
