/* GGUF experts of a mixture-of-experts MLP (ggml_moe.c): a call's plan, then its two phases of tasks. */
#ifndef SPECRT_GGML_MOE_H
#define SPECRT_GGML_MOE_H

#include <stddef.h>
#include <stdint.h>

enum { SPECRT_MOE_SILU = 0, SPECRT_MOE_GELU_TANH = 1 };

typedef struct {
    /* set by the caller */
    int64_t experts, hidden, inter;  /* E, H (the input's and output's width), I (each expert's gate and up rows) */
    int gate_type, up_type, down_type, activation, float_activations;
    int fused_gate_up;  /* gate_w holds each expert's gate rows, then its up rows (up_w and up_type unused) */
    const uint8_t *gate_w, *up_w, *down_w;
    int64_t gate_group_bytes, up_group_bytes, down_group_bytes;  /* bytes of a group of 8 rows of each matrix */
    /* set by specrt_moe_prepare (released by specrt_moe_release) */
    int64_t *count;     /* [E]: rows (token, slot) each expert takes */
    int64_t *start;     /* [E + 1]: an expert's first row */
    int64_t *used;      /* [used_count]: the experts some token chose, in order (a phase's tasks go by them) */
    int64_t *row_of;    /* [tokens * k]: the row of each (token, slot) */
    void *x_rows;       /* [rows] of the token's activations: quantized (x_stride bytes each) or float [H] */
    void *h_rows;       /* [rows] of act(gate) * up quantized (h_stride bytes each) */
    float *gate, *up;   /* [rows, I]: gate becomes act(gate) * up */
    float *out;         /* [rows, H]: each expert's output */
    int64_t tokens, k, x_stride, h_stride, used_count, up_tasks, down_tasks;
} SpecrtMoe;

/* The plan for tokens x [tokens, H] choosing experts ids [tokens, k]: 0, 1 (an id outside [0, E)) or 2 (out of
   memory); call specrt_moe_release after either. */
int specrt_moe_prepare(SpecrtMoe *moe, const float *x, const int64_t *ids, int64_t tokens, int64_t k);
void specrt_moe_up_task(const SpecrtMoe *moe, int64_t index);        /* index < up_tasks */
void specrt_moe_quantize_row(const SpecrtMoe *moe, int64_t row);     /* row < tokens * k; not with float activations */
void specrt_moe_down_task(const SpecrtMoe *moe, int64_t index);      /* index < down_tasks */
void specrt_moe_finish(const SpecrtMoe *moe, const float *weights, float *y); /* weights [tokens, k] -> y [tokens, H] */
void specrt_moe_release(SpecrtMoe *moe);

#endif
