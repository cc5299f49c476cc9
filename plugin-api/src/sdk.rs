//! The safe Rust SDK: implement [`MergeMethod`], call [`export_plugin!`](crate::export_plugin),
//! and build the crate as a `cdylib`. The SDK turns panics into `STATUS_PANIC` with the panic
//! message, forwards errors and logs to the host, and hands the method typed parameters.

use crate::abi::{self, HostApiV1, ParamValue, Status, Str, TensorHandle, TensorInfo};
use std::cell::RefCell;
use std::ffi::c_void;
use std::fmt;

/// A tensor owned by the host. Cheap to copy; valid until the current host call returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor(pub TensorHandle);

/// Why a method call failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// A host function failed; the host already holds the message.
    Host(Status),
    /// The method's own failure, with a message for the user.
    Message(String),
    /// The user cancelled the job.
    Cancelled,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Host(s) => write!(f, "host call failed with status {s}"),
            Error::Message(m) => f.write_str(m),
            Error::Cancelled => f.write_str("cancelled"),
        }
    }
}

impl From<String> for Error {
    fn from(m: String) -> Self {
        Error::Message(m)
    }
}

impl From<&str> for Error {
    fn from(m: &str) -> Self {
        Error::Message(m.to_owned())
    }
}

/// Result of SDK and method calls.
pub type Result<T> = std::result::Result<T, Error>;

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

    fn set_error(&self, message: &str) {
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

    /// Seeded 0/1 mask with P(1) = `keep_probability`, stable across devices and chunking.
    pub fn bernoulli_mask(&self, like: Tensor, keep_probability: f64, seed: u64, offset: u64) -> Result<Tensor> {
        host_out!(self, bernoulli_mask(like.0, keep_probability, seed, offset))
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

    /// Truncated SVD: (U m×k, S k, Vᵀ k×n).
    pub fn svd(&self, a: Tensor, k: usize) -> Result<(Tensor, Tensor, Tensor)> {
        let (mut u, mut s, mut vt) = (0, 0, 0);
        // SAFETY: valid table and out pointers.
        check(unsafe { (self.api.svd)(self.api.ctx, a.0, k, &mut u, &mut s, &mut vt) })?;
        Ok((Tensor(u), Tensor(s), Tensor(vt)))
    }

    /// Best rank-k approximation of a 2-D tensor.
    pub fn low_rank(&self, a: Tensor, k: usize) -> Result<Tensor> {
        host_out!(self, low_rank(a.0, k))
    }

    /// Frees a tensor before the call returns (the handle is invalid afterwards).
    pub fn release(&self, t: Tensor) -> Result<()> {
        // SAFETY: valid table.
        check(unsafe { (self.api.release)(self.api.ctx, t.0) })
    }

    /// `|a| ≥ threshold ? a : 0`
    pub fn trim_abs(&self, a: Tensor, threshold: f64) -> Result<Tensor> {
        host_out!(self, trim_abs(a.0, threshold))
    }

    /// Elected sign per element (`abi::ELECT_MASS` or `abi::ELECT_COUNT`).
    pub fn elect_sign(&self, ts: &[Tensor], rule: abi::ElectRule) -> Result<Tensor> {
        let handles: Vec<TensorHandle> = ts.iter().map(|t| t.0).collect();
        host_out!(self, elect_sign(handles.as_ptr(), handles.len(), rule))
    }

    /// Disjoint aggregation of the entries agreeing with `sign` (`abi::DISJOINT_*`).
    pub fn disjoint_merge(&self, ts: &[Tensor], sign: Tensor, op: abi::DisjointOp) -> Result<Tensor> {
        let handles: Vec<TensorHandle> = ts.iter().map(|t| t.0).collect();
        host_out!(self, disjoint_merge(handles.as_ptr(), handles.len(), sign.0, op))
    }
}

/// Type of a parameter in the schema.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamType {
    /// A real number, with optional inclusive bounds.
    Float {
        /// Default value.
        default: f64,
        /// Inclusive lower bound.
        min: Option<f64>,
        /// Inclusive upper bound.
        max: Option<f64>,
    },
    /// An integer, with optional inclusive bounds.
    Int {
        /// Default value.
        default: i64,
        /// Inclusive lower bound.
        min: Option<i64>,
        /// Inclusive upper bound.
        max: Option<i64>,
    },
    /// true / false.
    Bool {
        /// Default value.
        default: bool,
    },
    /// One of a fixed set of strings.
    Choice {
        /// Allowed values.
        choices: Vec<&'static str>,
        /// Default value (one of `choices`).
        default: &'static str,
    },
}

/// One entry of a plugin's parameter schema.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// Name, lowercase with underscores.
    pub name: &'static str,
    /// Type, default and range.
    pub ty: ParamType,
    /// One sentence for the form's tooltip and `plugins list`.
    pub help: &'static str,
    /// Float parameters only: one value per expert (a single value is broadcast).
    pub per_task: bool,
}

impl ParamSpec {
    /// A shared float parameter.
    pub fn float(name: &'static str, default: f64, help: &'static str) -> Self {
        ParamSpec {
            name,
            ty: ParamType::Float {
                default,
                min: None,
                max: None,
            },
            help,
            per_task: false,
        }
    }

    /// An integer parameter.
    pub fn int(name: &'static str, default: i64, help: &'static str) -> Self {
        ParamSpec {
            name,
            ty: ParamType::Int {
                default,
                min: None,
                max: None,
            },
            help,
            per_task: false,
        }
    }

    /// A bool parameter.
    pub fn bool(name: &'static str, default: bool, help: &'static str) -> Self {
        ParamSpec {
            name,
            ty: ParamType::Bool { default },
            help,
            per_task: false,
        }
    }

    /// A choice parameter.
    pub fn choice(name: &'static str, choices: &[&'static str], default: &'static str, help: &'static str) -> Self {
        ParamSpec {
            name,
            ty: ParamType::Choice {
                choices: choices.to_vec(),
                default,
            },
            help,
            per_task: false,
        }
    }

    /// Inclusive range for float and int parameters.
    pub fn range(mut self, lo: f64, hi: f64) -> Self {
        match &mut self.ty {
            ParamType::Float { min, max, .. } => {
                *min = Some(lo);
                *max = Some(hi);
            }
            ParamType::Int { min, max, .. } => {
                *min = Some(lo as i64);
                *max = Some(hi as i64);
            }
            _ => {}
        }
        self
    }

    /// Lower bound only.
    pub fn min(mut self, lo: f64) -> Self {
        match &mut self.ty {
            ParamType::Float { min, .. } => *min = Some(lo),
            ParamType::Int { min, .. } => *min = Some(lo as i64),
            _ => {}
        }
        self
    }

    /// Marks a float parameter as per-task (one value per expert).
    pub fn per_task(mut self) -> Self {
        self.per_task = true;
        self
    }
}

fn json_escape(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_number(v: f64) -> String {
    if v.is_finite() {
        format!("{v:?}")
    } else {
        "null".to_owned()
    }
}

/// Serialises a schema to the JSON the host reads (see plugin-api/README.md).
pub fn schema_json(params: &[ParamSpec]) -> String {
    let mut s = String::from("[");
    for (i, p) in params.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str("{\"name\":");
        json_escape(p.name, &mut s);
        match &p.ty {
            ParamType::Float { default, min, max } => {
                s.push_str(",\"type\":\"float\",\"default\":");
                s.push_str(&json_number(*default));
                if let Some(m) = min {
                    s.push_str(&format!(",\"min\":{}", json_number(*m)));
                }
                if let Some(m) = max {
                    s.push_str(&format!(",\"max\":{}", json_number(*m)));
                }
            }
            ParamType::Int { default, min, max } => {
                s.push_str(&format!(",\"type\":\"int\",\"default\":{default}"));
                if let Some(m) = min {
                    s.push_str(&format!(",\"min\":{m}"));
                }
                if let Some(m) = max {
                    s.push_str(&format!(",\"max\":{m}"));
                }
            }
            ParamType::Bool { default } => {
                s.push_str(&format!(",\"type\":\"bool\",\"default\":{default}"));
            }
            ParamType::Choice { choices, default } => {
                s.push_str(",\"type\":\"choice\",\"choices\":[");
                for (j, c) in choices.iter().enumerate() {
                    if j > 0 {
                        s.push(',');
                    }
                    json_escape(c, &mut s);
                }
                s.push_str("],\"default\":");
                json_escape(default, &mut s);
            }
        }
        if p.per_task {
            s.push_str(",\"per_task\":true");
        }
        s.push_str(",\"help\":");
        json_escape(p.help, &mut s);
        s.push('}');
    }
    s.push(']');
    s
}

/// The validated parameters of one merge, as the host passed them to `create`.
pub struct Params<'a> {
    values: &'a [ParamValue],
}

impl<'a> Params<'a> {
    /// Wraps the host's parameter array.
    ///
    /// # Safety
    /// `ptr` must point to `n` values (or be null with `n == 0`) alive for `'a`.
    pub unsafe fn from_raw(ptr: *const ParamValue, n: usize) -> Params<'a> {
        let values = if ptr.is_null() || n == 0 {
            &[][..]
        } else {
            // SAFETY: guaranteed by the caller.
            unsafe { std::slice::from_raw_parts(ptr, n) }
        };
        Params { values }
    }

    fn find(&self, name: &str) -> Result<&'a ParamValue> {
        self.values
            .iter()
            // SAFETY: the host keeps names alive for the call.
            .find(|p| unsafe { p.name.as_str() }.is_ok_and(|n| n == name))
            .ok_or_else(|| Error::Message(format!("parameter '{name}' was not passed by the host")))
    }

    fn expect_kind(&self, p: &ParamValue, name: &str, kind: abi::ParamKind, what: &str) -> Result<()> {
        if p.kind == kind {
            Ok(())
        } else {
            Err(Error::Message(format!(
                "parameter '{name}' is not {what} (kind {})",
                p.kind
            )))
        }
    }

    /// A float parameter.
    pub fn float(&self, name: &str) -> Result<f64> {
        let p = self.find(name)?;
        match p.kind {
            abi::PARAM_FLOAT => Ok(p.number),
            abi::PARAM_INT => Ok(p.integer as f64),
            _ => Err(Error::Message(format!("parameter '{name}' is not a number"))),
        }
    }

    /// An int parameter.
    pub fn int(&self, name: &str) -> Result<i64> {
        let p = self.find(name)?;
        self.expect_kind(p, name, abi::PARAM_INT, "an integer")?;
        Ok(p.integer)
    }

    /// A bool parameter.
    pub fn bool(&self, name: &str) -> Result<bool> {
        let p = self.find(name)?;
        self.expect_kind(p, name, abi::PARAM_BOOL, "a bool")?;
        Ok(p.integer != 0)
    }

    /// A choice parameter.
    pub fn choice(&self, name: &str) -> Result<&'a str> {
        let p = self.find(name)?;
        self.expect_kind(p, name, abi::PARAM_CHOICE, "a choice")?;
        // SAFETY: the host keeps the text alive for the call.
        unsafe { p.text.as_str() }.map_err(|_| Error::Message(format!("parameter '{name}' is not UTF-8")))
    }

    /// A float-list (per-task) parameter.
    pub fn list(&self, name: &str) -> Result<Vec<f64>> {
        let p = self.find(name)?;
        self.expect_kind(p, name, abi::PARAM_FLOAT_LIST, "a list")?;
        if p.list.is_null() || p.list_len == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: the host keeps the list alive for the call.
        Ok(unsafe { std::slice::from_raw_parts(p.list, p.list_len) }.to_vec())
    }
}

/// Everything `create` gets besides the parameters.
#[derive(Clone, Copy, Debug)]
pub struct CreateContext {
    /// Number of expert models in this merge.
    pub n_experts: usize,
    /// Seed of the merge (record of the user's `--seed`).
    pub seed: u64,
}

/// Safe view of a [`TensorInfo`].
#[derive(Clone, Debug)]
pub struct TensorMeta<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// `abi::ROLE_*`.
    pub role: abi::TensorRole,
    /// Index in the host's order.
    pub index: usize,
    /// Number of tensors.
    pub count: usize,
    /// Offset of the chunk in the full tensor.
    pub offset: u64,
    /// Elements of the full tensor.
    pub full_numel: u64,
    /// Shape of the full tensor.
    pub full_shape: &'a [usize],
}

impl<'a> TensorMeta<'a> {
    /// The base tensor, or an error naming the tensor and `method` that tells the user to pass
    /// `--base` (for methods that work on task vectors θ_t − θ0).
    pub fn require_base(&self, base: Option<Tensor>, method: &str) -> Result<Tensor> {
        base.ok_or_else(|| {
            Error::Message(format!(
                "tensor '{}': {method} needs a base model (task vectors are θ_t − θ0); give one with --base",
                self.name
            ))
        })
    }

    /// Reads the host's info.
    ///
    /// # Safety
    /// `info` must be the pointer the host passed to the current call.
    pub unsafe fn from_raw(info: *const TensorInfo) -> Result<TensorMeta<'a>> {
        // SAFETY: guaranteed by the caller.
        let info = unsafe { info.as_ref() }.ok_or(Error::Message("null tensor info".into()))?;
        // SAFETY: the host keeps the name alive for the call.
        let name = unsafe { info.name.as_str() }.map_err(|_| Error::Message("tensor name is not UTF-8".into()))?;
        let full_shape = if info.full_shape.is_null() || info.full_rank == 0 {
            &[][..]
        } else {
            // SAFETY: the host keeps the shape alive for the call.
            unsafe { std::slice::from_raw_parts(info.full_shape, info.full_rank) }
        };
        Ok(TensorMeta {
            name,
            role: info.role,
            index: info.index,
            count: info.count,
            offset: info.offset,
            full_numel: info.full_numel,
            full_shape,
        })
    }
}

/// Static description of a method.
#[derive(Clone, Debug)]
pub struct Descriptor {
    /// Stable id (`task-arithmetic`).
    pub id: &'static str,
    /// Display name.
    pub name: &'static str,
    /// Version; defaults to the crate version in [`export_plugin!`](crate::export_plugin).
    pub version: &'static str,
    /// One-line description.
    pub description: &'static str,
    /// Help text.
    pub help: &'static str,
    /// `abi::CAP_*` bits.
    pub capabilities: u64,
    /// Parameter schema.
    pub params: Vec<ParamSpec>,
}

/// A per-tensor merge method. One instance serves one merge.
pub trait MergeMethod: Sized + 'static {
    /// Describes the method (called once, when the host loads the library).
    fn descriptor() -> Descriptor;

    /// Makes an instance from validated parameters.
    fn create(host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<Self>;

    /// Capabilities of this instance when they depend on the parameters (`None`: the
    /// descriptor's).
    fn capabilities(&self) -> Option<u64> {
        None
    }

    /// Number of statistics passes needed before merging (global statistics).
    fn prepare_passes(&self) -> u32 {
        0
    }

    /// Sees one tensor during statistics pass `pass`.
    fn prepare_tensor(
        &mut self,
        _host: &Host<'_>,
        _pass: u32,
        _tensor: &TensorMeta<'_>,
        _base: Option<Tensor>,
        _experts: &[Tensor],
    ) -> Result<()> {
        Ok(())
    }

    /// Called after statistics pass `pass` saw every tensor.
    fn finish_pass(&mut self, _host: &Host<'_>, _pass: u32) -> Result<()> {
        Ok(())
    }

    /// Merges one tensor (or chunk).
    fn merge_tensor(
        &mut self,
        host: &Host<'_>,
        tensor: &TensorMeta<'_>,
        base: Option<Tensor>,
        experts: &[Tensor],
    ) -> Result<Tensor>;
}

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The plugin has its own copy of std, so this hook only sees the plugin's panics. It
        // records the message instead of printing it; the guard hands it to the host.
        std::panic::set_hook(Box::new(|info| {
            let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
                (*s).to_owned()
            } else if let Some(s) = info.payload().downcast_ref::<String>() {
                s.clone()
            } else {
                "unknown panic payload".to_owned()
            };
            let loc = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{msg}{loc}")));
        }));
    });
}

/// Runs `f` so that no panic and no error escapes: panics become `STATUS_PANIC`, errors become
/// their status, and the message goes to the host through `set_error`.
pub fn guard(host: Option<Host<'_>>, f: impl FnOnce() -> Result<()>) -> Status {
    install_panic_hook();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    let (status, message) = match outcome {
        Ok(Ok(())) => (abi::STATUS_OK, None),
        Ok(Err(Error::Host(s))) => (s, None),
        Ok(Err(Error::Cancelled)) => (abi::STATUS_CANCELLED, None),
        Ok(Err(Error::Message(m))) => (abi::STATUS_ERROR, Some(m)),
        Err(_) => {
            let m = LAST_PANIC
                .with(|p| p.borrow_mut().take())
                .unwrap_or_else(|| "unknown panic".into());
            (abi::STATUS_PANIC, Some(format!("plugin panicked: {m}")))
        }
    };
    if let (Some(h), Some(m)) = (host, message) {
        // set_error is an extern "C" host function that never unwinds.
        h.set_error(&m);
    }
    status
}

/// A `'static` copy of the descriptor with C strings, built once per library.
#[doc(hidden)]
pub struct StaticTable {
    /// The table handed to the host.
    pub api: abi::PluginApiV1,
    _strings: Vec<String>,
}

// SAFETY: the table only points into `_strings`, which never changes after construction.
unsafe impl Sync for StaticTable {}
// SAFETY: as above.
unsafe impl Send for StaticTable {}

/// The descriptor's strings, owned, and the table's fields common to both kinds of method.
pub(crate) fn table_parts(d: &Descriptor, crate_version: &'static str) -> (Vec<String>, [Str; 6]) {
    let version = if d.version.is_empty() { crate_version } else { d.version };
    let strings = vec![
        d.id.to_owned(),
        d.name.to_owned(),
        version.to_owned(),
        d.description.to_owned(),
        d.help.to_owned(),
        schema_json(&d.params),
    ];
    // The `Str`s point into the heap buffers of `strings`, which do not move with the Vec.
    let s: [Str; 6] = std::array::from_fn(|i| Str::new(&strings[i]));
    (strings, s)
}

impl StaticTable {
    /// Wraps a table and the strings it points into.
    pub(crate) fn new(api: abi::PluginApiV1, strings: Vec<String>) -> StaticTable {
        StaticTable { api, _strings: strings }
    }
}

#[doc(hidden)]
pub fn build_table<M: MergeMethod>(version: &'static str) -> StaticTable {
    let d = M::descriptor();
    let (strings, [id, name, version, description, help, schema]) = table_parts(&d, version);
    let api = abi::PluginApiV1 {
        struct_size: std::mem::size_of::<abi::PluginApiV1>(),
        id,
        name,
        version,
        description,
        help,
        kind: abi::KIND_PER_TENSOR,
        capabilities: d.capabilities,
        params_schema_json: schema,
        create: create_impl::<M>,
        destroy: destroy_impl::<M>,
        prepare_passes: Some(prepare_passes_impl::<M>),
        prepare_tensor: Some(prepare_tensor_impl::<M>),
        finish_pass: Some(finish_pass_impl::<M>),
        merge_tensor: merge_tensor_impl::<M>,
        get_extension: None,
        instance_capabilities: Some(instance_capabilities_impl::<M>),
        run_model: None,
    };
    StaticTable::new(api, strings)
}

pub(crate) unsafe fn experts_slice(experts: *const TensorHandle, n: usize) -> Result<Vec<Tensor>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if experts.is_null() {
        return Err(Error::Message("null experts array".into()));
    }
    // SAFETY: the host passes `n` handles.
    Ok(unsafe { std::slice::from_raw_parts(experts, n) }
        .iter()
        .map(|h| Tensor(*h))
        .collect())
}

fn base_opt(base: TensorHandle) -> Option<Tensor> {
    (base != 0).then_some(Tensor(base))
}

/// The body of `create` for any kind of method: `make` builds the instance.
///
/// # Safety
/// The pointers are those the host passed to `create`.
pub(crate) unsafe fn create_with<M: 'static>(
    host: *const HostApiV1,
    params: *const ParamValue,
    n_params: usize,
    n_experts: usize,
    seed: u64,
    out: *mut *mut c_void,
    make: fn(&Host<'_>, &Params<'_>, CreateContext) -> Result<M>,
) -> Status {
    // SAFETY: the host passes its table for this call.
    let Some(h) = (unsafe { Host::from_raw(host) }) else {
        return abi::STATUS_INVALID_ARGUMENT;
    };
    if out.is_null() {
        return abi::STATUS_INVALID_ARGUMENT;
    }
    guard(Some(h), || {
        // SAFETY: the host passes `n_params` values.
        let p = unsafe { Params::from_raw(params, n_params) };
        let inst = make(&h, &p, CreateContext { n_experts, seed })?;
        // SAFETY: `out` was checked for null.
        unsafe { *out = Box::into_raw(Box::new(inst)).cast::<c_void>() };
        Ok(())
    })
}

unsafe extern "C" fn create_impl<M: MergeMethod>(
    host: *const HostApiV1,
    params: *const ParamValue,
    n_params: usize,
    n_experts: usize,
    seed: u64,
    out: *mut *mut c_void,
) -> Status {
    // SAFETY: forwarded from the host.
    unsafe { create_with(host, params, n_params, n_experts, seed, out, M::create) }
}

pub(crate) unsafe extern "C" fn destroy_impl<M: 'static>(instance: *mut c_void) {
    if instance.is_null() {
        return;
    }
    guard(None, || {
        // SAFETY: `instance` was made by `create_impl::<M>` and is destroyed once.
        drop(unsafe { Box::from_raw(instance.cast::<M>()) });
        Ok(())
    });
}

pub(crate) unsafe fn instance<'a, M>(instance: *mut c_void) -> Result<&'a mut M> {
    // SAFETY: the host passes the pointer `create` returned, used by one thread at a time.
    unsafe { instance.cast::<M>().as_mut() }.ok_or(Error::Message("null instance".into()))
}

unsafe extern "C" fn instance_capabilities_impl<M: MergeMethod>(inst: *mut c_void) -> u64 {
    let static_caps = M::descriptor().capabilities;
    let mut caps = static_caps;
    guard(None, || {
        // SAFETY: see `instance`.
        caps = unsafe { instance::<M>(inst) }?.capabilities().unwrap_or(static_caps);
        Ok(())
    });
    caps
}

unsafe extern "C" fn prepare_passes_impl<M: MergeMethod>(inst: *mut c_void) -> u32 {
    let mut n = 0;
    guard(None, || {
        // SAFETY: see `instance`.
        n = unsafe { instance::<M>(inst) }?.prepare_passes();
        Ok(())
    });
    n
}

unsafe extern "C" fn prepare_tensor_impl<M: MergeMethod>(
    inst: *mut c_void,
    host: *const HostApiV1,
    pass: u32,
    info: *const TensorInfo,
    base: TensorHandle,
    experts: *const TensorHandle,
    n_experts: usize,
) -> Status {
    // SAFETY: the host passes its table for this call.
    let Some(h) = (unsafe { Host::from_raw(host) }) else {
        return abi::STATUS_INVALID_ARGUMENT;
    };
    guard(Some(h), || {
        // SAFETY: pointers from the host, valid for this call.
        let (m, meta, ex) = unsafe {
            (
                instance::<M>(inst)?,
                TensorMeta::from_raw(info)?,
                experts_slice(experts, n_experts)?,
            )
        };
        m.prepare_tensor(&h, pass, &meta, base_opt(base), &ex)
    })
}

unsafe extern "C" fn finish_pass_impl<M: MergeMethod>(inst: *mut c_void, host: *const HostApiV1, pass: u32) -> Status {
    // SAFETY: the host passes its table for this call.
    let Some(h) = (unsafe { Host::from_raw(host) }) else {
        return abi::STATUS_INVALID_ARGUMENT;
    };
    guard(Some(h), || {
        // SAFETY: see `instance`.
        unsafe { instance::<M>(inst) }?.finish_pass(&h, pass)
    })
}

unsafe extern "C" fn merge_tensor_impl<M: MergeMethod>(
    inst: *mut c_void,
    host: *const HostApiV1,
    info: *const TensorInfo,
    base: TensorHandle,
    experts: *const TensorHandle,
    n_experts: usize,
    out: *mut TensorHandle,
) -> Status {
    // SAFETY: the host passes its table for this call.
    let Some(h) = (unsafe { Host::from_raw(host) }) else {
        return abi::STATUS_INVALID_ARGUMENT;
    };
    if out.is_null() {
        return abi::STATUS_INVALID_ARGUMENT;
    }
    guard(Some(h), || {
        // SAFETY: pointers from the host, valid for this call.
        let (m, meta, ex) = unsafe {
            (
                instance::<M>(inst)?,
                TensorMeta::from_raw(info)?,
                experts_slice(experts, n_experts)?,
            )
        };
        let t = m.merge_tensor(&h, &meta, base_opt(base), &ex)?;
        // SAFETY: `out` was checked for null.
        unsafe { *out = t.0 };
        Ok(())
    })
}

/// Exports a [`MergeMethod`] as a mergescope plugin: the static header and the v1 entry.
/// Use once per `cdylib` crate: `mergescope_plugin_api::export_plugin!(MyMethod);`
#[macro_export]
macro_rules! export_plugin {
    ($method:ty) => {
        $crate::__export_table!($crate::sdk::build_table::<$method>);
    };
}

/// The static header and the v1 entry returning the table `$build` makes (shared by
/// [`export_plugin!`] and [`export_model_plugin!`](crate::export_model_plugin)).
#[doc(hidden)]
#[macro_export]
macro_rules! __export_table {
    ($build:path) => {
        #[unsafe(no_mangle)]
        #[used]
        pub static mergescope_plugin_header: $crate::abi::PluginHeader = $crate::abi::PluginHeader {
            magic: $crate::abi::MAGIC,
            abi_major: $crate::abi::ABI_MAJOR,
            abi_minor: $crate::abi::ABI_MINOR,
        };

        /// The v1 entry point read by the mergescope host.
        #[unsafe(no_mangle)]
        pub extern "C" fn mergescope_plugin_entry_v1() -> *const $crate::abi::PluginApiV1 {
            static TABLE: ::std::sync::OnceLock<$crate::sdk::StaticTable> = ::std::sync::OnceLock::new();
            let status = $crate::sdk::guard(None, || {
                TABLE.get_or_init(|| $build(env!("CARGO_PKG_VERSION")));
                Ok(())
            });
            match TABLE.get() {
                Some(t) if status == $crate::abi::STATUS_OK => &t.api,
                _ => ::std::ptr::null(),
            }
        }
    };
}

/// The rank CART keeps of a matrix of full rank `r` (min(m, n)) under a rank `ratio`:
/// ⌈r·ratio − 1e-9⌉ clamped to [0, r], so that round-off such as 25·0.08 = 2.0000000000000004
/// does not add a rank. One rule for the cart and adamerging plugins and the host's landscapes.
pub fn rank_from_ratio(r: usize, ratio: f64) -> usize {
    let k = (r as f64 * ratio - 1e-9).ceil();
    if k <= 0.0 {
        0
    } else if k >= r as f64 {
        r
    } else {
        k as usize
    }
}
