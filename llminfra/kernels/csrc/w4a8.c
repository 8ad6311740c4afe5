/* int4 weights x int8 activations: y = x . W^T with integer dot products.
 *
 * W (N, K) is stored as llama.cpp's Q4_1 stores it: groups of 32 weights along K, each a code
 * u in 0..15 (4 bits) with an fp16 scale d and an fp16 offset m, w = d*u + m. Each row of x is
 * quantized to int8 in the same groups of 32 (q = round(x * 127 / max|x|), dx = max|x| / 127,
 * as llama.cpp's Q8_1 does), so that one group's contribution to a dot product is
 *
 *     sum_j w_j x_j  ~  d * dx * sum_j u_j q_j  +  m * dx * sum_j q_j
 *
 * where sum_j u_j q_j is a sum of products of small integers: one AVX-512 VNNI instruction
 * (vpdpbusd) multiplies 64 unsigned codes by 64 signed activations and adds them, four at a time,
 * into 16 int32 lanes. The float work is done once per group, not once per weight.
 *
 * The layout puts one group in each int32 lane (LANES = 16 with AVX-512 VNNI, 8 with AVX2, 0
 * for the portable C loop): a block of LANES groups is read in 8 steps of 4 * LANES weights,
 * lane l holding 4 weights of group l in the low nibbles of bytes 4l..4l+3 of the step's
 * 2 * LANES bytes (l < LANES/2) or in their high nibbles (l >= LANES/2). The groups left after
 * the whole blocks (K a multiple of 64, so an even number) are read as blocks of LANES/2,
 * LANES/4, ..., 2 groups, group l % nb in lane l. The activations are quantized into the same
 * order. Without LANES, byte j of a group holds weights j (low nibble) and j + 16 (high):
 * the layout of the portable C loop (dot1, the generic reference) and of the NEON path for
 * aarch64 with ARMv8.2's dot product (vdotq_s32), which takes dot1's float steps in dot1's
 * order and so gives the portable build's bits (tests/test_kernels_portability.py, under qemu).
 *
 * T threads (thread_pool.c) split the output columns, W's rows, in pairs, and the rows of x
 * they quantize: each output is one thread's dot product of its own W row, so the result has
 * the same bits for any T. A pair of W rows meets up to 4 rows of x at once (TILE_ROWS): the
 * integer sums of one row alone would wait on each other (a chain of vpdpbusd), those of 4
 * rows keep both vector units busy; each output's float steps stay the same, and so its bits,
 * in any tile, and a product of 8 or more rows unpacks each W row's codes once. A prompt's
 * rows go in blocks whose int8 codes stay in L1 while every W row pair of a thread meets them
 * (Q_BLOCK_BYTES; 1,600 rows at K = 576 are 0.9 MB). Within its rows a thread prefetches a few
 * dozen rows ahead: a row of 576 codes is 288 bytes, too short a stream for the hardware
 * prefetcher to reach memory's bandwidth on its own. SwiGLU's exp is the file's own (the same
 * bits on every build). Built and loaded by llminfra/kernels/w4a8.py; chapter 08.
 */
#include "simd.h"               /* first, as in every file of the library */
#include "llminfra_kernels.h"

#include <math.h>
#include <stdlib.h>

/* the instruction set's layout (simd.h chooses the set): the NEON path reads the portable one */
#if defined(LLMINFRA_AVX512_VNNI)
#define LANES 16
#elif defined(LLMINFRA_AVX2)
#define LANES 8
#else
#define LANES 0
#endif

#define PREFETCH_ROWS 32 /* measured best at 32-48 on a 2-core AMD EPYC (chapter 08) */
/* The widest row: 1000 whole blocks of 8 groups of 32 on the AVX2 path (plus at most 2 partial
   blocks: 4 and 2 groups), 500 of 16 with AVX-512 (plus 3), one block for the portable loop:
   MAX_BLOCKS bounds them all. Every entry point refuses a wider K (returns -2). */
#define MAX_K (32 * 8 * 1000)
#define MAX_BLOCKS 1024
#define TILE_ROWS 4   /* rows of x a pair of W rows meets at once (dot2_rows) */
#define Q_BLOCK_BYTES 32768   /* x's int8 codes a block of rows holds (multiply_part) */

int w4a8_max_k(void) { return MAX_K; }

static int bad_k(int K) { return K <= 0 || K % 64 != 0 || K > MAX_K; }

#if LANES != 16  /* the AVX-512 path converts 16 at a time */
static inline float h2f(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#elif defined(__aarch64__)
    __fp16 f;                  /* IEEE half on aarch64: the conversion is exact */
    memcpy(&f, &h, 2);
    return (float)f;
#else
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, f = h & 0x3ff, b;
    if (e == 0) {
        float v = ldexpf((float)f, -24);
        return s ? -v : v;
    }
    b = e == 31 ? (s | 0x7f800000u | (f << 13)) : (s | ((e + 112) << 23) | (f << 13));
    float r;
    memcpy(&r, &b, 4);
    return r;
#endif
}
#endif

int w4a8_lanes(void) { return LANES; }

const char *llminfra_kernels_isa(void) { return LLMINFRA_ISA; }

/* The blocks a row of G groups is read in: nb[i] groups from group g0[i]; returns their count. */
static int blocks(int G, int *nb, int *g0) {
    int n = 0, g = 0;
#if LANES == 0
    nb[0] = G;
    g0[0] = 0;
    return 1;
#endif
    for (; g + LANES <= G; g += LANES) {
        nb[n] = LANES;
        g0[n++] = g;
    }
    for (int b = LANES / 2; b >= 2; b /= 2)
        if ((G - g) & b) {
            nb[n] = b;
            g0[n++] = g;
            g += b;
        }
    return n;
}

/* Where the 4 values 4w..4w+3 of group g sit: their first x position, first code byte and
   whether they are high nibbles. */
static void place4(int g, int w, int B, int g0, int *xpos, int *byte, int *high) {
#if LANES == 0
    (void)B;
    (void)g0;
    *xpos = 32 * g + 4 * w;
    *byte = 16 * g + (4 * w) % 16;
    *high = w >= 4;
#else
    int per = LANES / B, t = w / per, l = (g - g0) + B * (w % per);
    *xpos = 32 * g0 + 4 * LANES * t + 4 * l;
    *byte = 16 * g0 + 2 * LANES * t + 4 * (l % (LANES / 2));
    *high = l >= LANES / 2;
#endif
}

/* codes u (N, K) in 0..15 -> packed (N, K/2) in the kernel's order; K a multiple of 64 up to
   MAX_K (else returns -2, nothing written) */
int w4a8_pack(const uint8_t *u, uint8_t *packed, int N, int K) {
    if (bad_k(K) || N < 0) return -2;
    int G = K / 32, nb[MAX_BLOCKS], g0[MAX_BLOCKS], n = blocks(G, nb, g0);
    size_t rb = (size_t)K / 2;
    memset(packed, 0, (size_t)N * rb);
    for (int b = 0; b < n; b++)
        for (int g = g0[b]; g < g0[b] + nb[b]; g++)
            for (int w = 0; w < 8; w++) {
                int xp, byte, high;
                place4(g, w, nb[b], g0[b], &xp, &byte, &high);
                for (int r = 0; r < N; r++)
                    for (int i = 0; i < 4; i++) {
                        uint8_t v = u[(size_t)r * K + 32 * g + 4 * w + i] & 15;
                        packed[(size_t)r * rb + byte + i] |= high ? (uint8_t)(v << 4) : v;
                    }
            }
    return 0;
}

/* one row of x (K) -> q (K, the kernel's order), dx and sx = dx * sum(q) per group; with res,
   also what the rounding left, x - q * dx, in x's order */
static void quantize_row(const float *x, int K, int8_t *q, float *dx, float *sx, float *res) {
    int G = K / 32, nb[MAX_BLOCKS], g0[MAX_BLOCKS], n = blocks(G, nb, g0);
    int8_t nat[32];
    for (int b = 0; b < n; b++)
        for (int g = g0[b]; g < g0[b] + nb[b]; g++) {
            const float *xg = x + 32 * g;
#if LANES == 16
            __m512 v0 = _mm512_loadu_ps(xg), v1 = _mm512_loadu_ps(xg + 16);
            /* x * 0 is NaN exactly where x is NaN or infinite (max would skip a NaN) */
            __m512 zero = _mm512_setzero_ps();
            int finite = !isnan(_mm512_reduce_add_ps(
                _mm512_add_ps(_mm512_mul_ps(v0, zero), _mm512_mul_ps(v1, zero))));
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            if (!finite) amax = 0.f;
            __m512 inv16 = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
            __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv16));   /* to nearest even */
            __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv16));
            int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            _mm_storeu_si128((__m128i *)nat, _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(nat + 16), _mm512_cvtsepi32_epi8(q1));
            if (res) {
                __m512 step = _mm512_set1_ps(amax / 127.f);
                _mm512_storeu_ps(res + 32 * g, _mm512_fnmadd_ps(_mm512_cvtepi32_ps(q0), step, v0));
                _mm512_storeu_ps(res + 32 * g + 16,
                                 _mm512_fnmadd_ps(_mm512_cvtepi32_ps(q1), step, v1));
            }
#else
            float amax = 0.f, probe = 0.f;
            for (int j = 0; j < 32; j++) {
                amax = fmaxf(amax, fabsf(xg[j]));
                probe += xg[j] * 0.f;        /* NaN exactly where x is NaN or infinite */
            }
            int finite = !isnan(probe);
            if (!finite) amax = 0.f;         /* codes 0: no lrintf of NaN */
            float inv = amax > 0.f ? 127.f / amax : 0.f;
            int sum = 0;
            for (int j = 0; j < 32; j++) {
                nat[j] = finite ? (int8_t)lrintf(xg[j] * inv) : 0;   /* to nearest even */
                sum += nat[j];
            }
#endif
            dx[g] = finite ? amax / 127.f : NAN;    /* a NaN or inf in x: the result is NaN, */
            sx[g] = dx[g] * (float)sum;              /* as PyTorch's product would be        */
#if LANES != 16
            if (res)
                for (int j = 0; j < 32; j++) res[32 * g + j] = xg[j] - (float)nat[j] * dx[g];
#endif
            for (int w = 0; w < 8; w++) {
                int xp, byte, high;
                place4(g, w, nb[b], g0[b], &xp, &byte, &high);
                memcpy(q + xp, nat + 4 * w, 4);
            }
        }
}

#if LANES == 16
static const int32_t LANE_GROUP[3][16] = {{0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1},
                                          {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3},
                                          {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7}};

/* acc += the 4-byte dot products of u (unsigned) and q (signed) in each int32 lane: vpdpbusd
   on acc's register in place (GCC 12 copied each accumulator of the intrinsic's form out and
   back around every step, two moves for each multiply-add) */
static inline __attribute__((always_inline)) void dpbusd(__m512i *acc, __m512i u, __m512i q) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(*acc) : "v"(u), "v"(q));
}

/* the 64 codes of step t of a block from their 32 bytes: the low nibbles, then the high ones */
static inline __m512i unpack64(const uint8_t *c) {
    __m256i w = _mm256_loadu_si256((const __m256i *)c);
    return _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(w),
                                               _mm256_srli_epi16(w, 4), 1),
                            _mm512_set1_epi8(0x0f));
}

/* The 8 sums of a tile of 4 rows, a0[r] and a1[r] each summed over its 16 lanes, in the
   order _mm512_reduce_add_ps adds (lane j + lane j+8, then + 4, + 2, + 1: the same pairs, so
   the same bits) but four vectors a shuffle: 28 instructions where 8 reductions take 72. */
static inline __attribute__((always_inline)) void reduce8(const __m512 *a0, const __m512 *a1,
                                                          float *y0, float *y1, int rows) {
    __m512 v[8] = {a0[0], a1[0], a0[1], a1[1], a0[2], a1[2], a0[3], a1[3]}, s[4], u[2];
    for (int i = 0; i < 4; i++)       /* [v_hi256 + v_lo256 | w_hi256 + w_lo256] */
        s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44));
    for (int i = 0; i < 2; i++) {     /* four 128-bit sums: chunk 1 + chunk 0 of each */
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0xDD),
                             _mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0x88));
        u[i] = _mm512_add_ps(u[i], _mm512_permute_ps(u[i], 0x4E));   /* j + (j + 2) */
        u[i] = _mm512_add_ps(u[i], _mm512_permute_ps(u[i], 0xB1));   /* 0 + 1 */
    }
    float out[32];
    _mm512_storeu_ps(out, u[0]);
    _mm512_storeu_ps(out + 16, u[1]);
    for (int r = 0; r < rows; r++) {  /* output order: v[0], v[1], ... at lanes 0, 4, 8, ... */
        y0[r] = out[8 * r];
        y1[r] = out[8 * r + 4];
    }
}

/* `rows` rows of x (K int8 codes and G groups apart; a constant 1 .. TILE_ROWS where this is
   inlined) against W rows c0 and c1 (the same row twice for an odd last one); with unpacked,
   c0 and c1 are the rows as unpack_row leaves them (the order q has). Each output takes the
   same float steps whatever `rows` is, so the same bits: only the integer sums of several rows
   run side by side, as independent chains of vpdpbusd. One row's two chains wait on the
   instruction's latency (5 cycles); a tile of 4 rows keeps both vector units busy. */
static inline __attribute__((always_inline)) void dot2_rows(
        const uint8_t *c0, const uint8_t *c1, const uint16_t *d0, const uint16_t *d1,
        const uint16_t *m0, const uint16_t *m1, const int8_t *q, const float *dx,
        const float *sx, int K, int G, int rows, int n, const int *nb, const int *g0,
        float *y0, float *y1, int unpacked) {
    __m512 a0[TILE_ROWS], a1[TILE_ROWS];
    for (int r = 0; r < rows; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    for (int b = 0; b < n; b++) {
        int B = nb[b], g = g0[b];
        __m512i p0[TILE_ROWS], p1[TILE_ROWS];
        for (int r = 0; r < rows; r++) p0[r] = p1[r] = _mm512_setzero_si512();
        for (int t = 0; t < B / 2; t++) {             /* 8 * B / LANES steps */
            __m512i u0 = unpacked ? _mm512_loadu_si512((const void *)(c0 + 32 * g + 64 * t))
                                  : unpack64(c0 + 16 * g + 32 * t);
            __m512i u1 = unpacked ? _mm512_loadu_si512((const void *)(c1 + 32 * g + 64 * t))
                                  : unpack64(c1 + 16 * g + 32 * t);
            for (int r = 0; r < rows; r++) {
                __m512i qv = _mm512_loadu_si512(
                    (const void *)(q + (size_t)r * K + 32 * g + 64 * t));
                dpbusd(&p0[r], u0, qv);
                dpbusd(&p1[r], u1, qv);
            }
        }
        __mmask16 k = (__mmask16)((1u << B) - 1);
        __m512 e0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, d0 + g));
        __m512 e1 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, d1 + g));
        __m512 f0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, m0 + g));
        __m512 f1 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, m1 + g));
        __m512i idx = _mm512_loadu_si512((const void *)LANE_GROUP[B == 2 ? 0 : B == 4 ? 1 : 2]);
        for (int r = 0; r < rows; r++) {
            __m512 dxv = _mm512_maskz_loadu_ps(k, dx + (size_t)r * G + g);
            __m512 sxv = _mm512_maskz_loadu_ps(k, sx + (size_t)r * G + g);
            __m512 s0 = _mm512_mul_ps(dxv, e0), s1 = _mm512_mul_ps(dxv, e1);
            a0[r] = _mm512_fmadd_ps(sxv, f0, a0[r]);
            a1[r] = _mm512_fmadd_ps(sxv, f1, a1[r]);
            if (B < 16) {
                s0 = _mm512_permutexvar_ps(idx, s0);
                s1 = _mm512_permutexvar_ps(idx, s1);
            }
            a0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0[r]), s0, a0[r]);
            a1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1[r]), s1, a1[r]);
        }
    }
    if (rows <= 2) {
        for (int r = 0; r < rows; r++) {
            y0[r] = _mm512_reduce_add_ps(a0[r]);
            y1[r] = _mm512_reduce_add_ps(a1[r]);
        }
    } else {
        for (int r = rows; r < TILE_ROWS; r++) a0[r] = a1[r] = _mm512_setzero_ps();
        reduce8(a0, a1, y0, y1, rows);
    }
}

/* rows (1 .. TILE_ROWS) rows of x against W rows c0 and c1, packed or (unpacked) as unpack_row
   leaves them: dot2_rows with the row count a constant */
#define DOT2_TILE(unpacked)                                                                    \
    switch (rows) {                                                                            \
        case 1: dot2_rows(c0, c1, d0, d1, m0, m1, q, dx, sx, K, G, 1, n, nb, g0, y0, y1,       \
                          unpacked); break;                                                    \
        case 2: dot2_rows(c0, c1, d0, d1, m0, m1, q, dx, sx, K, G, 2, n, nb, g0, y0, y1,       \
                          unpacked); break;                                                    \
        case 3: dot2_rows(c0, c1, d0, d1, m0, m1, q, dx, sx, K, G, 3, n, nb, g0, y0, y1,       \
                          unpacked); break;                                                    \
        default: dot2_rows(c0, c1, d0, d1, m0, m1, q, dx, sx, K, G, 4, n, nb, g0, y0, y1,      \
                           unpacked);                                                          \
    }

static void dot2(const uint8_t *c0, const uint8_t *c1, const uint16_t *d0, const uint16_t *d1,
                 const uint16_t *m0, const uint16_t *m1, const int8_t *q, const float *dx,
                 const float *sx, int K, int G, int rows, int n, const int *nb, const int *g0,
                 float *y0, float *y1) {
    DOT2_TILE(0)
}

/* A prompt's product meets each pair of W rows once per row of x: dot2 would unpack the 4-bit
   codes again for every tile of rows. unpack_row unpacks a row once, into the order q has
   (step t of a block at 32 g + 64 t), and dot2_from is dot2 from there: the same integer sums
   and the same float steps, so the same bits. */
#define UNPACK_MIN_ROWS 8
static void unpack_row(const uint8_t *c, int n, const int *nb, const int *g0, uint8_t *u) {
    for (int b = 0; b < n; b++)
        for (int t = 0, g = g0[b]; t < nb[b] / 2; t++)
            _mm512_storeu_si512((void *)(u + 32 * g + 64 * t), unpack64(c + 16 * g + 32 * t));
}

static void dot2_from(const uint8_t *c0, const uint8_t *c1, const uint16_t *d0,
                      const uint16_t *d1, const uint16_t *m0, const uint16_t *m1,
                      const int8_t *q, const float *dx, const float *sx, int K, int G, int count,
                      int n, const int *nb, const int *g0, float *y0, float *y1) {
    int r = 0;      /* every tile of this call here: one call, not one a tile, per row pair */
    for (; r + TILE_ROWS <= count; r += TILE_ROWS)
        dot2_rows(c0, c1, d0, d1, m0, m1, q + (size_t)r * K, dx + (size_t)r * G,
                  sx + (size_t)r * G, K, G, TILE_ROWS, n, nb, g0, y0 + r, y1 + r, 1);
    int rows = count - r;
    q += (size_t)r * K, dx += (size_t)r * G, sx += (size_t)r * G, y0 += r, y1 += r;
    if (rows) {
        DOT2_TILE(1)
    }
}

#elif LANES == 8
static inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i q) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, q);
#else  /* pairs of u*q fit int16: 2 * 15 * 127 < 32767 */
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, q),
                                                   _mm256_set1_epi16(1)));
#endif
}

static void dot2_one(const uint8_t *c0, const uint8_t *c1, const uint16_t *d0, const uint16_t *d1,
                     const uint16_t *m0, const uint16_t *m1, const int8_t *q, const float *dx,
                     const float *sx, int n, const int *nb, const int *g0, float *y0, float *y1) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    float off0 = 0.f, off1 = 0.f, s0[8], s1[8];
    for (int b = 0; b < n; b++) {
        int B = nb[b], g = g0[b];
        __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();
        for (int t = 0; t < B; t++) {                 /* 8 * B / LANES steps */
            __m256i qv = _mm256_loadu_si256((const __m256i *)(q + 32 * g + 32 * t));
            __m128i w0 = _mm_loadu_si128((const __m128i *)(c0 + 16 * g + 16 * t));
            __m128i w1 = _mm_loadu_si128((const __m128i *)(c1 + 16 * g + 16 * t));
            __m256i u0 = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(w0, 4), w0), low);
            __m256i u1 = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(w1, 4), w1), low);
            p0 = dot_u8s8(p0, u0, qv);
            p1 = dot_u8s8(p1, u1, qv);
        }
        for (int l = 0; l < 8; l++) {
            int gl = g + l % B;
            s0[l] = h2f(d0[gl]) * dx[gl];
            s1[l] = h2f(d1[gl]) * dx[gl];
        }
        for (int l = 0; l < B; l++) {
            off0 += h2f(m0[g + l]) * sx[g + l];
            off1 += h2f(m1[g + l]) * sx[g + l];
        }
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_loadu_ps(s0), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_loadu_ps(s1), a1);
    }
    float v0[8], v1[8];
    _mm256_storeu_ps(v0, a0);
    _mm256_storeu_ps(v1, a1);
    for (int l = 0; l < 8; l++) {
        off0 += v0[l];
        off1 += v1[l];
    }
    *y0 = off0;
    *y1 = off1;
}

#elif defined(LLMINFRA_NEON_DOTPROD)
/* The portable loop's layout and float steps, its integer sums on ARMv8.2's dot product
   (vdotq_s32: 16 signed bytes times 16, added in fours into 4 int32 lanes, as llama.cpp's ARM
   path has it; codes 0..15 are signed bytes too). A group's sum s = sum_j u_j q_j is exact
   either way, and each output adds (d dx) s + m sx, group after group, into one float as dot1
   does: the same bits as the portable build (simd.h's float rules keep aarch64's FMA out).
   Two W rows share each load of q, two independent chains of adds. */

/* group g's 4 lanes of partial sums: byte j holds codes j (low nibble) and j + 16 (high) */
static inline int32x4_t group_dot(const uint8_t *c, const int8_t *q) {
    uint8x16_t w = vld1q_u8(c);
    int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(w, vdupq_n_u8(15)));
    int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(w, 4));
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(q)), hi, vld1q_s8(q + 16));
}

/* the terms (d dx) s + m sx of 4 groups from their partial sums p[0..3], as dot1 forms each */
static inline float32x4_t terms4(const int32x4_t *p, const uint16_t *d, const uint16_t *m,
                                 const float *dx, const float *sx) {
    int32x4_t s = vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
    float32x4_t dv = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(d)));
    float32x4_t mv = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(m)));
    return vaddq_f32(vmulq_f32(vmulq_f32(dv, vld1q_f32(dx)), vcvtq_f32_s32(s)),
                     vmulq_f32(mv, vld1q_f32(sx)));
}

static void dot2_one(const uint8_t *c0, const uint8_t *c1, const uint16_t *d0, const uint16_t *d1,
                     const uint16_t *m0, const uint16_t *m1, const int8_t *q, const float *dx,
                     const float *sx, int n, const int *nb, const int *g0, float *y0, float *y1) {
    (void)n;
    (void)g0;
    int G = nb[0], g = 0;
    float a0 = 0.f, a1 = 0.f;
    for (; g + 4 <= G; g += 4) {
        int32x4_t p0[4], p1[4];
        for (int i = 0; i < 4; i++) {
            p0[i] = group_dot(c0 + 16 * (g + i), q + 32 * (g + i));
            p1[i] = group_dot(c1 + 16 * (g + i), q + 32 * (g + i));
        }
        float32x4_t t0 = terms4(p0, d0 + g, m0 + g, dx + g, sx + g);
        float32x4_t t1 = terms4(p1, d1 + g, m1 + g, dx + g, sx + g);
        a0 += vgetq_lane_f32(t0, 0), a1 += vgetq_lane_f32(t1, 0);
        a0 += vgetq_lane_f32(t0, 1), a1 += vgetq_lane_f32(t1, 1);
        a0 += vgetq_lane_f32(t0, 2), a1 += vgetq_lane_f32(t1, 2);
        a0 += vgetq_lane_f32(t0, 3), a1 += vgetq_lane_f32(t1, 3);
    }
    for (; g < G; g++) {       /* the last two groups where G % 4 = 2 */
        float s0 = (float)vaddvq_s32(group_dot(c0 + 16 * g, q + 32 * g));
        float s1 = (float)vaddvq_s32(group_dot(c1 + 16 * g, q + 32 * g));
        a0 += h2f(d0[g]) * dx[g] * s0 + h2f(m0[g]) * sx[g];
        a1 += h2f(d1[g]) * dx[g] * s1 + h2f(m1[g]) * sx[g];
    }
    *y0 = a0;
    *y1 = a1;
}

#else
/* The generic C reference: the layout without LANES, one group at a time. */
static float dot1(const uint8_t *c, const uint16_t *d, const uint16_t *m, const int8_t *q,
                  const float *dx, const float *sx, int G) {
    float acc = 0.f;
    for (int g = 0; g < G; g++) {
        const uint8_t *cg = c + 16 * g;
        const int8_t *qg = q + 32 * g;
        int s = 0;
        for (int j = 0; j < 16; j++) s += (cg[j] & 15) * qg[j] + (cg[j] >> 4) * qg[j + 16];
        acc += h2f(d[g]) * dx[g] * (float)s + h2f(m[g]) * sx[g];
    }
    return acc;
}

static void dot2_one(const uint8_t *c0, const uint8_t *c1, const uint16_t *d0, const uint16_t *d1,
                     const uint16_t *m0, const uint16_t *m1, const int8_t *q, const float *dx,
                     const float *sx, int n, const int *nb, const int *g0, float *y0, float *y1) {
    (void)n;
    (void)g0;
    *y0 = dot1(c0, d0, m0, q, dx, sx, nb[0]);
    *y1 = c1 == c0 ? *y0 : dot1(c1, d1, m1, q, dx, sx, nb[0]);
}
#endif

#if LANES != 16
/* rows rows of x, K codes and G groups apart, against W rows c0 and c1: one at a time */
static void dot2(const uint8_t *c0, const uint8_t *c1, const uint16_t *d0, const uint16_t *d1,
                 const uint16_t *m0, const uint16_t *m1, const int8_t *q, const float *dx,
                 const float *sx, int K, int G, int rows, int n, const int *nb, const int *g0,
                 float *y0, float *y1) {
    for (int r = 0; r < rows; r++)
        dot2_one(c0, c1, d0, d1, m0, m1, q + (size_t)r * K, dx + (size_t)r * G,
                 sx + (size_t)r * G, n, nb, g0, y0 + r, y1 + r);
}
#endif

/* SwiGLU's silu(x) * up = x / (1 + e^-x) * up, with e^t computed by the same float steps on
   every build (a Cephes-style polynomial on t - n ln 2, times 2^n): the AVX-512 loop does 16 at
   a time what exp_steps does for one (each multiply-add fused in both), so the bits are the
   same, where libm's expf was 30 % of a down projection's call at 100-128 rows. t is clamped to
   [-87.3, 88.3] (2^n stays normal; silu is then x or 0 to float precision); a NaN stays NaN. */
#define EXP_LO -87.3f
#define EXP_HI 88.3f
static const float EXP_C[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

static inline float exp_steps(float t) {
    if (t != t) return t;
    t = EXP_LO > t ? EXP_LO : t;
    t = EXP_HI < t ? EXP_HI : t;
    float n = rintf(t * 1.44269504089f);               /* nearest, ties to even */
    float r = fmaf(n, -0.693359375f, t);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = EXP_C[0];
    for (int i = 1; i < 6; i++) p = fmaf(p, r, EXP_C[i]);
    float y = fmaf(p, r * r, r) + 1.f;
    uint32_t bits = (uint32_t)((int)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, 4);
    return y * two_n;
}

static void swiglu_row(const float *gate, const float *up, float *a, int K) {
    int k = 0;
#if LANES == 16
    for (; k + 16 <= K; k += 16) {
        __m512 x = _mm512_loadu_ps(gate + k);
        __m512 t = _mm512_sub_ps(_mm512_setzero_ps(), x);
        t = _mm512_max_ps(_mm512_set1_ps(EXP_LO), t);    /* the second operand where NaN */
        t = _mm512_min_ps(_mm512_set1_ps(EXP_HI), t);
        __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(t, _mm512_set1_ps(1.44269504089f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), t);
        r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
        __m512 p = _mm512_set1_ps(EXP_C[0]);
        for (int i = 1; i < 6; i++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_C[i]));
        __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
        __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n),
                                                       _mm512_set1_epi32(127)), 23);
        __m512 ex = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
        __m512 silu = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), ex));
        _mm512_storeu_ps(a + k, _mm512_mul_ps(silu, _mm512_loadu_ps(up + k)));
    }
#endif
    for (; k < K; k++) a[k] = gate[k] / (1.f + exp_steps(0.f - gate[k])) * up[k];
}

/* a = silu(gate) * up over K values as the gated product forms them (for tests: the same
   bits on every build, within a few float roundings of the exact value) */
void w4a8_swiglu(const float *gate, const float *up, float *a, int K) {
    swiglu_row(gate, up, a, K);
}

/* The work of one w4a8_gemm call, shared by its threads (thread_pool.c). */
typedef struct {
    const float *x, *norm;
    const uint8_t *codes;
    const uint16_t *d, *m;
    float *y, eps;
    int M, N, K, G, R, x_stride, gated, passes, n;
    const int *nb, *g0;
    int8_t *q;                 /* R quantized rows (kernel order), dx and sx per group */
    float *dx, *sx, *work;     /* work: a and res, 2K floats per thread */
} gemm_job;

/* Rows M t / T .. M (t+1) / T of a (x's rows, gated and normed as w4a8_gemm says) to int8:
   chunk t of T, with a and res of its own in work (T <= min(M, 4 threads)). */
static void quantize_part(void *arg, int t, int T) {
    gemm_job *j = (gemm_job *)arg;
    int K = j->K, G = j->G;
    float *a = j->work + 2 * (size_t)K * t, *res = a + K;
    for (int r = (int)((long)j->M * t / T); r < (int)((long)j->M * (t + 1) / T); r++) {
        const float *xr = j->x + (size_t)r * j->x_stride;
        if (j->gated)
            swiglu_row(xr, xr + K, a, K);
        else
            memcpy(a, xr, 4 * (size_t)K);
        if (j->norm) {
            float part[16] = {0.f}, ss = 0.f;   /* 16 partial sums: the loop vectorizes */
            for (int k = 0; k < K; k += 16)
                for (int l = 0; l < 16; l++) part[l] += a[k + l] * a[k + l];
            for (int l = 0; l < 16; l++) ss += part[l];
            float inv = 1.f / sqrtf(ss / (float)K + j->eps);
            for (int k = 0; k < K; k++) a[k] = a[k] * inv * j->norm[k];
        }
        if (j->passes == 2) {
            size_t r0 = 2 * (size_t)r, r1 = r0 + 1;
            quantize_row(a, K, j->q + r0 * K, j->dx + r0 * G, j->sx + r0 * G, res);
            quantize_row(res, K, j->q + r1 * K, j->dx + r1 * G, j->sx + r1 * G, NULL);
        } else {
            quantize_row(a, K, j->q + (size_t)r * K, j->dx + (size_t)r * G,
                         j->sx + (size_t)r * G, NULL);
        }
    }
}

/* Prefetch rows i .. i + count - 1 of W: codes, d and m. */
static void prefetch_rows(const gemm_job *j, int i, int count) {
    size_t rb = (size_t)j->K / 2, G = (size_t)j->G;
    const char *c = (const char *)(j->codes + (size_t)i * rb);
    const char *pd = (const char *)(j->d + (size_t)i * G), *pm = (const char *)(j->m + i * G);
    for (size_t o = 0; o < (size_t)count * rb; o += 64) __builtin_prefetch(c + o);
    for (size_t o = 0; o < 2 * (size_t)count * G; o += 64) {
        __builtin_prefetch(pd + o);
        __builtin_prefetch(pm + o);
    }
}

/* Row r of the products (R of them) into y: with two passes, rows 2 r' and 2 r' + 1 are the
   two roundings of x's row r' and add up to its output. */
static inline void put(const gemm_job *j, int r, int i, int k, float v0, float v1) {
    float *out = j->y + (size_t)(j->R == j->M ? r : r / 2) * j->N;
    if (j->R == j->M || r % 2 == 0) {
        out[i] = v0;
        if (k != i) out[k] = v1;
    } else {
        out[i] += v0;
        if (k != i) out[k] += v1;
    }
}

/* Output columns (W's rows) of pairs P t / T .. P (t+1) / T, P = ceil(N / 2), for every row of
   y, in tiles of TILE_ROWS rows: each output is the same float steps of its own W row and x
   row, whichever thread and tile take it, so the result is the same bits for any T and M. */
static void multiply_part(void *arg, int t, int T) {
    const gemm_job *j = (const gemm_job *)arg;
    int N = j->N, K = j->K, G = j->G, R = j->R, P = (N + 1) / 2;
    int begin = 2 * (int)((long)P * t / T), end = 2 * (int)((long)P * (t + 1) / T);
    size_t rb = (size_t)K / 2;
    if (end > N) end = N;
    uint8_t *u = NULL;         /* a row pair's codes unpacked once, where many rows of x meet it */
#if LANES == 16
    if (R >= UNPACK_MIN_ROWS) u = malloc(2 * (size_t)K);    /* NULL: dot2, as for few rows */
#endif
    /* x's rows in blocks whose int8 codes stay in L1 (32 kB) while every W row pair of this
       thread meets them: a prompt of 1,600 rows has 0.9 MB of them at K = 576 */
    int block = (int)(Q_BLOCK_BYTES / (size_t)K) & ~(TILE_ROWS - 1);
    block = block < TILE_ROWS ? TILE_ROWS : block;
    for (int r0 = 0; r0 < R; r0 += block) {
        int r1 = R - r0 < block ? R : r0 + block;
        /* the first rows: asked for all at once, so that their misses overlap */
        if (begin < end)
            prefetch_rows(j, begin, end - begin < PREFETCH_ROWS ? end - begin : PREFETCH_ROWS);
        for (int i = begin; i < end; i += 2) {
            int k = i + 1 < end ? i + 1 : i;
            const uint16_t *d0 = j->d + (size_t)i * G, *d1 = j->d + (size_t)k * G;
            const uint16_t *m0 = j->m + (size_t)i * G, *m1 = j->m + (size_t)k * G;
            if (i + PREFETCH_ROWS + 1 < end) prefetch_rows(j, i + PREFETCH_ROWS, 2);
#if LANES == 16
            if (u) {
                unpack_row(j->codes + i * rb, j->n, j->nb, j->g0, u);
                unpack_row(j->codes + k * rb, j->n, j->nb, j->g0, u + K);
            }
#endif
#if LANES == 16
            if (u) {        /* the block's rows in one call (at most Q_BLOCK_BYTES / 64) */
                float v0[Q_BLOCK_BYTES / 64], v1[Q_BLOCK_BYTES / 64];
                dot2_from(u, u + K, d0, d1, m0, m1, j->q + (size_t)r0 * K,
                          j->dx + (size_t)r0 * G, j->sx + (size_t)r0 * G, K, G, r1 - r0, j->n,
                          j->nb, j->g0, v0, v1);
                for (int s = 0; s < r1 - r0; s++) put(j, r0 + s, i, k, v0[s], v1[s]);
                continue;
            }
#endif
            for (int r = r0; r < r1; r += TILE_ROWS) {
                int rows = r1 - r < TILE_ROWS ? r1 - r : TILE_ROWS;
                float v0[TILE_ROWS], v1[TILE_ROWS];
                const int8_t *q = j->q + (size_t)r * K;
                const float *dx = j->dx + (size_t)r * G, *sx = j->sx + (size_t)r * G;
                dot2(j->codes + i * rb, j->codes + k * rb, d0, d1, m0, m1, q, dx, sx, K, G,
                     rows, j->n, j->nb, j->g0, v0, v1);
                for (int s = 0; s < rows; s++) put(j, r + s, i, k, v0[s], v1[s]);
            }
        }
    }
    free(u);
}

/* fn over `units` rows on T threads (pool_for): in up to 4 T chunks claimed by whichever
   thread runs (a worker the OS leaves waiting takes none). */
static void in_parallel(int T, void *pool, pool_fn fn, void *arg, int units) {
    pool_for(T, pool, fn, arg, units < 4 * T ? units : 4 * T);
}

/* y (M, N) = a (M, K) . W^T; W packed by w4a8_pack with d and m (N, K/32) as fp16 bits; K a
   multiple of 64 (checked by the caller). Row r of a is made from row r of x (x_stride floats
   apart): with gated, x's row is [gate (K) | up (K)] and a = silu(gate) * up (a SwiGLU's
   product); else a = x's first K values; then with norm (K gains, else NULL)
   a = a * norm / sqrt(mean(a^2) + eps) (RMSNorm). passes = 2 rounds what the first int8
   rounding of a left to int8 as well and adds its product (about 15 bits of activation, at the
   cost of a second dot product per weight). A NaN or infinity in a group of a gives NaN.
   threads (at most 64; pool: a w4a8_pool_new(threads) kept between calls, else NULL) split
   the output columns, and the rows of a where there are enough; the result is the same for
   any count. Returns 0, -1 where memory ran out, -2 for a K, M, N, passes or threads out of
   range. */
int w4a8_gemm(const float *x, const uint8_t *codes, const uint16_t *d, const uint16_t *m,
              float *y, int M, int N, int K, int x_stride, int gated, const float *norm,
              float eps, int passes, int threads, void *pool) {
    if (bad_k(K) || M < 0 || N < 0 || (passes != 1 && passes != 2) || threads < 1 ||
        threads > 64)
        return -2;
    int nb[MAX_BLOCKS], g0[MAX_BLOCKS];
    gemm_job j = {.x = x, .norm = norm, .codes = codes, .d = d, .m = m, .y = y, .eps = eps,
                  .M = M, .N = N, .K = K, .G = K / 32, .R = passes == 2 ? 2 * M : M,
                  .x_stride = x_stride, .gated = gated, .passes = passes, .nb = nb, .g0 = g0};
    j.n = blocks(j.G, nb, g0);
    size_t chunks = (size_t)(M < 4 * threads ? M : 4 * threads) + 1;   /* work's a and res */
    size_t need = (size_t)j.R * K + 8 * (size_t)j.R * j.G + 8 * (size_t)K * chunks;
    char stack[32768];
    void *scratch = need <= sizeof stack ? (void *)stack : malloc(need);
    if (!scratch) return -1;
    j.q = (int8_t *)scratch;
    j.dx = (float *)(j.q + (size_t)j.R * K);
    j.sx = j.dx + (size_t)j.R * j.G;
    j.work = j.sx + (size_t)j.R * j.G;
    /* a few rows are quantized faster than the threads are woken */
    in_parallel((size_t)M * K >= 4096 ? threads : 1, pool, quantize_part, &j, M);
    in_parallel(threads, pool, multiply_part, &j, (N + 1) / 2);
    if (scratch != (void *)stack) free(scratch);
    return 0;
}
