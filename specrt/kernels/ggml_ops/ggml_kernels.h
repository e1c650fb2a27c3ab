/* GGUF matrix products (ggml_kernels.c): the calls the ONNX Runtime operators (ort_ops.c) and the tests make. */
#ifndef SPECRT_GGML_KERNELS_H
#define SPECRT_GGML_KERNELS_H

#include <stdint.h>

enum { SPECRT_Q5_0 = 6, SPECRT_Q5_1 = 7, SPECRT_Q4_K = 12, SPECRT_Q5_K = 13, SPECRT_Q6_K = 14 };  /* ggml's type numbers */

/* Bytes of one activation row of k values quantized for the products (k rounded up to 256): int8 values, a float
   scale per 32, a float sum per 16. */
int64_t specrt_q8k_row_bytes(int64_t k);
void specrt_q8k_quantize(const float *x, int64_t k, uint8_t *out);
int specrt_ggml_block_bytes(int type);   /* 0: a type these kernels do not take */
int specrt_ggml_block_weights(int type); /* 256 (K-quants) or 32 */
/* Where byte j of row r's block lies in a group's block (8 rows interleaved: ggml_kernels.c says how). */
int64_t specrt_ggml_group_offset(int type, int r, int j);
int64_t specrt_ggml_groups(int64_t n); /* groups of 8 rows holding n rows */
/* y[m, n] for the rows of groups [g_lo, g_hi) below n_total, m < m_count: weight rows of `type` blocks, interleaved
   by 8, against quantized activation rows. */
void specrt_ggml_rows(int type, const uint8_t *w, int64_t g_lo, int64_t g_hi, int64_t k, const uint8_t *act,
                      int64_t m_count, float *y, int64_t n_total);
/* The same with float activations (each block dequantized, then float dot products): conversion's exact check. */
void specrt_ggml_rows_float(int type, const uint8_t *w, int64_t g_lo, int64_t g_hi, int64_t k, const float *x,
                            int64_t m_count, float *y, int64_t n_total);
/* Row `row` of a k-wide weight (`type` blocks interleaved by 8) as floats, dequantized as ggml's get_rows does. */
void specrt_ggml_gather_row(int type, const uint8_t *w, int64_t k, int64_t row, float *out);
/* The whole product over interleaved weights, one thread (float_activations: as specrt_ggml_rows_float): 0 on
   success. */
int specrt_ggml_matmul(int type, const float *x, int64_t m_count, int64_t k, const uint8_t *w, int64_t n, float *y,
                       int float_activations);

#endif
