//! The raw C ABI, version 1 (minor 1 added model-level methods: [`SessionApiV1`] and
//! `PluginApiV1::run_model`; minor 2 moved the method-specific fused operations behind host
//! extensions that `HostApiV1::get_extension` returns by id, and added the host's worker
//! threads as the [`HostParallelV1`] extension; minor 3 added the [`HostRandomV2`] extension,
//! whose `bernoulli_mask_p` draws a mask with a keep probability per element; minor 4 added
//! [`CAP_ORDERED_STATISTICS`], statistics passes that see each tensor's chunks in order, and the
//! [`HostViewsV1`] extension, which lends a tensor's f32 values without a copy; minor 5 added
//! [`CAP_TENSOR_STATISTICS`] and `PluginApiV1::finish_tensor`, statistics that a tensor's merge
//! may follow at once). Every type here
//! is `#[repr(C)]` and mirrored one to one in `include/mergescope_plugin.h`; a test keeps the
//! two in sync.
//!
//! Compatibility rules (CLAP-style): tables start with `struct_size` and only ever grow at the
//! end; optional functions are nullable; a new major version renames the entry symbol, so an old
//! host can never call a new layout.

use core::ffi::c_void;

/// Eight bytes every plugin's header starts with.
pub const MAGIC: [u8; 8] = *b"MRGSCOPE";
/// Major ABI version: a host only loads plugins of exactly this major.
pub const ABI_MAJOR: u32 = 1;
/// Minor ABI version: a host loads plugins whose minor is at most its own.
pub const ABI_MINOR: u32 = 5;

/// Name of the exported static [`PluginHeader`].
pub const HEADER_SYMBOL: &str = "mergescope_plugin_header";
/// Name of the exported entry function of ABI major 1 ([`EntryV1`]).
pub const ENTRY_SYMBOL_V1: &str = "mergescope_plugin_entry_v1";

/// Status codes returned by every fallible function on both sides of the ABI.
pub type Status = i32;
/// Success.
pub const STATUS_OK: Status = 0;
/// A failure described by the text set with `HostApiV1::set_error`.
pub const STATUS_ERROR: Status = 1;
/// The plugin panicked; the SDK caught it and set the error text.
pub const STATUS_PANIC: Status = 2;
/// The user cancelled the job (`HostApiV1::is_cancelled` returned true).
pub const STATUS_CANCELLED: Status = 3;
/// The function or operation code is not supported by this side.
pub const STATUS_UNSUPPORTED: Status = 4;
/// An argument was invalid (unknown handle, wrong length, null pointer).
pub const STATUS_INVALID_ARGUMENT: Status = 5;

/// Opaque tensor handle owned by the host; `0` is never a valid handle.
pub type TensorHandle = u64;

/// A borrowed UTF-8 string: pointer plus length, not NUL-terminated.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Str {
    /// First byte; may be null when `len` is 0.
    pub ptr: *const u8,
    /// Length in bytes.
    pub len: usize,
}

impl Str {
    /// The empty string.
    pub const EMPTY: Str = Str {
        ptr: core::ptr::null(),
        len: 0,
    };

    /// Borrows a Rust string (the caller keeps it alive for as long as the `Str` is used).
    pub const fn new(s: &str) -> Str {
        Str {
            ptr: s.as_ptr(),
            len: s.len(),
        }
    }

    /// Reads the string back.
    ///
    /// # Safety
    /// `ptr` must point to `len` readable bytes that stay alive for `'a`.
    pub unsafe fn as_str<'a>(&self) -> Result<&'a str, core::str::Utf8Error> {
        if self.ptr.is_null() || self.len == 0 {
            return Ok("");
        }
        // SAFETY: guaranteed by the caller.
        let bytes = unsafe { core::slice::from_raw_parts(self.ptr, self.len) };
        core::str::from_utf8(bytes)
    }
}

/// The static header every plugin exports under [`HEADER_SYMBOL`]; read before anything else.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PluginHeader {
    /// Must equal [`MAGIC`].
    pub magic: [u8; 8],
    /// ABI major the plugin was built against.
    pub abi_major: u32,
    /// ABI minor the plugin was built against.
    pub abi_minor: u32,
}

/// What kind of merge method a plugin implements.
pub type PluginKind = u32;
/// Per-tensor method: the host streams the model and calls `merge_tensor` per tensor.
pub const KIND_PER_TENSOR: PluginKind = 1;
/// Model-level method (data-driven or iterative, ABI 1.1): the host calls `run_model` once with
/// a [`SessionApiV1`] giving whole models, calibration data, gradients and fine-tuning.
pub const KIND_MODEL_LEVEL: PluginKind = 2;

/// Capability bit: one instance may be called from several threads at once.
pub const CAP_THREAD_SAFE: u64 = 1 << 0;
/// Capability bit: the result of every element depends only on that element's inputs (and on
/// state fixed before the merge pass), so the host may split large tensors into chunks and call
/// `merge_tensor` once per chunk. `TensorInfo::offset` then tells where the chunk starts.
pub const CAP_ELEMENTWISE: u64 = 1 << 1;
/// Capability bit: the method needs a base model (task vectors are taken against it).
pub const CAP_NEEDS_BASE: u64 = 1 << 2;
/// Capability bit: the statistics passes accept chunks too (their statistics add up over
/// pieces of a tensor, like histograms), so the host may stream them in parallel chunks with
/// bounded memory; `TensorInfo::offset` tells where a chunk starts.
pub const CAP_CHUNKED_STATISTICS: u64 = 1 << 3;
/// Capability bit (ABI 1.4), with [`CAP_CHUNKED_STATISTICS`]: the statistics are sequential
/// within a tensor (a running floating-point sum, whose last bits depend on the order of its
/// terms), so the host hands each tensor's chunks to the statistics passes in order, from one
/// thread at a time; different tensors may still run in parallel. The merge pass is unaffected.
pub const CAP_ORDERED_STATISTICS: u64 = 1 << 5;
/// Capability bit: the method merges the base with exactly one expert (SLERP), so the host
/// refuses other counts before creating an instance and comparisons over several experts leave
/// it out.
pub const CAP_ONE_EXPERT: u64 = 1 << 4;
/// Capability bit (ABI 1.5), with [`CAP_CHUNKED_STATISTICS`], [`CAP_ELEMENTWISE`] and a
/// `finish_tensor` (the host uses it for [`CAP_THREAD_SAFE`] methods): the statistics of a tensor
/// serve only that tensor's merge. The host may then take one tensor at a
/// time: its chunks through every statistics pass in order, `finish_tensor` after each pass,
/// then its merge, while other tensors run likewise on other threads; `finish_pass` still
/// follows once per pass, after every tensor. A tensor's inputs are then read while still in
/// memory.
pub const CAP_TENSOR_STATISTICS: u64 = 1 << 6;

/// Role of a tensor in the model, so methods can treat matrices and vectors differently.
pub type TensorRole = u32;
/// A 2-D weight matrix (linear layers, attention projections).
pub const ROLE_MATRIX: TensorRole = 0;
/// A 1-D vector that is not a norm (biases, class tokens).
pub const ROLE_VECTOR: TensorRole = 1;
/// A normalisation weight or bias (LayerNorm, RMSNorm, BatchNorm).
pub const ROLE_NORM: TensorRole = 2;
/// A token or position embedding table.
pub const ROLE_EMBEDDING: TensorRole = 3;
/// A convolution kernel (rank 3 or more).
pub const ROLE_CONV: TensorRole = 4;
/// A scalar (rank 0) or any other tensor.
pub const ROLE_OTHER: TensorRole = 5;

/// Parameter value kinds, as passed to `create`.
pub type ParamKind = u32;
/// `number` holds the value.
pub const PARAM_FLOAT: ParamKind = 0;
/// `integer` holds the value.
pub const PARAM_INT: ParamKind = 1;
/// `integer` is 0 or 1.
pub const PARAM_BOOL: ParamKind = 2;
/// `text` holds one of the schema's choices.
pub const PARAM_CHOICE: ParamKind = 3;
/// `list`/`list_len` hold the values (per-task parameters: one value per expert).
pub const PARAM_FLOAT_LIST: ParamKind = 4;

/// One validated parameter value, with the schema's default filled in where the user gave none.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ParamValue {
    /// Parameter name as in the schema.
    pub name: Str,
    /// One of the `PARAM_*` kinds.
    pub kind: ParamKind,
    /// Value of a float parameter.
    pub number: f64,
    /// Value of an int or bool parameter.
    pub integer: i64,
    /// Value of a choice parameter.
    pub text: Str,
    /// Values of a float-list parameter.
    pub list: *const f64,
    /// Number of values in `list`.
    pub list_len: usize,
}

/// Facts about the tensor (or chunk of a tensor) handed to `merge_tensor`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TensorInfo {
    /// `size_of::<TensorInfo>()` as the host knows it.
    pub struct_size: usize,
    /// Tensor name in the checkpoint.
    pub name: Str,
    /// One of the `ROLE_*` values.
    pub role: TensorRole,
    /// Index of this tensor in the host's (sorted) order, 0-based.
    pub index: usize,
    /// Number of tensors the host will merge.
    pub count: usize,
    /// Offset of this chunk's first element in the flattened full tensor (0 when unchunked).
    pub offset: u64,
    /// Number of elements of the full tensor.
    pub full_numel: u64,
    /// Shape of the full tensor.
    pub full_shape: *const usize,
    /// Rank of the full tensor.
    pub full_rank: usize,
}

/// Log levels for `HostApiV1::log`.
pub type LogLevel = u32;
/// Error.
pub const LOG_ERROR: LogLevel = 0;
/// Warning.
pub const LOG_WARN: LogLevel = 1;
/// Information.
pub const LOG_INFO: LogLevel = 2;
/// Debugging detail.
pub const LOG_DEBUG: LogLevel = 3;

/// Operation codes for `HostApiV1::binary` (same shape, or one side a one-element tensor).
pub type BinaryOp = u32;
/// a + b
pub const BINARY_ADD: BinaryOp = 0;
/// a − b
pub const BINARY_SUB: BinaryOp = 1;
/// a · b
pub const BINARY_MUL: BinaryOp = 2;
/// a / b
pub const BINARY_DIV: BinaryOp = 3;
/// max(a, b)
pub const BINARY_MAXIMUM: BinaryOp = 4;
/// min(a, b)
pub const BINARY_MINIMUM: BinaryOp = 5;
/// 1.0 where a > b, else 0.0
pub const BINARY_GT: BinaryOp = 6;
/// 1.0 where a ≥ b, else 0.0
pub const BINARY_GE: BinaryOp = 7;
/// 1.0 where a < b, else 0.0
pub const BINARY_LT: BinaryOp = 8;
/// 1.0 where a ≤ b, else 0.0
pub const BINARY_LE: BinaryOp = 9;
/// 1.0 where a = b, else 0.0
pub const BINARY_EQ: BinaryOp = 10;

/// Operation codes for `HostApiV1::unary`.
pub type UnaryOp = u32;
/// −a
pub const UNARY_NEG: UnaryOp = 0;
/// |a|
pub const UNARY_ABS: UnaryOp = 1;
/// sign(a) ∈ {−1, 0, 1}
pub const UNARY_SIGN: UnaryOp = 2;
/// √a
pub const UNARY_SQRT: UnaryOp = 3;
/// a²
pub const UNARY_SQUARE: UnaryOp = 4;
/// exp(a)
pub const UNARY_EXP: UnaryOp = 5;
/// ln(a)
pub const UNARY_LOG: UnaryOp = 6;

/// Operation codes for `HostApiV1::reduce` (whole tensor to one f64).
pub type ReduceOp = u32;
/// Σ a
pub const REDUCE_SUM: ReduceOp = 0;
/// Σ a²
pub const REDUCE_SUM_SQUARES: ReduceOp = 1;
/// Σ |a|
pub const REDUCE_SUM_ABS: ReduceOp = 2;
/// max |a|
pub const REDUCE_MAX_ABS: ReduceOp = 3;
/// number of elements ≠ 0
pub const REDUCE_COUNT_NONZERO: ReduceOp = 4;
/// mean of a
pub const REDUCE_MEAN: ReduceOp = 5;
/// min of a
pub const REDUCE_MIN: ReduceOp = 6;
/// max of a
pub const REDUCE_MAX: ReduceOp = 7;

/// Operation codes for `HostApiV1::reduce_stack` (elementwise over n same-shape tensors).
pub type StackOp = u32;
/// Σ_i t_i
pub const STACK_SUM: StackOp = 0;
/// mean_i t_i
pub const STACK_MEAN: StackOp = 1;
/// max_i t_i
pub const STACK_MAX: StackOp = 2;
/// min_i t_i
pub const STACK_MIN: StackOp = 3;

/// Sign-election rules for `HostApiV1::elect_sign`.
pub type ElectRule = u32;
/// sign(Σ_i t_i): the sign of the total mass (TIES paper).
pub const ELECT_MASS: ElectRule = 0;
/// sign(Σ_i sign(t_i)): the majority of signs by count.
pub const ELECT_COUNT: ElectRule = 1;

/// Aggregations for `HostApiV1::disjoint_merge`.
pub type DisjointOp = u32;
/// Σ of the entries that agree with the sign.
pub const DISJOINT_SUM: DisjointOp = 0;
/// Σ of the agreeing entries / max(1, number of agreeing entries).
pub const DISJOINT_MEAN: DisjointOp = 1;
/// max |agreeing entry| · sign.
pub const DISJOINT_MAX: DisjointOp = 2;

/// The table of host services and tensor operations a plugin calls back into.
///
/// Threading: every function may only be called on the thread that is inside the host's call
/// into the plugin (`create`, `prepare_tensor`, `merge_tensor`), with the `HostApiV1` pointer
/// that call received. Handles created during one call live until that call returns, except
/// the one the plugin returns through `out`; input handles live for the call too.
/// No function unwinds: failures return a status and the host keeps the message.
#[repr(C)]
pub struct HostApiV1 {
    /// `size_of::<HostApiV1>()` as the host knows it.
    pub struct_size: usize,
    /// ABI major of the host.
    pub abi_major: u32,
    /// ABI minor of the host.
    pub abi_minor: u32,
    /// Host state for this call; pass it back as the first argument of every function.
    pub ctx: *mut c_void,

    /// Writes a line to the host's log, attributed to the plugin.
    pub log: unsafe extern "C" fn(ctx: *mut c_void, level: LogLevel, message: Str),
    /// Reports progress inside a long call, as a fraction in [0, 1].
    pub report_progress: unsafe extern "C" fn(ctx: *mut c_void, fraction: f64),
    /// Non-zero when the user cancelled the job: return `STATUS_CANCELLED` soon.
    pub is_cancelled: unsafe extern "C" fn(ctx: *mut c_void) -> i32,
    /// Records the error text of the failure the plugin is about to return (copied by the host).
    pub set_error: unsafe extern "C" fn(ctx: *mut c_void, message: Str),
    /// Looks up an optional host extension by id (`HOST_EXT_*`; a pointer to its static table);
    /// null when the host has none.
    pub get_extension: unsafe extern "C" fn(ctx: *mut c_void, id: Str) -> *const c_void,

    /// Writes the rank to `rank` and up to `max_rank` dimensions to `dims`.
    pub shape: unsafe extern "C" fn(
        ctx: *mut c_void,
        t: TensorHandle,
        dims: *mut usize,
        max_rank: usize,
        rank: *mut usize,
    ) -> Status,
    /// Number of elements.
    pub numel: unsafe extern "C" fn(ctx: *mut c_void, t: TensorHandle, out: *mut usize) -> Status,
    /// Copies `len` f32 values (the whole tensor, row-major) into `dst`.
    pub read_f32: unsafe extern "C" fn(ctx: *mut c_void, t: TensorHandle, dst: *mut f32, len: usize) -> Status,
    /// Creates a tensor from `len` row-major f32 values with the given shape.
    pub from_f32: unsafe extern "C" fn(
        ctx: *mut c_void,
        data: *const f32,
        len: usize,
        dims: *const usize,
        rank: usize,
        out: *mut TensorHandle,
    ) -> Status,
    /// Creates a tensor of `like`'s shape filled with `value`.
    pub full_like:
        unsafe extern "C" fn(ctx: *mut c_void, like: TensorHandle, value: f64, out: *mut TensorHandle) -> Status,

    /// Elementwise binary operation (`BINARY_*`); comparisons give 0.0/1.0 masks.
    pub binary: unsafe extern "C" fn(
        ctx: *mut c_void,
        op: BinaryOp,
        a: TensorHandle,
        b: TensorHandle,
        out: *mut TensorHandle,
    ) -> Status,
    /// Elementwise unary operation (`UNARY_*`).
    pub unary: unsafe extern "C" fn(ctx: *mut c_void, op: UnaryOp, a: TensorHandle, out: *mut TensorHandle) -> Status,
    /// `a · mul + add`, elementwise.
    pub affine:
        unsafe extern "C" fn(ctx: *mut c_void, a: TensorHandle, mul: f64, add: f64, out: *mut TensorHandle) -> Status,
    /// Elementwise comparison with a scalar (`BINARY_GT`…`BINARY_EQ`), giving a 0/1 mask.
    pub compare_scalar: unsafe extern "C" fn(
        ctx: *mut c_void,
        op: BinaryOp,
        a: TensorHandle,
        scalar: f64,
        out: *mut TensorHandle,
    ) -> Status,
    /// `mask ≠ 0 ? on_true : on_false`, elementwise.
    pub select: unsafe extern "C" fn(
        ctx: *mut c_void,
        mask: TensorHandle,
        on_true: TensorHandle,
        on_false: TensorHandle,
        out: *mut TensorHandle,
    ) -> Status,
    /// Whole-tensor reduction (`REDUCE_*`) to one f64, accumulated in f64; sums add element i to
    /// lane i mod 8 and the eight lanes in a fixed tree (`sdk::sums`), the same bits everywhere.
    pub reduce: unsafe extern "C" fn(ctx: *mut c_void, op: ReduceOp, a: TensorHandle, out: *mut f64) -> Status,
    /// Σ a·b over all elements, accumulated in f64 in the lane order of `reduce`.
    pub dot: unsafe extern "C" fn(ctx: *mut c_void, a: TensorHandle, b: TensorHandle, out: *mut f64) -> Status,
    /// The k-th largest |a| (k is 1-based, k ≤ numel), by linear-time selection, not a sort.
    pub kth_largest_abs: unsafe extern "C" fn(ctx: *mut c_void, a: TensorHandle, k: usize, out: *mut f64) -> Status,
    /// `Σ_i weights[i] · ts[i]` over n same-shape tensors in one pass; `weights` may be null
    /// (all ones).
    pub weighted_sum: unsafe extern "C" fn(
        ctx: *mut c_void,
        ts: *const TensorHandle,
        weights: *const f64,
        n: usize,
        out: *mut TensorHandle,
    ) -> Status,
    /// Elementwise reduction over n same-shape tensors (`STACK_*`).
    pub reduce_stack: unsafe extern "C" fn(
        ctx: *mut c_void,
        op: StackOp,
        ts: *const TensorHandle,
        n: usize,
        out: *mut TensorHandle,
    ) -> Status,
    /// Kept for ABI 1.0/1.1 plugins; since 1.2 the same function is
    /// [`HostRandomV1::bernoulli_mask`] (extension [`HOST_EXT_RANDOM_V1`]).
    pub bernoulli_mask: BernoulliMaskFn,
    /// Matrix product of 2-D tensors.
    pub matmul:
        unsafe extern "C" fn(ctx: *mut c_void, a: TensorHandle, b: TensorHandle, out: *mut TensorHandle) -> Status,
    /// Transpose of a 2-D tensor.
    pub transpose: unsafe extern "C" fn(ctx: *mut c_void, a: TensorHandle, out: *mut TensorHandle) -> Status,
    /// Same data, new shape (same element count).
    pub reshape: unsafe extern "C" fn(
        ctx: *mut c_void,
        a: TensorHandle,
        dims: *const usize,
        rank: usize,
        out: *mut TensorHandle,
    ) -> Status,
    /// Kept for ABI 1.0/1.1 plugins; since 1.2 the same function is [`HostLinalgV1::svd`]
    /// (extension [`HOST_EXT_LINALG_V1`]).
    pub svd: SvdFn,
    /// Kept for ABI 1.0/1.1 plugins; since 1.2 the same function is [`HostLinalgV1::low_rank`].
    pub low_rank: LowRankFn,
    /// Frees a tensor made during this call before the call returns, so long computations on
    /// large tensors keep few intermediates alive. The handle is invalid afterwards; input
    /// handles may be released too.
    pub release: unsafe extern "C" fn(ctx: *mut c_void, t: TensorHandle) -> Status,
    /// Kept for ABI 1.0/1.1 plugins; since 1.2 the same function is
    /// [`HostSignConsensusV1::trim_abs`] (extension [`HOST_EXT_SIGN_CONSENSUS_V1`]).
    pub trim_abs: TrimAbsFn,
    /// Kept for ABI 1.0/1.1 plugins; since 1.2 the same function is
    /// [`HostSignConsensusV1::elect_sign`].
    pub elect_sign: ElectSignFn,
    /// Kept for ABI 1.0/1.1 plugins; since 1.2 the same function is
    /// [`HostSignConsensusV1::disjoint_merge`].
    pub disjoint_merge: DisjointMergeFn,
}

/// `|a| ≥ threshold ? a : 0`, elementwise (magnitude trim).
pub type TrimAbsFn =
    unsafe extern "C" fn(ctx: *mut c_void, a: TensorHandle, threshold: f64, out: *mut TensorHandle) -> Status;
/// Elected sign in {−1, 0, 1} per element over n same-shape tensors (`ELECT_*`).
pub type ElectSignFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    ts: *const TensorHandle,
    n: usize,
    rule: ElectRule,
    out: *mut TensorHandle,
) -> Status;
/// Disjoint aggregation (`DISJOINT_*`) over the entries whose sign equals `sign`'s (zeros never
/// agree; where `sign` is 0 nothing agrees and the result is 0).
pub type DisjointMergeFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    ts: *const TensorHandle,
    n: usize,
    sign: TensorHandle,
    op: DisjointOp,
    out: *mut TensorHandle,
) -> Status;
/// A 0/1 mask of `like`'s shape with P(1) = `keep_probability`, from a counter-based generator:
/// element j of the full tensor gets the same draw for the same `seed` whatever the device or
/// chunking (`offset` is the chunk's first element, as in `TensorInfo`).
pub type BernoulliMaskFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    like: TensorHandle,
    keep_probability: f64,
    seed: u64,
    offset: u64,
    out: *mut TensorHandle,
) -> Status;
/// A 0/1 mask of `probabilities`' shape in which element j is 1 iff the draw that
/// [`BernoulliMaskFn`] makes for element `offset + j` under `seed` is below `probabilities[j]`
/// (so a tensor filled with p gives exactly `bernoulli_mask(like, p, seed, offset)`'s mask).
/// Every probability must be finite and in [0, 1]; otherwise the call fails naming the value.
pub type BernoulliMaskPFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    probabilities: TensorHandle,
    seed: u64,
    offset: u64,
    out: *mut TensorHandle,
) -> Status;
/// Lends tensor `t`'s values (ABI 1.4): `*data` receives a pointer to its `*len` values, contiguous
/// row-major f32 in host memory, readable until the current call returns (the host keeps them
/// alive until then, even when `t` is released first); never write through it.
/// `STATUS_UNSUPPORTED` where the values are not contiguous f32 in host memory (a tensor on a
/// GPU): copy them out with `read_f32` then.
pub type ViewF32Fn =
    unsafe extern "C" fn(ctx: *mut c_void, t: TensorHandle, data: *mut *const f32, len: *mut usize) -> Status;
/// Truncated SVD of a 2-D tensor (m×n): U (m×k), S (k), Vᵀ (k×n), computed in f64; k is clamped
/// to min(m, n). Any of the outputs may be null when not wanted.
pub type SvdFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    a: TensorHandle,
    k: usize,
    out_u: *mut TensorHandle,
    out_s: *mut TensorHandle,
    out_vt: *mut TensorHandle,
) -> Status;
/// Best rank-k approximation U_k diag(S_k) V_kᵀ of a 2-D tensor (Eckart–Young).
pub type LowRankFn =
    unsafe extern "C" fn(ctx: *mut c_void, a: TensorHandle, k: usize, out: *mut TensorHandle) -> Status;

/// Id of the host extension [`HostSignConsensusV1`] (ABI 1.2): the fused operations of
/// sign-consensus methods (TIES, DARE-TIES).
pub const HOST_EXT_SIGN_CONSENSUS_V1: &str = "mergescope.host.sign-consensus.v1";
/// Id of the host extension [`HostRandomV1`] (ABI 1.2): seeded random masks.
pub const HOST_EXT_RANDOM_V1: &str = "mergescope.host.random.v1";
/// Id of the host extension [`HostRandomV2`] (ABI 1.3): seeded random masks, also with a keep
/// probability per element.
pub const HOST_EXT_RANDOM_V2: &str = "mergescope.host.random.v2";
/// Id of the host extension [`HostViewsV1`] (ABI 1.4): a tensor's f32 values lent without a copy.
pub const HOST_EXT_VIEWS_V1: &str = "mergescope.host.views.v1";
/// Id of the host extension [`HostLinalgV1`] (ABI 1.2): truncated SVD and low-rank approximation.
pub const HOST_EXT_LINALG_V1: &str = "mergescope.host.linalg.v1";
/// Id of the host extension [`HostParallelV1`] (ABI 1.2): the host's worker threads.
pub const HOST_EXT_PARALLEL_V1: &str = "mergescope.host.parallel.v1";

/// Host extension [`HOST_EXT_SIGN_CONSENSUS_V1`]. Static; call its functions with the `ctx` of the
/// `HostApiV1` it was looked up through, under that table's threading rules.
#[repr(C)]
pub struct HostSignConsensusV1 {
    /// `size_of::<HostSignConsensusV1>()` as the host knows it.
    pub struct_size: usize,
    /// Magnitude trim (see [`TrimAbsFn`]).
    pub trim_abs: TrimAbsFn,
    /// Sign election (see [`ElectSignFn`]).
    pub elect_sign: ElectSignFn,
    /// Disjoint aggregation (see [`DisjointMergeFn`]).
    pub disjoint_merge: DisjointMergeFn,
}

/// Host extension [`HOST_EXT_RANDOM_V1`]. Static; called like [`HostSignConsensusV1`]'s.
#[repr(C)]
pub struct HostRandomV1 {
    /// `size_of::<HostRandomV1>()` as the host knows it.
    pub struct_size: usize,
    /// Seeded Bernoulli mask (see [`BernoulliMaskFn`]).
    pub bernoulli_mask: BernoulliMaskFn,
}

/// Host extension [`HOST_EXT_RANDOM_V2`] (ABI 1.3): [`HostRandomV1`]'s function and
/// `bernoulli_mask_p`, over the same counter-based draws. Static; called like
/// [`HostSignConsensusV1`]'s.
#[repr(C)]
pub struct HostRandomV2 {
    /// `size_of::<HostRandomV2>()` as the host knows it.
    pub struct_size: usize,
    /// Seeded Bernoulli mask with one keep probability (see [`BernoulliMaskFn`]).
    pub bernoulli_mask: BernoulliMaskFn,
    /// Seeded Bernoulli mask with a keep probability per element (see [`BernoulliMaskPFn`]).
    pub bernoulli_mask_p: BernoulliMaskPFn,
}

/// Host extension [`HOST_EXT_VIEWS_V1`] (ABI 1.4). Static; called like [`HostSignConsensusV1`]'s.
#[repr(C)]
pub struct HostViewsV1 {
    /// `size_of::<HostViewsV1>()` as the host knows it.
    pub struct_size: usize,
    /// Lends a tensor's values (see [`ViewF32Fn`]).
    pub view_f32: ViewF32Fn,
}

/// Host extension [`HOST_EXT_LINALG_V1`]. Static; called like [`HostSignConsensusV1`]'s.
#[repr(C)]
pub struct HostLinalgV1 {
    /// `size_of::<HostLinalgV1>()` as the host knows it.
    pub struct_size: usize,
    /// Truncated SVD (see [`SvdFn`]).
    pub svd: SvdFn,
    /// Best rank-k approximation (see [`LowRankFn`]).
    pub low_rank: LowRankFn,
}

/// One job of `HostParallelV1::parallel_for`: works on item `index` with the plugin's `user`
/// data. It runs on a host worker thread and must not call any host function.
pub type ParallelJob = unsafe extern "C" fn(user: *mut c_void, index: usize) -> Status;

/// Host extension [`HOST_EXT_PARALLEL_V1`]: lends the host's worker threads to a plugin for
/// plain computation on its own data (statistics over a copied tensor), so plugins keep no
/// thread pools of their own and honour the user's thread setting.
#[repr(C)]
pub struct HostParallelV1 {
    /// `size_of::<HostParallelV1>()` as the host knows it.
    pub struct_size: usize,
    /// How many threads `parallel_for` runs jobs on (at least 1).
    pub threads: unsafe extern "C" fn(ctx: *mut c_void) -> usize,
    /// Calls `job(user, i)` for every i in `0..n`, on up to `threads` threads, and returns when
    /// all have returned: `STATUS_OK`, or the first failing job's status (jobs not yet started
    /// are then skipped), or `STATUS_CANCELLED` when the user cancelled.
    pub parallel_for: unsafe extern "C" fn(ctx: *mut c_void, n: usize, job: ParallelJob, user: *mut c_void) -> Status,
}

/// Objectives for `SessionApiV1::loss_and_grad`.
pub type Objective = u32;
/// Mean cross-entropy against the labels of the calibration examples.
pub const OBJECTIVE_CROSS_ENTROPY: Objective = 0;
/// Mean entropy of the predicted class distribution; uses no labels (AdaMerging's objective).
pub const OBJECTIVE_ENTROPY: Objective = 1;

/// Optimisers for `SessionApiV1::finetune`.
pub type OptimizerKind = u32;
/// Plain stochastic gradient descent.
pub const OPTIMIZER_SGD: OptimizerKind = 0;
/// SGD with momentum 0.9.
pub const OPTIMIZER_MOMENTUM: OptimizerKind = 1;
/// AdamW (β = 0.9, 0.999).
pub const OPTIMIZER_ADAMW: OptimizerKind = 2;

/// `task` argument of session functions that stands for every task: `evaluate` then gives the
/// means over tasks and `loss_and_grad` the sum of the per-task objectives.
pub const ALL_TASKS: usize = usize::MAX;

/// Loss and accuracy of a candidate model, written by `SessionApiV1::evaluate`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EvalMetrics {
    /// `size_of::<EvalMetrics>()` as the plugin knows it.
    pub struct_size: usize,
    /// Mean cross-entropy.
    pub loss: f64,
    /// Fraction classified correctly.
    pub accuracy: f64,
    /// Examples evaluated.
    pub examples: u64,
}

/// Settings of `SessionApiV1::finetune`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FinetuneOptions {
    /// `size_of::<FinetuneOptions>()` as the plugin knows it.
    pub struct_size: usize,
    /// Optimiser steps.
    pub steps: u64,
    /// Learning rate.
    pub learning_rate: f64,
    /// Examples per step (0: the whole training split, full-batch gradient descent).
    pub batch_size: u64,
    /// One of the `OPTIMIZER_*` values.
    pub optimizer: OptimizerKind,
    /// Decoupled weight decay (AdamW only).
    pub weight_decay: f64,
    /// Seed of the batch order.
    pub seed: u64,
}

/// The session a model-level method runs in (ABI 1.1): whole models as tensor handles, the
/// tasks' calibration data, and training services. A *candidate* is an array of
/// `tensor_count` handles in the session's tensor order (base, experts and results all use it).
///
/// Data: `evaluate` and `loss_and_grad` use each task's calibration examples (the first ones of
/// its train split, 100 by default), `finetune` its train split; no function touches the test
/// split, which is kept for the final evaluation.
///
/// Threading and lifetime as in [`HostApiV1`]: call only on the thread inside `run_model`, with
/// the pointer it received. Handles live until `run_model` returns or until released (by
/// `HostApiV1::release` or `release_since`).
#[repr(C)]
pub struct SessionApiV1 {
    /// `size_of::<SessionApiV1>()` as the host knows it.
    pub struct_size: usize,
    /// Host state; pass it back as the first argument of every function.
    pub ctx: *mut c_void,
    /// Number of tensors of a candidate.
    pub tensor_count: unsafe extern "C" fn(ctx: *mut c_void) -> usize,
    /// Name, role and shape of tensor `index` (`offset` 0, `count` = `tensor_count`); the
    /// pointers in `out` stay valid until `run_model` returns.
    pub tensor_info: unsafe extern "C" fn(ctx: *mut c_void, index: usize, out: *mut TensorInfo) -> Status,
    /// Number of experts; expert t was fine-tuned on task t.
    pub expert_count: unsafe extern "C" fn(ctx: *mut c_void) -> usize,
    /// Name of task `task` (valid until `run_model` returns).
    pub task_name: unsafe extern "C" fn(ctx: *mut c_void, task: usize, out: *mut Str) -> Status,
    /// A handle to tensor `index` of the base model.
    pub base_tensor: unsafe extern "C" fn(ctx: *mut c_void, index: usize, out: *mut TensorHandle) -> Status,
    /// A handle to tensor `index` of expert `expert`.
    pub expert_tensor:
        unsafe extern "C" fn(ctx: *mut c_void, expert: usize, index: usize, out: *mut TensorHandle) -> Status,
    /// Loss and accuracy of `candidate` on the calibration examples of `task` (or
    /// [`ALL_TASKS`]: means over tasks).
    pub evaluate: unsafe extern "C" fn(
        ctx: *mut c_void,
        candidate: *const TensorHandle,
        n: usize,
        task: usize,
        out: *mut EvalMetrics,
    ) -> Status,
    /// The objective (`OBJECTIVE_*`) of `candidate` on the calibration examples of `task` (or
    /// the sum over tasks for [`ALL_TASKS`]) and, when `grads` is not null, its gradient with
    /// respect to every candidate tensor (`n` handles written to `grads`).
    pub loss_and_grad: unsafe extern "C" fn(
        ctx: *mut c_void,
        candidate: *const TensorHandle,
        n: usize,
        task: usize,
        objective: Objective,
        loss: *mut f64,
        grads: *mut TensorHandle,
    ) -> Status,
    /// Fine-tunes `candidate` on the train split of `task` with that task's frozen head; writes
    /// the `n` tensors of the result to `out`.
    pub finetune: unsafe extern "C" fn(
        ctx: *mut c_void,
        candidate: *const TensorHandle,
        n: usize,
        task: usize,
        options: *const FinetuneOptions,
        out: *mut TensorHandle,
    ) -> Status,
    /// Records `candidate` as the next iterate of the method's trajectory, with a label and a
    /// JSON object of metrics (may be empty). The last iterate is the partial result kept when
    /// the run is cancelled.
    pub report_iterate: unsafe extern "C" fn(
        ctx: *mut c_void,
        candidate: *const TensorHandle,
        n: usize,
        label: Str,
        metrics_json: Str,
    ) -> Status,
    /// A mark of the handles made so far, for `release_since`.
    pub mark: unsafe extern "C" fn(ctx: *mut c_void) -> u64,
    /// Releases every handle made after `mark` except the `n_keep` handles in `keep`, so an
    /// iterative method keeps its memory flat.
    pub release_since:
        unsafe extern "C" fn(ctx: *mut c_void, mark: u64, keep: *const TensorHandle, n_keep: usize) -> Status,
    /// Looks up an optional session extension by id; null when the host has none.
    pub get_extension: unsafe extern "C" fn(ctx: *mut c_void, id: Str) -> *const c_void,
}

/// Id of the diagonal-Fisher session extension ([`SessionFisherV1`]), for
/// `SessionApiV1::get_extension`.
pub const SESSION_EXT_FISHER_V1: &str = "mergescope.session.fisher.v1";

/// Which label the Fisher extension differentiates the log-likelihood of.
pub type FisherLabels = u32;
/// The example's true label (the empirical Fisher).
pub const FISHER_LABELS_TRUE: FisherLabels = 0;
/// The candidate's own prediction (argmax; uses no labels).
pub const FISHER_LABELS_PREDICTED: FisherLabels = 1;

/// Session extension [`SESSION_EXT_FISHER_V1`]: the diagonal Fisher information of a candidate,
/// for Fisher-weighted averaging. Static; call its functions with the session's `ctx`, under the
/// session's threading rules.
#[repr(C)]
pub struct SessionFisherV1 {
    /// `size_of::<SessionFisherV1>()` as the host knows it.
    pub struct_size: usize,
    /// Mean over the calibration examples of `task` of the squared per-example gradient of
    /// log p(y | x) with respect to every candidate tensor (`labels`: which y); writes `n`
    /// handles to `out`.
    pub diag_fisher: unsafe extern "C" fn(
        ctx: *mut c_void,
        candidate: *const TensorHandle,
        n: usize,
        task: usize,
        labels: FisherLabels,
        out: *mut TensorHandle,
    ) -> Status,
}

/// Id of the mini-batch session extension ([`SessionMinibatchV1`]), for
/// `SessionApiV1::get_extension`.
pub const SESSION_EXT_MINIBATCH_V1: &str = "mergescope.session.minibatch.v1";

/// Which calibration examples a mini-batch call uses: for each task, batch `step` of a seeded
/// shuffle of its calibration examples, `size` per batch (the examples are reshuffled every
/// epoch, and an epoch's last batch may be short). A function of (`size`, `seed`, task, `step`)
/// alone, so a run is reproducible and resumable.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Minibatch {
    /// `size_of::<Minibatch>()` as the plugin knows it.
    pub struct_size: usize,
    /// Examples per task and batch (at least 1; the whole calibration set when larger).
    pub size: u64,
    /// Seed of the shuffles.
    pub seed: u64,
    /// Batch number, 0-based (optimisation step).
    pub step: u64,
}

/// Session extension [`SESSION_EXT_MINIBATCH_V1`]: the calibration objective on a mini-batch,
/// for stochastic methods (AdaMerging's batches of 16 per task) whose full-batch gradient costs a
/// pass over every calibration example. Static; call its functions with the session's `ctx`,
/// under the session's threading rules.
#[repr(C)]
pub struct SessionMinibatchV1 {
    /// `size_of::<SessionMinibatchV1>()` as the host knows it.
    pub struct_size: usize,
    /// As `SessionApiV1::loss_and_grad`, on `batch`'s examples of each task only: the mean
    /// objective over the batch of `task` (or the sum of the tasks' means for [`ALL_TASKS`]).
    pub loss_and_grad: unsafe extern "C" fn(
        ctx: *mut c_void,
        candidate: *const TensorHandle,
        n: usize,
        task: usize,
        objective: Objective,
        batch: *const Minibatch,
        loss: *mut f64,
        grads: *mut TensorHandle,
    ) -> Status,
}

/// The plugin's table, returned by the entry function. Static for the life of the process.
#[repr(C)]
pub struct PluginApiV1 {
    /// `size_of::<PluginApiV1>()` as the plugin knows it.
    pub struct_size: usize,
    /// Stable id, lowercase with dashes (`task-arithmetic`); what users type after `--method`.
    pub id: Str,
    /// Display name.
    pub name: Str,
    /// Plugin version (semver), recorded in every output.
    pub version: Str,
    /// One-line description.
    pub description: Str,
    /// Help text: the algorithm, its parameters, and the choices made where references differ.
    pub help: Str,
    /// `KIND_PER_TENSOR` or `KIND_MODEL_LEVEL`.
    pub kind: PluginKind,
    /// `CAP_*` bits.
    pub capabilities: u64,
    /// JSON array describing the parameters (see the README for the format).
    pub params_schema_json: Str,

    /// Creates an instance for one merge of `n_experts` experts. `params` holds every schema
    /// parameter, validated, defaults filled. Writes the instance to `out`.
    pub create: unsafe extern "C" fn(
        host: *const HostApiV1,
        params: *const ParamValue,
        n_params: usize,
        n_experts: usize,
        seed: u64,
        out: *mut *mut c_void,
    ) -> Status,
    /// Frees an instance made by `create`.
    pub destroy: unsafe extern "C" fn(instance: *mut c_void),
    /// Optional: number of statistics passes over the model the instance needs before merging
    /// (0 when null). Methods with model-wide statistics (global TIES trimming) use it.
    pub prepare_passes: Option<unsafe extern "C" fn(instance: *mut c_void) -> u32>,
    /// Optional: one tensor of statistics pass `pass` (0-based). Handles as in `merge_tensor`.
    pub prepare_tensor: Option<
        unsafe extern "C" fn(
            instance: *mut c_void,
            host: *const HostApiV1,
            pass: u32,
            info: *const TensorInfo,
            base: TensorHandle,
            experts: *const TensorHandle,
            n_experts: usize,
        ) -> Status,
    >,
    /// Optional: called after every tensor of pass `pass` was seen.
    pub finish_pass: Option<unsafe extern "C" fn(instance: *mut c_void, host: *const HostApiV1, pass: u32) -> Status>,
    /// Merges one tensor (or chunk, see `CAP_ELEMENTWISE`); writes the result to `out`, which
    /// must have the shape of `base`. `base` is 0 when the method runs without a base.
    pub merge_tensor: unsafe extern "C" fn(
        instance: *mut c_void,
        host: *const HostApiV1,
        info: *const TensorInfo,
        base: TensorHandle,
        experts: *const TensorHandle,
        n_experts: usize,
        out: *mut TensorHandle,
    ) -> Status,
    /// Optional: looks up a plugin extension by id (model-level session tables, later features).
    pub get_extension: Option<unsafe extern "C" fn(id: Str) -> *const c_void>,
    /// Optional: capabilities of this instance when they depend on its parameters (for example
    /// `CAP_ELEMENTWISE` only for some settings); the static `capabilities` when null.
    pub instance_capabilities: Option<unsafe extern "C" fn(instance: *mut c_void) -> u64>,
    /// ABI 1.1; required for `KIND_MODEL_LEVEL`, null for per-tensor methods. Runs the whole
    /// merge in `session` and writes the `n_out` (= `tensor_count`) handles of the merged model
    /// to `out`.
    pub run_model: Option<
        unsafe extern "C" fn(
            instance: *mut c_void,
            host: *const HostApiV1,
            session: *const SessionApiV1,
            out: *mut TensorHandle,
            n_out: usize,
        ) -> Status,
    >,
    /// ABI 1.5, optional: called after statistics pass `pass` saw every chunk of the tensor `info`
    /// describes (its offset is 0), with [`CAP_TENSOR_STATISTICS`] before that tensor's merge.
    pub finish_tensor: Option<
        unsafe extern "C" fn(
            instance: *mut c_void,
            host: *const HostApiV1,
            pass: u32,
            info: *const TensorInfo,
        ) -> Status,
    >,
}

/// Signature of the entry function exported as [`ENTRY_SYMBOL_V1`].
pub type EntryV1 = unsafe extern "C" fn() -> *const PluginApiV1;

/// Byte size of the v1.0 prefix of [`PluginApiV1`] (through `instance_capabilities`): the
/// smallest table a host accepts. Pinned to the 1.0 layout, so fields appended in later minor
/// versions do not make 1.0 plugins look too short.
pub const PLUGIN_API_V1_MIN_SIZE: usize =
    core::mem::offset_of!(PluginApiV1, instance_capabilities) + core::mem::size_of::<usize>();

/// Byte size of the v1.1 prefix of [`PluginApiV1`] (through `run_model`): the smallest table of a
/// model-level plugin.
pub const PLUGIN_API_V1_1_MIN_SIZE: usize =
    core::mem::offset_of!(PluginApiV1, run_model) + core::mem::size_of::<usize>();

/// Byte size of the v1.5 prefix of [`PluginApiV1`] (through `finish_tensor`): a host reads
/// `finish_tensor` only from tables at least this long.
pub const PLUGIN_API_V1_5_MIN_SIZE: usize =
    core::mem::offset_of!(PluginApiV1, finish_tensor) + core::mem::size_of::<usize>();

// SAFETY: the tables hold pointers to 'static data and functions only; they are immutable.
unsafe impl Sync for PluginApiV1 {}
// SAFETY: as above.
unsafe impl Send for PluginApiV1 {}
// SAFETY: the header holds plain data.
unsafe impl Sync for PluginHeader {}
