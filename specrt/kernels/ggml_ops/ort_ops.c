/* ONNX Runtime operators over ggml_kernels.c: specrt.ggml MatMulQ5_0, MatMulQ5_1, MatMulQ4_K, MatMulQ5_K and
   MatMulQ6_K, GatherQ5_0 ... GatherQ6_K, and MoE (ggml_moe.c), registered by
   SessionOptions.register_custom_ops_library (the entry point RegisterCustomOps below).

   MatMul: Y [..., N] float = A [..., K] float times W^T, W the GGUF tensor's own blocks (of 32 weights, or 256 for
   the K-quants) interleaved by 8 rows (ggml_kernels.c; ggml_ops/layout.py writes them): B [ceil(N / 8), K / block *
   block bytes * 8] uint8. Attributes: N (required: the rows, which B's padding hides), accuracy_level (0: float
   activations, each block dequantized: conversion's exact check; else 8-bit activations per 32, MatMulNBits'
   level 4).
   Gather: Y [..., K] float = rows ids [...] int64 of the same B (a token embedding table), dequantized as ggml's
   get_rows does; attribute N. A tied model's lm_head multiplies by the very bytes its embedding gathers from. An
   id outside [-N, N) fails the call (negative ids count from the end, as ONNX's Gather).

   Only what these operators call of ONNX Runtime's C API is declared here: the API is a table of function
   pointers whose order never changes between releases (new entries are appended), so a slot is named by its
   index. Indices and signatures are those of onnxruntime_c_api.h; the table is asked for at API version 17 (ONNX
   Runtime 1.17, the first with KernelContext_ParallelFor; specrt needs 1.22 or later). */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_kernels.h"
#include "ggml_moe.h"

#define API_VERSION 17

typedef struct OrtStatus OrtStatus;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtValue OrtValue;
typedef struct OrtShapeInfo OrtShapeInfo; /* OrtTensorTypeAndShapeInfo */
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtDomain OrtDomain; /* OrtCustomOpDomain */

typedef struct {
    void *slot[300];  /* the first entries of OrtApi, by index; this file reads at most slot 274 */
} OrtApiTable;

typedef struct {
    const OrtApiTable *(*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} OrtApiBaseTable;

/* Slots of OrtApi used here (index: name). */
enum {
    CREATE_STATUS = 0,
    CREATE_CUSTOM_OP_DOMAIN = 26,
    CUSTOM_OP_DOMAIN_ADD = 27,
    ADD_CUSTOM_OP_DOMAIN = 28,
    GET_TENSOR_MUTABLE_DATA = 51,
    GET_DIMENSIONS_COUNT = 61,
    GET_DIMENSIONS = 62,
    GET_TENSOR_TYPE_AND_SHAPE = 65,
    KERNEL_INFO_GET_ATTRIBUTE_INT64 = 86,
    KERNEL_CONTEXT_GET_INPUT = 90,
    KERNEL_CONTEXT_GET_OUTPUT = 91,
    RELEASE_STATUS = 93,
    RELEASE_TENSOR_TYPE_AND_SHAPE_INFO = 99,
    KERNEL_CONTEXT_PARALLEL_FOR = 274,
};

enum { ELEMENT_FLOAT = 1, ELEMENT_UINT8 = 2, ELEMENT_INT64 = 7 };
enum { ORT_FAIL = 1, ORT_INVALID_ARGUMENT = 2 };
enum { INPUT_OUTPUT_REQUIRED = 0 };

/* OrtCustomOp, all 26 members (a zeroed member is "not provided"; which ones are read depends on `version`). */
typedef struct CustomOp {
    uint32_t version;
    void *(*CreateKernel)(const struct CustomOp *op, const OrtApiTable *api, const OrtKernelInfo *info);
    const char *(*GetName)(const struct CustomOp *op);
    const char *(*GetExecutionProviderType)(const struct CustomOp *op);
    int (*GetInputType)(const struct CustomOp *op, size_t index);
    size_t (*GetInputTypeCount)(const struct CustomOp *op);
    int (*GetOutputType)(const struct CustomOp *op, size_t index);
    size_t (*GetOutputTypeCount)(const struct CustomOp *op);
    void (*KernelCompute)(void *kernel, OrtKernelContext *context);
    void (*KernelDestroy)(void *kernel);
    int (*GetInputCharacteristic)(const struct CustomOp *op, size_t index);
    int (*GetOutputCharacteristic)(const struct CustomOp *op, size_t index);
    int (*GetInputMemoryType)(const struct CustomOp *op, size_t index);
    int (*GetVariadicInputMinArity)(const struct CustomOp *op);
    int (*GetVariadicInputHomogeneity)(const struct CustomOp *op);
    int (*GetVariadicOutputMinArity)(const struct CustomOp *op);
    int (*GetVariadicOutputHomogeneity)(const struct CustomOp *op);
    OrtStatus *(*CreateKernelV2)(const struct CustomOp *op, const OrtApiTable *api, const OrtKernelInfo *info,
                                 void **kernel);
    OrtStatus *(*KernelComputeV2)(void *kernel, OrtKernelContext *context);
    void *InferOutputShapeFn;
    int (*GetStartVersion)(const struct CustomOp *op);
    int (*GetEndVersion)(const struct CustomOp *op);
    void *GetMayInplace, *ReleaseMayInplace, *GetAliasMap, *ReleaseAliasMap;
} CustomOp;

typedef OrtStatus *(*CreateStatusFn)(int code, const char *msg);
typedef OrtStatus *(*CreateDomainFn)(const char *domain, OrtDomain **out);
typedef OrtStatus *(*DomainAddFn)(OrtDomain *domain, const CustomOp *op);
typedef OrtStatus *(*AddDomainFn)(OrtSessionOptions *options, OrtDomain *domain);
typedef OrtStatus *(*MutableDataFn)(OrtValue *value, void **out);
typedef OrtStatus *(*DimsCountFn)(const OrtShapeInfo *info, size_t *out);
typedef OrtStatus *(*DimsFn)(const OrtShapeInfo *info, int64_t *dims, size_t length);
typedef OrtStatus *(*TypeAndShapeFn)(const OrtValue *value, OrtShapeInfo **out);
typedef OrtStatus *(*GetInputFn)(const OrtKernelContext *context, size_t index, const OrtValue **out);
typedef OrtStatus *(*GetOutputFn)(OrtKernelContext *context, size_t index, const int64_t *dims, size_t count,
                                  OrtValue **out);
typedef OrtStatus *(*AttributeIntFn)(const OrtKernelInfo *info, const char *name, int64_t *out);
typedef void (*ReleaseStatusFn)(OrtStatus *status);
typedef void (*ReleaseShapeFn)(OrtShapeInfo *info);
typedef OrtStatus *(*ParallelForFn)(const OrtKernelContext *context, void (*fn)(void *, size_t), size_t total,
                                    size_t num_batch, void *usr_data);

#define API(api, index, type) ((type)(api)->slot[index])

typedef struct {
    const OrtApiTable *api;
    int type;  /* ggml's type number (ggml_kernels.h) */
    int float_activations;  /* attribute accuracy_level 0 (as MatMulNBits'): float activations, for exact checks */
    int64_t n;  /* attribute N: the weight's rows */
} Kernel;

typedef struct {
    int type;
    const uint8_t *w;
    int64_t n, k, m;
    const uint8_t *act;  /* the activations quantized, or NULL: float activations x */
    const float *x;
    float *y;
    int64_t chunk;  /* groups of 8 output columns per task */
} Job;

static void run_chunk(void *data, size_t index) {
    const Job *job = (const Job *)data;
    int64_t groups = specrt_ggml_groups(job->n), lo = (int64_t)index * job->chunk;
    int64_t hi = lo + job->chunk < groups ? lo + job->chunk : groups;
    if (job->act)
        specrt_ggml_rows(job->type, job->w, lo, hi, job->k, job->act, job->m, job->y, job->n);
    else
        specrt_ggml_rows_float(job->type, job->w, lo, hi, job->k, job->x, job->m, job->y, job->n);
}

/* dims of a value into out (at most 8); returns the count, or -1 on an error. */
static int dims_of(const OrtApiTable *api, const OrtValue *value, int64_t *out) {
    OrtShapeInfo *info = NULL;
    size_t count = 0;
    if (API(api, GET_TENSOR_TYPE_AND_SHAPE, TypeAndShapeFn)(value, &info)) return -1;
    int bad = API(api, GET_DIMENSIONS_COUNT, DimsCountFn)(info, &count) != NULL || count > 8 ||
              API(api, GET_DIMENSIONS, DimsFn)(info, out, count) != NULL;
    API(api, RELEASE_TENSOR_TYPE_AND_SHAPE_INFO, ReleaseShapeFn)(info);
    return bad ? -1 : (int)count;
}

/* A kernel's inputs 0 and 1; nonzero where ONNX Runtime gives either no value. */
static int two_inputs(const OrtApiTable *api, OrtKernelContext *context, const OrtValue **first,
                      const OrtValue **second) {
    return API(api, KERNEL_CONTEXT_GET_INPUT, GetInputFn)(context, 0, first) != NULL ||
           API(api, KERNEL_CONTEXT_GET_INPUT, GetInputFn)(context, 1, second) != NULL;
}

/* The output (y_dims, rank) allocated and its data; nonzero on a failure. */
static int bind_output(const OrtApiTable *api, OrtKernelContext *context, const int64_t *y_dims, size_t rank,
                       void **y) {
    OrtValue *y_value = NULL;
    return API(api, KERNEL_CONTEXT_GET_OUTPUT, GetOutputFn)(context, 0, y_dims, rank, &y_value) != NULL ||
           API(api, GET_TENSOR_MUTABLE_DATA, MutableDataFn)(y_value, y) != NULL;
}

/* The output (y_dims, rank) allocated, and the data of both inputs and of the output; nonzero on a failure. */
static int bind_data(const OrtApiTable *api, OrtKernelContext *context, const int64_t *y_dims, size_t rank,
                     const OrtValue *first, const OrtValue *second, void **x, void **b, void **y) {
    return bind_output(api, context, y_dims, rank, y) ||
           API(api, GET_TENSOR_MUTABLE_DATA, MutableDataFn)((OrtValue *)first, x) != NULL ||
           API(api, GET_TENSOR_MUTABLE_DATA, MutableDataFn)((OrtValue *)second, b) != NULL;
}

static OrtStatus *compute(void *data, OrtKernelContext *context) {
    const Kernel *kernel = (const Kernel *)data;
    const OrtApiTable *api = kernel->api;
    CreateStatusFn status = API(api, CREATE_STATUS, CreateStatusFn);
    const OrtValue *a_value = NULL, *b_value = NULL;
    if (two_inputs(api, context, &a_value, &b_value)) return status(ORT_FAIL, "specrt.ggml: cannot read the inputs");
    int64_t a_dims[8], b_dims[8];
    int a_rank = dims_of(api, a_value, a_dims), b_rank = dims_of(api, b_value, b_dims);
    if (a_rank < 1 || b_rank != 2)
        return status(ORT_INVALID_ARGUMENT, "specrt.ggml: A must be [..., K], B [N / 8, bytes * 8]");
    int64_t k = a_dims[a_rank - 1], n = kernel->n, m = 1;
    for (int i = 0; i < a_rank - 1; ++i) m *= a_dims[i];
    int per = specrt_ggml_block_weights(kernel->type);
    int64_t group_row = k / per * specrt_ggml_block_bytes(kernel->type) * 8;  /* bytes of a group of 8 rows */
    if (k % per || b_dims[0] != specrt_ggml_groups(n) || b_dims[1] != group_row)
        return status(ORT_INVALID_ARGUMENT, "specrt.ggml: B is not N rows of K / block blocks of its type by 8");
    int64_t y_dims[8];
    memcpy(y_dims, a_dims, sizeof(int64_t) * (size_t)a_rank);
    y_dims[a_rank - 1] = n;
    void *a = NULL, *b = NULL, *y = NULL;
    if (bind_data(api, context, y_dims, (size_t)a_rank, a_value, b_value, &a, &b, &y))
        return status(ORT_FAIL, "specrt.ggml: cannot bind the output");
    if (m == 0 || n == 0) return NULL;
    int64_t stride = specrt_q8k_row_bytes(k);
    uint8_t *act = NULL;
    if (!kernel->float_activations) {
        act = (uint8_t *)malloc((size_t)(stride * m));
        if (!act) return status(ORT_FAIL, "specrt.ggml: out of memory for the quantized activations");
        for (int64_t i = 0; i < m; ++i) specrt_q8k_quantize((const float *)a + i * k, k, act + i * stride);
    }
    Job job = {kernel->type, (const uint8_t *)b, n, k, m, act, (const float *)a, (float *)y, 2};
    size_t chunks = (size_t)((specrt_ggml_groups(n) + job.chunk - 1) / job.chunk);
    OrtStatus *failed = API(api, KERNEL_CONTEXT_PARALLEL_FOR, ParallelForFn)(context, run_chunk, chunks, 0, &job);
    free(act);
    return failed;
}

typedef struct {
    int type;
    const uint8_t *w;
    int64_t k;
    const int64_t *ids;  /* already checked and made non-negative */
    float *y;
} GatherJob;

static void gather_one(void *data, size_t index) {
    const GatherJob *job = (const GatherJob *)data;
    specrt_ggml_gather_row(job->type, job->w, job->k, job->ids[index], job->y + (int64_t)index * job->k);
}

static OrtStatus *gather_compute(void *data, OrtKernelContext *context) {
    const Kernel *kernel = (const Kernel *)data;
    const OrtApiTable *api = kernel->api;
    CreateStatusFn status = API(api, CREATE_STATUS, CreateStatusFn);
    const OrtValue *ids_value = NULL, *b_value = NULL;
    if (two_inputs(api, context, &ids_value, &b_value)) return status(ORT_FAIL, "specrt.ggml: cannot read the inputs");
    int64_t ids_dims[8], b_dims[8];
    int ids_rank = dims_of(api, ids_value, ids_dims), b_rank = dims_of(api, b_value, b_dims);
    int64_t group_block = (int64_t)specrt_ggml_block_bytes(kernel->type) * 8, n = kernel->n;
    if (ids_rank < 0 || ids_rank > 7 || b_rank != 2 || b_dims[1] % group_block || b_dims[0] != specrt_ggml_groups(n))
        return status(ORT_INVALID_ARGUMENT, "specrt.ggml: Gather takes ids [...] and B [N / 8, bytes * 8]");
    int64_t k = b_dims[1] / group_block * specrt_ggml_block_weights(kernel->type), count = 1, y_dims[8];
    for (int i = 0; i < ids_rank; ++i) count *= ids_dims[i];
    memcpy(y_dims, ids_dims, sizeof(int64_t) * (size_t)ids_rank);
    y_dims[ids_rank] = k;
    void *ids = NULL, *b = NULL, *y = NULL;
    if (bind_data(api, context, y_dims, (size_t)ids_rank + 1, ids_value, b_value, &ids, &b, &y))
        return status(ORT_FAIL, "specrt.ggml: cannot bind the output");
    if (count == 0 || k == 0) return NULL;
    int64_t *rows = (int64_t *)malloc(sizeof(int64_t) * (size_t)count);
    if (!rows) return status(ORT_FAIL, "specrt.ggml: out of memory for the ids");
    for (int64_t i = 0; i < count; ++i) {
        int64_t id = ((const int64_t *)ids)[i];
        if (id < -n || id >= n) {
            free(rows);
            return status(ORT_INVALID_ARGUMENT, "specrt.ggml: a token id is outside the embedding table");
        }
        rows[i] = id < 0 ? id + n : id;
    }
    GatherJob job = {kernel->type, (const uint8_t *)b, k, rows, (float *)y};
    OrtStatus *failed =
        API(api, KERNEL_CONTEXT_PARALLEL_FOR, ParallelForFn)(context, gather_one, (size_t)count, 0, &job);
    free(rows);
    return failed;
}

typedef struct {
    const OrtApiTable *api;
    SpecrtMoe config;  /* the attributes; a call's plan is a copy of it */
} MoeKernel;

static void moe_up(void *data, size_t index) { specrt_moe_up_task((const SpecrtMoe *)data, (int64_t)index); }
static void moe_quantize(void *data, size_t index) {
    specrt_moe_quantize_row((const SpecrtMoe *)data, (int64_t)index);
}
static void moe_down(void *data, size_t index) { specrt_moe_down_task((const SpecrtMoe *)data, (int64_t)index); }

/* Input `index`'s value, its data and its dims (at most 8); nonzero on a failure. */
static int input_at(const OrtApiTable *api, OrtKernelContext *context, size_t index, const OrtValue **value,
                    void **data, int64_t *dims, int *rank) {
    if (API(api, KERNEL_CONTEXT_GET_INPUT, GetInputFn)(context, index, value) != NULL || !*value) return 1;
    *rank = dims_of(api, *value, dims);
    return *rank < 0 || API(api, GET_TENSOR_MUTABLE_DATA, MutableDataFn)((OrtValue *)*value, data) != NULL;
}

/* Whether weight dims [rows, bytes] are E matrices of `rows_each` rows of k weights of `type`, interleaved. */
static int experts_fit(const int64_t *dims, int rank, int type, int64_t experts, int64_t rows_each, int64_t k) {
    int per = specrt_ggml_block_weights(type);
    return rank == 2 && per && k % per == 0 && rows_each % 8 == 0 && dims[0] == experts * (rows_each / 8) &&
           dims[1] == k / per * specrt_ggml_block_bytes(type) * 8;
}

static OrtStatus *moe_compute(void *data, OrtKernelContext *context) {
    const MoeKernel *kernel = (const MoeKernel *)data;
    const OrtApiTable *api = kernel->api;
    CreateStatusFn status = API(api, CREATE_STATUS, CreateStatusFn);
    const OrtValue *value[6];
    void *in[6];
    int64_t dims[6][8];
    int rank[6];
    for (size_t i = 0; i < 6; ++i)
        if (input_at(api, context, i, &value[i], &in[i], dims[i], &rank[i]))
            return status(ORT_FAIL, "specrt.ggml: MoE cannot read its inputs");
    SpecrtMoe moe = kernel->config;
    const char *misshaped = "specrt.ggml: MoE takes X [..., H], ids and weights [X's rows, k]";
    if (rank[0] < 1) return status(ORT_INVALID_ARGUMENT, misshaped);
    int64_t h = dims[0][rank[0] - 1], tokens = 1, e = moe.experts, inter = moe.inter;
    for (int i = 0; i < rank[0] - 1; ++i) tokens *= dims[0][i];
    if (rank[1] != 2 || rank[2] != 2 || dims[1][0] != tokens || dims[2][0] != tokens ||
        dims[1][1] != dims[2][1] || dims[1][1] < 1)
        return status(ORT_INVALID_ARGUMENT, misshaped);
    if (!experts_fit(dims[3], rank[3], moe.gate_type, e, moe.fused_gate_up ? 2 * inter : inter, h) ||
        (!moe.fused_gate_up && !experts_fit(dims[4], rank[4], moe.up_type, e, inter, h)) ||
        !experts_fit(dims[5], rank[5], moe.down_type, e, h, inter))
        return status(ORT_INVALID_ARGUMENT, "specrt.ggml: MoE's gate, up and down are not E experts' interleaved "
                                            "blocks of [I, H], [I, H] and [H, I]");
    void *y = NULL;
    if (bind_output(api, context, dims[0], (size_t)rank[0], &y))
        return status(ORT_FAIL, "specrt.ggml: cannot bind the output");
    if (tokens == 0 || h == 0) return NULL;
    moe.hidden = h;
    moe.gate_w = (const uint8_t *)in[3];
    moe.up_w = (const uint8_t *)in[4];
    moe.down_w = (const uint8_t *)in[5];
    moe.gate_group_bytes = dims[3][1];
    moe.up_group_bytes = dims[4][1];
    moe.down_group_bytes = dims[5][1];
    int64_t k = dims[1][1];
    int failed_plan = specrt_moe_prepare(&moe, (const float *)in[0], (const int64_t *)in[1], tokens, k);
    OrtStatus *failed = NULL;
    ParallelForFn parallel = API(api, KERNEL_CONTEXT_PARALLEL_FOR, ParallelForFn);
    if (failed_plan)
        failed = status(failed_plan == 1 ? ORT_INVALID_ARGUMENT : ORT_FAIL,
                        failed_plan == 1 ? "specrt.ggml: an expert id is outside [0, experts)"
                                         : "specrt.ggml: out of memory for the experts' rows");
    if (!failed) failed = parallel(context, moe_up, (size_t)moe.up_tasks, 0, &moe);
    if (!failed && !moe.float_activations) failed = parallel(context, moe_quantize, (size_t)(tokens * k), 0, &moe);
    if (!failed) failed = parallel(context, moe_down, (size_t)moe.down_tasks, 0, &moe);
    if (!failed) specrt_moe_finish(&moe, (const float *)in[2], (float *)y);
    specrt_moe_release(&moe);
    return failed;
}

/* An int64 attribute, or `fallback` where the node has none. */
static int64_t attribute_or(const OrtApiTable *api, const OrtKernelInfo *info, const char *name, int64_t fallback) {
    int64_t value = fallback;
    OrtStatus *absent = API(api, KERNEL_INFO_GET_ATTRIBUTE_INT64, AttributeIntFn)(info, name, &value);
    if (absent) {
        API(api, RELEASE_STATUS, ReleaseStatusFn)(absent);
        return fallback;
    }
    return value;
}

static OrtStatus *create_moe_kernel(const CustomOp *op, const OrtApiTable *api, const OrtKernelInfo *info,
                                    void **out) {
    (void)op;
    CreateStatusFn status = API(api, CREATE_STATUS, CreateStatusFn);
    MoeKernel *kernel = (MoeKernel *)calloc(1, sizeof(MoeKernel));
    if (!kernel) return status(ORT_FAIL, "specrt.ggml: out of memory");
    kernel->api = api;
    SpecrtMoe *c = &kernel->config;
    c->experts = attribute_or(api, info, "experts", -1);
    c->inter = attribute_or(api, info, "inter", -1);
    c->gate_type = (int)attribute_or(api, info, "gate_type", -1);
    c->up_type = (int)attribute_or(api, info, "up_type", -1);
    c->down_type = (int)attribute_or(api, info, "down_type", -1);
    c->activation = (int)attribute_or(api, info, "activation", SPECRT_MOE_SILU);
    c->float_activations = attribute_or(api, info, "accuracy_level", 4) == 0;
    c->fused_gate_up = attribute_or(api, info, "fused_gate_up", 0) != 0;
    if (c->fused_gate_up) c->up_type = c->gate_type;
    if (c->experts < 1 || c->inter < 1 || !specrt_ggml_block_bytes(c->gate_type) ||
        !specrt_ggml_block_bytes(c->up_type) || !specrt_ggml_block_bytes(c->down_type) ||
        (c->activation != SPECRT_MOE_SILU && c->activation != SPECRT_MOE_GELU_TANH)) {
        free(kernel);
        return status(ORT_INVALID_ARGUMENT, "specrt.ggml: MoE needs experts, inter, gate_type, up_type and down_type "
                                            "(types these kernels take) and activation 0 or 1");
    }
    *out = kernel;
    return NULL;
}

static OrtStatus *create_kernel(const CustomOp *op, const OrtApiTable *api, const OrtKernelInfo *info, void **out);

/* The operators of each ggml type: its product and its gather (ops[i] and ops[KIND_COUNT + i]). */
static const struct {
    const char *matmul, *gather;
    int type;
} KINDS[] = {{"MatMulQ5_0", "GatherQ5_0", SPECRT_Q5_0}, {"MatMulQ5_1", "GatherQ5_1", SPECRT_Q5_1},
             {"MatMulQ4_K", "GatherQ4_K", SPECRT_Q4_K}, {"MatMulQ5_K", "GatherQ5_K", SPECRT_Q5_K},
             {"MatMulQ6_K", "GatherQ6_K", SPECRT_Q6_K}};
#define KIND_COUNT (sizeof(KINDS) / sizeof(KINDS[0]))
#define MOE_OP ((ptrdiff_t)(2 * KIND_COUNT))
#define OP_COUNT (MOE_OP + 1)
static CustomOp ops[OP_COUNT];
static int is_gather(const CustomOp *op) { return op - ops >= (ptrdiff_t)KIND_COUNT && op - ops < MOE_OP; }
static int is_moe(const CustomOp *op) { return op - ops == MOE_OP; }
static const char *cpu_provider(const CustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static int input_type(const CustomOp *op, size_t index) {
    if (is_moe(op)) return index == 0 || index == 2 ? ELEMENT_FLOAT : (index == 1 ? ELEMENT_INT64 : ELEMENT_UINT8);
    if (index == 1) return ELEMENT_UINT8;
    return is_gather(op) ? ELEMENT_INT64 : ELEMENT_FLOAT;
}
static size_t input_count(const CustomOp *op) { return is_moe(op) ? 6 : 2; }
static int output_type(const CustomOp *op, size_t index) { (void)op; (void)index; return ELEMENT_FLOAT; }
static size_t one(const CustomOp *op) { (void)op; return 1; }
static void destroy(void *kernel) { free(kernel); }
static int required(const CustomOp *op, size_t index) { (void)op; (void)index; return INPUT_OUTPUT_REQUIRED; }
static int default_memory(const CustomOp *op, size_t index) { (void)op; (void)index; return 0; }
static int opset_one(const CustomOp *op) { (void)op; return 1; }
static int any_later(const CustomOp *op) { (void)op; return 2147483647; }

static const char *op_name(const CustomOp *op) {
    if (is_moe(op)) return "MoE";
    return is_gather(op) ? KINDS[op - ops - KIND_COUNT].gather : KINDS[op - ops].matmul;
}

static OrtStatus *create_kernel(const CustomOp *op, const OrtApiTable *api, const OrtKernelInfo *info, void **out) {
    Kernel *kernel = (Kernel *)malloc(sizeof(Kernel));
    if (!kernel) return API(api, CREATE_STATUS, CreateStatusFn)(ORT_FAIL, "specrt.ggml: out of memory");
    kernel->api = api;
    kernel->type = KINDS[(op - ops) % KIND_COUNT].type;
    kernel->float_activations = attribute_or(api, info, "accuracy_level", 4) == 0;
    OrtStatus *no_rows = API(api, KERNEL_INFO_GET_ATTRIBUTE_INT64, AttributeIntFn)(info, "N", &kernel->n);
    if (no_rows || kernel->n < 0) {
        if (no_rows) API(api, RELEASE_STATUS, ReleaseStatusFn)(no_rows);
        free(kernel);
        return API(api, CREATE_STATUS, CreateStatusFn)(
            ORT_INVALID_ARGUMENT, "specrt.ggml: the operator has no N: a bundle converted by an earlier specrt, whose "
                                  "weights are not interleaved; convert it again");
    }
    *out = kernel;
    return NULL;
}

static void fill(CustomOp *op) {
    memset(op, 0, sizeof(*op));
    op->version = API_VERSION;
    op->GetName = op_name;
    op->GetExecutionProviderType = cpu_provider;
    op->GetInputType = input_type;
    op->GetInputTypeCount = input_count;
    op->GetOutputType = output_type;
    op->GetOutputTypeCount = one;
    op->KernelDestroy = destroy;
    op->GetInputCharacteristic = required;
    op->GetOutputCharacteristic = required;
    op->GetInputMemoryType = default_memory;
    op->CreateKernelV2 = is_moe(op) ? create_moe_kernel : create_kernel;
    op->KernelComputeV2 = is_moe(op) ? moe_compute : (is_gather(op) ? gather_compute : compute);
    op->GetStartVersion = opset_one;
    op->GetEndVersion = any_later;
}

OrtStatus *RegisterCustomOps(OrtSessionOptions *options, const OrtApiBaseTable *base) {
    const OrtApiTable *api = base->GetApi(API_VERSION);
    if (!api) return NULL;  /* an ONNX Runtime older than 1.17: nothing is registered, the graph will not load */
    for (ptrdiff_t i = 0; i < OP_COUNT; ++i) fill(&ops[i]);
    OrtDomain *domain = NULL;
    OrtStatus *failed = API(api, CREATE_CUSTOM_OP_DOMAIN, CreateDomainFn)("specrt.ggml", &domain);
    for (ptrdiff_t i = 0; !failed && i < OP_COUNT; ++i)
        failed = API(api, CUSTOM_OP_DOMAIN_ADD, DomainAddFn)(domain, &ops[i]);
    if (!failed) failed = API(api, ADD_CUSTOM_OP_DOMAIN, AddDomainFn)(options, domain);
    return failed;
}
