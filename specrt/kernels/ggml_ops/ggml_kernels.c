/* GGUF K-quant matrix products on the CPU: y[m, n] = sum_k x[m, k] * w[n, k], w kept in the file's own blocks.

   The activations are first quantized to 8 bits per 32 values (a float scale each, as MatMulNBits' int8
   activations at accuracy level 4: llama.cpp's K-quant path scales per 256, which rounds a row with one large
   feature much more coarsely), with the float sum of every 16. Each product is then an integer dot product of 32
   weights with 32 activations, rescaled once: by the weights' sub-scale and the activations' scale, less the
   weights' minimum times the activations' sum. A row of y does not depend on how many rows the call has or on
   how the output columns are split between threads: each output is one fixed sequence of operations.

   Block layouts (bytes): Q4_K 144 = fp16 d, fp16 dmin, 12 bytes of 6-bit sub-scales and sub-minimums (8 each),
   128 bytes of nibbles (per 64 weights: 32 bytes, low nibbles the first 32 weights, high nibbles the next 32);
   w = d * sc_j * q - dmin * m_j. Q5_K 176 = as Q4_K, with 32 bytes of fifth bits before the nibbles (weight
   64p + l of the low nibbles takes bit 2p of byte l, of the high nibbles bit 2p + 1): q = nibble | bit << 4. Q6_K
   210 = 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales (one per 16 weights), fp16 d;
   w = d * sc_g * (q - 32) with q = low | high << 4. Q5_0 22 = fp16 d, 4 bytes of fifth bits (least significant
   first), 16 bytes of nibbles (the first 16 weights low); w = d * (q - 16). Q5_1 24 = fp16 d, fp16 m, then as Q5_0;
   w = d * q + m.

   The vector path needs AVX2 (and uses AVX-512 VNNI's dot product where the compiler may: the same integers);
   without it the same integers and the same float operations run in plain C. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "ggml_kernels.h"

#define QK_K 256

static inline float half_to_float(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, bits;
    if (exp == 0) {
        float f = ldexpf((float)man, -24);  /* zero or subnormal */
        return sign ? -f : f;
    }
    bits = exp == 31 ? (sign | 0x7F800000u | (man << 13)) : (sign | ((exp + 112) << 23) | (man << 13));
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Q4_K's 12 bytes -> 8 sub-scales and 8 sub-minimums, 6 bits each: bytes 0-3 hold the first four scales in their
   low 6 bits, bytes 4-7 the first four minimums; bytes 8-11 the last four of each in their nibbles (scale low,
   minimum high), whose top 2 bits are the top bits of bytes 0-3 (scales) and 4-7 (minimums). */
static inline void k4_scale_min(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[3], out[4];
    memcpy(u, s, 12);
    out[0] = u[0] & 0x3F3F3F3Fu;
    out[1] = (u[2] & 0x0F0F0F0Fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    out[2] = u[1] & 0x3F3F3F3Fu;
    out[3] = ((u[2] >> 4) & 0x0F0F0F0Fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    memcpy(sc, out, 8);
    memcpy(mn, out + 2, 8);
}

/* A row of k activations is laid out over k rounded up to 256 (the padding zero): every group of 8 sub-blocks of
   32 reads whole vectors, also in a 32-block format's last, partial group. */
static inline int64_t padded(int64_t k) { return (k + QK_K - 1) / QK_K * QK_K; }

int64_t specrt_q8k_row_bytes(int64_t k) { return padded(k) + (padded(k) / 32) * 4 + (padded(k) / 16) * 4; }

void specrt_q8k_quantize(const float *x, int64_t k, uint8_t *out) {
    int64_t kp = padded(k);
    int8_t *q = (int8_t *)out;
    float *d = (float *)(out + kp);
    float *sums = (float *)(out + kp + (kp / 32) * 4);
    memset(out, 0, (size_t)specrt_q8k_row_bytes(k));
    for (int64_t b = 0; b < k / 32; ++b) {
        const float *xb = x + b * 32;
        int8_t *qb = q + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(xb[i]));
        float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        d[b] = amax / 127.0f;
        for (int i = 0; i < 32; ++i) {
            float v = nearbyintf(xb[i] * inv);
            qb[i] = (int8_t)(v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v));
        }
        for (int h = 0; h < 2; ++h) {
            int s = 0;
            for (int i = 0; i < 16; ++i) s += qb[16 * h + i];
            sums[2 * b + h] = d[b] * (float)s;
        }
    }
}

/* An activation row quantized for the products (specrt_q8k_quantize's layout). */
typedef struct {
    const int8_t *q;    /* [k] */
    const float *d;     /* [k / 32]: q * d is the activation */
    const float *sum;   /* [k / 16]: each 16 activations' sum, as q * d */
} q8_row;

static inline q8_row q8_at(const uint8_t *act, int64_t stride, int64_t k, int64_t m) {
    const uint8_t *a = act + m * stride;
    int64_t kp = padded(k);
    q8_row r = {(const int8_t *)a, (const float *)(a + kp), (const float *)(a + kp + (kp / 32) * 4)};
    return r;
}

static inline float fp16(const uint8_t *p) {
#if defined(__F16C__)
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
#else
    return half_to_float(p);
#endif
}

/* Weight rows are interleaved by 8 in the bundle (as llama.cpp repacks Q4_K for its CPU kernels): a group holds 8
   rows' block b side by side, so that one broadcast of 4 activation bytes meets 4 weights of each of the 8 rows
   in one vector, a 32-bit lane per row, and each row's sums stay in its own lane with no horizontal additions;
   the unpacking of a group's block is shared by every activation row of the call. The bytes are the file's, only
   placed elsewhere (specrt_ggml_group_offset; ggml_ops/layout.py writes them): of row r (0..7) in a group's block,
   Q4_K (1152 bytes): fp16 d at 2r, fp16 dmin at 16 + 2r, the 12 scale bytes as 3 words (word w at 32 + 4 (8w + r)),
     qs[32p + 4c + i] (p < 4 pairs of sub-blocks, c < 8, i < 4) at 128 + 4 (8 (8p + c) + r) + i;
   Q5_K (1408): as Q4_K up to 128, qh[4c + i] at 128 + 4 (8c + r) + i, qs[32p + 4c + i] at
     384 + 4 (8 (8p + c) + r) + i;
   Q6_K (1680): ql[64h + 32a + 4c + i] at 4 (8 (8 (2h + a) + c) + r) + i, qh[32h + 4c + i] at
     1024 + 4 (8 (8h + c) + r) + i, scale s at 1536 + 8s + r, fp16 d at 1664 + 2r;
   Q5_0 (176) / Q5_1 (192): fp16 d at 2r, (Q5_1: fp16 m at 16 + 2r), the fifth bits' word at H + 4r, qs[4c + i]
     at H + 32 + 4 (8c + r) + i, H = 16 (Q5_0) or 32 (Q5_1).
   A row count that is not a multiple of 8 is padded with zero rows, which no output reads. */

#define ROWS 8    /* weight rows in a group */
/* Activation rows multiplied by a group's block while it is unpacked, at most (the accumulators of a tile stay in
   registers): Q6_K's unpacking costs more than the others', which pays for a taller tile. */
#define M_TILE 8
#define TILE_Q6_K 8
#define TILE_OTHER 4  /* measured: 8 no faster for Q4_K and Q5_0 */

int specrt_ggml_block_bytes(int type) {
    switch (type) {
    case SPECRT_Q5_0: return 22;
    case SPECRT_Q5_1: return 24;
    case SPECRT_Q4_K: return 144;
    case SPECRT_Q5_K: return 176;
    case SPECRT_Q6_K: return 210;
    default: return 0;
    }
}

static inline int is_k_quant(int type) { return type == SPECRT_Q4_K || type == SPECRT_Q5_K || type == SPECRT_Q6_K; }

int specrt_ggml_block_weights(int type) { return is_k_quant(type) ? QK_K : 32; }

int64_t specrt_ggml_group_offset(int type, int r, int j) {
    int i = j % 4;
    switch (type) {
    case SPECRT_Q4_K:
        if (j < 4) return 16 * (j / 2) + 2 * r + j % 2;
        if (j < 16) return 32 + 4 * (8 * ((j - 4) / 4) + r) + i;
        return 128 + 4 * (8 * ((j - 16) / 4) + r) + i;  /* (j - 16) / 4 = 8p + c */
    case SPECRT_Q5_K:
        if (j < 16) return specrt_ggml_group_offset(SPECRT_Q4_K, r, j);
        if (j < 48) return 128 + 4 * (8 * ((j - 16) / 4) + r) + i;
        return 384 + 4 * (8 * ((j - 48) / 4) + r) + i;
    case SPECRT_Q6_K:
        if (j < 128) return 4 * (8 * (j / 4) + r) + i;  /* j / 4 = 8 (2h + a) + c */
        if (j < 192) return 1024 + 4 * (8 * ((j - 128) / 4) + r) + i;
        if (j < 208) return 1536 + 8 * (j - 192) + r;
        return 1664 + 2 * r + (j - 208);
    default: {
        int has_min = type == SPECRT_Q5_1, h = has_min ? 32 : 16;
        if (j < 2 || (has_min && j < 4)) return 16 * (j / 2) + 2 * r + j % 2;
        int bits = has_min ? 4 : 2;
        if (j < bits + 4) return h + 4 * r + (j - bits);
        return h + 32 + 4 * (8 * ((j - bits - 4) / 4) + r) + (j - bits - 4) % 4;
    }
    }
}

/* specrt_ggml_group_offset per format, as tables (filled when the library loads). */
#define FORMATS 5
static const int formats[FORMATS] = {SPECRT_Q5_0, SPECRT_Q5_1, SPECRT_Q4_K, SPECRT_Q5_K, SPECRT_Q6_K};
static int16_t group_map[FORMATS][ROWS][210];

static int map_index(int type) {
    int t = 0;
    while (formats[t] != type) ++t;
    return t;
}

__attribute__((constructor)) static void fill_group_maps(void) {
    const int *types = formats;
    for (int t = 0; t < FORMATS; ++t)
        for (int r = 0; r < ROWS; ++r)
            for (int j = 0; j < specrt_ggml_block_bytes(types[t]); ++j)
                group_map[t][r][j] = (int16_t)specrt_ggml_group_offset(types[t], r, j);
}

/* Row r's block as the file holds it, from a group's block. */
static void gather_block(int type, const uint8_t *group, int r, uint8_t *out) {
    const int16_t *at = group_map[map_index(type)][r];
    for (int j = 0; j < specrt_ggml_block_bytes(type); ++j) out[j] = group[at[j]];
}

/* A block's unsigned weight values in weight order (the file's layout): Q4_K 4 bits, Q5_K, Q5_0 and Q5_1 5 bits,
   Q6_K 6 bits (w = d sc (u - 32)). Each block's scales are read where they are used. */
static void block_values(int type, const uint8_t *blk, uint8_t *u) {
    if (type == SPECRT_Q4_K || type == SPECRT_Q5_K) {  /* per 64 weights 32 bytes: the first 32 in the low nibbles */
        const int five = type == SPECRT_Q5_K;
        const uint8_t *qs = blk + (five ? 48 : 16), *qh = blk + 16;
        for (int j = 0; j < 4; ++j) {
            for (int l = 0; l < 32; ++l) {
                uint8_t byte = qs[32 * j + l];
                u[64 * j + l] = (byte & 0x0F) | (five ? ((qh[l] >> (2 * j)) & 1) << 4 : 0);
                u[64 * j + 32 + l] = (byte >> 4) | (five ? ((qh[l] >> (2 * j + 1)) & 1) << 4 : 0);
            }
        }
    } else if (type == SPECRT_Q6_K) {  /* low nibbles in ql, two high bits each in qh */
        const uint8_t *ql = blk, *qh = blk + 128;
        for (int half = 0; half < 2; ++half) {
            for (int l = 0; l < 32; ++l) {
                const uint8_t a0 = ql[64 * half + l], a1 = ql[64 * half + 32 + l], h = qh[32 * half + l];
                u[128 * half + l] = (a0 & 15) | ((h & 3) << 4);
                u[128 * half + 32 + l] = (a1 & 15) | (((h >> 2) & 3) << 4);
                u[128 * half + 64 + l] = (a0 >> 4) | (((h >> 4) & 3) << 4);
                u[128 * half + 96 + l] = (a1 >> 4) | (((h >> 6) & 3) << 4);
            }
        }
    } else {  /* 16 bytes of nibbles (the first 16 weights low), the fifth bits in a word before them */
        int has_min = type == SPECRT_Q5_1;
        const uint8_t *qs = blk + (has_min ? 8 : 6);
        uint32_t high;
        memcpy(&high, blk + (has_min ? 4 : 2), 4);
        for (int l = 0; l < 16; ++l) {
            u[l] = (qs[l] & 0x0F) | (((high >> l) & 1) << 4);
            u[16 + l] = (qs[l] >> 4) | (((high >> (16 + l)) & 1) << 4);
        }
    }
}

#define AI __attribute__((always_inline))

#if defined(__AVX2__)
typedef int32_t loose_i32 __attribute__((aligned(1), may_alias));  /* any 4 bytes as an int32 */

/* acc + per lane the dot product of 4 unsigned bytes of u with 4 signed bytes of q. */
static inline AI __m256i dot4(__m256i acc, __m256i u, __m256i q) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, q);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1)));
#endif
}

/* 8 fp16 -> 8 floats. */
static inline AI __m256 halves8(const uint8_t *p) {
#if defined(__F16C__)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    float f[8];
    for (int i = 0; i < 8; ++i) f[i] = half_to_float(p + 2 * i);
    return _mm256_loadu_ps(f);
#endif
}

static inline AI __m256i load32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Four activation bytes in every lane. */
#define bcast4(p) _mm256_set1_epi32(*(const loose_i32 *)(p))

/* Ask for the weights PREFETCH_BYTES on while this block (`bytes` of a group) is multiplied: with several activation
   rows, or Q6_K's longer unpacking, the products are slow enough that the hardware's own prefetching does not keep
   ahead (one thread, 16384 x 10240 Q4_K, 4 rows: 11.7 -> 5.2 ms; docs/performance.md). Each block asks for the
   next `bytes` of the stream, so every cache line is asked for once. A prefetch never faults: the last blocks of a
   matrix may ask past its end. */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 8192
#endif
static inline AI void prefetch_block(const uint8_t *blk, int bytes) {
    if (!PREFETCH_BYTES) return;  /* -DPREFETCH_BYTES=0: none (to measure against) */
    const uint8_t *next = blk + PREFETCH_BYTES;
    for (int at = 0; at < bytes; at += 64) _mm_prefetch((const char *)(next + at), _MM_HINT_T0);
}

/* Bits s .. s + 3 of each lane's word -> 16 in that lane's bytes 0 .. 3 (0 where the bit is clear). */
static inline AI __m256i fifth_bits(__m256i words, int s) {
    const __m256i first_byte = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                                                0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    const __m256i bit = _mm256_set1_epi32(0x08040201);
    __m256i spread = _mm256_shuffle_epi8(_mm256_srli_epi32(words, s), first_byte);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

/* Byte `shift / 8` of each lane's word, as a float. */
static inline AI __m256 lane_byte(__m256i words, int shift) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(words, shift), _mm256_set1_epi32(0xFF)));
}

/* acc + x * y * z, the product x * y rounded first. */
static inline AI __m256 fma_scaled(__m256 acc, __m256 x, __m256 y, float z) {
    return _mm256_fmadd_ps(x, _mm256_mul_ps(y, _mm256_set1_ps(z)), acc);
}

/* Each output row's lane: its sums less its minimums' (or offsets') share, for the valid rows. */
static inline AI void store_rows(float *y, int64_t y_stride, const __m256 *acc, const __m256 *less, int mt,
                                 int rows) {
    for (int t = 0; t < mt; ++t) {
        float out[ROWS];
        _mm256_storeu_ps(out, _mm256_sub_ps(acc[t], less[t]));
        for (int r = 0; r < rows; ++r) y[t * y_stride + r] = out[r];
    }
}

/* Bit s of each byte -> 16 in that byte (0 where the bit is clear). */
static inline AI __m256i bit_as_16(__m256i v, int s) {
    const __m256i sixteen = _mm256_set1_epi8(0x10);
    return _mm256_and_si256(s < 4 ? _mm256_slli_epi16(v, 4 - s) : _mm256_srli_epi16(v, s - 4), sixteen);
}

/* Q4_K rows (five: Q5_K rows) against activation rows x[0 .. mt - 1]: y[t * y_stride + r]. Per sub-block j of 32
   (one weight scale, one activation scale): d sc_j * xd_j * (q . q8) into acc; dmin m_j times the activations' two
   16-sums into mins. */
static inline AI void q4_k_group(const uint8_t *w, int64_t nb, const q8_row *x, int mt, float *y,
                                 int64_t y_stride, int rows, int five) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), six = _mm256_set1_epi32(0x3F3F3F3F);
    const __m256i four = _mm256_set1_epi32(0x0F0F0F0F), two = _mm256_set1_epi32(0x03030303);
    __m256 acc[M_TILE], mins[M_TILE];
    for (int t = 0; t < mt; ++t) acc[t] = mins[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = w + b * (five ? 1408 : 1152), *qh = blk + 128, *qs = blk + (five ? 384 : 128);
        prefetch_block(blk, five ? 1408 : 1152);
        __m256 d = halves8(blk), dmin = halves8(blk + 16);
        __m256i u0 = load32(blk + 32), u1 = load32(blk + 64), u2 = load32(blk + 96);
        /* as k4_scale_min, a row a lane: scales 0-3 and 4-7, minimums 0-3 and 4-7, a byte each */
        __m256i sc[2] = {_mm256_and_si256(u0, six),
                         _mm256_or_si256(_mm256_and_si256(u2, four),
                                         _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), two), 4))};
        __m256i mn[2] = {_mm256_and_si256(u1, six),
                         _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), four),
                                         _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), two), 4))};
        for (int p = 0; p < 4; ++p) {  /* sub-blocks 2p (low nibbles) and 2p + 1 (high) */
            const int sh = 16 * (p & 1);
            __m256 dsc0 = _mm256_mul_ps(d, lane_byte(sc[p >> 1], sh));
            __m256 dsc1 = _mm256_mul_ps(d, lane_byte(sc[p >> 1], sh + 8));
            __m256 dmn0 = _mm256_mul_ps(dmin, lane_byte(mn[p >> 1], sh));
            __m256 dmn1 = _mm256_mul_ps(dmin, lane_byte(mn[p >> 1], sh + 8));
            __m256i lo[M_TILE], hi[M_TILE];
            for (int t = 0; t < mt; ++t) lo[t] = hi[t] = _mm256_setzero_si256();
            for (int c = 0; c < 8; ++c) {
                __m256i v = load32(qs + 256 * p + 32 * c);
                __m256i l = _mm256_and_si256(v, low4), h = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                if (five) {  /* the fifth bits of the 4 weights of each row: bits 2p (low nibbles), 2p + 1 (high) */
                    __m256i f = load32(qh + 32 * c);
                    l = _mm256_or_si256(l, bit_as_16(f, 2 * p));
                    h = _mm256_or_si256(h, bit_as_16(f, 2 * p + 1));
                }
                for (int t = 0; t < mt; ++t) {
                    const int8_t *qa = x[t].q + QK_K * b + 64 * p + 4 * c;
                    lo[t] = dot4(lo[t], l, bcast4(qa));
                    hi[t] = dot4(hi[t], h, bcast4(qa + 32));
                }
            }
            for (int t = 0; t < mt; ++t) {
                int64_t j = 8 * b + 2 * p;
                acc[t] = fma_scaled(acc[t], _mm256_cvtepi32_ps(lo[t]), dsc0, x[t].d[j]);
                acc[t] = fma_scaled(acc[t], _mm256_cvtepi32_ps(hi[t]), dsc1, x[t].d[j + 1]);
                mins[t] = _mm256_fmadd_ps(dmn0, _mm256_set1_ps(x[t].sum[2 * j]), mins[t]);
                mins[t] = _mm256_fmadd_ps(dmn0, _mm256_set1_ps(x[t].sum[2 * j + 1]), mins[t]);
                mins[t] = _mm256_fmadd_ps(dmn1, _mm256_set1_ps(x[t].sum[2 * j + 2]), mins[t]);
                mins[t] = _mm256_fmadd_ps(dmn1, _mm256_set1_ps(x[t].sum[2 * j + 3]), mins[t]);
            }
        }
    }
    store_rows(y, y_stride, acc, mins, mt, rows);
}

/* Q6_K rows (as q4_k). Per sub-block j of 32 (two weight scales of 16, one activation scale): d xd_j * sum_g sc_g
   (u . q8) with u = q + 32 into acc; 32 d sc_g times the activations' 16-sums into offs. */
static inline AI void q6_k_group(const uint8_t *w, int64_t nb, const q8_row *x, int mt, float *y,
                                 int64_t y_stride, int rows) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
    __m256 acc[M_TILE], offs[M_TILE];
    for (int t = 0; t < mt; ++t) acc[t] = offs[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = w + b * 1680, *ql = blk, *qh = blk + 1024, *sc = blk + 1536;
        prefetch_block(blk, 1680);
        __m256 d = halves8(blk + 1664), d32 = _mm256_mul_ps(_mm256_set1_ps(32.0f), d);
        for (int j = 0; j < 8; ++j) {  /* weights 32j .. 32j + 31: half h, ql part s & 1, nibble and qh bits by s */
            const int h = j / 4, s = j % 4;
            __m256i first[M_TILE], second[M_TILE];  /* the sub-block's two scale groups' integer dot products */
            for (int t = 0; t < mt; ++t) first[t] = second[t] = _mm256_setzero_si256();
            for (int c = 0; c < 8; ++c) {
                __m256i lv = load32(ql + 32 * (8 * (2 * h + (s & 1)) + c)), hv = load32(qh + 32 * (8 * h + c));
                /* u: the low nibble (s < 2) or the high one, and qh's bits 2s, 2s + 1 as bits 4, 5 */
                __m256i low = _mm256_and_si256(s < 2 ? lv : _mm256_srli_epi16(lv, 4), low4);
                __m256i top = s == 0   ? _mm256_slli_epi16(hv, 4)
                              : s == 1 ? _mm256_slli_epi16(hv, 2)
                              : s == 2 ? hv
                                       : _mm256_srli_epi16(hv, 2);
                __m256i u = _mm256_or_si256(low, _mm256_and_si256(top, bits45));
                for (int t = 0; t < mt; ++t) {
                    __m256i q = bcast4(x[t].q + QK_K * b + 32 * j + 4 * c);
                    if (c < 4) first[t] = dot4(first[t], u, q);
                    else second[t] = dot4(second[t], u, q);
                }
            }
            __m256i s0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * j)));
            __m256i s1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16 * j + 8)));
            __m256 o0 = _mm256_mul_ps(d32, _mm256_cvtepi32_ps(s0)), o1 = _mm256_mul_ps(d32, _mm256_cvtepi32_ps(s1));
            for (int t = 0; t < mt; ++t) {
                __m256i sum = _mm256_add_epi32(_mm256_mullo_epi32(first[t], s0), _mm256_mullo_epi32(second[t], s1));
                acc[t] = fma_scaled(acc[t], _mm256_cvtepi32_ps(sum), d, x[t].d[8 * b + j]);
                offs[t] = _mm256_fmadd_ps(o0, _mm256_set1_ps(x[t].sum[16 * b + 2 * j]), offs[t]);
                offs[t] = _mm256_fmadd_ps(o1, _mm256_set1_ps(x[t].sum[16 * b + 2 * j + 1]), offs[t]);
            }
        }
    }
    store_rows(y, y_stride, acc, offs, mt, rows);
}

/* Rows of a 32-weight format (Q5_0, Q5_1): w = d u - c per block (Q5_0: c = 16 d; Q5_1: c = -m); d xd_b (u . q8)
   into acc, c times the activations' two 16-sums into cs. */
static inline AI void q5_group(int type, const uint8_t *w, int64_t nb, const q8_row *x, int mt, float *y,
                               int64_t y_stride, int rows) {
    const int has_min = type == SPECRT_Q5_1, words = has_min ? 32 : 16, size = ROWS * specrt_ggml_block_bytes(type);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256 acc[M_TILE], cs[M_TILE];
    for (int t = 0; t < mt; ++t) acc[t] = cs[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = w + b * size, *qs = blk + words + 32;
        prefetch_block(blk, size);
        __m256 d = halves8(blk);
        __m256 c = has_min ? _mm256_sub_ps(_mm256_setzero_ps(), halves8(blk + 16))
                           : _mm256_mul_ps(d, _mm256_set1_ps(16.0f));
        __m256i hbits = load32(blk + words), sums[M_TILE];
        for (int t = 0; t < mt; ++t) sums[t] = _mm256_setzero_si256();
        for (int q = 0; q < 4; ++q) {
            __m256i v = load32(qs + 32 * q);
            __m256i lo = _mm256_or_si256(_mm256_and_si256(v, low4), fifth_bits(hbits, 4 * q));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4),
                                         fifth_bits(hbits, 16 + 4 * q));
            for (int t = 0; t < mt; ++t) {
                const int8_t *qa = x[t].q + 32 * b + 4 * q;
                sums[t] = dot4(dot4(sums[t], lo, bcast4(qa)), hi, bcast4(qa + 16));
            }
        }
        for (int t = 0; t < mt; ++t) {
            acc[t] = fma_scaled(acc[t], _mm256_cvtepi32_ps(sums[t]), d, x[t].d[b]);
            cs[t] = _mm256_fmadd_ps(c, _mm256_set1_ps(x[t].sum[2 * b]), cs[t]);
            cs[t] = _mm256_fmadd_ps(c, _mm256_set1_ps(x[t].sum[2 * b + 1]), cs[t]);
        }
    }
    store_rows(y, y_stride, acc, cs, mt, rows);
}

#else /* plain C: each row's block gathered back to the file's layout, the same integers, the same float order */

/* The integer dot products of one block with its activations per 32 (K-quants: 8; Q6_K already scaled per 16),
   and the block's float factors: out = sum_j f[j] * xd_j * dots[j] - sum_g o[g] * (the g-th 16-sum). */
static void block_terms(int type, const uint8_t *blk, const int8_t *qa, int dots[8], float f[8], float o[16]) {
    uint8_t u[QK_K];
    block_values(type, blk, u);
    memset(dots, 0, 8 * sizeof(int));
    if (type == SPECRT_Q4_K || type == SPECRT_Q5_K) {
        float d = fp16(blk), dmin = fp16(blk + 2);
        uint8_t sc[8], mn[8];
        k4_scale_min(blk + 4, sc, mn);
        for (int i = 0; i < QK_K; ++i) dots[i / 32] += u[i] * qa[i];
        for (int j = 0; j < 8; ++j) {
            f[j] = d * (float)sc[j];
            o[2 * j] = o[2 * j + 1] = dmin * (float)mn[j];
        }
    } else if (type == SPECRT_Q6_K) {
        const int8_t *sc = (const int8_t *)(blk + 192);
        float d = fp16(blk + 208);
        for (int i = 0; i < QK_K; ++i) dots[i / 32] += sc[i / 16] * u[i] * qa[i];
        for (int j = 0; j < 8; ++j) f[j] = d;
        for (int g = 0; g < 16; ++g) o[g] = 32.0f * d * (float)sc[g];
    } else {
        int has_min = type == SPECRT_Q5_1;
        float d = fp16(blk), c = has_min ? -fp16(blk + 2) : d * 16.0f;
        for (int i = 0; i < 32; ++i) dots[0] += u[i] * qa[i];
        f[0] = d;
        o[0] = o[1] = c;
    }
}

static void scalar_group(int type, const uint8_t *w, int64_t nb, const q8_row *x, int mt, float *y,
                         int64_t y_stride, int rows) {
    int size = specrt_ggml_block_bytes(type), per = specrt_ggml_block_weights(type), subs = per / 32;
    uint8_t blk[210];
    for (int r = 0; r < rows; ++r) {
        for (int t = 0; t < mt; ++t) {
            float acc = 0.0f, less = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                int dots[8];
                float f[8], o[16];
                gather_block(type, w + b * ROWS * size, r, blk);
                block_terms(type, blk, x[t].q + per * b, dots, f, o);
                for (int j = 0; j < subs; ++j) acc = fmaf((float)dots[j], f[j] * x[t].d[subs * b + j], acc);
                for (int g = 0; g < 2 * subs; ++g) less = fmaf(o[g], x[t].sum[2 * subs * b + g], less);
            }
            y[t * y_stride + r] = acc - less;
        }
    }
}
#endif

void specrt_ggml_rows(int type, const uint8_t *w, int64_t g_lo, int64_t g_hi, int64_t k, const uint8_t *act,
                      int64_t m_count, float *y, int64_t n_total) {
    int64_t stride = specrt_q8k_row_bytes(k), nb = k / specrt_ggml_block_weights(type);
    int64_t group_bytes = nb * ROWS * specrt_ggml_block_bytes(type);
    const int tile = type == SPECRT_Q6_K ? TILE_Q6_K : TILE_OTHER;
    for (int64_t m0 = 0; m0 < m_count; m0 += tile) {
        int mt = (int)(m_count - m0 < tile ? m_count - m0 : tile);
        q8_row x[M_TILE];
        for (int t = 0; t < mt; ++t) x[t] = q8_at(act, stride, k, m0 + t);
        for (int64_t g = g_lo; g < g_hi; ++g) {
            const uint8_t *grp = w + g * group_bytes;
            float *out = y + m0 * n_total + ROWS * g;
            int rows = (int)(n_total - ROWS * g < ROWS ? n_total - ROWS * g : ROWS);
#if defined(__AVX2__)
            /* a copy of the loop per format and tile height, both known: the accumulators stay in registers */
#define UP_TO_4(call)       \
    case 1: call(1); break; \
    case 2: call(2); break; \
    case 3: call(3); break; \
    case 4: call(4); break;
#define UP_TO_8(call)       \
    UP_TO_4(call)           \
    case 5: call(5); break; \
    case 6: call(6); break; \
    case 7: call(7); break; \
    case 8: call(8); break;
#define Q6_K_AT(n) q6_k_group(grp, nb, x, n, out, n_total, rows)
#define Q4_K_AT(n) q4_k_group(grp, nb, x, n, out, n_total, rows, 0)
#define Q5_K_AT(n) q4_k_group(grp, nb, x, n, out, n_total, rows, 1)
#define Q5_AT(n) q5_group(type, grp, nb, x, n, out, n_total, rows)
            switch (type) {
            case SPECRT_Q6_K: switch (mt) { UP_TO_8(Q6_K_AT) } break;
            case SPECRT_Q4_K: switch (mt) { UP_TO_4(Q4_K_AT) } break;
            case SPECRT_Q5_K: switch (mt) { UP_TO_4(Q5_K_AT) } break;
            default: switch (mt) { UP_TO_4(Q5_AT) }
            }
#else
            scalar_group(type, grp, nb, x, mt, out, n_total, rows);
#endif
        }
    }
}

/* One block's weights as floats, as ggml dequantizes them. */
static void dequantize_block(int type, const uint8_t *blk, float *out) {
    uint8_t u[QK_K];
    block_values(type, blk, u);
    if (type == SPECRT_Q6_K) {
        const int8_t *sc = (const int8_t *)(blk + 192);
        float d = fp16(blk + 208);
        for (int i = 0; i < QK_K; ++i) out[i] = d * (float)sc[i / 16] * (float)(u[i] - 32);
    } else if (type == SPECRT_Q4_K || type == SPECRT_Q5_K) {
        float d = fp16(blk), dmin = fp16(blk + 2);
        uint8_t sc[8], mn[8];
        k4_scale_min(blk + 4, sc, mn);
        for (int i = 0; i < QK_K; ++i) out[i] = d * sc[i / 32] * (float)u[i] - dmin * mn[i / 32];
    } else {
        int has_min = type == SPECRT_Q5_1;  /* Q5_0: w = d * (u - 16); Q5_1: w = d * u + m */
        float d = fp16(blk), c = has_min ? -fp16(blk + 2) : d * 16.0f;
        for (int i = 0; i < 32; ++i) out[i] = d * (float)u[i] - c;
    }
}

void specrt_ggml_rows_float(int type, const uint8_t *w, int64_t g_lo, int64_t g_hi, int64_t k, const float *x,
                            int64_t m_count, float *y, int64_t n_total) {
    int per = specrt_ggml_block_weights(type), size = specrt_ggml_block_bytes(type);
    int64_t nb = k / per;
    uint8_t blk[210];
    float block[QK_K];
    for (int64_t g = g_lo; g < g_hi; ++g) {
        for (int64_t n = ROWS * g; n < ROWS * g + ROWS && n < n_total; ++n) {
            for (int64_t m = 0; m < m_count; ++m) y[m * n_total + n] = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                gather_block(type, w + (g * nb + b) * ROWS * size, (int)(n - ROWS * g), blk);
                dequantize_block(type, blk, block);
                for (int64_t m = 0; m < m_count; ++m) {
                    const float *xb = x + m * k + b * per;
                    float part[8] = {0};  /* eight running sums: the compiler keeps them in one vector */
                    for (int i = 0; i < per; i += 8)
                        for (int l = 0; l < 8; ++l) part[l] += block[i + l] * xb[i + l];
                    y[m * n_total + n] +=
                        ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
                }
            }
        }
    }
}

int64_t specrt_ggml_groups(int64_t n) { return (n + ROWS - 1) / ROWS; }

void specrt_ggml_gather_row(int type, const uint8_t *w, int64_t k, int64_t row, float *out) {
    int per = specrt_ggml_block_weights(type), size = specrt_ggml_block_bytes(type);
    int64_t nb = k / per;
    const uint8_t *group = w + (row / ROWS) * nb * ROWS * size;
    uint8_t blk[210];
    for (int64_t b = 0; b < nb; ++b) {
        gather_block(type, group + b * ROWS * size, (int)(row % ROWS), blk);
        dequantize_block(type, blk, out + b * per);
    }
}

int specrt_ggml_matmul(int type, const float *x, int64_t m_count, int64_t k, const uint8_t *w, int64_t n, float *y,
                       int float_activations) {
    if (specrt_ggml_block_bytes(type) == 0 || k % specrt_ggml_block_weights(type)) return 1;
    if (float_activations) {
        specrt_ggml_rows_float(type, w, 0, specrt_ggml_groups(n), k, x, m_count, y, n);
        return 0;
    }
    int64_t stride = specrt_q8k_row_bytes(k);
    uint8_t *act = (uint8_t *)malloc((size_t)(stride * (m_count ? m_count : 1)));
    if (!act) return 2;
    for (int64_t m = 0; m < m_count; ++m) specrt_q8k_quantize(x + m * k, k, act + m * stride);
    specrt_ggml_rows(type, w, 0, specrt_ggml_groups(n), k, act, m_count, y, n);
    free(act);
    return 0;
}
