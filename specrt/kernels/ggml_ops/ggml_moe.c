/* A mixture-of-experts MLP over GGUF experts kept in the file's own blocks (ggml_kernels.c's products):
   y[t] = sum_j weight[t, j] * down_e(act(gate_e(x[t])) * up_e(x[t])), e = expert[t, j], j = 0 .. k - 1 in order.

   The routing (which k experts a token takes and their weights) is the graph's; this file runs the experts. The
   call's tokens are grouped by expert, so each chosen expert's blocks are read once for all the tokens that chose
   it, in two phases of independent tasks (each a run of 16 output rows of one expert): gate and up with the
   activation between them, then down. A token's output depends on its own routing only: each product row is one
   fixed sequence of operations whatever the other rows (ggml_kernels.c), and its k contributions are added in its
   own slot order, so a k-token call gives each token the bits a one-token call would.

   Weights are each expert's matrix interleaved by 8 rows (layout.py), the experts one after another: gate and up
   [E * I / 8, H / block * block bytes * 8], down [E * H / 8, I / block * block bytes * 8]; or, fused (Gemma 4's
   gate_up_proj), one tensor [E * 2I / 8, ...] with each expert's gate rows before its up rows. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_kernels.h"
#include "ggml_moe.h"

#define CHUNK 2 /* groups of 8 output rows a task (measured: 32, 11 times fewer tasks, no faster) */

int specrt_moe_prepare(SpecrtMoe *moe, const float *x, const int64_t *ids, int64_t tokens, int64_t k) {
    int64_t e_count = moe->experts, slots = tokens * k, h = moe->hidden, inter = moe->inter;
    memset(&moe->count, 0, sizeof(*moe) - offsetof(SpecrtMoe, count));
    moe->tokens = tokens;
    moe->k = k;
    moe->count = (int64_t *)calloc((size_t)e_count, sizeof(int64_t));
    moe->start = (int64_t *)calloc((size_t)e_count + 1, sizeof(int64_t));
    moe->used = (int64_t *)malloc(sizeof(int64_t) * (size_t)e_count);
    moe->row_of = (int64_t *)malloc(sizeof(int64_t) * (size_t)(slots ? slots : 1));
    moe->x_stride = specrt_q8k_row_bytes(h);
    moe->h_stride = specrt_q8k_row_bytes(inter);
    size_t rows = (size_t)(slots ? slots : 1);
    moe->gate = (float *)malloc(sizeof(float) * rows * (size_t)inter);
    moe->up = (float *)malloc(sizeof(float) * rows * (size_t)inter);
    moe->out = (float *)malloc(sizeof(float) * rows * (size_t)h);
    if (moe->float_activations) {
        moe->x_rows = malloc(sizeof(float) * rows * (size_t)h);
    } else {
        moe->x_rows = malloc(rows * (size_t)moe->x_stride);
        moe->h_rows = malloc(rows * (size_t)moe->h_stride);
    }
    if (!moe->count || !moe->start || !moe->used || !moe->row_of || !moe->gate || !moe->up || !moe->out ||
        !moe->x_rows || (!moe->float_activations && !moe->h_rows))
        return 2;
    for (int64_t s = 0; s < slots; ++s) {
        if (ids[s] < 0 || ids[s] >= e_count) return 1;
        moe->count[ids[s]] += 1;
    }
    for (int64_t e = 0; e < e_count; ++e) {
        moe->start[e + 1] = moe->start[e] + moe->count[e];
        if (moe->count[e]) moe->used[moe->used_count++] = e;
    }
    int64_t *next = (int64_t *)malloc(sizeof(int64_t) * (size_t)e_count);
    if (!next) return 2;
    memcpy(next, moe->start, sizeof(int64_t) * (size_t)e_count);
    for (int64_t s = 0; s < slots; ++s) moe->row_of[s] = next[ids[s]]++;  /* an expert's rows in token order */
    free(next);
    /* each row's input: its token's activations, quantized at the token's first slot and copied to the others */
    for (int64_t s = 0; s < slots; ++s) {
        const float *token = x + (s / k) * h;
        if (moe->float_activations)
            memcpy((float *)moe->x_rows + moe->row_of[s] * h, token, sizeof(float) * (size_t)h);
        else if (s % k == 0)
            specrt_q8k_quantize(token, h, (uint8_t *)moe->x_rows + moe->row_of[s] * moe->x_stride);
        else
            memcpy((uint8_t *)moe->x_rows + moe->row_of[s] * moe->x_stride,
                   (uint8_t *)moe->x_rows + moe->row_of[s - s % k] * moe->x_stride, (size_t)moe->x_stride);
    }
    moe->up_tasks = moe->used_count * ((specrt_ggml_groups(inter) + CHUNK - 1) / CHUNK);
    moe->down_tasks = moe->used_count * ((specrt_ggml_groups(h) + CHUNK - 1) / CHUNK);
    return 0;
}

/* Task `index` of a phase over `groups` groups of output rows: its expert and first group. */
static void task_at(const SpecrtMoe *moe, int64_t index, int64_t groups, int64_t *expert, int64_t *lo) {
    int64_t per = (groups + CHUNK - 1) / CHUNK;
    *expert = moe->used[index / per];
    *lo = index % per * CHUNK;
}

static inline float activation(int kind, float g) {
    if (kind == SPECRT_MOE_GELU_TANH)
        return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    return g / (1.0f + expf(-g));  /* silu */
}

void specrt_moe_up_task(const SpecrtMoe *moe, int64_t index) {
    int64_t inter = moe->inter, h = moe->hidden, groups = specrt_ggml_groups(inter), e, lo;
    task_at(moe, index, groups, &e, &lo);
    int64_t hi = lo + CHUNK < groups ? lo + CHUNK : groups, m = moe->count[e], row0 = moe->start[e];
    /* fused: one tensor holds each expert's gate rows, then its up rows */
    const uint8_t *gate_w = moe->gate_w + e * (moe->fused_gate_up ? 2 : 1) * groups * moe->gate_group_bytes;
    const uint8_t *up_w = moe->fused_gate_up ? gate_w + groups * moe->gate_group_bytes
                                             : moe->up_w + e * groups * moe->up_group_bytes;
    float *gate = moe->gate + row0 * inter, *up = moe->up + row0 * inter;
    if (moe->float_activations) {
        const float *x = (const float *)moe->x_rows + row0 * h;
        specrt_ggml_rows_float(moe->gate_type, gate_w, lo, hi, h, x, m, gate, inter);
        specrt_ggml_rows_float(moe->up_type, up_w, lo, hi, h, x, m, up, inter);
    } else {
        const uint8_t *x = (const uint8_t *)moe->x_rows + row0 * moe->x_stride;
        specrt_ggml_rows(moe->gate_type, gate_w, lo, hi, h, x, m, gate, inter);
        specrt_ggml_rows(moe->up_type, up_w, lo, hi, h, x, m, up, inter);
    }
    int64_t c_hi = 8 * hi < inter ? 8 * hi : inter;
    for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 8 * lo; c < c_hi; ++c)
            gate[r * inter + c] = activation(moe->activation, gate[r * inter + c]) * up[r * inter + c];
}

void specrt_moe_quantize_row(const SpecrtMoe *moe, int64_t row) {
    specrt_q8k_quantize(moe->gate + row * moe->inter, moe->inter, (uint8_t *)moe->h_rows + row * moe->h_stride);
}

void specrt_moe_down_task(const SpecrtMoe *moe, int64_t index) {
    int64_t inter = moe->inter, h = moe->hidden, groups = specrt_ggml_groups(h), e, lo;
    task_at(moe, index, groups, &e, &lo);
    int64_t hi = lo + CHUNK < groups ? lo + CHUNK : groups, m = moe->count[e], row0 = moe->start[e];
    const uint8_t *down_w = moe->down_w + e * groups * moe->down_group_bytes;
    if (moe->float_activations)
        specrt_ggml_rows_float(moe->down_type, down_w, lo, hi, inter, moe->gate + row0 * inter, m,
                               moe->out + row0 * h, h);
    else
        specrt_ggml_rows(moe->down_type, down_w, lo, hi, inter, (const uint8_t *)moe->h_rows + row0 * moe->h_stride,
                         m, moe->out + row0 * h, h);
}

void specrt_moe_finish(const SpecrtMoe *moe, const float *weights, float *y) {
    int64_t h = moe->hidden;
    for (int64_t t = 0; t < moe->tokens; ++t) {
        float *out = y + t * h;
        for (int64_t c = 0; c < h; ++c) out[c] = 0.0f;
        for (int64_t j = 0; j < moe->k; ++j) {  /* the token's own slot order */
            int64_t s = t * moe->k + j;
            const float *part = moe->out + moe->row_of[s] * h;
            float w = weights[s];
            for (int64_t c = 0; c < h; ++c) out[c] += w * part[c];
        }
    }
}

void specrt_moe_release(SpecrtMoe *moe) {
    free(moe->count);
    free(moe->start);
    free(moe->used);
    free(moe->row_of);
    free(moe->gate);
    free(moe->up);
    free(moe->out);
    free(moe->x_rows);
    free(moe->h_rows);
    memset(&moe->count, 0, sizeof(*moe) - offsetof(SpecrtMoe, count));
}
