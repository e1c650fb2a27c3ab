/* GGUF K-quant matrix products on the CPU: y[m, n] = sum_k x[m, k] * w[n, k], w kept in the file's own blocks.

   The activations are first quantized to 8 bits per 32 values (a float scale each, as MatMulNBits' int8
   activations at accuracy level 4: llama.cpp's K-quant path scales per 256, which rounds a row with one large
   feature much more coarsely), with the float sum of every 16. Each product is then an integer dot product of 32
   weights with 32 activations, rescaled once: by the weights' sub-scale and the activations' scale, less the
   weights' minimum times the activations' sum. A row of y does not depend on how many rows the call has or on
   how the output columns are split between threads: each output is one fixed sequence of operations.

   Block layouts (bytes): Q4_K 144 = fp16 d, fp16 dmin, 12 bytes of 6-bit sub-scales and sub-minimums (8 each),
   128 bytes of nibbles (per 64 weights: 32 bytes, low nibbles the first 32 weights, high nibbles the next 32);
   w = d * sc_j * q - dmin * m_j. Q6_K 210 = 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales (one
   per 16 weights), fp16 d; w = d * sc_g * (q - 32) with q = low | high << 4. Q5_0 22 = fp16 d, 4 bytes of fifth bits
   (least significant first), 16 bytes of nibbles (the first 16 weights low); w = d * (q - 16). Q5_1 24 = fp16 d,
   fp16 m, then as Q5_0; w = d * q + m.

   The vector paths need AVX2 (and use AVX-512 VNNI's dot product where the compiler may); without them the same
   integers are computed in plain C. */

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

#define M_TILE 8  /* activation rows multiplied by a weight block while it is unpacked */

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

#if defined(__AVX2__)
static inline float hsum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* Eight vectors of 8 int32 -> one vector whose lane i is the sum of p[i]'s lanes. */
static inline __m256i lane_sums(const __m256i p[8]) {
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    /* a: p0..p3's low-half sums, then their high-half sums; b: p4..p7's */
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* u (unsigned bytes) . q (signed bytes) per 4 bytes -> 8 int32. */
static inline __m256i dot4(__m256i u, __m256i q) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, q);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1));
#endif
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define WIDE 1
/* Four vectors of 16 int32, each two groups of 8 (p[i]: groups 2i, 2i + 1) -> the 8 groups' sums in order: what
   lane_sums gives for the same products, with fewer, wider steps. */
static inline __m256i pair_sums(__m512i p0, __m512i p1, __m512i p2, __m512i p3) {
    __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
    __m512i b = _mm512_add_epi32(_mm512_unpacklo_epi32(p2, p3), _mm512_unpackhi_epi32(p2, p3));
    /* per 128-bit chunk c: the sums of that chunk of p0, p1, p2, p3 */
    __m512i c = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    /* chunks 0 + 1 hold groups 0, 2, 4, 6; chunks 2 + 3 groups 1, 3, 5, 7 */
    __m512i d = _mm512_add_epi32(c, _mm512_shuffle_i32x4(c, c, _MM_SHUFFLE(2, 3, 0, 1)));
    __m256i e = _mm512_castsi512_si256(_mm512_shuffle_i32x4(d, d, _MM_SHUFFLE(2, 0, 2, 0)));
    return _mm256_permutevar8x32_epi32(e, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

/* 8 bytes -> 8 floats. */
static inline __m256 bytes_to_floats(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* 256 unsigned weight values in the order of their activations, ready for dots256: 8 vectors of 32, or (WIDE) 4 of
   64. */
typedef struct {
#if defined(WIDE)
    __m512i z[4];
#else
    __m256i u[8];
#endif
} weights256;

static inline __attribute__((always_inline)) weights256 from_vectors(const __m256i u[8]) {
    weights256 w;
#if defined(WIDE)
    for (int j = 0; j < 4; ++j) w.z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(u[2 * j]), u[2 * j + 1], 1);
#else
    for (int j = 0; j < 8; ++j) w.u[j] = u[j];
#endif
    return w;
}

/* Q4_K's 128 bytes of nibbles: per 64 weights, 32 bytes whose low nibbles are the first 32 and high the next. */
static inline __attribute__((always_inline)) weights256 from_nibbles(const uint8_t *qs) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i u[8];
    for (int j = 0; j < 4; ++j) {
        __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
        u[2 * j] = _mm256_and_si256(bits, low4);
        u[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), low4);
    }
    return from_vectors(u);
}

/* The 8 dot products of each 32 weights with their 32 activations (signed bytes at qa), lane j for the j-th 32. */
static inline __attribute__((always_inline)) __m256i dots256(const weights256 *w, const int8_t *qa) {
#if defined(WIDE)
    __m512i p[4];
    for (int j = 0; j < 4; ++j)
        p[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w->z[j], _mm512_loadu_si512((const void *)(qa + 64 * j)));
    return pair_sums(p[0], p[1], p[2], p[3]);
#else
    __m256i p[8];
    for (int j = 0; j < 8; ++j) p[j] = dot4(w->u[j], _mm256_loadu_si256((const __m256i *)(qa + 32 * j)));
    return lane_sums(p);
#endif
}

/* One activation row's share of 256 weights: its 8 dot products `sums` (lane j: the j-th 32) times scale_j * xd_j
   into acc; the activations' 16-sums times lo (the first 8) and hi (the next 8) into extra. */
static inline __attribute__((always_inline)) void accumulate(__m256 *acc, __m256 *extra, __m256i sums,
                                                             const q8_row *x, int64_t g, __m256 scale, __m256 lo,
                                                             __m256 hi) {
    __m256 f = _mm256_mul_ps(scale, _mm256_loadu_ps(x->d + 8 * g));
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), f, *acc);
    *extra = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x->sum + 16 * g), *extra);
    *extra = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x->sum + 16 * g + 8), *extra);
}
/* Each activation row's output: its weighted dot products less its minimums' (or offsets') share. */
static inline void finish(float *y, int64_t y_stride, const __m256 *acc, const __m256 *extra, int mt) {
    for (int t = 0; t < mt; ++t) y[t * y_stride] = hsum8(acc[t]) - hsum8(extra[t]);
}
#endif

/* The 32-block formats (Q5_0, Q5_1) in groups of 8 blocks, each block j: w = d_j * u - c_j with u unsigned bytes
   (Q5_0: c = 16 d; Q5_1: c = -m). A row's last group may hold fewer blocks: the rest are zero weights
   against the activations' zero padding. */
typedef struct {
#if defined(__AVX2__)
    __m256i u[8];
#else
    uint8_t u[256];
#endif
    float d[8], c[8];
} group;

/* Block j's 32 values u (16 bytes of nibbles, the first 16 weights in the low ones, and a fifth bit per weight in
   4 bytes before them, least significant first), and its d and c. */
static inline void unpack32(int type, const uint8_t *blk, group *out, int j) {
    float d = fp16(blk);
    int has_min = type == SPECRT_Q5_1;
    const uint8_t *qs = blk + 2 + (has_min ? 2 : 0) + 4;
    uint32_t high;
    memcpy(&high, blk + 2 + (has_min ? 2 : 0), 4);
    out->d[j] = d;
    out->c[j] = has_min ? -fp16(blk + 2) : d * 16.0f;
#if defined(__AVX2__)
    __m128i bytes = _mm_loadu_si128((const __m128i *)qs), low4 = _mm_set1_epi8(0x0F);
    __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), low4), _mm_and_si128(bytes, low4));
    {  /* bit i of `high` -> 16 in byte i */
        __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)high),
                                             _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                              2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
        __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        u = _mm256_or_si256(u, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                                                _mm256_set1_epi8(0x10)));
    }
    out->u[j] = u;
#else
    for (int i = 0; i < 16; ++i) {
        out->u[32 * j + i] = qs[i] & 0x0F;
        out->u[32 * j + 16 + i] = qs[i] >> 4;
    }
    for (int i = 0; i < 32; ++i) out->u[32 * j + i] |= ((high >> i) & 1) << 4;
#endif
}

/* Group g (blocks 8g .. 8g + 7) of a row of a 32-block format, k weights long. */
static inline void unpack_group(int type, const uint8_t *row, int64_t g, int64_t k, group *out) {
    int size = specrt_ggml_block_bytes(type);
    int64_t first = 8 * g, count = k / 32 - first < 8 ? k / 32 - first : 8;
    for (int j = 0; j < 8; ++j) {
        if (j < count) {
            unpack32(type, row + (first + j) * size, out, j);
        } else {
            out->d[j] = out->c[j] = 0.0f;
#if defined(__AVX2__)
            out->u[j] = _mm256_setzero_si256();
#else
            memset(out->u + 32 * j, 0, 32);
#endif
        }
    }
}

/* One weight row against activation rows x[0 .. mt - 1] (mt <= M_TILE): y[t * y_stride]. Per sub-block j (one
   weight scale, one activation scale): d_j * xd_j * (u . q8) + c_j * (sum of x). */
static inline __attribute__((always_inline)) void tile_groups(int type, const uint8_t *w, int64_t k, const q8_row *x,
                                                              int mt, float *y, int64_t y_stride) {
    int64_t groups = (k + QK_K - 1) / QK_K;
    group G;
#if defined(__AVX2__)
    __m256 acc[M_TILE], cacc[M_TILE];
    for (int t = 0; t < mt; ++t) acc[t] = cacc[t] = _mm256_setzero_ps();
    const __m256i first_half = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const __m256i second_half = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
#else
    float acc[M_TILE] = {0};
#endif
    for (int64_t g = 0; g < groups; ++g) {
        unpack_group(type, w, g, k, &G);
#if defined(__AVX2__)
        __m256 d8 = _mm256_loadu_ps(G.d), c8 = _mm256_loadu_ps(G.c);
        /* each c twice: against the 16-sums of its 32 activations */
        __m256 c_lo = _mm256_permutevar8x32_ps(c8, first_half), c_hi = _mm256_permutevar8x32_ps(c8, second_half);
        weights256 W = from_vectors(G.u);
        for (int t = 0; t < mt; ++t)
            accumulate(&acc[t], &cacc[t], dots256(&W, x[t].q + g * QK_K), &x[t], g, d8, c_lo, c_hi);
#else
        for (int t = 0; t < mt; ++t) {
            const int8_t *qa = x[t].q + g * QK_K;
            for (int j = 0; j < 8; ++j) {
                int dot = 0;
                for (int l = 0; l < 32; ++l) dot += G.u[32 * j + l] * qa[32 * j + l];
                acc[t] += G.d[j] * x[t].d[8 * g + j] * (float)dot;
                acc[t] -= G.c[j] * (x[t].sum[16 * g + 2 * j] + x[t].sum[16 * g + 2 * j + 1]);
            }
        }
#endif
    }
#if defined(__AVX2__)
    finish(y, y_stride, acc, cacc, mt);
#else
    for (int t = 0; t < mt; ++t) y[t * y_stride] = acc[t];
#endif
}

/* One weight row of Q4_K blocks against activation rows x[0 .. mt - 1] (mt <= M_TILE): y[t * y_stride].
   Per 32 weights (one sub-block, one activation scale): d * sc_j * xd_j * (q4 . q8) - dmin * m_j * (sum of x). */
static inline __attribute__((always_inline)) void tile_q4_k(const uint8_t *w, int64_t nb, const q8_row *x, int mt,
                                                            float *y, int64_t y_stride) {
#if defined(__AVX2__)
    __m256 acc[M_TILE], mins[M_TILE];
    for (int t = 0; t < mt; ++t) acc[t] = mins[t] = _mm256_setzero_ps();
#else
    float acc[M_TILE] = {0};
#endif
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = w + b * 144, *qs = blk + 16;
        float d = fp16(blk), dmin = fp16(blk + 2);
        uint8_t sc[8], mn[8];
        k4_scale_min(blk + 4, sc, mn);
#if defined(__AVX2__)
        weights256 W = from_nibbles(qs);
        __m256 dsc = _mm256_mul_ps(_mm256_set1_ps(d), bytes_to_floats(sc));
        __m128i mn8 = _mm_loadl_epi64((const __m128i *)mn);
        __m128i twice = _mm_unpacklo_epi8(mn8, mn8);  /* each minimum twice: against the 16-sums of its 32 */
        __m256 m_lo = _mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(twice)));
        __m256 m_hi = _mm256_mul_ps(_mm256_set1_ps(dmin),
                                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(twice, 8))));
        for (int t = 0; t < mt; ++t)  /* d * sc_j * xd_j per 32; the minimums against the 16-sums */
            accumulate(&acc[t], &mins[t], dots256(&W, x[t].q + b * QK_K), &x[t], b, dsc, m_lo, m_hi);
#else
        for (int t = 0; t < mt; ++t) {
            const int8_t *qa = x[t].q + b * QK_K;
            for (int j = 0; j < 8; ++j) {
                int dot = 0;
                for (int l = 0; l < 32; ++l) {
                    uint8_t byte = qs[32 * (j / 2) + l];
                    dot += ((j & 1) ? (byte >> 4) : (byte & 0x0F)) * qa[32 * j + l];
                }
                acc[t] += d * (float)sc[j] * x[t].d[8 * b + j] * (float)dot;
                acc[t] -= dmin * (float)mn[j] * (x[t].sum[16 * b + 2 * j] + x[t].sum[16 * b + 2 * j + 1]);
            }
        }
#endif
    }
#if defined(__AVX2__)
    finish(y, y_stride, acc, mins, mt);
#else
    for (int t = 0; t < mt; ++t) y[t * y_stride] = acc[t];
#endif
}

/* One weight row of Q6_K blocks against activation rows (as tile_q4_k). Per 32 weights (two scales of 16, one
   activation scale): d * xd_i * sum_g sc_g * (u . q8) with u = q + 32, less 32 * d * sum_g sc_g * (sum of x). */
static inline __attribute__((always_inline)) void tile_q6_k(const uint8_t *w, int64_t nb, const q8_row *x, int mt,
                                                            float *y, int64_t y_stride) {
#if defined(__AVX2__)
    __m256 acc[M_TILE], offs[M_TILE];
    for (int t = 0; t < mt; ++t) acc[t] = offs[t] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(0x03);
#else
    float acc[M_TILE] = {0};
#endif
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = w + b * 210, *ql = blk, *qh = blk + 128;
        const int8_t *sc = (const int8_t *)(blk + 192);
        float d = fp16(blk + 208);
#if defined(__AVX2__)
        __m256i u[8];  /* the 256 weights' 6-bit values (0..63), 32 a vector, in order */
        for (int half = 0; half < 2; ++half) {
            __m256i la = _mm256_loadu_si256((const __m256i *)(ql + 64 * half));
            __m256i lb = _mm256_loadu_si256((const __m256i *)(ql + 64 * half + 32));
            __m256i hv = _mm256_loadu_si256((const __m256i *)(qh + 32 * half));
            u[4 * half] = _mm256_or_si256(_mm256_and_si256(la, low4), _mm256_slli_epi16(_mm256_and_si256(hv, low2), 4));
            u[4 * half + 1] = _mm256_or_si256(_mm256_and_si256(lb, low4),
                                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 2), low2), 4));
            u[4 * half + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), low4),
                                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 4), low2), 4));
            u[4 * half + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), low4),
                                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 6), low2), 4));
        }
        __m256i scv[8];  /* per vector: its first 16 weights' scale in the low lanes, the next 16's in the high */
        for (int i = 0; i < 8; ++i) scv[i] = _mm256_set_m128i(_mm_set1_epi16(sc[2 * i + 1]), _mm_set1_epi16(sc[2 * i]));
        __m256i sc32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc));
        __m256 ds_lo = _mm256_mul_ps(_mm256_set1_ps(32.0f * d), _mm256_cvtepi32_ps(sc32));
        sc32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8)));
        __m256 ds_hi = _mm256_mul_ps(_mm256_set1_ps(32.0f * d), _mm256_cvtepi32_ps(sc32));
        __m256 dv = _mm256_set1_ps(d);
#if defined(WIDE)
        __m512i uz[4], scz[4];  /* u and scv two by two */
        for (int i = 0; i < 4; ++i) {
            uz[i] = _mm512_inserti64x4(_mm512_castsi256_si512(u[2 * i]), u[2 * i + 1], 1);
            scz[i] = _mm512_inserti64x4(_mm512_castsi256_si512(scv[2 * i]), scv[2 * i + 1], 1);
        }
#endif
        for (int t = 0; t < mt; ++t) {
            const int8_t *qa = x[t].q + b * QK_K;
#if defined(WIDE)
            __m512i pz[4];
            for (int i = 0; i < 4; ++i)
                pz[i] = _mm512_madd_epi16(
                    _mm512_maddubs_epi16(uz[i], _mm512_loadu_si512((const void *)(qa + 64 * i))), scz[i]);
            __m256i sums = pair_sums(pz[0], pz[1], pz[2], pz[3]);
#else
            __m256i p[8];
            for (int i = 0; i < 8; ++i)
                p[i] = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(u[i], _mm256_loadu_si256((const __m256i *)(qa + 32 * i))), scv[i]);
            __m256i sums = lane_sums(p);
#endif
            accumulate(&acc[t], &offs[t], sums, &x[t], b, dv, ds_lo, ds_hi);  /* d * xd_i; 32 d sc_g per 16-sum */
        }
#else
        for (int t = 0; t < mt; ++t) {
            const int8_t *qa = x[t].q + b * QK_K;
            int dots[8] = {0};
            for (int half = 0; half < 2; ++half) {
                for (int l = 0; l < 32; ++l) {
                    const uint8_t a0 = ql[64 * half + l], a1 = ql[64 * half + 32 + l], h = qh[32 * half + l];
                    int v[4] = {(a0 & 15) | ((h & 3) << 4), (a1 & 15) | (((h >> 2) & 3) << 4),
                                (a0 >> 4) | (((h >> 4) & 3) << 4), (a1 >> 4) | (((h >> 6) & 3) << 4)};
                    for (int i = 0; i < 4; ++i) {
                        int pos = 128 * half + 32 * i + l;
                        dots[pos / 32] += sc[pos / 16] * v[i] * qa[pos];
                    }
                }
            }
            for (int i = 0; i < 8; ++i) acc[t] += d * x[t].d[8 * b + i] * (float)dots[i];
            for (int g = 0; g < 16; ++g) acc[t] -= 32.0f * d * (float)sc[g] * x[t].sum[16 * b + g];
        }
#endif
    }
#if defined(__AVX2__)
    finish(y, y_stride, acc, offs, mt);
#else
    for (int t = 0; t < mt; ++t) y[t * y_stride] = acc[t];
#endif
}

int specrt_ggml_block_bytes(int type) {
    switch (type) {
    case SPECRT_Q5_0: return 22;
    case SPECRT_Q5_1: return 24;
    case SPECRT_Q4_K: return 144;
    case SPECRT_Q6_K: return 210;
    default: return 0;
    }
}

int specrt_ggml_block_weights(int type) { return type == SPECRT_Q4_K || type == SPECRT_Q6_K ? QK_K : 32; }

/* One block's weights as floats, as ggml dequantizes them. */
static void dequantize_block(int type, const uint8_t *blk, float *out) {
    if (type == SPECRT_Q6_K) {
        const uint8_t *ql = blk, *qh = blk + 128;
        const int8_t *sc = (const int8_t *)(blk + 192);
        float d = fp16(blk + 208);
        for (int half = 0; half < 2; ++half) {
            for (int l = 0; l < 32; ++l) {
                const uint8_t a0 = ql[64 * half + l], a1 = ql[64 * half + 32 + l], h = qh[32 * half + l];
                int v[4] = {(a0 & 15) | ((h & 3) << 4), (a1 & 15) | (((h >> 2) & 3) << 4),
                            (a0 >> 4) | (((h >> 4) & 3) << 4), (a1 >> 4) | (((h >> 6) & 3) << 4)};
                for (int i = 0; i < 4; ++i) {
                    int pos = 128 * half + 32 * i + l;
                    out[pos] = d * (float)sc[pos / 16] * (float)(v[i] - 32);
                }
            }
        }
        return;
    }
    if (type == SPECRT_Q4_K) {
        float d = fp16(blk), dmin = fp16(blk + 2);
        uint8_t sc[8], mn[8];
        k4_scale_min(blk + 4, sc, mn);
        for (int j = 0; j < 4; ++j) {
            for (int l = 0; l < 32; ++l) {
                uint8_t byte = blk[16 + 32 * j + l];
                out[64 * j + l] = d * sc[2 * j] * (float)(byte & 0x0F) - dmin * mn[2 * j];
                out[64 * j + 32 + l] = d * sc[2 * j + 1] * (float)(byte >> 4) - dmin * mn[2 * j + 1];
            }
        }
        return;
    }
    group g;  /* Q5_0, Q5_1 through their unpacking: w = d * u - c */
    unpack32(type, blk, &g, 0);
    uint8_t u[256];
#if defined(__AVX2__)
    for (int j = 0; j < 8; ++j) _mm256_storeu_si256((__m256i *)(u + 32 * j), g.u[j]);
#else
    memcpy(u, g.u, 256);
#endif
    for (int i = 0; i < specrt_ggml_block_weights(type); ++i) out[i] = g.d[i / 32] * (float)u[i] - g.c[i / 32];
}

void specrt_ggml_rows_float(int type, const uint8_t *w, int64_t n_lo, int64_t n_hi, int64_t k, const float *x,
                            int64_t m_count, float *y, int64_t n_total) {
    int per = specrt_ggml_block_weights(type), size = specrt_ggml_block_bytes(type);
    int64_t nb = k / per, row_bytes = nb * size;
    float block[QK_K];
    for (int64_t n = n_lo; n < n_hi; ++n) {
        for (int64_t m = 0; m < m_count; ++m) y[m * n_total + n] = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
            dequantize_block(type, w + n * row_bytes + b * size, block);
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

void specrt_ggml_dequantize(int type, const uint8_t *w, int64_t blocks, float *out) {
    int per = specrt_ggml_block_weights(type);
    for (int64_t b = 0; b < blocks; ++b) dequantize_block(type, w + b * specrt_ggml_block_bytes(type), out + b * per);
}

void specrt_ggml_rows(int type, const uint8_t *w, int64_t n_lo, int64_t n_hi, int64_t k, const uint8_t *act,
                      int64_t m_count, float *y, int64_t n_total) {
    int64_t stride = specrt_q8k_row_bytes(k);
    int64_t row_bytes = k / specrt_ggml_block_weights(type) * specrt_ggml_block_bytes(type);
    for (int64_t m0 = 0; m0 < m_count; m0 += M_TILE) {
        int mt = (int)(m_count - m0 < M_TILE ? m_count - m0 : M_TILE);
        q8_row x[M_TILE];
        for (int t = 0; t < mt; ++t) x[t] = q8_at(act, stride, k, m0 + t);
        for (int64_t n = n_lo; n < n_hi; ++n) {
            const uint8_t *row = w + n * row_bytes;
            float *out = y + m0 * n_total + n;
            /* a copy of the loop per format and tile height, both known: the accumulators stay in registers */
#define TILES(call)                                                                                                  \
    switch (mt) {                                                                                                    \
    case 1: call(1); break;                                                                                          \
    case 2: call(2); break;                                                                                          \
    case 3: call(3); break;                                                                                          \
    case 4: call(4); break;                                                                                          \
    case 5: call(5); break;                                                                                          \
    case 6: call(6); break;                                                                                          \
    case 7: call(7); break;                                                                                          \
    default: call(8);                                                                                                \
    }
#define Q6_K_TILE(rows) tile_q6_k(row, k / QK_K, x, rows, out, n_total)
#define Q4_K_TILE(rows) tile_q4_k(row, k / QK_K, x, rows, out, n_total)
#define Q5_0_TILE(rows) tile_groups(SPECRT_Q5_0, row, k, x, rows, out, n_total)
#define Q5_1_TILE(rows) tile_groups(SPECRT_Q5_1, row, k, x, rows, out, n_total)
            switch (type) {
            case SPECRT_Q6_K: TILES(Q6_K_TILE) break;
            case SPECRT_Q4_K: TILES(Q4_K_TILE) break;
            case SPECRT_Q5_0: TILES(Q5_0_TILE) break;
            default: TILES(Q5_1_TILE)
            }
        }
    }
}

int specrt_ggml_matmul(int type, const float *x, int64_t m_count, int64_t k, const uint8_t *w, int64_t n, float *y,
                       int float_activations) {
    if (specrt_ggml_block_bytes(type) == 0 || k % specrt_ggml_block_weights(type)) return 1;
    if (float_activations) {
        specrt_ggml_rows_float(type, w, 0, n, k, x, m_count, y, n);
        return 0;
    }
    int64_t stride = specrt_q8k_row_bytes(k);
    uint8_t *act = (uint8_t *)malloc((size_t)(stride * (m_count ? m_count : 1)));
    if (!act) return 2;
    for (int64_t m = 0; m < m_count; ++m) specrt_q8k_quantize(x + m * k, k, act + m * stride);
    specrt_ggml_rows(type, w, 0, n, k, act, m_count, y, n);
    free(act);
    return 0;
}
