/*
 * mergescope_plugin.h: the C ABI, version 1, of mergescope merge-method plugins.
 *
 * This header mirrors plugin-api/src/abi.rs one to one (same constants, same structs, same
 * field order and types); the test tests/tests/end_to_end/abi_header_sync.rs compiles
 * tests/c/layout_probe.c against it and compares every size, offset and constant with the
 * Rust definitions. Change both files together.
 *
 * A plugin is a shared library (lib mergescope_plugin_<id>.so / .dylib, mergescope_plugin_<id>.dll)
 * that exports, with default visibility:
 *
 *   const ms_plugin_header mergescope_plugin_header;          read first by the host
 *   const ms_plugin_api_v1 *mergescope_plugin_entry_v1(void); the entry of ABI major 1
 *
 * Compatibility rules (CLAP-style):
 *   - The host reads the header first. A missing header or wrong magic means "not a mergescope
 *     plugin"; a different major, or a minor newer than the host's, is refused.
 *   - Every table starts with `struct_size`, the size of the table as its author knows it.
 *     Fields are only ever appended at the end, in later minor versions; a reader uses a field
 *     only when `struct_size` covers it.
 *   - Optional functions are nullable function pointers; check for NULL before calling.
 *   - A new major version renames the entry symbol (mergescope_plugin_entry_v2, ...), so an old
 *     host can never call a new layout.
 *   - Model-level methods (MS_KIND_MODEL_LEVEL, ABI 1.1) fill run_model, which the host calls
 *     once with an ms_session_api_v1; a 1.0 host refuses them by their minor version.
 *   - Optional host features are extensions looked up by id with ms_host_api_v1.get_extension
 *     (ABI 1.2: MS_HOST_EXT_SIGN_CONSENSUS_V1, MS_HOST_EXT_RANDOM_V1, MS_HOST_EXT_LINALG_V1,
 *     MS_HOST_EXT_PARALLEL_V1; ABI 1.3: MS_HOST_EXT_RANDOM_V2; ABI 1.4: MS_HOST_EXT_VIEWS_V1). The method-specific fused operations of the core table
 *     (bernoulli_mask, svd, low_rank, trim_abs, elect_sign, disjoint_merge) stay in it for
 *     1.0/1.1 plugins; new plugins take them from the extensions.
 *
 * Ownership:
 *   - Tensors are opaque handles (ms_tensor_handle) owned by the host; 0 is never valid.
 *     Handles created during one host call into the plugin live in a per-call arena the host
 *     frees when the call returns, except the one the plugin returns through `out`. Input
 *     handles (base, experts) are valid for the duration of the call only.
 *   - ms_host_api_v1.release frees a handle (made in this call, or an input) before the call
 *     returns; release big intermediates early. A released handle is invalid: using it,
 *     releasing it again or returning it fails the call.
 *   - Strings (ms_str) passed by the host (tensor names, parameter names and text) are borrowed
 *     for the duration of the call. Strings in ms_plugin_api_v1 must be static: they stay valid
 *     and unchanged for the life of the process. Text passed to set_error or log is copied by
 *     the host before the function returns.
 *   - Memory is always freed by the side that allocated it. Instances made by `create` are
 *     freed by the plugin's `destroy`.
 *
 * Threading:
 *   - One instance is called from one thread at a time, unless the plugin declares
 *     MS_CAP_THREAD_SAFE (then the host may call merge_tensor on one instance from several
 *     threads at once).
 *   - Host functions may only be called on the thread that is inside the host's call into the
 *     plugin (create, prepare_tensor, finish_pass, merge_tensor), with the ms_host_api_v1
 *     pointer that call received, and only until that call returns. Never keep the pointer.
 *
 * Errors and unwinding:
 *   - Every fallible function returns an ms_status. Before returning MS_STATUS_ERROR the
 *     plugin describes the failure with set_error. Host functions never unwind (they return a
 *     status and the host keeps the message); plugin functions must not unwind either (C++
 *     plugins catch every exception at the boundary).
 *   - Libraries are never unloaded: static data and function pointers stay valid forever.
 */

#ifndef MERGESCOPE_PLUGIN_H
#define MERGESCOPE_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------- */
/* Export helpers                                                                            */
/* ---------------------------------------------------------------------------------------- */

/* Marks a symbol as exported from the shared library (default visibility). */
#if defined(_WIN32) || defined(__CYGWIN__)
#define MS_EXPORT __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#define MS_EXPORT __attribute__((visibility("default")))
#else
#define MS_EXPORT
#endif

/* `extern "C"` in C++, nothing in C: for the plugin's own definitions of the two symbols. */
#ifdef __cplusplus
#define MS_EXTERN_C extern "C"
#else
#define MS_EXTERN_C
#endif

/* ---------------------------------------------------------------------------------------- */
/* Versions and symbol names                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* Eight bytes every plugin's header starts with ("MRGSCOPE", no NUL terminator). */
#define MS_MAGIC "MRGSCOPE"
/* Initialiser of ms_plugin_header.magic (valid in C and C++). */
#define MS_MAGIC_INIT { 'M', 'R', 'G', 'S', 'C', 'O', 'P', 'E' }
/* Major ABI version: a host only loads plugins of exactly this major. */
#define MS_ABI_MAJOR 1u
/* Minor ABI version: a host loads plugins whose minor is at most its own. */
#define MS_ABI_MINOR 5u

/* Name of the exported static ms_plugin_header. */
#define MS_HEADER_SYMBOL "mergescope_plugin_header"
/* Name of the exported entry function of ABI major 1 (ms_entry_v1_fn). */
#define MS_ENTRY_SYMBOL_V1 "mergescope_plugin_entry_v1"

/* ---------------------------------------------------------------------------------------- */
/* Status codes                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* Status codes returned by every fallible function on both sides of the ABI. */
typedef int32_t ms_status;
/* Success. */
#define MS_STATUS_OK 0
/* A failure described by the text set with ms_host_api_v1.set_error. */
#define MS_STATUS_ERROR 1
/* The plugin panicked (or threw); the guard caught it and set the error text. */
#define MS_STATUS_PANIC 2
/* The user cancelled the job (ms_host_api_v1.is_cancelled returned non-zero). */
#define MS_STATUS_CANCELLED 3
/* The function or operation code is not supported by this side. */
#define MS_STATUS_UNSUPPORTED 4
/* An argument was invalid (unknown handle, wrong length, null pointer). */
#define MS_STATUS_INVALID_ARGUMENT 5

/* Opaque tensor handle owned by the host; 0 is never a valid handle. */
typedef uint64_t ms_tensor_handle;

/* ---------------------------------------------------------------------------------------- */
/* Strings and the header                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* A borrowed UTF-8 string: pointer plus length, NOT NUL-terminated. */
typedef struct ms_str {
    /* First byte; may be NULL when len is 0. */
    const uint8_t *ptr;
    /* Length in bytes. */
    size_t len;
} ms_str;

/* An ms_str for a string literal: MS_STR_LIT("weight-average"). */
#define MS_STR_LIT(s) { (const uint8_t *)(s), sizeof(s) - 1 }

/* The static header every plugin exports under MS_HEADER_SYMBOL; read before anything else. */
typedef struct ms_plugin_header {
    /* Must equal MS_MAGIC (use MS_MAGIC_INIT). */
    uint8_t magic[8];
    /* ABI major the plugin was built against (MS_ABI_MAJOR). */
    uint32_t abi_major;
    /* ABI minor the plugin was built against (MS_ABI_MINOR). */
    uint32_t abi_minor;
} ms_plugin_header;

/* ---------------------------------------------------------------------------------------- */
/* Kinds, capabilities, roles                                                                */
/* ---------------------------------------------------------------------------------------- */

/* What kind of merge method a plugin implements. */
typedef uint32_t ms_plugin_kind;
/* Per-tensor method: the host streams the model and calls merge_tensor per tensor. */
#define MS_KIND_PER_TENSOR 1u
/* Model-level method (data-driven or iterative, ABI 1.1): the host calls run_model once with an
 * ms_session_api_v1 giving whole models, calibration data, gradients and fine-tuning. */
#define MS_KIND_MODEL_LEVEL 2u

/* Capability bit: one instance may be called from several threads at once. */
#define MS_CAP_THREAD_SAFE (UINT64_C(1) << 0)
/* Capability bit: the result of every element depends only on that element's inputs (and on
 * state fixed before the merge pass), so the host may split large tensors into chunks and call
 * merge_tensor once per chunk. ms_tensor_info.offset then tells where the chunk starts. */
#define MS_CAP_ELEMENTWISE (UINT64_C(1) << 1)
/* Capability bit: the method needs a base model (task vectors are taken against it). */
#define MS_CAP_NEEDS_BASE (UINT64_C(1) << 2)
/* Capability bit: the statistics passes accept chunks too (their statistics add up over pieces of a tensor,
 *  like histograms), so the host may stream them in parallel chunks with bounded memory;
 *  `ms_tensor_info.offset` tells where a chunk starts. */
#define MS_CAP_CHUNKED_STATISTICS (UINT64_C(1) << 3)
/* Capability bit (ABI 1.4), with MS_CAP_CHUNKED_STATISTICS: the statistics are sequential within a
 * tensor (a running floating-point sum, whose last bits depend on the order of its terms), so the
 * host hands each tensor's chunks to the statistics passes in order, from one thread at a time;
 * different tensors may still run in parallel. The merge pass is unaffected. */
#define MS_CAP_ORDERED_STATISTICS (UINT64_C(1) << 5)
/* The method merges the base with exactly one expert (SLERP): the host refuses other counts
 * before creating an instance, and comparisons over several experts leave it out. */
#define MS_CAP_ONE_EXPERT (UINT64_C(1) << 4)
/* Capability bit (ABI 1.5), with MS_CAP_CHUNKED_STATISTICS, MS_CAP_ELEMENTWISE and a finish_tensor
 * (the host uses it for MS_CAP_THREAD_SAFE methods): the statistics of a tensor serve only that
 * tensor's merge. The host may then take one tensor at a time: its
 * chunks through every statistics pass in order, finish_tensor after each pass, then its merge,
 * while other tensors run likewise on other threads; finish_pass still follows once per pass,
 * after every tensor. A tensor's inputs are then read while still in memory. */
#define MS_CAP_TENSOR_STATISTICS (UINT64_C(1) << 6)

/* Role of a tensor in the model, so methods can treat matrices and vectors differently. */
typedef uint32_t ms_tensor_role;
/* A 2-D weight matrix (linear layers, attention projections). */
#define MS_ROLE_MATRIX 0u
/* A 1-D vector that is not a norm (biases, class tokens). */
#define MS_ROLE_VECTOR 1u
/* A normalisation weight or bias (LayerNorm, RMSNorm, BatchNorm). */
#define MS_ROLE_NORM 2u
/* A token or position embedding table. */
#define MS_ROLE_EMBEDDING 3u
/* A convolution kernel (rank 3 or more). */
#define MS_ROLE_CONV 4u
/* A scalar (rank 0) or any other tensor. */
#define MS_ROLE_OTHER 5u

/* ---------------------------------------------------------------------------------------- */
/* Parameters and tensor facts                                                               */
/* ---------------------------------------------------------------------------------------- */

/* Parameter value kinds, as passed to create. */
typedef uint32_t ms_param_kind;
/* `number` holds the value. */
#define MS_PARAM_FLOAT 0u
/* `integer` holds the value. */
#define MS_PARAM_INT 1u
/* `integer` is 0 or 1. */
#define MS_PARAM_BOOL 2u
/* `text` holds one of the schema's choices. */
#define MS_PARAM_CHOICE 3u
/* `list`/`list_len` hold the values (per-task parameters: one value per expert). */
#define MS_PARAM_FLOAT_LIST 4u

/* One validated parameter value, with the schema's default filled in where the user gave none.
 * Borrowed from the host for the duration of create; copy what you keep. */
typedef struct ms_param_value {
    /* Parameter name as in the schema. */
    ms_str name;
    /* One of the MS_PARAM_* kinds. */
    ms_param_kind kind;
    /* Value of a float parameter. */
    double number;
    /* Value of an int or bool parameter. */
    int64_t integer;
    /* Value of a choice parameter. */
    ms_str text;
    /* Values of a float-list parameter. */
    const double *list;
    /* Number of values in `list`. */
    size_t list_len;
} ms_param_value;

/* Facts about the tensor (or chunk of a tensor) handed to merge_tensor. Borrowed for the call. */
typedef struct ms_tensor_info {
    /* sizeof(ms_tensor_info) as the host knows it. */
    size_t struct_size;
    /* Tensor name in the checkpoint. */
    ms_str name;
    /* One of the MS_ROLE_* values. */
    ms_tensor_role role;
    /* Index of this tensor in the host's (sorted) order, 0-based. */
    size_t index;
    /* Number of tensors the host will merge. */
    size_t count;
    /* Offset of this chunk's first element in the flattened full tensor (0 when unchunked). */
    uint64_t offset;
    /* Number of elements of the full tensor. */
    uint64_t full_numel;
    /* Shape of the full tensor (full_rank entries). */
    const size_t *full_shape;
    /* Rank of the full tensor. */
    size_t full_rank;
} ms_tensor_info;

/* ---------------------------------------------------------------------------------------- */
/* Operation codes                                                                           */
/* ---------------------------------------------------------------------------------------- */

/* Log levels for ms_host_api_v1.log. */
typedef uint32_t ms_log_level;
/* Error. */
#define MS_LOG_ERROR 0u
/* Warning. */
#define MS_LOG_WARN 1u
/* Information. */
#define MS_LOG_INFO 2u
/* Debugging detail. */
#define MS_LOG_DEBUG 3u

/* Operation codes for ms_host_api_v1.binary (same shape, or one side a one-element tensor). */
typedef uint32_t ms_binary_op;
/* a + b */
#define MS_BINARY_ADD 0u
/* a - b */
#define MS_BINARY_SUB 1u
/* a * b */
#define MS_BINARY_MUL 2u
/* a / b */
#define MS_BINARY_DIV 3u
/* max(a, b) */
#define MS_BINARY_MAXIMUM 4u
/* min(a, b) */
#define MS_BINARY_MINIMUM 5u
/* 1.0 where a > b, else 0.0 */
#define MS_BINARY_GT 6u
/* 1.0 where a >= b, else 0.0 */
#define MS_BINARY_GE 7u
/* 1.0 where a < b, else 0.0 */
#define MS_BINARY_LT 8u
/* 1.0 where a <= b, else 0.0 */
#define MS_BINARY_LE 9u
/* 1.0 where a == b, else 0.0 */
#define MS_BINARY_EQ 10u

/* Operation codes for ms_host_api_v1.unary. */
typedef uint32_t ms_unary_op;
/* -a */
#define MS_UNARY_NEG 0u
/* |a| */
#define MS_UNARY_ABS 1u
/* sign(a) in {-1, 0, 1} */
#define MS_UNARY_SIGN 2u
/* sqrt(a) */
#define MS_UNARY_SQRT 3u
/* a^2 */
#define MS_UNARY_SQUARE 4u
/* exp(a) */
#define MS_UNARY_EXP 5u
/* ln(a) */
#define MS_UNARY_LOG 6u

/* Operation codes for ms_host_api_v1.reduce (whole tensor to one double). Sums are f64 with element i
   in lane i mod 8, each lane in element order, the lanes added as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)). */
typedef uint32_t ms_reduce_op;
/* sum of a */
#define MS_REDUCE_SUM 0u
/* sum of a^2 */
#define MS_REDUCE_SUM_SQUARES 1u
/* sum of |a| */
#define MS_REDUCE_SUM_ABS 2u
/* max |a| */
#define MS_REDUCE_MAX_ABS 3u
/* number of elements != 0 */
#define MS_REDUCE_COUNT_NONZERO 4u
/* mean of a */
#define MS_REDUCE_MEAN 5u
/* min of a */
#define MS_REDUCE_MIN 6u
/* max of a */
#define MS_REDUCE_MAX 7u

/* Operation codes for ms_host_api_v1.reduce_stack (elementwise over n same-shape tensors). */
typedef uint32_t ms_stack_op;
/* sum_i t_i */
#define MS_STACK_SUM 0u
/* mean_i t_i */
#define MS_STACK_MEAN 1u
/* max_i t_i */
#define MS_STACK_MAX 2u
/* min_i t_i */
#define MS_STACK_MIN 3u

/* Sign-election rules for ms_host_api_v1.elect_sign. */
typedef uint32_t ms_elect_rule;
/* sign(sum_i t_i): the sign of the total mass (TIES paper). */
#define MS_ELECT_MASS 0u
/* sign(sum_i sign(t_i)): the majority of signs by count. */
#define MS_ELECT_COUNT 1u

/* Aggregations for ms_host_api_v1.disjoint_merge. */
typedef uint32_t ms_disjoint_op;
/* sum of the entries that agree with the sign */
#define MS_DISJOINT_SUM 0u
/* sum of the agreeing entries / max(1, number of agreeing entries) */
#define MS_DISJOINT_MEAN 1u
/* max |agreeing entry| * sign */
#define MS_DISJOINT_MAX 2u

/* ---------------------------------------------------------------------------------------- */
/* The host's table                                                                          */
/* ---------------------------------------------------------------------------------------- */

/*
 * The table of host services and tensor operations a plugin calls back into.
 *
 * Threading: every function may only be called on the thread that is inside the host's call
 * into the plugin (create, prepare_tensor, finish_pass, merge_tensor), with the ms_host_api_v1
 * pointer that call received. Handles created during one call live until that call returns,
 * except the one the plugin returns through `out`; input handles live for the call too.
 * No function unwinds: failures return a status and the host keeps the message.
 * Pass `ctx` back as the first argument of every function.
 */
typedef struct ms_host_api_v1 {
    /* sizeof(ms_host_api_v1) as the host knows it. */
    size_t struct_size;
    /* ABI major of the host. */
    uint32_t abi_major;
    /* ABI minor of the host. */
    uint32_t abi_minor;
    /* Host state for this call; pass it back as the first argument of every function. */
    void *ctx;

    /* Writes a line to the host's log, attributed to the plugin (the text is copied). */
    void (*log)(void *ctx, ms_log_level level, ms_str message);
    /* Reports progress inside a long call, as a fraction in [0, 1]. */
    void (*report_progress)(void *ctx, double fraction);
    /* Non-zero when the user cancelled the job: return MS_STATUS_CANCELLED soon. */
    int32_t (*is_cancelled)(void *ctx);
    /* Records the error text of the failure the plugin is about to return (copied by the host). */
    void (*set_error)(void *ctx, ms_str message);
    /* Looks up an optional host extension by id; NULL when the host has none. */
    const void *(*get_extension)(void *ctx, ms_str id);

    /* Writes the rank to `rank` and up to `max_rank` dimensions to `dims`. */
    ms_status (*shape)(void *ctx, ms_tensor_handle t, size_t *dims, size_t max_rank, size_t *rank);
    /* Number of elements. */
    ms_status (*numel)(void *ctx, ms_tensor_handle t, size_t *out);
    /* Copies `len` float values (the whole tensor, row-major) into `dst`. */
    ms_status (*read_f32)(void *ctx, ms_tensor_handle t, float *dst, size_t len);
    /* Creates a tensor from `len` row-major float values with the given shape. */
    ms_status (*from_f32)(void *ctx, const float *data, size_t len, const size_t *dims, size_t rank,
                          ms_tensor_handle *out);
    /* Creates a tensor of `like`'s shape filled with `value`. */
    ms_status (*full_like)(void *ctx, ms_tensor_handle like, double value, ms_tensor_handle *out);

    /* Elementwise binary operation (MS_BINARY_*); comparisons give 0.0/1.0 masks. */
    ms_status (*binary)(void *ctx, ms_binary_op op, ms_tensor_handle a, ms_tensor_handle b,
                        ms_tensor_handle *out);
    /* Elementwise unary operation (MS_UNARY_*). */
    ms_status (*unary)(void *ctx, ms_unary_op op, ms_tensor_handle a, ms_tensor_handle *out);
    /* a * mul + add, elementwise. */
    ms_status (*affine)(void *ctx, ms_tensor_handle a, double mul, double add, ms_tensor_handle *out);
    /* Elementwise comparison with a scalar (MS_BINARY_GT ... MS_BINARY_EQ), giving a 0/1 mask. */
    ms_status (*compare_scalar)(void *ctx, ms_binary_op op, ms_tensor_handle a, double scalar,
                                ms_tensor_handle *out);
    /* mask != 0 ? on_true : on_false, elementwise. */
    ms_status (*select)(void *ctx, ms_tensor_handle mask, ms_tensor_handle on_true, ms_tensor_handle on_false,
                        ms_tensor_handle *out);
    /* Whole-tensor reduction (MS_REDUCE_*) to one double, accumulated in double. */
    ms_status (*reduce)(void *ctx, ms_reduce_op op, ms_tensor_handle a, double *out);
    /* sum of a*b over all elements, accumulated in double. */
    ms_status (*dot)(void *ctx, ms_tensor_handle a, ms_tensor_handle b, double *out);
    /* The k-th largest |a| (k is 1-based, k <= numel), by linear-time selection, not a sort. */
    ms_status (*kth_largest_abs)(void *ctx, ms_tensor_handle a, size_t k, double *out);
    /* sum_i weights[i] * ts[i] over n same-shape tensors in one pass; `weights` may be NULL
     * (all ones). */
    ms_status (*weighted_sum)(void *ctx, const ms_tensor_handle *ts, const double *weights, size_t n,
                              ms_tensor_handle *out);
    /* Elementwise reduction over n same-shape tensors (MS_STACK_*). */
    ms_status (*reduce_stack)(void *ctx, ms_stack_op op, const ms_tensor_handle *ts, size_t n,
                              ms_tensor_handle *out);
    /* Kept for ABI 1.0/1.1 plugins; since 1.2: ms_host_random_v1.bernoulli_mask. */
    ms_status (*bernoulli_mask)(void *ctx, ms_tensor_handle like, double keep_probability, uint64_t seed,
                                uint64_t offset, ms_tensor_handle *out);
    /* Matrix product of 2-D tensors. */
    ms_status (*matmul)(void *ctx, ms_tensor_handle a, ms_tensor_handle b, ms_tensor_handle *out);
    /* Transpose of a 2-D tensor. */
    ms_status (*transpose)(void *ctx, ms_tensor_handle a, ms_tensor_handle *out);
    /* Same data, new shape (same element count). */
    ms_status (*reshape)(void *ctx, ms_tensor_handle a, const size_t *dims, size_t rank, ms_tensor_handle *out);
    /* Kept for ABI 1.0/1.1 plugins; since 1.2: ms_host_linalg_v1.svd. */
    ms_status (*svd)(void *ctx, ms_tensor_handle a, size_t k, ms_tensor_handle *out_u, ms_tensor_handle *out_s,
                     ms_tensor_handle *out_vt);
    /* Kept for ABI 1.0/1.1 plugins; since 1.2: ms_host_linalg_v1.low_rank. */
    ms_status (*low_rank)(void *ctx, ms_tensor_handle a, size_t k, ms_tensor_handle *out);
    /* Frees a tensor made during this call before the call returns, so long computations on
     * large tensors keep few intermediates alive. The handle is invalid afterwards; input
     * handles may be released too. */
    ms_status (*release)(void *ctx, ms_tensor_handle t);
    /* Kept for ABI 1.0/1.1 plugins; since 1.2: ms_host_sign_consensus_v1.trim_abs. */
    ms_status (*trim_abs)(void *ctx, ms_tensor_handle a, double threshold, ms_tensor_handle *out);
    /* Kept for ABI 1.0/1.1 plugins; since 1.2: ms_host_sign_consensus_v1.elect_sign. */
    ms_status (*elect_sign)(void *ctx, const ms_tensor_handle *ts, size_t n, ms_elect_rule rule,
                            ms_tensor_handle *out);
    /* Kept for ABI 1.0/1.1 plugins; since 1.2: ms_host_sign_consensus_v1.disjoint_merge. */
    ms_status (*disjoint_merge)(void *ctx, const ms_tensor_handle *ts, size_t n, ms_tensor_handle sign,
                                ms_disjoint_op op, ms_tensor_handle *out);
} ms_host_api_v1;

/* ---------------------------------------------------------------------------------------- */
/* Host extensions (ABI 1.2), looked up with ms_host_api_v1.get_extension                    */
/* ---------------------------------------------------------------------------------------- */

/* |a| >= threshold ? a : 0, elementwise (magnitude trim). */
typedef ms_status (*ms_trim_abs_fn)(void *ctx, ms_tensor_handle a, double threshold, ms_tensor_handle *out);
/* Elected sign in {-1, 0, 1} per element over n same-shape tensors (MS_ELECT_*). */
typedef ms_status (*ms_elect_sign_fn)(void *ctx, const ms_tensor_handle *ts, size_t n, ms_elect_rule rule,
                                      ms_tensor_handle *out);
/* Disjoint aggregation (MS_DISJOINT_*) over the entries whose sign equals `sign`'s (zeros never
 * agree; where `sign` is 0 nothing agrees and the result is 0). */
typedef ms_status (*ms_disjoint_merge_fn)(void *ctx, const ms_tensor_handle *ts, size_t n, ms_tensor_handle sign,
                                          ms_disjoint_op op, ms_tensor_handle *out);
/* A 0/1 mask of `like`'s shape with P(1) = keep_probability, from a counter-based generator:
 * element j of the full tensor gets the same draw for the same `seed` whatever the device or
 * chunking (`offset` is the chunk's first element, as in ms_tensor_info). */
typedef ms_status (*ms_bernoulli_mask_fn)(void *ctx, ms_tensor_handle like, double keep_probability, uint64_t seed,
                                          uint64_t offset, ms_tensor_handle *out);
/* A 0/1 mask of `probabilities`' shape in which element j is 1 iff the draw that
 * ms_bernoulli_mask_fn makes for element offset + j under `seed` is below probabilities[j] (so a
 * tensor filled with p gives exactly bernoulli_mask(like, p, seed, offset)'s mask). Every
 * probability must be finite and in [0, 1]; otherwise the call fails naming the value. */
typedef ms_status (*ms_bernoulli_mask_p_fn)(void *ctx, ms_tensor_handle probabilities, uint64_t seed,
                                            uint64_t offset, ms_tensor_handle *out);
/* Lends tensor t's values (ABI 1.4): *data receives a pointer to its *len values, contiguous
 * row-major float in host memory, readable until the current call returns (the host keeps them
 * alive until then, even when t is released first); never write through it. MS_STATUS_UNSUPPORTED
 * where the values are not contiguous float in host memory (a tensor on a GPU): copy them out with
 * read_f32 then. */
typedef ms_status (*ms_view_f32_fn)(void *ctx, ms_tensor_handle t, const float **data, size_t *len);
/* Truncated SVD of a 2-D tensor (m x n): U (m x k), S (k), V^T (k x n), computed in double; k is
 * clamped to min(m, n). Any of the outputs may be NULL when not wanted. */
typedef ms_status (*ms_svd_fn)(void *ctx, ms_tensor_handle a, size_t k, ms_tensor_handle *out_u,
                               ms_tensor_handle *out_s, ms_tensor_handle *out_vt);
/* Best rank-k approximation U_k diag(S_k) V_k^T of a 2-D tensor (Eckart-Young). */
typedef ms_status (*ms_low_rank_fn)(void *ctx, ms_tensor_handle a, size_t k, ms_tensor_handle *out);

/* Id of the host extension ms_host_sign_consensus_v1: the fused operations of sign-consensus
 * methods (TIES, DARE-TIES). */
#define MS_HOST_EXT_SIGN_CONSENSUS_V1 "mergescope.host.sign-consensus.v1"
/* Id of the host extension ms_host_random_v1: seeded random masks. */
#define MS_HOST_EXT_RANDOM_V1 "mergescope.host.random.v1"
/* Id of the host extension ms_host_random_v2 (ABI 1.3): seeded random masks, also with a keep
 * probability per element. */
#define MS_HOST_EXT_RANDOM_V2 "mergescope.host.random.v2"
/* Id of the host extension ms_host_views_v1 (ABI 1.4): a tensor's float values lent without a copy. */
#define MS_HOST_EXT_VIEWS_V1 "mergescope.host.views.v1"
/* Id of the host extension ms_host_linalg_v1: truncated SVD and low-rank approximation. */
#define MS_HOST_EXT_LINALG_V1 "mergescope.host.linalg.v1"
/* Id of the host extension ms_host_parallel_v1: the host's worker threads. */
#define MS_HOST_EXT_PARALLEL_V1 "mergescope.host.parallel.v1"

/* Host extension MS_HOST_EXT_SIGN_CONSENSUS_V1. Static; call its functions with the ctx of the
 * ms_host_api_v1 it was looked up through, under that table's threading rules. */
typedef struct ms_host_sign_consensus_v1 {
    /* sizeof(ms_host_sign_consensus_v1) as the host knows it. */
    size_t struct_size;
    ms_trim_abs_fn trim_abs;
    ms_elect_sign_fn elect_sign;
    ms_disjoint_merge_fn disjoint_merge;
} ms_host_sign_consensus_v1;

/* Host extension MS_HOST_EXT_RANDOM_V1. Static; called like ms_host_sign_consensus_v1's. */
typedef struct ms_host_random_v1 {
    /* sizeof(ms_host_random_v1) as the host knows it. */
    size_t struct_size;
    ms_bernoulli_mask_fn bernoulli_mask;
} ms_host_random_v1;

/* Host extension MS_HOST_EXT_RANDOM_V2 (ABI 1.3): ms_host_random_v1's function and
 * bernoulli_mask_p, over the same counter-based draws. Static; called like
 * ms_host_sign_consensus_v1's. */
typedef struct ms_host_random_v2 {
    /* sizeof(ms_host_random_v2) as the host knows it. */
    size_t struct_size;
    ms_bernoulli_mask_fn bernoulli_mask;
    ms_bernoulli_mask_p_fn bernoulli_mask_p;
} ms_host_random_v2;

/* Host extension MS_HOST_EXT_VIEWS_V1 (ABI 1.4). Static; called like ms_host_sign_consensus_v1's. */
typedef struct ms_host_views_v1 {
    /* sizeof(ms_host_views_v1) as the host knows it. */
    size_t struct_size;
    ms_view_f32_fn view_f32;
} ms_host_views_v1;

/* Host extension MS_HOST_EXT_LINALG_V1. Static; called like ms_host_sign_consensus_v1's. */
typedef struct ms_host_linalg_v1 {
    /* sizeof(ms_host_linalg_v1) as the host knows it. */
    size_t struct_size;
    ms_svd_fn svd;
    ms_low_rank_fn low_rank;
} ms_host_linalg_v1;

/* One job of ms_host_parallel_v1.parallel_for: works on item `index` with the plugin's `user`
 * data. It runs on a host worker thread and must not call any host function. */
typedef ms_status (*ms_parallel_job_fn)(void *user, size_t index);

/* Host extension MS_HOST_EXT_PARALLEL_V1: lends the host's worker threads to a plugin for plain
 * computation on its own data, so plugins keep no thread pools of their own and honour the
 * user's thread setting. */
typedef struct ms_host_parallel_v1 {
    /* sizeof(ms_host_parallel_v1) as the host knows it. */
    size_t struct_size;
    /* How many threads parallel_for runs jobs on (at least 1). */
    size_t (*threads)(void *ctx);
    /* Calls job(user, i) for every i in 0..n, on up to `threads` threads, and returns when all
     * have returned: MS_STATUS_OK, or the first failing job's status (jobs not yet started are
     * then skipped), or MS_STATUS_CANCELLED when the user cancelled. */
    ms_status (*parallel_for)(void *ctx, size_t n, ms_parallel_job_fn job, void *user);
} ms_host_parallel_v1;

/* ---------------------------------------------------------------------------------------- */
/* Model-level sessions (ABI 1.1)                                                            */
/* ---------------------------------------------------------------------------------------- */

/* Objectives for ms_session_api_v1.loss_and_grad. */
typedef uint32_t ms_objective;
/* Mean cross-entropy against the labels of the calibration examples. */
#define MS_OBJECTIVE_CROSS_ENTROPY 0u
/* Mean entropy of the predicted class distribution; uses no labels (AdaMerging's objective). */
#define MS_OBJECTIVE_ENTROPY 1u

/* Optimisers for ms_session_api_v1.finetune. */
typedef uint32_t ms_optimizer_kind;
/* Plain stochastic gradient descent. */
#define MS_OPTIMIZER_SGD 0u
/* SGD with momentum 0.9. */
#define MS_OPTIMIZER_MOMENTUM 1u
/* AdamW (beta = 0.9, 0.999). */
#define MS_OPTIMIZER_ADAMW 2u

/* `task` argument of session functions that stands for every task: evaluate then gives the
 * means over tasks and loss_and_grad the sum of the per-task objectives. */
#define MS_ALL_TASKS SIZE_MAX

/* Loss and accuracy of a candidate model, written by ms_session_api_v1.evaluate. */
typedef struct ms_eval_metrics {
    /* sizeof(ms_eval_metrics) as the plugin knows it. */
    size_t struct_size;
    /* Mean cross-entropy. */
    double loss;
    /* Fraction classified correctly. */
    double accuracy;
    /* Examples evaluated. */
    uint64_t examples;
} ms_eval_metrics;

/* Settings of ms_session_api_v1.finetune. */
typedef struct ms_finetune_options {
    /* sizeof(ms_finetune_options) as the plugin knows it. */
    size_t struct_size;
    /* Optimiser steps. */
    uint64_t steps;
    /* Learning rate. */
    double learning_rate;
    /* Examples per step (0: the whole training split, full-batch gradient descent). */
    uint64_t batch_size;
    /* One of the MS_OPTIMIZER_* values. */
    ms_optimizer_kind optimizer;
    /* Decoupled weight decay (AdamW only). */
    double weight_decay;
    /* Seed of the batch order. */
    uint64_t seed;
} ms_finetune_options;

/*
 * The session a model-level method runs in (ABI 1.1): whole models as tensor handles, the
 * tasks' calibration data, and training services. A *candidate* is an array of tensor_count
 * handles in the session's tensor order (base, experts and results all use it).
 *
 * Data: evaluate and loss_and_grad use each task's calibration examples (the first ones of its
 * train split, 100 by default), finetune its train split; no function touches the test split.
 *
 * Threading and lifetime as in ms_host_api_v1: call only on the thread inside run_model, with
 * the pointer it received. Handles live until run_model returns or until released (by
 * ms_host_api_v1.release or release_since).
 */
typedef struct ms_session_api_v1 {
    /* sizeof(ms_session_api_v1) as the host knows it. */
    size_t struct_size;
    /* Host state; pass it back as the first argument of every function. */
    void *ctx;
    /* Number of tensors of a candidate. */
    size_t (*tensor_count)(void *ctx);
    /* Name, role and shape of tensor `index` (offset 0, count = tensor_count); the pointers in
     * `out` stay valid until run_model returns. */
    ms_status (*tensor_info)(void *ctx, size_t index, ms_tensor_info *out);
    /* Number of experts; expert t was fine-tuned on task t. */
    size_t (*expert_count)(void *ctx);
    /* Name of task `task` (valid until run_model returns). */
    ms_status (*task_name)(void *ctx, size_t task, ms_str *out);
    /* A handle to tensor `index` of the base model. */
    ms_status (*base_tensor)(void *ctx, size_t index, ms_tensor_handle *out);
    /* A handle to tensor `index` of expert `expert`. */
    ms_status (*expert_tensor)(void *ctx, size_t expert, size_t index, ms_tensor_handle *out);
    /* Loss and accuracy of `candidate` on the calibration examples of `task` (or MS_ALL_TASKS:
     * means over tasks). */
    ms_status (*evaluate)(void *ctx, const ms_tensor_handle *candidate, size_t n, size_t task, ms_eval_metrics *out);
    /* The objective (MS_OBJECTIVE_*) of `candidate` on the calibration examples of `task` (or
     * the sum over tasks for MS_ALL_TASKS) and, when `grads` is not NULL, its gradient with
     * respect to every candidate tensor (n handles written to `grads`). */
    ms_status (*loss_and_grad)(void *ctx, const ms_tensor_handle *candidate, size_t n, size_t task,
                               ms_objective objective, double *loss, ms_tensor_handle *grads);
    /* Fine-tunes `candidate` on the train split of `task` with that task's frozen head; writes
     * the n tensors of the result to `out`. */
    ms_status (*finetune)(void *ctx, const ms_tensor_handle *candidate, size_t n, size_t task,
                          const ms_finetune_options *options, ms_tensor_handle *out);
    /* Records `candidate` as the next iterate of the method's trajectory, with a label and a
     * JSON object of metrics (may be empty). The last iterate is the partial result kept when
     * the run is cancelled. */
    ms_status (*report_iterate)(void *ctx, const ms_tensor_handle *candidate, size_t n, ms_str label,
                                ms_str metrics_json);
    /* A mark of the handles made so far, for release_since. */
    uint64_t (*mark)(void *ctx);
    /* Releases every handle made after `mark` except the n_keep handles in `keep`, so an
     * iterative method keeps its memory flat. */
    ms_status (*release_since)(void *ctx, uint64_t mark, const ms_tensor_handle *keep, size_t n_keep);
    /* Looks up an optional session extension by id; NULL when the host has none. */
    const void *(*get_extension)(void *ctx, ms_str id);
} ms_session_api_v1;

/* Id of the diagonal-Fisher session extension (ms_session_fisher_v1), for
 * ms_session_api_v1.get_extension. */
#define MS_SESSION_EXT_FISHER_V1 "mergescope.session.fisher.v1"

/* Which label the Fisher extension differentiates the log-likelihood of. */
typedef uint32_t ms_fisher_labels;
/* The example's true label (the empirical Fisher). */
#define MS_FISHER_LABELS_TRUE 0u
/* The candidate's own prediction (argmax; uses no labels). */
#define MS_FISHER_LABELS_PREDICTED 1u

/* Session extension MS_SESSION_EXT_FISHER_V1: the diagonal Fisher information of a candidate,
 * for Fisher-weighted averaging. Static; call its functions with the session's ctx, under the
 * session's threading rules. */
typedef struct ms_session_fisher_v1 {
    /* sizeof(ms_session_fisher_v1) as the host knows it. */
    size_t struct_size;
    /* Mean over the calibration examples of `task` of the squared per-example gradient of
     * log p(y | x) with respect to every candidate tensor (`labels`: which y); writes n handles
     * to `out`. */
    ms_status (*diag_fisher)(void *ctx, const ms_tensor_handle *candidate, size_t n, size_t task,
                             ms_fisher_labels labels, ms_tensor_handle *out);
} ms_session_fisher_v1;

/* Id of the mini-batch session extension (ms_session_minibatch_v1), for
 * ms_session_api_v1.get_extension. */
#define MS_SESSION_EXT_MINIBATCH_V1 "mergescope.session.minibatch.v1"

/* Which calibration examples a mini-batch call uses: for each task, batch `step` of a seeded
 * shuffle of its calibration examples, `size` per batch (the examples are reshuffled every
 * epoch, and an epoch's last batch may be short). A function of (size, seed, task, step)
 * alone, so a run is reproducible and resumable. */
typedef struct ms_minibatch {
    /* sizeof(ms_minibatch) as the plugin knows it. */
    size_t struct_size;
    /* Examples per task and batch (at least 1; the whole calibration set when larger). */
    uint64_t size;
    /* Seed of the shuffles. */
    uint64_t seed;
    /* Batch number, 0-based (optimisation step). */
    uint64_t step;
} ms_minibatch;

/* Session extension MS_SESSION_EXT_MINIBATCH_V1: the calibration objective on a mini-batch, for
 * stochastic methods whose full-batch gradient costs a pass over every calibration example.
 * Static; call its functions with the session's ctx, under the session's threading rules. */
typedef struct ms_session_minibatch_v1 {
    /* sizeof(ms_session_minibatch_v1) as the host knows it. */
    size_t struct_size;
    /* As ms_session_api_v1.loss_and_grad, on `batch`'s examples of each task only: the mean
     * objective over the batch of `task` (or the sum of the tasks' means for MS_ALL_TASKS). */
    ms_status (*loss_and_grad)(void *ctx, const ms_tensor_handle *candidate, size_t n, size_t task,
                               ms_objective objective, const ms_minibatch *batch, double *loss,
                               ms_tensor_handle *grads);
} ms_session_minibatch_v1;

/* ---------------------------------------------------------------------------------------- */
/* The plugin's table                                                                        */
/* ---------------------------------------------------------------------------------------- */

/*
 * The plugin's table, returned by the entry function. Static (and unchanged) for the life of
 * the process; every string in it is static too.
 */
typedef struct ms_plugin_api_v1 {
    /* sizeof(ms_plugin_api_v1) as the plugin knows it. */
    size_t struct_size;
    /* Stable id, lowercase with dashes ("task-arithmetic"); what users type after --method. */
    ms_str id;
    /* Display name. */
    ms_str name;
    /* Plugin version (semver), recorded in every output. */
    ms_str version;
    /* One-line description. */
    ms_str description;
    /* Help text: the algorithm, its parameters, and the choices made where references differ. */
    ms_str help;
    /* MS_KIND_PER_TENSOR or MS_KIND_MODEL_LEVEL. */
    ms_plugin_kind kind;
    /* MS_CAP_* bits. */
    uint64_t capabilities;
    /* JSON array describing the parameters (see plugin-api/README.md for the format). */
    ms_str params_schema_json;

    /* Creates an instance for one merge of `n_experts` experts. `params` holds every schema
     * parameter, validated, defaults filled (borrowed for the call). Writes the instance to
     * `out`. Host functions may be used during the call. */
    ms_status (*create)(const ms_host_api_v1 *host, const ms_param_value *params, size_t n_params, size_t n_experts,
                        uint64_t seed, void **out);
    /* Frees an instance made by create. */
    void (*destroy)(void *instance);
    /* Optional (NULL = 0): number of statistics passes over the model the instance needs
     * before merging. Methods with model-wide statistics (global TIES trimming) use it. */
    uint32_t (*prepare_passes)(void *instance);
    /* Optional: one tensor of statistics pass `pass` (0-based). Handles as in merge_tensor. */
    ms_status (*prepare_tensor)(void *instance, const ms_host_api_v1 *host, uint32_t pass, const ms_tensor_info *info,
                                ms_tensor_handle base, const ms_tensor_handle *experts, size_t n_experts);
    /* Optional: called after every tensor of pass `pass` was seen. */
    ms_status (*finish_pass)(void *instance, const ms_host_api_v1 *host, uint32_t pass);
    /* Merges one tensor (or chunk, see MS_CAP_ELEMENTWISE); writes the result to `out`, which
     * must have the shape of `base` (of the experts when `base` is 0). `base` is 0 when the
     * method runs without a base. */
    ms_status (*merge_tensor)(void *instance, const ms_host_api_v1 *host, const ms_tensor_info *info,
                              ms_tensor_handle base, const ms_tensor_handle *experts, size_t n_experts,
                              ms_tensor_handle *out);
    /* Optional: looks up a plugin extension by id (model-level session tables, later features). */
    const void *(*get_extension)(ms_str id);
    /* Optional: capabilities of this instance when they depend on its parameters (for example
     * MS_CAP_ELEMENTWISE only for some settings); the static `capabilities` when NULL. */
    uint64_t (*instance_capabilities)(void *instance);
    /* ABI 1.1; required for MS_KIND_MODEL_LEVEL, NULL for per-tensor methods. Runs the whole
     * merge in `session` and writes the n_out (= tensor_count) handles of the merged model to
     * `out`. */
    ms_status (*run_model)(void *instance, const ms_host_api_v1 *host, const ms_session_api_v1 *session,
                           ms_tensor_handle *out, size_t n_out);
    /* ABI 1.5, optional: called after statistics pass `pass` saw every chunk of the tensor `info`
     * describes (its offset is 0), with MS_CAP_TENSOR_STATISTICS before that tensor's merge. */
    ms_status (*finish_tensor)(void *instance, const ms_host_api_v1 *host, uint32_t pass,
                               const ms_tensor_info *info);
} ms_plugin_api_v1;

/* Signature of the entry function exported as MS_ENTRY_SYMBOL_V1. Returns the plugin's static
 * table, or NULL when the plugin cannot initialise. */
typedef const ms_plugin_api_v1 *(*ms_entry_v1_fn)(void);

/* Byte size of the v1.0 prefix of ms_plugin_api_v1: the smallest table a host accepts. Pinned to
 * the last field of v1.0, so it stays the same when later minors append fields. */
#define MS_PLUGIN_API_V1_MIN_SIZE \
    (offsetof(ms_plugin_api_v1, instance_capabilities) + sizeof(uint64_t (*)(void *)))

/* Byte size of the v1.1 prefix of ms_plugin_api_v1 (through run_model): the smallest table of a
 * model-level plugin. */
#define MS_PLUGIN_API_V1_1_MIN_SIZE (offsetof(ms_plugin_api_v1, run_model) + sizeof(void *))

/* Byte size of the v1.5 prefix of ms_plugin_api_v1 (through finish_tensor): a host reads
 * finish_tensor only from tables at least this long. */
#define MS_PLUGIN_API_V1_5_MIN_SIZE (offsetof(ms_plugin_api_v1, finish_tensor) + sizeof(void *))

/* Defines the exported header of a plugin built against this header (use once, at file scope):
 *     MS_DEFINE_PLUGIN_HEADER();
 */
#define MS_DEFINE_PLUGIN_HEADER()                                                                                   \
    MS_EXTERN_C MS_EXPORT const ms_plugin_header mergescope_plugin_header = { MS_MAGIC_INIT, MS_ABI_MAJOR,          \
                                                                              MS_ABI_MINOR }

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MERGESCOPE_PLUGIN_H */
