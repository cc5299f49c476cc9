/*
 * c-example: weight averaging written in plain C against mergescope_plugin.h, as proof that the
 * plugin ABI is really C. Same semantics as the Rust `weight-average` plugin:
 *
 *     theta = sum_t w_t * theta_t / sum_t w_t
 *
 * with one weight per expert (`weights`, default 1.0 each). The work is one call to the host's
 * weighted_sum, so the same library runs on whatever device the host computes on.
 *
 * Build by hand (the workspace does this in build.rs):
 *     cc -shared -fPIC -fvisibility=hidden -I plugin-api/include \
 *        plugins/c-example/src/plugin.c -o libmergescope_plugin_c_example.so
 */

#include "mergescope_plugin.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Static description                                                                        */
/* ---------------------------------------------------------------------------------------- */

#define ID "c-example"

static const char HELP[] =
    "Weight averaging written in plain C (a demonstration of the C plugin ABI): "
    "theta = sum_t w_t * theta_t / sum_t w_t over the experts. The base model, if given, is not "
    "used. With the default weights (all 1) this is the plain average, which equals task "
    "arithmetic with lambda = 1/T. Weights may be negative, but they must not sum to 0. "
    "Gives the same numbers as the Rust weight-average plugin.";

/* The parameter schema, written by hand (format: plugin-api/README.md). */
static const char SCHEMA[] =
    "[{\"name\":\"weights\",\"type\":\"float\",\"default\":1.0,"
    "\"help\":\"Weight of each expert (normalised to sum to 1).\",\"per_task\":true}]";

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* True when the host's table is long enough to contain `field` (the struct_size rule). */
#define HOST_HAS(host, field) \
    ((host)->struct_size >= offsetof(ms_host_api_v1, field) + sizeof(((ms_host_api_v1 *)0)->field))

#if defined(__GNUC__) || defined(__clang__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif

/* Formats a message and hands it to the host, which copies it; returns MS_STATUS_ERROR. */
static ms_status fail(const ms_host_api_v1 *host, const char *fmt, ...) PRINTF_LIKE(2, 3);

static ms_status fail(const ms_host_api_v1 *host, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) {
        n = 0;
    }
    if ((size_t)n >= sizeof buf) {
        n = (int)(sizeof buf - 1);
    }
    ms_str msg = { (const uint8_t *)buf, (size_t)n };
    host->set_error(host->ctx, msg);
    return MS_STATUS_ERROR;
}

static int str_eq(ms_str a, const char *b) {
    size_t n = strlen(b);
    return a.len == n && (n == 0 || memcmp(a.ptr, b, n) == 0);
}

/* ---------------------------------------------------------------------------------------- */
/* The method                                                                                */
/* ---------------------------------------------------------------------------------------- */

/* One instance: the normalised coefficients w_t / sum(w). Read-only after create, so the
 * instance is thread-safe. */
typedef struct instance {
    size_t n_experts;
    double coefficients[]; /* n_experts values */
} instance;

static ms_status create(const ms_host_api_v1 *host, const ms_param_value *params, size_t n_params, size_t n_experts,
                        uint64_t seed, void **out) {
    (void)seed;
    if (host == NULL || out == NULL || (n_params > 0 && params == NULL)) {
        return MS_STATUS_INVALID_ARGUMENT;
    }
    if (!HOST_HAS(host, weighted_sum)) {
        return fail(host, ID ": the host's table is too old (no weighted_sum)");
    }

    const ms_param_value *weights = NULL;
    for (size_t i = 0; i < n_params; i++) {
        if (str_eq(params[i].name, "weights")) {
            weights = &params[i];
        }
    }
    if (weights == NULL) {
        return fail(host, "weights: missing parameter");
    }
    if (weights->kind != MS_PARAM_FLOAT_LIST) {
        return fail(host, "weights: expected a list of floats (kind %u), got kind %u", (unsigned)MS_PARAM_FLOAT_LIST,
                    (unsigned)weights->kind);
    }
    if (weights->list_len != n_experts) {
        return fail(host, "weights: expected %zu values, got %zu", n_experts, weights->list_len);
    }
    if (n_experts > 0 && weights->list == NULL) {
        return MS_STATUS_INVALID_ARGUMENT;
    }

    double total = 0.0;
    for (size_t i = 0; i < n_experts; i++) {
        total += weights->list[i];
    }
    if (fabs(total) < 1e-12) {
        return fail(host, "weights sum to %g; the average is undefined. Give weights whose sum is not 0.", total);
    }

    instance *inst = (instance *)malloc(sizeof(instance) + n_experts * sizeof(double));
    if (inst == NULL) {
        return fail(host, ID ": out of memory");
    }
    inst->n_experts = n_experts;
    for (size_t i = 0; i < n_experts; i++) {
        inst->coefficients[i] = weights->list[i] / total;
    }

    static const ms_str created = MS_STR_LIT(ID ": instance created");
    host->log(host->ctx, MS_LOG_DEBUG, created);
    *out = inst;
    return MS_STATUS_OK;
}

static void destroy(void *inst) {
    free(inst);
}

static ms_status merge_tensor(void *inst_ptr, const ms_host_api_v1 *host, const ms_tensor_info *info,
                              ms_tensor_handle base, const ms_tensor_handle *experts, size_t n_experts,
                              ms_tensor_handle *out) {
    (void)base; /* weight averaging ignores the base model */
    const instance *inst = (const instance *)inst_ptr;
    if (inst == NULL || host == NULL || info == NULL || out == NULL || (n_experts > 0 && experts == NULL)) {
        return MS_STATUS_INVALID_ARGUMENT;
    }
    if (n_experts != inst->n_experts) {
        return fail(host, ID ": %.*s: %zu experts, but the instance was created for %zu", (int)info->name.len,
                    (const char *)info->name.ptr, n_experts, inst->n_experts);
    }
    /* One host call: sum_t c_t * theta_t. The host keeps the message if it fails. */
    return host->weighted_sum(host->ctx, experts, inst->coefficients, n_experts, out);
}

/* ---------------------------------------------------------------------------------------- */
/* Exports                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static const ms_plugin_api_v1 TABLE = {
    sizeof(ms_plugin_api_v1),                                                /* struct_size */
    MS_STR_LIT(ID),                                                          /* id */
    MS_STR_LIT("Weight averaging (C example)"),                              /* name */
    MS_STR_LIT("0.1.0"),                                                     /* version */
    MS_STR_LIT("Average of the expert models, optionally weighted; written in C."), /* description */
    { (const uint8_t *)HELP, sizeof HELP - 1 },                              /* help */
    MS_KIND_PER_TENSOR,                                                      /* kind */
    MS_CAP_ELEMENTWISE | MS_CAP_THREAD_SAFE,                                 /* capabilities */
    { (const uint8_t *)SCHEMA, sizeof SCHEMA - 1 },                          /* params_schema_json */
    create,                                                                  /* create */
    destroy,                                                                 /* destroy */
    NULL,                                                                    /* prepare_passes */
    NULL,                                                                    /* prepare_tensor */
    NULL,                                                                    /* finish_pass */
    merge_tensor,                                                            /* merge_tensor */
    NULL,                                                                    /* get_extension */
    NULL,                                                                    /* instance_capabilities */
    NULL,                                                                    /* run_model (ABI 1.1) */
    NULL,                                                                    /* finish_tensor (ABI 1.5) */
};

MS_DEFINE_PLUGIN_HEADER();

MS_EXTERN_C MS_EXPORT const ms_plugin_api_v1 *mergescope_plugin_entry_v1(void);

MS_EXTERN_C MS_EXPORT const ms_plugin_api_v1 *mergescope_plugin_entry_v1(void) {
    return &TABLE;
}
