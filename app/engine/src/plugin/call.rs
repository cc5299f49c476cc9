//! One call into a plugin, as the host functions see it: [`CallCtx`] holds the call's tensor
//! arena (handles index it; it is dropped when the call returns, except the tensor the plugin
//! returns), its error text, cancel flag, log and thread allowance. [`with_ctx`] runs a host
//! function's body so that nothing unwinds into the plugin. The core table (`host_api`) and the
//! extensions (`host_ext`) are built on these.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use mergescope_plugin_api::abi::{self, Status, TensorHandle};
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::AtomicBool;

/// Receives log lines of a plugin: (level, message).
pub type LogSink<'a> = &'a (dyn Fn(abi::LogLevel, &str) + Sync);

/// State of one call into a plugin.
pub struct CallCtx<'a> {
    device: &'a Device,
    pub(crate) tensors: Vec<Option<Tensor>>,
    /// The error text the plugin or a host function set during the call.
    pub error: Option<String>,
    cancel: &'a AtomicBool,
    log: LogSink<'a>,
    /// Last progress fraction the plugin reported inside the call.
    pub progress: f64,
    /// Threads the parallel extension lends the plugin (at least 1).
    threads: usize,
    /// Tensors whose values are lent to the plugin (`views` extension): kept until the call
    /// returns, even when their handles are released.
    lent: Vec<Tensor>,
}

pub(crate) enum HostError {
    Invalid(String),
    Failed(String),
    Unsupported(String),
}

impl From<candle_core::Error> for HostError {
    fn from(e: candle_core::Error) -> Self {
        HostError::Failed(e.to_string())
    }
}

pub(crate) type HResult<T> = Result<T, HostError>;

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
            threads: 1,
            lent: Vec::new(),
        }
    }

    /// Sets how many threads the parallel extension lends the plugin: `0` means one per
    /// available core (the executor passes its own worker count, so `--threads` holds for the
    /// plugin's own parallel work too).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = match threads {
            0 => crate::sys::available_cores(),
            n => n,
        };
        self
    }

    /// Threads the parallel extension lends the plugin.
    pub fn threads(&self) -> usize {
        self.threads
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

    /// Keeps `t`'s storage alive until the call returns (its values are lent to the plugin).
    pub(crate) fn keep_alive(&mut self, t: Tensor) {
        self.lent.push(t);
    }

    /// Records an error for the plugin's current call.
    pub fn fail(&mut self, message: String) {
        self.error = Some(message);
    }

    /// The device tensors live on.
    pub fn device(&self) -> &'a Device {
        self.device
    }

    /// Where the plugin's log lines go.
    pub(crate) fn log(&self) -> LogSink<'a> {
        self.log
    }

    /// The job's cancel flag.
    pub fn cancel_flag(&self) -> &AtomicBool {
        self.cancel
    }

    pub(crate) fn tensor(&self, h: TensorHandle) -> HResult<&Tensor> {
        self.get(h).ok_or_else(|| {
            HostError::Invalid(format!(
                "unknown or released tensor handle {h} (handles are valid only during the call that made them)"
            ))
        })
    }

    pub(crate) fn put(&mut self, t: Tensor, out: *mut TensorHandle) -> HResult<()> {
        if out.is_null() {
            return Err(HostError::Invalid("null output pointer".into()));
        }
        let h = self.insert(t);
        // SAFETY: checked for null; the plugin passes a writable pointer.
        unsafe { *out = h };
        Ok(())
    }
}

/// Runs a host function body: resolves the context, catches panics, records errors.
pub(crate) fn with_ctx(ctx: *mut c_void, f: impl FnOnce(&mut CallCtx<'_>) -> HResult<()>) -> Status {
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

pub(crate) fn slice_arg<'s, T>(ptr: *const T, len: usize, what: &str) -> HResult<&'s [T]> {
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
