//! Keeps `plugin-api/include/mergescope_plugin.h` in sync with `plugin-api/src/abi.rs`.
//!
//! `tests/c/layout_probe.c` (built by `tests/build.rs`) reports, from the C side, the size and
//! alignment of every type, the offset and size of every struct field and the value of every
//! constant; this test computes the same facts from the Rust definitions and compares them.
//!
//! Nothing can be added on one side only:
//! - Rust structs are destructured exhaustively, with every field's type spelt out, in
//!   [`rust_facts`]: a field added to, removed from or retyped in `abi.rs` fails to compile here;
//! - C structs are initialised positionally with one typed value per field in the probe, which
//!   is built with warnings as errors: a field added to, removed from or retyped in the header
//!   fails the build;
//! - every `pub const`, `pub struct` and `pub type` of `abi.rs` and every `#define MS_*` and
//!   `typedef` of the header must appear in the facts (checked by scanning both sources);
//! - a field present in one list but not the other shows up as a missing key.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use mergescope_plugin_api::abi::*;
use std::collections::BTreeMap;
use std::ffi::{CStr, c_char, c_void};
use std::mem::{align_of, offset_of, size_of};

const ABI_RS: &str = include_str!("../../../plugin-api/src/abi.rs");
const HEADER: &str = include_str!("../../../plugin-api/include/mergescope_plugin.h");

/// Macros of the header that are helpers, not mirrors of something in abi.rs.
const HEADER_HELPERS: &[&str] = &[
    "MS_EXPORT",
    "MS_EXTERN_C",
    "MS_MAGIC_INIT",
    "MS_STR_LIT",
    "MS_DEFINE_PLUGIN_HEADER",
];

/// Rust type name → C type name.
const TYPE_NAMES: &[(&str, &str)] = &[
    ("Status", "ms_status"),
    ("TensorHandle", "ms_tensor_handle"),
    ("PluginKind", "ms_plugin_kind"),
    ("TensorRole", "ms_tensor_role"),
    ("ParamKind", "ms_param_kind"),
    ("LogLevel", "ms_log_level"),
    ("BinaryOp", "ms_binary_op"),
    ("UnaryOp", "ms_unary_op"),
    ("ReduceOp", "ms_reduce_op"),
    ("StackOp", "ms_stack_op"),
    ("ElectRule", "ms_elect_rule"),
    ("DisjointOp", "ms_disjoint_op"),
    ("Objective", "ms_objective"),
    ("OptimizerKind", "ms_optimizer_kind"),
    ("EntryV1", "ms_entry_v1_fn"),
    ("Str", "ms_str"),
    ("PluginHeader", "ms_plugin_header"),
    ("ParamValue", "ms_param_value"),
    ("TensorInfo", "ms_tensor_info"),
    ("HostApiV1", "ms_host_api_v1"),
    ("PluginApiV1", "ms_plugin_api_v1"),
    ("EvalMetrics", "ms_eval_metrics"),
    ("FinetuneOptions", "ms_finetune_options"),
    ("SessionApiV1", "ms_session_api_v1"),
    ("FisherLabels", "ms_fisher_labels"),
    ("SessionFisherV1", "ms_session_fisher_v1"),
    ("Minibatch", "ms_minibatch"),
    ("SessionMinibatchV1", "ms_session_minibatch_v1"),
    ("TrimAbsFn", "ms_trim_abs_fn"),
    ("ElectSignFn", "ms_elect_sign_fn"),
    ("DisjointMergeFn", "ms_disjoint_merge_fn"),
    ("BernoulliMaskFn", "ms_bernoulli_mask_fn"),
    ("BernoulliMaskPFn", "ms_bernoulli_mask_p_fn"),
    ("ViewF32Fn", "ms_view_f32_fn"),
    ("SvdFn", "ms_svd_fn"),
    ("LowRankFn", "ms_low_rank_fn"),
    ("ParallelJob", "ms_parallel_job_fn"),
    ("HostSignConsensusV1", "ms_host_sign_consensus_v1"),
    ("HostRandomV1", "ms_host_random_v1"),
    ("HostRandomV2", "ms_host_random_v2"),
    ("HostViewsV1", "ms_host_views_v1"),
    ("HostLinalgV1", "ms_host_linalg_v1"),
    ("HostParallelV1", "ms_host_parallel_v1"),
];

/// One fact from the C probe (mirrors `ms_probe_entry` in layout_probe.c).
#[repr(C)]
struct ProbeEntry {
    key: *const c_char,
    value: i64,
    bytes: *const u8,
    bytes_len: usize,
}

#[link(name = "mergescope_layout_probe", kind = "static")]
unsafe extern "C" {
    fn ms_probe_entries(n: *mut usize) -> *const ProbeEntry;
    fn ms_probe_magic_init() -> *const u8;
    fn ms_probe_struct_sizes() -> usize;
}

/// A fact's value: a number, or the bytes of a string constant.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Value {
    Int(i64),
    Bytes(Vec<u8>),
}

fn c_facts() -> BTreeMap<String, Value> {
    let mut n = 0usize;
    // SAFETY: the probe returns a pointer to its static array and writes its length.
    let ptr = unsafe { ms_probe_entries(&mut n) };
    assert!(!ptr.is_null() && n > 0, "the probe returned no entries");
    // SAFETY: `n` entries of a static array.
    let entries = unsafe { std::slice::from_raw_parts(ptr, n) };
    let mut facts = BTreeMap::new();
    for e in entries {
        // SAFETY: keys are NUL-terminated string literals.
        let key = unsafe { CStr::from_ptr(e.key) }
            .to_str()
            .expect("probe key is UTF-8")
            .to_owned();
        let value = if e.bytes.is_null() {
            Value::Int(e.value)
        } else {
            // SAFETY: `bytes_len` bytes of a string literal.
            Value::Bytes(unsafe { std::slice::from_raw_parts(e.bytes, e.bytes_len) }.to_vec())
        };
        assert!(
            facts.insert(key.clone(), value).is_none(),
            "the probe reports {key} twice"
        );
    }
    facts
}

fn c_name(rust: &str) -> &'static str {
    TYPE_NAMES
        .iter()
        .find(|(r, _)| *r == rust)
        .map(|(_, c)| *c)
        .unwrap_or_else(|| panic!("abi.rs type {rust} has no C name in TYPE_NAMES"))
}

/// An integer type alias: size, alignment and signedness.
macro_rules! int_type {
    ($facts:ident, $ty:ident) => {{
        let c = c_name(stringify!($ty));
        $facts.insert(format!("size {c}"), Value::Int(size_of::<$ty>() as i64));
        $facts.insert(format!("align {c}"), Value::Int(align_of::<$ty>() as i64));
        $facts.insert(format!("signed {c}"), Value::Int(i64::from(<$ty>::MIN != 0)));
    }};
}

/// A struct: size, alignment, and offset and size of every field. The field list must be
/// complete and typed: the pinning function destructures the struct exhaustively.
macro_rules! layout {
    ($facts:ident, $ty:ident { $($field:ident : $fty:ty),* $(,)? }) => {{
        #[allow(dead_code)]
        fn pin(v: &$ty) {
            let $ty { $($field),* } = v;
            $( let _: &$fty = $field; )*
        }
        let c = c_name(stringify!($ty));
        $facts.insert(format!("size {c}"), Value::Int(size_of::<$ty>() as i64));
        $facts.insert(format!("align {c}"), Value::Int(align_of::<$ty>() as i64));
        $(
            $facts.insert(
                format!("offset {c}.{}", stringify!($field)),
                Value::Int(offset_of!($ty, $field) as i64),
            );
            $facts.insert(format!("size {c}.{}", stringify!($field)), Value::Int(size_of::<$fty>() as i64));
        )*
    }};
}

/// A function-pointer type alias: size and alignment, with its signature pinned.
macro_rules! fn_type {
    ($facts:ident, $ty:ident = $sig:ty) => {{
        #[allow(dead_code)]
        fn pin(f: $ty) -> $sig {
            f
        }
        let c = c_name(stringify!($ty));
        $facts.insert(format!("size {c}"), Value::Int(size_of::<$ty>() as i64));
        $facts.insert(format!("align {c}"), Value::Int(align_of::<$ty>() as i64));
    }};
}

/// Integer constants.
macro_rules! consts {
    ($facts:ident, $($name:ident),* $(,)?) => {{
        $( $facts.insert(format!("const MS_{}", stringify!($name)), Value::Int($name as i64)); )*
    }};
}

type Ctx = *mut c_void;
type H = TensorHandle;

fn rust_facts() -> BTreeMap<String, Value> {
    let mut f = BTreeMap::new();

    int_type!(f, Status);
    int_type!(f, TensorHandle);
    int_type!(f, PluginKind);
    int_type!(f, TensorRole);
    int_type!(f, ParamKind);
    int_type!(f, LogLevel);
    int_type!(f, BinaryOp);
    int_type!(f, UnaryOp);
    int_type!(f, ReduceOp);
    int_type!(f, StackOp);
    int_type!(f, ElectRule);
    int_type!(f, DisjointOp);
    int_type!(f, Objective);
    int_type!(f, OptimizerKind);
    int_type!(f, FisherLabels);

    #[allow(dead_code)]
    fn pin_entry(e: EntryV1) -> unsafe extern "C" fn() -> *const PluginApiV1 {
        e
    }
    f.insert("size ms_entry_v1_fn".into(), Value::Int(size_of::<EntryV1>() as i64));
    f.insert("align ms_entry_v1_fn".into(), Value::Int(align_of::<EntryV1>() as i64));

    layout!(f, Str { ptr: *const u8, len: usize });
    layout!(
        f,
        PluginHeader {
            magic: [u8; 8],
            abi_major: u32,
            abi_minor: u32
        }
    );
    layout!(f, ParamValue {
        name: Str,
        kind: ParamKind,
        number: f64,
        integer: i64,
        text: Str,
        list: *const f64,
        list_len: usize,
    });
    layout!(f, TensorInfo {
        struct_size: usize,
        name: Str,
        role: TensorRole,
        index: usize,
        count: usize,
        offset: u64,
        full_numel: u64,
        full_shape: *const usize,
        full_rank: usize,
    });
    layout!(f, HostApiV1 {
        struct_size: usize,
        abi_major: u32,
        abi_minor: u32,
        ctx: Ctx,
        log: unsafe extern "C" fn(Ctx, LogLevel, Str),
        report_progress: unsafe extern "C" fn(Ctx, f64),
        is_cancelled: unsafe extern "C" fn(Ctx) -> i32,
        set_error: unsafe extern "C" fn(Ctx, Str),
        get_extension: unsafe extern "C" fn(Ctx, Str) -> *const c_void,
        shape: unsafe extern "C" fn(Ctx, H, *mut usize, usize, *mut usize) -> Status,
        numel: unsafe extern "C" fn(Ctx, H, *mut usize) -> Status,
        read_f32: unsafe extern "C" fn(Ctx, H, *mut f32, usize) -> Status,
        from_f32: unsafe extern "C" fn(Ctx, *const f32, usize, *const usize, usize, *mut H) -> Status,
        full_like: unsafe extern "C" fn(Ctx, H, f64, *mut H) -> Status,
        binary: unsafe extern "C" fn(Ctx, BinaryOp, H, H, *mut H) -> Status,
        unary: unsafe extern "C" fn(Ctx, UnaryOp, H, *mut H) -> Status,
        affine: unsafe extern "C" fn(Ctx, H, f64, f64, *mut H) -> Status,
        compare_scalar: unsafe extern "C" fn(Ctx, BinaryOp, H, f64, *mut H) -> Status,
        select: unsafe extern "C" fn(Ctx, H, H, H, *mut H) -> Status,
        reduce: unsafe extern "C" fn(Ctx, ReduceOp, H, *mut f64) -> Status,
        dot: unsafe extern "C" fn(Ctx, H, H, *mut f64) -> Status,
        kth_largest_abs: unsafe extern "C" fn(Ctx, H, usize, *mut f64) -> Status,
        weighted_sum: unsafe extern "C" fn(Ctx, *const H, *const f64, usize, *mut H) -> Status,
        reduce_stack: unsafe extern "C" fn(Ctx, StackOp, *const H, usize, *mut H) -> Status,
        bernoulli_mask: unsafe extern "C" fn(Ctx, H, f64, u64, u64, *mut H) -> Status,
        matmul: unsafe extern "C" fn(Ctx, H, H, *mut H) -> Status,
        transpose: unsafe extern "C" fn(Ctx, H, *mut H) -> Status,
        reshape: unsafe extern "C" fn(Ctx, H, *const usize, usize, *mut H) -> Status,
        svd: unsafe extern "C" fn(Ctx, H, usize, *mut H, *mut H, *mut H) -> Status,
        low_rank: unsafe extern "C" fn(Ctx, H, usize, *mut H) -> Status,
        release: unsafe extern "C" fn(Ctx, H) -> Status,
        trim_abs: unsafe extern "C" fn(Ctx, H, f64, *mut H) -> Status,
        elect_sign: unsafe extern "C" fn(Ctx, *const H, usize, ElectRule, *mut H) -> Status,
        disjoint_merge: unsafe extern "C" fn(Ctx, *const H, usize, H, DisjointOp, *mut H) -> Status,
    });
    layout!(f, PluginApiV1 {
        struct_size: usize,
        id: Str,
        name: Str,
        version: Str,
        description: Str,
        help: Str,
        kind: PluginKind,
        capabilities: u64,
        params_schema_json: Str,
        create: unsafe extern "C" fn(*const HostApiV1, *const ParamValue, usize, usize, u64, *mut Ctx) -> Status,
        destroy: unsafe extern "C" fn(Ctx),
        prepare_passes: Option<unsafe extern "C" fn(Ctx) -> u32>,
        prepare_tensor: Option<
            unsafe extern "C" fn(Ctx, *const HostApiV1, u32, *const TensorInfo, H, *const H, usize) -> Status,
        >,
        finish_pass: Option<unsafe extern "C" fn(Ctx, *const HostApiV1, u32) -> Status>,
        merge_tensor:
            unsafe extern "C" fn(Ctx, *const HostApiV1, *const TensorInfo, H, *const H, usize, *mut H) -> Status,
        get_extension: Option<unsafe extern "C" fn(Str) -> *const c_void>,
        instance_capabilities: Option<unsafe extern "C" fn(Ctx) -> u64>,
        run_model: Option<unsafe extern "C" fn(Ctx, *const HostApiV1, *const SessionApiV1, *mut H, usize) -> Status>,
        finish_tensor: Option<unsafe extern "C" fn(Ctx, *const HostApiV1, u32, *const TensorInfo) -> Status>,
    });
    layout!(
        f,
        EvalMetrics {
            struct_size: usize,
            loss: f64,
            accuracy: f64,
            examples: u64,
        }
    );
    layout!(
        f,
        FinetuneOptions {
            struct_size: usize,
            steps: u64,
            learning_rate: f64,
            batch_size: u64,
            optimizer: OptimizerKind,
            weight_decay: f64,
            seed: u64,
        }
    );
    layout!(f, SessionApiV1 {
        struct_size: usize,
        ctx: Ctx,
        tensor_count: unsafe extern "C" fn(Ctx) -> usize,
        tensor_info: unsafe extern "C" fn(Ctx, usize, *mut TensorInfo) -> Status,
        expert_count: unsafe extern "C" fn(Ctx) -> usize,
        task_name: unsafe extern "C" fn(Ctx, usize, *mut Str) -> Status,
        base_tensor: unsafe extern "C" fn(Ctx, usize, *mut H) -> Status,
        expert_tensor: unsafe extern "C" fn(Ctx, usize, usize, *mut H) -> Status,
        evaluate: unsafe extern "C" fn(Ctx, *const H, usize, usize, *mut EvalMetrics) -> Status,
        loss_and_grad: unsafe extern "C" fn(Ctx, *const H, usize, usize, Objective, *mut f64, *mut H) -> Status,
        finetune: unsafe extern "C" fn(Ctx, *const H, usize, usize, *const FinetuneOptions, *mut H) -> Status,
        report_iterate: unsafe extern "C" fn(Ctx, *const H, usize, Str, Str) -> Status,
        mark: unsafe extern "C" fn(Ctx) -> u64,
        release_since: unsafe extern "C" fn(Ctx, u64, *const H, usize) -> Status,
        get_extension: unsafe extern "C" fn(Ctx, Str) -> *const c_void,
    });
    layout!(f, SessionFisherV1 {
        struct_size: usize,
        diag_fisher: unsafe extern "C" fn(Ctx, *const H, usize, usize, FisherLabels, *mut H) -> Status,
    });
    f.insert(
        "str MS_SESSION_EXT_FISHER_V1".into(),
        Value::Bytes(SESSION_EXT_FISHER_V1.as_bytes().to_vec()),
    );
    layout!(
        f,
        Minibatch {
            struct_size: usize,
            size: u64,
            seed: u64,
            step: u64,
        }
    );
    layout!(f, SessionMinibatchV1 {
        struct_size: usize,
        loss_and_grad: unsafe extern "C" fn(Ctx, *const H, usize, usize, Objective, *const Minibatch, *mut f64, *mut H) -> Status,
    });
    f.insert(
        "str MS_SESSION_EXT_MINIBATCH_V1".into(),
        Value::Bytes(SESSION_EXT_MINIBATCH_V1.as_bytes().to_vec()),
    );

    fn_type!(f, TrimAbsFn = unsafe extern "C" fn(Ctx, H, f64, *mut H) -> Status);
    fn_type!(f, ElectSignFn = unsafe extern "C" fn(Ctx, *const H, usize, ElectRule, *mut H) -> Status);
    fn_type!(f, DisjointMergeFn = unsafe extern "C" fn(Ctx, *const H, usize, H, DisjointOp, *mut H) -> Status);
    fn_type!(f, BernoulliMaskFn = unsafe extern "C" fn(Ctx, H, f64, u64, u64, *mut H) -> Status);
    fn_type!(f, BernoulliMaskPFn = unsafe extern "C" fn(Ctx, H, u64, u64, *mut H) -> Status);
    fn_type!(f, ViewF32Fn = unsafe extern "C" fn(Ctx, H, *mut *const f32, *mut usize) -> Status);
    fn_type!(f, SvdFn = unsafe extern "C" fn(Ctx, H, usize, *mut H, *mut H, *mut H) -> Status);
    fn_type!(f, LowRankFn = unsafe extern "C" fn(Ctx, H, usize, *mut H) -> Status);
    fn_type!(f, ParallelJob = unsafe extern "C" fn(Ctx, usize) -> Status);
    for (name, id) in [
        ("MS_HOST_EXT_SIGN_CONSENSUS_V1", HOST_EXT_SIGN_CONSENSUS_V1),
        ("MS_HOST_EXT_RANDOM_V1", HOST_EXT_RANDOM_V1),
        ("MS_HOST_EXT_RANDOM_V2", HOST_EXT_RANDOM_V2),
        ("MS_HOST_EXT_VIEWS_V1", HOST_EXT_VIEWS_V1),
        ("MS_HOST_EXT_LINALG_V1", HOST_EXT_LINALG_V1),
        ("MS_HOST_EXT_PARALLEL_V1", HOST_EXT_PARALLEL_V1),
    ] {
        f.insert(format!("str {name}"), Value::Bytes(id.as_bytes().to_vec()));
    }
    layout!(
        f,
        HostSignConsensusV1 {
            struct_size: usize,
            trim_abs: TrimAbsFn,
            elect_sign: ElectSignFn,
            disjoint_merge: DisjointMergeFn,
        }
    );
    layout!(
        f,
        HostRandomV1 {
            struct_size: usize,
            bernoulli_mask: BernoulliMaskFn,
        }
    );
    layout!(
        f,
        HostRandomV2 {
            struct_size: usize,
            bernoulli_mask: BernoulliMaskFn,
            bernoulli_mask_p: BernoulliMaskPFn,
        }
    );
    layout!(
        f,
        HostViewsV1 {
            struct_size: usize,
            view_f32: ViewF32Fn,
        }
    );
    layout!(
        f,
        HostLinalgV1 {
            struct_size: usize,
            svd: SvdFn,
            low_rank: LowRankFn,
        }
    );
    layout!(f, HostParallelV1 {
        struct_size: usize,
        threads: unsafe extern "C" fn(Ctx) -> usize,
        parallel_for: unsafe extern "C" fn(Ctx, usize, ParallelJob, Ctx) -> Status,
    });

    f.insert("str MS_MAGIC".into(), Value::Bytes(MAGIC.to_vec()));
    f.insert(
        "str MS_HEADER_SYMBOL".into(),
        Value::Bytes(HEADER_SYMBOL.as_bytes().to_vec()),
    );
    f.insert(
        "str MS_ENTRY_SYMBOL_V1".into(),
        Value::Bytes(ENTRY_SYMBOL_V1.as_bytes().to_vec()),
    );
    consts!(
        f,
        ABI_MAJOR,
        ABI_MINOR,
        STATUS_OK,
        STATUS_ERROR,
        STATUS_PANIC,
        STATUS_CANCELLED,
        STATUS_UNSUPPORTED,
        STATUS_INVALID_ARGUMENT,
        KIND_PER_TENSOR,
        KIND_MODEL_LEVEL,
        CAP_THREAD_SAFE,
        CAP_ELEMENTWISE,
        CAP_NEEDS_BASE,
        CAP_CHUNKED_STATISTICS,
        CAP_ONE_EXPERT,
        CAP_ORDERED_STATISTICS,
        CAP_TENSOR_STATISTICS,
        ROLE_MATRIX,
        ROLE_VECTOR,
        ROLE_NORM,
        ROLE_EMBEDDING,
        ROLE_CONV,
        ROLE_OTHER,
        PARAM_FLOAT,
        PARAM_INT,
        PARAM_BOOL,
        PARAM_CHOICE,
        PARAM_FLOAT_LIST,
        LOG_ERROR,
        LOG_WARN,
        LOG_INFO,
        LOG_DEBUG,
        BINARY_ADD,
        BINARY_SUB,
        BINARY_MUL,
        BINARY_DIV,
        BINARY_MAXIMUM,
        BINARY_MINIMUM,
        BINARY_GT,
        BINARY_GE,
        BINARY_LT,
        BINARY_LE,
        BINARY_EQ,
        UNARY_NEG,
        UNARY_ABS,
        UNARY_SIGN,
        UNARY_SQRT,
        UNARY_SQUARE,
        UNARY_EXP,
        UNARY_LOG,
        REDUCE_SUM,
        REDUCE_SUM_SQUARES,
        REDUCE_SUM_ABS,
        REDUCE_MAX_ABS,
        REDUCE_COUNT_NONZERO,
        REDUCE_MEAN,
        REDUCE_MIN,
        REDUCE_MAX,
        STACK_SUM,
        STACK_MEAN,
        STACK_MAX,
        STACK_MIN,
        ELECT_MASS,
        ELECT_COUNT,
        DISJOINT_SUM,
        DISJOINT_MEAN,
        DISJOINT_MAX,
        PLUGIN_API_V1_MIN_SIZE,
        PLUGIN_API_V1_1_MIN_SIZE,
        PLUGIN_API_V1_5_MIN_SIZE,
        OBJECTIVE_CROSS_ENTROPY,
        OBJECTIVE_ENTROPY,
        OPTIMIZER_SGD,
        OPTIMIZER_MOMENTUM,
        OPTIMIZER_ADAMW,
        ALL_TASKS,
        FISHER_LABELS_TRUE,
        FISHER_LABELS_PREDICTED,
    );
    f
}

/// Identifiers that follow `prefix` at the very start of a line of `src` (top-level items only,
/// so `impl` members such as `Str::EMPTY` are not counted).
fn declared<'a>(src: &'a str, prefix: &str) -> Vec<&'a str> {
    src.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|rest| {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            (end > 0).then(|| &rest[..end])
        })
        .collect()
}

fn show(v: Option<&Value>) -> String {
    match v {
        None => "(absent)".into(),
        Some(Value::Int(i)) => i.to_string(),
        Some(Value::Bytes(b)) => format!("{:?}", String::from_utf8_lossy(b)),
    }
}

#[test]
fn header_matches_abi_rs() {
    let c = c_facts();
    let rust = rust_facts();
    let mut problems = Vec::new();
    for key in c.keys().chain(rust.keys()).collect::<std::collections::BTreeSet<_>>() {
        let (cv, rv) = (c.get(key), rust.get(key));
        if cv != rv {
            problems.push(format!("{key}: header {} vs abi.rs {}", show(cv), show(rv)));
        }
    }
    assert!(
        problems.is_empty(),
        "mergescope_plugin.h and abi.rs disagree:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn every_rust_item_is_covered() {
    let rust = rust_facts();
    let mut missing = Vec::new();
    for name in declared(ABI_RS, "pub const ") {
        let (k1, k2) = (format!("const MS_{name}"), format!("str MS_{name}"));
        if !rust.contains_key(&k1) && !rust.contains_key(&k2) {
            missing.push(format!("const {name}"));
        }
    }
    for name in declared(ABI_RS, "pub struct ")
        .into_iter()
        .chain(declared(ABI_RS, "pub type "))
    {
        match TYPE_NAMES.iter().find(|(r, _)| *r == name) {
            Some((_, c)) if rust.contains_key(&format!("size {c}")) => {}
            _ => missing.push(format!("type {name}")),
        }
    }
    assert!(
        missing.is_empty(),
        "abi.rs items not covered by abi_header_sync.rs: {missing:?}"
    );
}

#[test]
fn every_header_item_is_covered() {
    let c = c_facts();
    let mut missing = Vec::new();
    for name in declared(HEADER, "#define MS_") {
        let name = format!("MS_{name}");
        if HEADER_HELPERS.contains(&name.as_str()) {
            continue;
        }
        if !c.contains_key(&format!("const {name}")) && !c.contains_key(&format!("str {name}")) {
            missing.push(name);
        }
    }
    // `typedef struct ms_x {` and `typedef uint32_t ms_x;`
    let mut types: Vec<&str> = declared(HEADER, "typedef struct ");
    for rest in HEADER.lines().filter_map(|l| l.strip_prefix("typedef ")) {
        if let Some(name) = rest.strip_suffix(';').and_then(|r| r.split_whitespace().nth(1))
            && rest.split_whitespace().count() == 2
        {
            types.push(name);
        }
    }
    // Function-pointer typedefs: `typedef R (*ms_x_fn)(...)`.
    for rest in HEADER.lines().filter_map(|l| l.strip_prefix("typedef ")) {
        if let Some(name) = rest.split("(*").nth(1).and_then(|r| r.split(')').next()) {
            types.push(name);
        }
    }
    for t in &types {
        if !c.contains_key(&format!("size {t}")) {
            missing.push(format!("type {t}"));
        }
    }
    assert!(
        types.len() >= TYPE_NAMES.len(),
        "found only these header types: {types:?}"
    );
    assert!(
        missing.is_empty(),
        "header items not reported by tests/c/layout_probe.c: {missing:?}"
    );
}

#[test]
fn header_helpers_agree() {
    // MS_MAGIC_INIT spells the same eight bytes.
    // SAFETY: the probe returns its static header's 8-byte magic array.
    let magic = unsafe { std::slice::from_raw_parts(ms_probe_magic_init(), 8) };
    assert_eq!(magic, &MAGIC[..]);
    // The typed initialisers exist and were built from sizeof.
    // SAFETY: plain function of the probe.
    let sizes = unsafe { ms_probe_struct_sizes() };
    assert_eq!(
        sizes,
        size_of::<TensorInfo>()
            + size_of::<HostApiV1>()
            + size_of::<PluginApiV1>()
            + size_of::<EvalMetrics>()
            + size_of::<FinetuneOptions>()
            + size_of::<SessionApiV1>()
            + size_of::<SessionFisherV1>()
            + size_of::<Minibatch>()
            + size_of::<SessionMinibatchV1>()
            + size_of::<HostSignConsensusV1>()
            + size_of::<HostRandomV1>()
            + size_of::<HostRandomV2>()
            + size_of::<HostViewsV1>()
            + size_of::<HostLinalgV1>()
            + size_of::<HostParallelV1>()
    );
    // The minimum table is the ABI 1.0 layout, which ends with `instance_capabilities`; it must
    // not grow when later minors append fields.
    assert_eq!(
        PLUGIN_API_V1_MIN_SIZE,
        offset_of!(PluginApiV1, instance_capabilities) + size_of::<usize>()
    );
}

/// plugin-api/README.md documents every function of the host's core table (`ms_host_api_v1`),
/// every plugin-table field a C author fills (`ms_plugin_api_v1`), and every host extension id:
/// a function added to the header without a line in the README fails here.
#[test]
fn the_readme_lists_every_host_operation_and_plugin_table_field() {
    const README: &str = include_str!("../../../plugin-api/README.md");
    let functions_of = |table: &str| -> Vec<String> {
        let start = HEADER.find(&format!("typedef struct {table} {{")).expect(table);
        let end = start + HEADER[start..].find(&format!("}} {table};")).expect(table);
        HEADER[start..end]
            .split("(*")
            .skip(1)
            .map(|rest| rest.split(')').next().unwrap().trim().to_owned())
            .collect()
    };
    let host = functions_of("ms_host_api_v1");
    assert!(host.len() >= 30, "{host:?}");
    for f in &host {
        assert!(
            README.contains(&format!("`{f}(")) || README.contains(&format!("`{f}`")),
            "plugin-api/README.md does not document the host function `{f}`"
        );
    }
    for f in functions_of("ms_plugin_api_v1") {
        assert!(
            README.contains(&format!("{f} "))
                || README.contains(&format!("{f},"))
                || README.contains(&format!("`{f}`")),
            "plugin-api/README.md does not mention the plugin-table field `{f}`"
        );
    }
    for id in ABI_RS
        .lines()
        .filter_map(|l| l.split("EXT_").nth(1))
        .filter_map(|l| l.split('"').nth(1))
    {
        assert!(
            README.contains(id),
            "plugin-api/README.md does not document the extension '{id}'"
        );
    }
}
