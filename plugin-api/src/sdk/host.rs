//! [`Host`]: the safe view of the host's table a method calls during one call, with the host
//! extensions (fused operations, worker threads) behind the same methods.

use super::{Error, Result, Tensor, catch_job};
use crate::abi::{self, HostApiV1, Status, Str, TensorHandle};
use std::borrow::Cow;
use std::ffi::c_void;
use std::ops::Range;
use std::sync::{Mutex, PoisonError};

/// Safe view of the host's table for the duration of one call.
#[derive(Clone, Copy)]
pub struct Host<'a> {
    api: &'a HostApiV1,
}

pub(crate) fn check(status: Status) -> Result<()> {
    if status == abi::STATUS_OK {
        Ok(())
    } else if status == abi::STATUS_CANCELLED {
        Err(Error::Cancelled)
    } else {
        Err(Error::Host(status))
    }
}

macro_rules! host_out {
    ($self:ident, $f:ident ( $($arg:expr),* )) => {{
        let mut out: TensorHandle = 0;
        // SAFETY: the table comes from the host for this call; `out` is a valid pointer.
        check(unsafe { ($self.api.$f)($self.api.ctx, $($arg,)* &mut out) })?;
        Ok(Tensor(out))
    }};
}

impl<'a> Host<'a> {
    /// Wraps a host table.
    ///
    /// # Safety
    /// `api` must be the table the host passed to the current call.
    pub unsafe fn from_raw(api: *const HostApiV1) -> Option<Host<'a>> {
        // SAFETY: guaranteed by the caller; null is rejected.
        unsafe { api.as_ref() }.map(|api| Host { api })
    }

    /// The raw table, for calls this SDK does not wrap (and for fixtures that call the ABI
    /// directly).
    pub fn api(&self) -> &'a HostApiV1 {
        self.api
    }

    /// Logs a message at the given `abi::LOG_*` level.
    pub fn log(&self, level: abi::LogLevel, message: &str) {
        // SAFETY: valid table and borrowed string for the call.
        unsafe { (self.api.log)(self.api.ctx, level, Str::new(message)) }
    }

    /// Logs at info level.
    pub fn info(&self, message: &str) {
        self.log(abi::LOG_INFO, message);
    }

    /// Logs at warning level.
    pub fn warn(&self, message: &str) {
        self.log(abi::LOG_WARN, message);
    }

    /// Reports progress inside a long call.
    pub fn report_progress(&self, fraction: f64) {
        // SAFETY: valid table.
        unsafe { (self.api.report_progress)(self.api.ctx, fraction) }
    }

    /// `Err(Error::Cancelled)` when the user cancelled the job.
    pub fn check_cancelled(&self) -> Result<()> {
        // SAFETY: valid table.
        if unsafe { (self.api.is_cancelled)(self.api.ctx) } != 0 {
            Err(Error::Cancelled)
        } else {
            Ok(())
        }
    }

    pub(crate) fn set_error(&self, message: &str) {
        // SAFETY: valid table; the host copies the text.
        unsafe { (self.api.set_error)(self.api.ctx, Str::new(message)) }
    }

    /// Shape of a tensor.
    pub fn shape(&self, t: Tensor) -> Result<Vec<usize>> {
        let mut dims = [0usize; 8];
        let mut rank = 0usize;
        // SAFETY: valid table; `dims` has room for 8 entries.
        check(unsafe { (self.api.shape)(self.api.ctx, t.0, dims.as_mut_ptr(), dims.len(), &mut rank) })?;
        if rank > dims.len() {
            return Err(Error::Message(format!(
                "tensor rank {rank} exceeds the SDK's limit of 8"
            )));
        }
        Ok(dims[..rank].to_vec())
    }

    /// Number of elements.
    pub fn numel(&self, t: Tensor) -> Result<usize> {
        let mut n = 0usize;
        // SAFETY: valid table and out pointer.
        check(unsafe { (self.api.numel)(self.api.ctx, t.0, &mut n) })?;
        Ok(n)
    }

    /// Copies a tensor's values out, row-major.
    pub fn read_f32(&self, t: Tensor) -> Result<Vec<f32>> {
        let n = self.numel(t)?;
        let mut v: Vec<f32> = Vec::with_capacity(n);
        // SAFETY: `v` has capacity for `n` values; on success the host wrote all `n` of them,
        // so they are initialised before `set_len` (no zero-fill needed first).
        unsafe {
            check((self.api.read_f32)(self.api.ctx, t.0, v.as_mut_ptr(), n))?;
            v.set_len(n);
        }
        Ok(v)
    }

    /// A tensor's values, row-major: lent in place by the host (extension
    /// `mergescope.host.views.v1`, ABI 1.4: no copy; readable until the current call returns,
    /// also after [`Host::release`]), or copied out with [`Host::read_f32`] where the host cannot
    /// lend them (an older host, a tensor on a GPU).
    pub fn view_f32(&self, t: Tensor) -> Result<Cow<'a, [f32]>> {
        if let Some(ext) = self.extension::<abi::HostViewsV1>(abi::HOST_EXT_VIEWS_V1) {
            let (mut data, mut len) = (std::ptr::null(), 0usize);
            // SAFETY: the extension's function, called with this call's context and writable
            // outputs.
            let status = unsafe { (ext.view_f32)(self.api.ctx, t.0, &mut data, &mut len) };
            if status == abi::STATUS_OK && !data.is_null() {
                // SAFETY: the host lends `len` f32 values at `data` until the current call
                // returns, which `'a` (the call's table) does not outlive.
                return Ok(Cow::Borrowed(unsafe { std::slice::from_raw_parts(data, len) }));
            }
            if status != abi::STATUS_UNSUPPORTED {
                check(status)?;
            }
        }
        Ok(Cow::Owned(self.read_f32(t)?))
    }

    /// Creates a tensor from row-major values.
    pub fn from_f32(&self, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        host_out!(self, from_f32(data.as_ptr(), data.len(), shape.as_ptr(), shape.len()))
    }

    /// A tensor of `like`'s shape filled with `value`.
    pub fn full_like(&self, like: Tensor, value: f64) -> Result<Tensor> {
        host_out!(self, full_like(like.0, value))
    }

    /// Elementwise binary operation (`abi::BINARY_*`).
    pub fn binary(&self, op: abi::BinaryOp, a: Tensor, b: Tensor) -> Result<Tensor> {
        host_out!(self, binary(op, a.0, b.0))
    }

    /// a + b
    pub fn add(&self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.binary(abi::BINARY_ADD, a, b)
    }

    /// a − b
    pub fn sub(&self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.binary(abi::BINARY_SUB, a, b)
    }

    /// a · b
    pub fn mul(&self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.binary(abi::BINARY_MUL, a, b)
    }

    /// a / b
    pub fn div(&self, a: Tensor, b: Tensor) -> Result<Tensor> {
        self.binary(abi::BINARY_DIV, a, b)
    }

    /// Elementwise unary operation (`abi::UNARY_*`).
    pub fn unary(&self, op: abi::UnaryOp, a: Tensor) -> Result<Tensor> {
        host_out!(self, unary(op, a.0))
    }

    /// |a|
    pub fn abs(&self, a: Tensor) -> Result<Tensor> {
        self.unary(abi::UNARY_ABS, a)
    }

    /// sign(a)
    pub fn sign(&self, a: Tensor) -> Result<Tensor> {
        self.unary(abi::UNARY_SIGN, a)
    }

    /// a · mul + add
    pub fn affine(&self, a: Tensor, mul: f64, add: f64) -> Result<Tensor> {
        host_out!(self, affine(a.0, mul, add))
    }

    /// a · s
    pub fn scale(&self, a: Tensor, s: f64) -> Result<Tensor> {
        self.affine(a, s, 0.0)
    }

    /// 0/1 mask of `a op scalar` (`abi::BINARY_GT`…`abi::BINARY_EQ`).
    pub fn compare_scalar(&self, op: abi::BinaryOp, a: Tensor, scalar: f64) -> Result<Tensor> {
        host_out!(self, compare_scalar(op, a.0, scalar))
    }

    /// `mask ≠ 0 ? on_true : on_false`
    pub fn select(&self, mask: Tensor, on_true: Tensor, on_false: Tensor) -> Result<Tensor> {
        host_out!(self, select(mask.0, on_true.0, on_false.0))
    }

    /// Whole-tensor reduction (`abi::REDUCE_*`).
    pub fn reduce(&self, op: abi::ReduceOp, a: Tensor) -> Result<f64> {
        let mut v = 0f64;
        // SAFETY: valid table and out pointer.
        check(unsafe { (self.api.reduce)(self.api.ctx, op, a.0, &mut v) })?;
        Ok(v)
    }

    /// Σ a·b
    pub fn dot(&self, a: Tensor, b: Tensor) -> Result<f64> {
        let mut v = 0f64;
        // SAFETY: valid table and out pointer.
        check(unsafe { (self.api.dot)(self.api.ctx, a.0, b.0, &mut v) })?;
        Ok(v)
    }

    /// k-th largest |a| (1-based), by linear-time selection.
    pub fn kth_largest_abs(&self, a: Tensor, k: usize) -> Result<f64> {
        let mut v = 0f64;
        // SAFETY: valid table and out pointer.
        check(unsafe { (self.api.kth_largest_abs)(self.api.ctx, a.0, k, &mut v) })?;
        Ok(v)
    }

    /// Σ_i w_i · t_i in one pass (`weights` None = all ones).
    pub fn weighted_sum(&self, ts: &[Tensor], weights: Option<&[f64]>) -> Result<Tensor> {
        if let Some(w) = weights
            && w.len() != ts.len()
        {
            return Err(Error::Message(format!(
                "weighted_sum: {} weights for {} tensors",
                w.len(),
                ts.len()
            )));
        }
        let handles: Vec<TensorHandle> = ts.iter().map(|t| t.0).collect();
        let wp = weights.map_or(std::ptr::null(), <[f64]>::as_ptr);
        host_out!(self, weighted_sum(handles.as_ptr(), wp, handles.len()))
    }

    /// Elementwise reduction over tensors (`abi::STACK_*`).
    pub fn reduce_stack(&self, op: abi::StackOp, ts: &[Tensor]) -> Result<Tensor> {
        let handles: Vec<TensorHandle> = ts.iter().map(|t| t.0).collect();
        host_out!(self, reduce_stack(op, handles.as_ptr(), handles.len()))
    }

    /// Matrix product.
    pub fn matmul(&self, a: Tensor, b: Tensor) -> Result<Tensor> {
        host_out!(self, matmul(a.0, b.0))
    }

    /// Transpose of a 2-D tensor.
    pub fn transpose(&self, a: Tensor) -> Result<Tensor> {
        host_out!(self, transpose(a.0))
    }

    /// New shape, same data.
    pub fn reshape(&self, a: Tensor, shape: &[usize]) -> Result<Tensor> {
        host_out!(self, reshape(a.0, shape.as_ptr(), shape.len()))
    }

    /// Frees a tensor before the call returns (the handle is invalid afterwards).
    pub fn release(&self, t: Tensor) -> Result<()> {
        // SAFETY: valid table.
        check(unsafe { (self.api.release)(self.api.ctx, t.0) })
    }

    /// The host extension `id` as its table type `T`, when the host has it and its table is
    /// at least as large as `T` (tables only grow, so a larger one is a newer minor of it).
    pub fn extension<T>(&self, id: &str) -> Option<&'a T> {
        // SAFETY: valid table; the host copies nothing and returns a static table or null.
        let ptr = unsafe { (self.api.get_extension)(self.api.ctx, Str::new(id)) }.cast::<T>();
        // SAFETY: every extension table starts with its `struct_size`; the host's tables are
        // static, so they outlive `'a`.
        let size = unsafe { ptr.cast::<usize>().as_ref() }.copied()?;
        // SAFETY: non-null (read above) and at least `size_of::<T>()` bytes of a `T`.
        (size >= std::mem::size_of::<T>()).then(|| unsafe { &*ptr })
    }

    /// A host extension this SDK relies on, or an error naming it.
    fn required<T>(&self, id: &str) -> Result<&'a T> {
        self.extension(id).ok_or_else(|| {
            Error::Message(format!(
                "the host does not offer the extension '{id}' (ABI {}.{} or newer has it); run the plugin in a \
                 newer mergescope",
                abi::ABI_MAJOR,
                abi::ABI_MINOR
            ))
        })
    }

    /// Seeded 0/1 mask with P(1) = `keep_probability`, stable across devices and chunking
    /// (extension `mergescope.host.random.v1`).
    pub fn bernoulli_mask(&self, like: Tensor, keep_probability: f64, seed: u64, offset: u64) -> Result<Tensor> {
        let ext = self.required::<abi::HostRandomV1>(abi::HOST_EXT_RANDOM_V1)?;
        // SAFETY: the extension's function, called with this call's context.
        self.out(|ctx, out| unsafe { (ext.bernoulli_mask)(ctx, like.0, keep_probability, seed, offset, out) })
    }

    /// Seeded 0/1 mask of `probabilities`' shape with P(element j = 1) = `probabilities[j]`:
    /// element j is kept iff the draw [`Host::bernoulli_mask`] makes for element `offset + j`
    /// under `seed` is below its probability, so a tensor filled with p gives exactly
    /// `bernoulli_mask(like, p, seed, offset)` (extension `mergescope.host.random.v2`, ABI 1.3).
    /// Probabilities must be finite and in [0, 1]; the host names the first one that is not.
    pub fn bernoulli_mask_p(&self, probabilities: Tensor, seed: u64, offset: u64) -> Result<Tensor> {
        let ext = self.required::<abi::HostRandomV2>(abi::HOST_EXT_RANDOM_V2)?;
        // SAFETY: the extension's function, called with this call's context.
        self.out(|ctx, out| unsafe { (ext.bernoulli_mask_p)(ctx, probabilities.0, seed, offset, out) })
    }

    /// Truncated SVD: (U m×k, S k, Vᵀ k×n) (extension `mergescope.host.linalg.v1`).
    pub fn svd(&self, a: Tensor, k: usize) -> Result<(Tensor, Tensor, Tensor)> {
        let ext = self.required::<abi::HostLinalgV1>(abi::HOST_EXT_LINALG_V1)?;
        let (mut u, mut s, mut vt) = (0, 0, 0);
        // SAFETY: the extension's function, with this call's context and valid out pointers.
        check(unsafe { (ext.svd)(self.api.ctx, a.0, k, &mut u, &mut s, &mut vt) })?;
        Ok((Tensor(u), Tensor(s), Tensor(vt)))
    }

    /// Best rank-k approximation of a 2-D tensor (extension `mergescope.host.linalg.v1`).
    pub fn low_rank(&self, a: Tensor, k: usize) -> Result<Tensor> {
        let ext = self.required::<abi::HostLinalgV1>(abi::HOST_EXT_LINALG_V1)?;
        // SAFETY: the extension's function, called with this call's context.
        self.out(|ctx, out| unsafe { (ext.low_rank)(ctx, a.0, k, out) })
    }

    /// `|a| ≥ threshold ? a : 0` (extension `mergescope.host.sign-consensus.v1`).
    pub fn trim_abs(&self, a: Tensor, threshold: f64) -> Result<Tensor> {
        let ext = self.required::<abi::HostSignConsensusV1>(abi::HOST_EXT_SIGN_CONSENSUS_V1)?;
        // SAFETY: the extension's function, called with this call's context.
        self.out(|ctx, out| unsafe { (ext.trim_abs)(ctx, a.0, threshold, out) })
    }

    /// Elected sign per element (`abi::ELECT_MASS` or `abi::ELECT_COUNT`; extension
    /// `mergescope.host.sign-consensus.v1`).
    pub fn elect_sign(&self, ts: &[Tensor], rule: abi::ElectRule) -> Result<Tensor> {
        let ext = self.required::<abi::HostSignConsensusV1>(abi::HOST_EXT_SIGN_CONSENSUS_V1)?;
        let handles: Vec<TensorHandle> = ts.iter().map(|t| t.0).collect();
        // SAFETY: the extension's function; `handles` lives through the call.
        self.out(|ctx, out| unsafe { (ext.elect_sign)(ctx, handles.as_ptr(), handles.len(), rule, out) })
    }

    /// Disjoint aggregation of the entries agreeing with `sign` (`abi::DISJOINT_*`; extension
    /// `mergescope.host.sign-consensus.v1`).
    pub fn disjoint_merge(&self, ts: &[Tensor], sign: Tensor, op: abi::DisjointOp) -> Result<Tensor> {
        let ext = self.required::<abi::HostSignConsensusV1>(abi::HOST_EXT_SIGN_CONSENSUS_V1)?;
        let handles: Vec<TensorHandle> = ts.iter().map(|t| t.0).collect();
        // SAFETY: the extension's function; `handles` lives through the call.
        self.out(|ctx, out| unsafe { (ext.disjoint_merge)(ctx, handles.as_ptr(), handles.len(), sign.0, op, out) })
    }

    /// Calls a host function that writes one tensor handle.
    fn out(&self, f: impl FnOnce(*mut c_void, *mut TensorHandle) -> Status) -> Result<Tensor> {
        let mut out: TensorHandle = 0;
        check(f(self.api.ctx, &mut out))?;
        Ok(Tensor(out))
    }

    /// How many threads [`Host::parallel_for`] runs on (1 when the host lends none).
    pub fn threads(&self) -> usize {
        self.extension::<abi::HostParallelV1>(abi::HOST_EXT_PARALLEL_V1)
            // SAFETY: the extension's function, called with this call's context.
            .map_or(1, |ext| unsafe { (ext.threads)(self.api.ctx) }.max(1))
    }

    /// Runs `job(i)` for every i in `0..n` on the host's worker threads (extension
    /// `mergescope.host.parallel.v1`; in order on this thread when the host lends none) and
    /// returns the first error. Jobs must not call the host: copy what they need first.
    pub fn parallel_for(&self, n: usize, job: impl Fn(usize) -> Result<()> + Sync) -> Result<()> {
        let Some(ext) = self.extension::<abi::HostParallelV1>(abi::HOST_EXT_PARALLEL_V1) else {
            return (0..n).try_for_each(job);
        };
        let shared = Jobs {
            job: &job,
            error: Mutex::new(None),
        };
        let user = std::ptr::from_ref(&shared).cast_mut().cast::<c_void>();
        // SAFETY: the extension's function; `shared` outlives the call, which returns only when
        // every job has returned.
        let status = unsafe { (ext.parallel_for)(self.api.ctx, n, run_job, user) };
        let error = shared.error.into_inner().unwrap_or_else(PoisonError::into_inner);
        match error {
            Some(e) => Err(e),
            None => check(status),
        }
    }

    /// Splits `0..len` into contiguous ranges of at least `min_len` elements (one per host
    /// thread at most), runs `f` on each with [`Host::parallel_for`] and returns the results in
    /// range order.
    pub fn map_ranges<R: Send>(
        &self,
        len: usize,
        min_len: usize,
        f: impl Fn(Range<usize>) -> R + Sync,
    ) -> Result<Vec<R>> {
        let parts = self.threads().min(len / min_len.max(1)).max(1);
        let step = len.div_ceil(parts).max(1);
        let slots: Vec<Mutex<Option<R>>> = (0..parts).map(|_| Mutex::new(None)).collect();
        self.parallel_for(parts, |i| {
            let value = f((i * step).min(len)..((i + 1) * step).min(len));
            *slots[i].lock().unwrap_or_else(PoisonError::into_inner) = Some(value);
            Ok(())
        })?;
        slots
            .into_iter()
            .map(|s| {
                s.into_inner()
                    .unwrap_or_else(PoisonError::into_inner)
                    .ok_or_else(|| Error::Message("a parallel job of the plugin did not run".into()))
            })
            .collect()
    }
}

/// A plugin's job and the first error of its runs, shared with the host's threads.
struct Jobs<'f> {
    job: &'f (dyn Fn(usize) -> Result<()> + Sync),
    error: Mutex<Option<Error>>,
}

/// The `ParallelJob` the SDK hands the host: runs one index of [`Jobs`], keeps its error (or
/// panic message) for the caller, and never unwinds.
unsafe extern "C" fn run_job(user: *mut c_void, index: usize) -> Status {
    // SAFETY: `user` is the `Jobs` that `parallel_for` passed, alive for the whole call.
    let jobs = unsafe { &*user.cast::<Jobs<'_>>() };
    let (status, error) = match catch_job(|| (jobs.job)(index)) {
        Ok(()) => (abi::STATUS_OK, None),
        Err((status, e)) => (status, Some(e)),
    };
    if let Some(e) = error {
        let mut first = jobs.error.lock().unwrap_or_else(PoisonError::into_inner);
        first.get_or_insert(e);
    }
    status
}
