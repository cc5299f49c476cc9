/*
 * Layout probe for tests/tests/abi_header_sync.rs: reports the size and alignment of every
 * type, the offset and size of every field and the value of every constant of
 * plugin-api/include/mergescope_plugin.h, so the test can compare them with plugin-api/src/abi.rs.
 *
 * Built by tests/build.rs as C11 with -Wall -Wextra -Werror. Two compile-time guards make a field that
 * exists on one side only impossible to miss:
 *   - every struct is initialised below positionally with one typed value per field, so a
 *     field added to the header fails with -Wmissing-field-initializers and a removed one with
 *     "excess elements";
 *   - every function pointer is initialised with a null pointer cast to the exact signature
 *     expected (the same signatures the Rust test pins), so a changed signature fails with
 *     -Wincompatible-pointer-types.
 */

#include "mergescope_plugin.h"

#include <stdint.h>

/* One probe fact. `key` is "size T", "align T", "signed T", "offset T.f", "size T.f",
 * "const NAME" (value) or "str NAME" (bytes). */
typedef struct ms_probe_entry {
    const char *key;
    int64_t value;
    const uint8_t *bytes;
    size_t bytes_len;
} ms_probe_entry;

#define PROBE_TYPE(T) { "size " #T, (int64_t)sizeof(T), NULL, 0 }, { "align " #T, (int64_t)_Alignof(T), NULL, 0 }
#define PROBE_INT(T) PROBE_TYPE(T), { "signed " #T, (int64_t)((T)-1 > (T)0 ? 0 : 1), NULL, 0 }
#define PROBE_FIELD(T, f)                                                                                          \
    { "offset " #T "." #f, (int64_t)offsetof(T, f), NULL, 0 }, { "size " #T "." #f, (int64_t)sizeof(((T *)0)->f), NULL, 0 }
#define PROBE_CONST(c) { "const " #c, (int64_t)(c), NULL, 0 }
#define PROBE_STR(c) { "str " #c, (int64_t)(sizeof(c) - 1), (const uint8_t *)(c), sizeof(c) - 1 }

/* A null function pointer of exactly the given type. */
#define FN(ret, args) ((ret(*) args)0)
#define NOSTR { NULL, 0 }

/* ---- positional, typed initialisers: one value per field, in order ---------------------- */

static const ms_str probe_str = { (const uint8_t *)NULL, (size_t)0 };

static const ms_plugin_header probe_header = { MS_MAGIC_INIT, (uint32_t)MS_ABI_MAJOR, (uint32_t)MS_ABI_MINOR };

static const ms_param_value probe_param_value = {
    NOSTR,               /* name */
    (ms_param_kind)0,    /* kind */
    0.0,                 /* number */
    (int64_t)0,          /* integer */
    NOSTR,               /* text */
    (const double *)0,   /* list */
    (size_t)0,           /* list_len */
};

static const ms_tensor_info probe_tensor_info = {
    sizeof(ms_tensor_info), /* struct_size */
    NOSTR,                  /* name */
    (ms_tensor_role)0,      /* role */
    (size_t)0,              /* index */
    (size_t)0,              /* count */
    (uint64_t)0,            /* offset */
    (uint64_t)0,            /* full_numel */
    (const size_t *)0,      /* full_shape */
    (size_t)0,              /* full_rank */
};

static const ms_host_api_v1 probe_host_api = {
    sizeof(ms_host_api_v1), /* struct_size */
    (uint32_t)0,            /* abi_major */
    (uint32_t)0,            /* abi_minor */
    (void *)0,              /* ctx */
    FN(void, (void *, ms_log_level, ms_str)),                                               /* log */
    FN(void, (void *, double)),                                                             /* report_progress */
    FN(int32_t, (void *)),                                                                  /* is_cancelled */
    FN(void, (void *, ms_str)),                                                             /* set_error */
    FN(const void *, (void *, ms_str)),                                                     /* get_extension */
    FN(ms_status, (void *, ms_tensor_handle, size_t *, size_t, size_t *)),                  /* shape */
    FN(ms_status, (void *, ms_tensor_handle, size_t *)),                                    /* numel */
    FN(ms_status, (void *, ms_tensor_handle, float *, size_t)),                             /* read_f32 */
    FN(ms_status, (void *, const float *, size_t, const size_t *, size_t, ms_tensor_handle *)), /* from_f32 */
    FN(ms_status, (void *, ms_tensor_handle, double, ms_tensor_handle *)),                  /* full_like */
    FN(ms_status, (void *, ms_binary_op, ms_tensor_handle, ms_tensor_handle, ms_tensor_handle *)), /* binary */
    FN(ms_status, (void *, ms_unary_op, ms_tensor_handle, ms_tensor_handle *)),             /* unary */
    FN(ms_status, (void *, ms_tensor_handle, double, double, ms_tensor_handle *)),          /* affine */
    FN(ms_status, (void *, ms_binary_op, ms_tensor_handle, double, ms_tensor_handle *)),    /* compare_scalar */
    FN(ms_status, (void *, ms_tensor_handle, ms_tensor_handle, ms_tensor_handle, ms_tensor_handle *)), /* select */
    FN(ms_status, (void *, ms_reduce_op, ms_tensor_handle, double *)),                      /* reduce */
    FN(ms_status, (void *, ms_tensor_handle, ms_tensor_handle, double *)),                  /* dot */
    FN(ms_status, (void *, ms_tensor_handle, size_t, double *)),                            /* kth_largest_abs */
    FN(ms_status, (void *, const ms_tensor_handle *, const double *, size_t, ms_tensor_handle *)), /* weighted_sum */
    FN(ms_status, (void *, ms_stack_op, const ms_tensor_handle *, size_t, ms_tensor_handle *)), /* reduce_stack */
    FN(ms_status, (void *, ms_tensor_handle, double, uint64_t, uint64_t, ms_tensor_handle *)), /* bernoulli_mask */
    FN(ms_status, (void *, ms_tensor_handle, ms_tensor_handle, ms_tensor_handle *)),        /* matmul */
    FN(ms_status, (void *, ms_tensor_handle, ms_tensor_handle *)),                          /* transpose */
    FN(ms_status, (void *, ms_tensor_handle, const size_t *, size_t, ms_tensor_handle *)),  /* reshape */
    FN(ms_status, (void *, ms_tensor_handle, size_t, ms_tensor_handle *, ms_tensor_handle *, ms_tensor_handle *)), /* svd */
    FN(ms_status, (void *, ms_tensor_handle, size_t, ms_tensor_handle *)),                  /* low_rank */
    FN(ms_status, (void *, ms_tensor_handle)),                                              /* release */
    FN(ms_status, (void *, ms_tensor_handle, double, ms_tensor_handle *)),                  /* trim_abs */
    FN(ms_status, (void *, const ms_tensor_handle *, size_t, ms_elect_rule, ms_tensor_handle *)), /* elect_sign */
    FN(ms_status, (void *, const ms_tensor_handle *, size_t, ms_tensor_handle, ms_disjoint_op,
                   ms_tensor_handle *)),                                                    /* disjoint_merge */
};

static const ms_plugin_api_v1 probe_plugin_api = {
    sizeof(ms_plugin_api_v1), /* struct_size */
    NOSTR,                    /* id */
    NOSTR,                    /* name */
    NOSTR,                    /* version */
    NOSTR,                    /* description */
    NOSTR,                    /* help */
    (ms_plugin_kind)0,        /* kind */
    (uint64_t)0,              /* capabilities */
    NOSTR,                    /* params_schema_json */
    FN(ms_status, (const ms_host_api_v1 *, const ms_param_value *, size_t, size_t, uint64_t, void **)), /* create */
    FN(void, (void *)),                                                                      /* destroy */
    FN(uint32_t, (void *)),                                                                  /* prepare_passes */
    FN(ms_status, (void *, const ms_host_api_v1 *, uint32_t, const ms_tensor_info *, ms_tensor_handle,
                   const ms_tensor_handle *, size_t)),                                       /* prepare_tensor */
    FN(ms_status, (void *, const ms_host_api_v1 *, uint32_t)),                               /* finish_pass */
    FN(ms_status, (void *, const ms_host_api_v1 *, const ms_tensor_info *, ms_tensor_handle,
                   const ms_tensor_handle *, size_t, ms_tensor_handle *)),                   /* merge_tensor */
    FN(const void *, (ms_str)),                                                              /* get_extension */
    FN(uint64_t, (void *)),                                                                  /* instance_capabilities */
    FN(ms_status, (void *, const ms_host_api_v1 *, const ms_session_api_v1 *, ms_tensor_handle *,
                   size_t)),                                                                 /* run_model */
    FN(ms_status, (void *, const ms_host_api_v1 *, uint32_t, const ms_tensor_info *)),       /* finish_tensor */
};

static const ms_eval_metrics probe_eval_metrics = {
    sizeof(ms_eval_metrics), /* struct_size */
    0.0,                     /* loss */
    0.0,                     /* accuracy */
    (uint64_t)0,             /* examples */
};

static const ms_finetune_options probe_finetune_options = {
    sizeof(ms_finetune_options), /* struct_size */
    (uint64_t)0,                 /* steps */
    0.0,                         /* learning_rate */
    (uint64_t)0,                 /* batch_size */
    (ms_optimizer_kind)0,        /* optimizer */
    0.0,                         /* weight_decay */
    (uint64_t)0,                 /* seed */
};

static const ms_session_api_v1 probe_session_api = {
    sizeof(ms_session_api_v1), /* struct_size */
    NULL,                      /* ctx */
    FN(size_t, (void *)),                                                                   /* tensor_count */
    FN(ms_status, (void *, size_t, ms_tensor_info *)),                                      /* tensor_info */
    FN(size_t, (void *)),                                                                   /* expert_count */
    FN(ms_status, (void *, size_t, ms_str *)),                                              /* task_name */
    FN(ms_status, (void *, size_t, ms_tensor_handle *)),                                    /* base_tensor */
    FN(ms_status, (void *, size_t, size_t, ms_tensor_handle *)),                            /* expert_tensor */
    FN(ms_status, (void *, const ms_tensor_handle *, size_t, size_t, ms_eval_metrics *)),   /* evaluate */
    FN(ms_status, (void *, const ms_tensor_handle *, size_t, size_t, ms_objective, double *,
                   ms_tensor_handle *)),                                                    /* loss_and_grad */
    FN(ms_status, (void *, const ms_tensor_handle *, size_t, size_t, const ms_finetune_options *,
                   ms_tensor_handle *)),                                                    /* finetune */
    FN(ms_status, (void *, const ms_tensor_handle *, size_t, ms_str, ms_str)),              /* report_iterate */
    FN(uint64_t, (void *)),                                                                 /* mark */
    FN(ms_status, (void *, uint64_t, const ms_tensor_handle *, size_t)),                    /* release_since */
    FN(const void *, (void *, ms_str)),                                                     /* get_extension */
};

static const ms_session_fisher_v1 probe_session_fisher = {
    sizeof(ms_session_fisher_v1), /* struct_size */
    FN(ms_status, (void *, const ms_tensor_handle *, size_t, size_t, ms_fisher_labels,
                   ms_tensor_handle *)), /* diag_fisher */
};

static const ms_minibatch probe_minibatch = {
    sizeof(ms_minibatch), /* struct_size */
    (uint64_t)0,          /* size */
    (uint64_t)0,          /* seed */
    (uint64_t)0,          /* step */
};

static const ms_session_minibatch_v1 probe_session_minibatch = {
    sizeof(ms_session_minibatch_v1), /* struct_size */
    FN(ms_status, (void *, const ms_tensor_handle *, size_t, size_t, ms_objective, const ms_minibatch *,
                   double *, ms_tensor_handle *)), /* loss_and_grad */
};

static const ms_entry_v1_fn probe_entry = FN(const ms_plugin_api_v1 *, (void));

static const ms_host_sign_consensus_v1 probe_sign_consensus = {
    sizeof(ms_host_sign_consensus_v1),                                                      /* struct_size */
    FN(ms_status, (void *, ms_tensor_handle, double, ms_tensor_handle *)),                  /* trim_abs */
    FN(ms_status, (void *, const ms_tensor_handle *, size_t, ms_elect_rule, ms_tensor_handle *)), /* elect_sign */
    FN(ms_status, (void *, const ms_tensor_handle *, size_t, ms_tensor_handle, ms_disjoint_op,
                   ms_tensor_handle *)),                                                    /* disjoint_merge */
};

static const ms_host_random_v1 probe_random = {
    sizeof(ms_host_random_v1),                                                                   /* struct_size */
    FN(ms_status, (void *, ms_tensor_handle, double, uint64_t, uint64_t, ms_tensor_handle *)),   /* bernoulli_mask */
};

static const ms_host_random_v2 probe_random_v2 = {
    sizeof(ms_host_random_v2),                                                                   /* struct_size */
    FN(ms_status, (void *, ms_tensor_handle, double, uint64_t, uint64_t, ms_tensor_handle *)),   /* bernoulli_mask */
    FN(ms_status, (void *, ms_tensor_handle, uint64_t, uint64_t, ms_tensor_handle *)),           /* bernoulli_mask_p */
};

static const ms_host_views_v1 probe_views = {
    sizeof(ms_host_views_v1),                                                       /* struct_size */
    FN(ms_status, (void *, ms_tensor_handle, const float **, size_t *)),            /* view_f32 */
};

static const ms_host_linalg_v1 probe_linalg = {
    sizeof(ms_host_linalg_v1),                                                              /* struct_size */
    FN(ms_status, (void *, ms_tensor_handle, size_t, ms_tensor_handle *, ms_tensor_handle *,
                   ms_tensor_handle *)),                                                    /* svd */
    FN(ms_status, (void *, ms_tensor_handle, size_t, ms_tensor_handle *)),                  /* low_rank */
};

static const ms_host_parallel_v1 probe_parallel = {
    sizeof(ms_host_parallel_v1),                                                            /* struct_size */
    FN(size_t, (void *)),                                                                   /* threads */
    FN(ms_status, (void *, size_t, ms_parallel_job_fn, void *)),                            /* parallel_for */
};

/* The function types of the extensions, checked against the fields that use them. */
static const ms_parallel_job_fn probe_job = FN(ms_status, (void *, size_t));

/* ---- the facts ------------------------------------------------------------------------- */

static const ms_probe_entry ENTRIES[] = {
    /* integer typedefs: size, alignment, signedness */
    PROBE_INT(ms_status),
    PROBE_INT(ms_tensor_handle),
    PROBE_INT(ms_plugin_kind),
    PROBE_INT(ms_tensor_role),
    PROBE_INT(ms_param_kind),
    PROBE_INT(ms_log_level),
    PROBE_INT(ms_binary_op),
    PROBE_INT(ms_unary_op),
    PROBE_INT(ms_reduce_op),
    PROBE_INT(ms_stack_op),
    PROBE_INT(ms_elect_rule),
    PROBE_INT(ms_disjoint_op),
    PROBE_INT(ms_objective),
    PROBE_INT(ms_optimizer_kind),
    PROBE_TYPE(ms_entry_v1_fn),

    PROBE_TYPE(ms_str),
    PROBE_FIELD(ms_str, ptr),
    PROBE_FIELD(ms_str, len),

    PROBE_TYPE(ms_plugin_header),
    PROBE_FIELD(ms_plugin_header, magic),
    PROBE_FIELD(ms_plugin_header, abi_major),
    PROBE_FIELD(ms_plugin_header, abi_minor),

    PROBE_TYPE(ms_param_value),
    PROBE_FIELD(ms_param_value, name),
    PROBE_FIELD(ms_param_value, kind),
    PROBE_FIELD(ms_param_value, number),
    PROBE_FIELD(ms_param_value, integer),
    PROBE_FIELD(ms_param_value, text),
    PROBE_FIELD(ms_param_value, list),
    PROBE_FIELD(ms_param_value, list_len),

    PROBE_TYPE(ms_tensor_info),
    PROBE_FIELD(ms_tensor_info, struct_size),
    PROBE_FIELD(ms_tensor_info, name),
    PROBE_FIELD(ms_tensor_info, role),
    PROBE_FIELD(ms_tensor_info, index),
    PROBE_FIELD(ms_tensor_info, count),
    PROBE_FIELD(ms_tensor_info, offset),
    PROBE_FIELD(ms_tensor_info, full_numel),
    PROBE_FIELD(ms_tensor_info, full_shape),
    PROBE_FIELD(ms_tensor_info, full_rank),

    PROBE_TYPE(ms_host_api_v1),
    PROBE_FIELD(ms_host_api_v1, struct_size),
    PROBE_FIELD(ms_host_api_v1, abi_major),
    PROBE_FIELD(ms_host_api_v1, abi_minor),
    PROBE_FIELD(ms_host_api_v1, ctx),
    PROBE_FIELD(ms_host_api_v1, log),
    PROBE_FIELD(ms_host_api_v1, report_progress),
    PROBE_FIELD(ms_host_api_v1, is_cancelled),
    PROBE_FIELD(ms_host_api_v1, set_error),
    PROBE_FIELD(ms_host_api_v1, get_extension),
    PROBE_FIELD(ms_host_api_v1, shape),
    PROBE_FIELD(ms_host_api_v1, numel),
    PROBE_FIELD(ms_host_api_v1, read_f32),
    PROBE_FIELD(ms_host_api_v1, from_f32),
    PROBE_FIELD(ms_host_api_v1, full_like),
    PROBE_FIELD(ms_host_api_v1, binary),
    PROBE_FIELD(ms_host_api_v1, unary),
    PROBE_FIELD(ms_host_api_v1, affine),
    PROBE_FIELD(ms_host_api_v1, compare_scalar),
    PROBE_FIELD(ms_host_api_v1, select),
    PROBE_FIELD(ms_host_api_v1, reduce),
    PROBE_FIELD(ms_host_api_v1, dot),
    PROBE_FIELD(ms_host_api_v1, kth_largest_abs),
    PROBE_FIELD(ms_host_api_v1, weighted_sum),
    PROBE_FIELD(ms_host_api_v1, reduce_stack),
    PROBE_FIELD(ms_host_api_v1, bernoulli_mask),
    PROBE_FIELD(ms_host_api_v1, matmul),
    PROBE_FIELD(ms_host_api_v1, transpose),
    PROBE_FIELD(ms_host_api_v1, reshape),
    PROBE_FIELD(ms_host_api_v1, svd),
    PROBE_FIELD(ms_host_api_v1, low_rank),
    PROBE_FIELD(ms_host_api_v1, release),
    PROBE_FIELD(ms_host_api_v1, trim_abs),
    PROBE_FIELD(ms_host_api_v1, elect_sign),
    PROBE_FIELD(ms_host_api_v1, disjoint_merge),

    PROBE_TYPE(ms_plugin_api_v1),
    PROBE_FIELD(ms_plugin_api_v1, struct_size),
    PROBE_FIELD(ms_plugin_api_v1, id),
    PROBE_FIELD(ms_plugin_api_v1, name),
    PROBE_FIELD(ms_plugin_api_v1, version),
    PROBE_FIELD(ms_plugin_api_v1, description),
    PROBE_FIELD(ms_plugin_api_v1, help),
    PROBE_FIELD(ms_plugin_api_v1, kind),
    PROBE_FIELD(ms_plugin_api_v1, capabilities),
    PROBE_FIELD(ms_plugin_api_v1, params_schema_json),
    PROBE_FIELD(ms_plugin_api_v1, create),
    PROBE_FIELD(ms_plugin_api_v1, destroy),
    PROBE_FIELD(ms_plugin_api_v1, prepare_passes),
    PROBE_FIELD(ms_plugin_api_v1, prepare_tensor),
    PROBE_FIELD(ms_plugin_api_v1, finish_pass),
    PROBE_FIELD(ms_plugin_api_v1, merge_tensor),
    PROBE_FIELD(ms_plugin_api_v1, get_extension),
    PROBE_FIELD(ms_plugin_api_v1, instance_capabilities),
    PROBE_FIELD(ms_plugin_api_v1, run_model),
    PROBE_FIELD(ms_plugin_api_v1, finish_tensor),

    /* constants, in the order of abi.rs */
    PROBE_STR(MS_MAGIC),
    PROBE_CONST(MS_ABI_MAJOR),
    PROBE_CONST(MS_ABI_MINOR),
    PROBE_STR(MS_HEADER_SYMBOL),
    PROBE_STR(MS_ENTRY_SYMBOL_V1),
    PROBE_CONST(MS_STATUS_OK),
    PROBE_CONST(MS_STATUS_ERROR),
    PROBE_CONST(MS_STATUS_PANIC),
    PROBE_CONST(MS_STATUS_CANCELLED),
    PROBE_CONST(MS_STATUS_UNSUPPORTED),
    PROBE_CONST(MS_STATUS_INVALID_ARGUMENT),
    PROBE_CONST(MS_KIND_PER_TENSOR),
    PROBE_CONST(MS_KIND_MODEL_LEVEL),
    PROBE_CONST(MS_CAP_THREAD_SAFE),
    PROBE_CONST(MS_CAP_ELEMENTWISE),
    PROBE_CONST(MS_CAP_NEEDS_BASE),
    PROBE_CONST(MS_CAP_CHUNKED_STATISTICS),
    PROBE_CONST(MS_CAP_ONE_EXPERT),
    PROBE_CONST(MS_CAP_ORDERED_STATISTICS),
    PROBE_CONST(MS_CAP_TENSOR_STATISTICS),
    PROBE_CONST(MS_ROLE_MATRIX),
    PROBE_CONST(MS_ROLE_VECTOR),
    PROBE_CONST(MS_ROLE_NORM),
    PROBE_CONST(MS_ROLE_EMBEDDING),
    PROBE_CONST(MS_ROLE_CONV),
    PROBE_CONST(MS_ROLE_OTHER),
    PROBE_CONST(MS_PARAM_FLOAT),
    PROBE_CONST(MS_PARAM_INT),
    PROBE_CONST(MS_PARAM_BOOL),
    PROBE_CONST(MS_PARAM_CHOICE),
    PROBE_CONST(MS_PARAM_FLOAT_LIST),
    PROBE_CONST(MS_LOG_ERROR),
    PROBE_CONST(MS_LOG_WARN),
    PROBE_CONST(MS_LOG_INFO),
    PROBE_CONST(MS_LOG_DEBUG),
    PROBE_CONST(MS_BINARY_ADD),
    PROBE_CONST(MS_BINARY_SUB),
    PROBE_CONST(MS_BINARY_MUL),
    PROBE_CONST(MS_BINARY_DIV),
    PROBE_CONST(MS_BINARY_MAXIMUM),
    PROBE_CONST(MS_BINARY_MINIMUM),
    PROBE_CONST(MS_BINARY_GT),
    PROBE_CONST(MS_BINARY_GE),
    PROBE_CONST(MS_BINARY_LT),
    PROBE_CONST(MS_BINARY_LE),
    PROBE_CONST(MS_BINARY_EQ),
    PROBE_CONST(MS_UNARY_NEG),
    PROBE_CONST(MS_UNARY_ABS),
    PROBE_CONST(MS_UNARY_SIGN),
    PROBE_CONST(MS_UNARY_SQRT),
    PROBE_CONST(MS_UNARY_SQUARE),
    PROBE_CONST(MS_UNARY_EXP),
    PROBE_CONST(MS_UNARY_LOG),
    PROBE_CONST(MS_REDUCE_SUM),
    PROBE_CONST(MS_REDUCE_SUM_SQUARES),
    PROBE_CONST(MS_REDUCE_SUM_ABS),
    PROBE_CONST(MS_REDUCE_MAX_ABS),
    PROBE_CONST(MS_REDUCE_COUNT_NONZERO),
    PROBE_CONST(MS_REDUCE_MEAN),
    PROBE_CONST(MS_REDUCE_MIN),
    PROBE_CONST(MS_REDUCE_MAX),
    PROBE_CONST(MS_STACK_SUM),
    PROBE_CONST(MS_STACK_MEAN),
    PROBE_CONST(MS_STACK_MAX),
    PROBE_CONST(MS_STACK_MIN),
    PROBE_CONST(MS_ELECT_MASS),
    PROBE_CONST(MS_ELECT_COUNT),
    PROBE_CONST(MS_DISJOINT_SUM),
    PROBE_CONST(MS_DISJOINT_MEAN),
    PROBE_CONST(MS_DISJOINT_MAX),
    PROBE_CONST(MS_PLUGIN_API_V1_MIN_SIZE),
    PROBE_CONST(MS_PLUGIN_API_V1_1_MIN_SIZE),
    PROBE_CONST(MS_PLUGIN_API_V1_5_MIN_SIZE),
    PROBE_CONST(MS_OBJECTIVE_CROSS_ENTROPY),
    PROBE_CONST(MS_OBJECTIVE_ENTROPY),
    PROBE_CONST(MS_OPTIMIZER_SGD),
    PROBE_CONST(MS_OPTIMIZER_MOMENTUM),
    PROBE_CONST(MS_OPTIMIZER_ADAMW),
    PROBE_CONST(MS_ALL_TASKS),

    PROBE_TYPE(ms_eval_metrics),
    PROBE_FIELD(ms_eval_metrics, struct_size),
    PROBE_FIELD(ms_eval_metrics, loss),
    PROBE_FIELD(ms_eval_metrics, accuracy),
    PROBE_FIELD(ms_eval_metrics, examples),

    PROBE_TYPE(ms_finetune_options),
    PROBE_FIELD(ms_finetune_options, struct_size),
    PROBE_FIELD(ms_finetune_options, steps),
    PROBE_FIELD(ms_finetune_options, learning_rate),
    PROBE_FIELD(ms_finetune_options, batch_size),
    PROBE_FIELD(ms_finetune_options, optimizer),
    PROBE_FIELD(ms_finetune_options, weight_decay),
    PROBE_FIELD(ms_finetune_options, seed),

    PROBE_TYPE(ms_session_api_v1),
    PROBE_FIELD(ms_session_api_v1, struct_size),
    PROBE_FIELD(ms_session_api_v1, ctx),
    PROBE_FIELD(ms_session_api_v1, tensor_count),
    PROBE_FIELD(ms_session_api_v1, tensor_info),
    PROBE_FIELD(ms_session_api_v1, expert_count),
    PROBE_FIELD(ms_session_api_v1, task_name),
    PROBE_FIELD(ms_session_api_v1, base_tensor),
    PROBE_FIELD(ms_session_api_v1, expert_tensor),
    PROBE_FIELD(ms_session_api_v1, evaluate),
    PROBE_FIELD(ms_session_api_v1, loss_and_grad),
    PROBE_FIELD(ms_session_api_v1, finetune),
    PROBE_FIELD(ms_session_api_v1, report_iterate),
    PROBE_FIELD(ms_session_api_v1, mark),
    PROBE_FIELD(ms_session_api_v1, release_since),
    PROBE_FIELD(ms_session_api_v1, get_extension),

    PROBE_STR(MS_SESSION_EXT_FISHER_V1),
    PROBE_INT(ms_fisher_labels),
    PROBE_CONST(MS_FISHER_LABELS_TRUE),
    PROBE_CONST(MS_FISHER_LABELS_PREDICTED),
    PROBE_TYPE(ms_session_fisher_v1),
    PROBE_FIELD(ms_session_fisher_v1, struct_size),
    PROBE_FIELD(ms_session_fisher_v1, diag_fisher),

    PROBE_STR(MS_SESSION_EXT_MINIBATCH_V1),
    PROBE_TYPE(ms_minibatch),
    PROBE_FIELD(ms_minibatch, struct_size),
    PROBE_FIELD(ms_minibatch, size),
    PROBE_FIELD(ms_minibatch, seed),
    PROBE_FIELD(ms_minibatch, step),
    PROBE_TYPE(ms_session_minibatch_v1),
    PROBE_FIELD(ms_session_minibatch_v1, struct_size),
    PROBE_FIELD(ms_session_minibatch_v1, loss_and_grad),

    PROBE_TYPE(ms_trim_abs_fn),
    PROBE_TYPE(ms_elect_sign_fn),
    PROBE_TYPE(ms_disjoint_merge_fn),
    PROBE_TYPE(ms_bernoulli_mask_fn),
    PROBE_TYPE(ms_bernoulli_mask_p_fn),
    PROBE_TYPE(ms_view_f32_fn),
    PROBE_TYPE(ms_svd_fn),
    PROBE_TYPE(ms_low_rank_fn),
    PROBE_TYPE(ms_parallel_job_fn),
    PROBE_STR(MS_HOST_EXT_SIGN_CONSENSUS_V1),
    PROBE_STR(MS_HOST_EXT_RANDOM_V1),
    PROBE_STR(MS_HOST_EXT_RANDOM_V2),
    PROBE_STR(MS_HOST_EXT_VIEWS_V1),
    PROBE_STR(MS_HOST_EXT_LINALG_V1),
    PROBE_STR(MS_HOST_EXT_PARALLEL_V1),
    PROBE_TYPE(ms_host_sign_consensus_v1),
    PROBE_FIELD(ms_host_sign_consensus_v1, struct_size),
    PROBE_FIELD(ms_host_sign_consensus_v1, trim_abs),
    PROBE_FIELD(ms_host_sign_consensus_v1, elect_sign),
    PROBE_FIELD(ms_host_sign_consensus_v1, disjoint_merge),
    PROBE_TYPE(ms_host_random_v1),
    PROBE_FIELD(ms_host_random_v1, struct_size),
    PROBE_FIELD(ms_host_random_v1, bernoulli_mask),
    PROBE_TYPE(ms_host_random_v2),
    PROBE_FIELD(ms_host_random_v2, struct_size),
    PROBE_FIELD(ms_host_random_v2, bernoulli_mask),
    PROBE_FIELD(ms_host_random_v2, bernoulli_mask_p),
    PROBE_TYPE(ms_host_views_v1),
    PROBE_FIELD(ms_host_views_v1, struct_size),
    PROBE_FIELD(ms_host_views_v1, view_f32),
    PROBE_TYPE(ms_host_linalg_v1),
    PROBE_FIELD(ms_host_linalg_v1, struct_size),
    PROBE_FIELD(ms_host_linalg_v1, svd),
    PROBE_FIELD(ms_host_linalg_v1, low_rank),
    PROBE_TYPE(ms_host_parallel_v1),
    PROBE_FIELD(ms_host_parallel_v1, struct_size),
    PROBE_FIELD(ms_host_parallel_v1, threads),
    PROBE_FIELD(ms_host_parallel_v1, parallel_for),
};

/* Returns the facts and writes their number to `n`. */
const ms_probe_entry *ms_probe_entries(size_t *n) {
    *n = sizeof(ENTRIES) / sizeof(ENTRIES[0]);
    return ENTRIES;
}

/* The magic bytes as MS_MAGIC_INIT spells them (8 bytes). */
const uint8_t *ms_probe_magic_init(void) {
    return probe_header.magic;
}

/* Keeps the typed initialisers referenced (they exist for their compile-time checks); returns
 * the sum of their struct_size fields, which the test also checks. */
size_t ms_probe_struct_sizes(void) {
    return probe_str.len + probe_param_value.list_len + probe_tensor_info.struct_size + probe_host_api.struct_size +
           probe_plugin_api.struct_size + probe_eval_metrics.struct_size + probe_finetune_options.struct_size +
           probe_session_api.struct_size + probe_session_fisher.struct_size + probe_minibatch.struct_size +
           probe_session_minibatch.struct_size + probe_sign_consensus.struct_size +
           probe_random.struct_size + probe_random_v2.struct_size + probe_views.struct_size + probe_linalg.struct_size + probe_parallel.struct_size +
           (probe_entry == NULL ? 0 : 1) + (probe_job == NULL ? 0 : 1);
}
