/* fp32 products of a few rows, y = x . W^T (+ r), read the way a decode step must read W: once,
 * front to back.
 *
 * A decode step multiplies one row per sequence (M = 1 .. 8) by every weight matrix; the step
 * is a stream of W through the core, and its speed is how fast that stream flows. A BLAS tuned
 * for big products (MKL's sgemv / sgemm, oneDNN) walks W in panels that suit its cache blocking,
 * and on one core of an AMD EPYC it drew about 12 GB/s from memory for SmolLM2-135M's layers,
 * where summing the same bytes draws 27 GB/s. Here each thread takes a run of W's rows and reads
 * them in order, a few rows at a time: each block of W's rows meets the M rows of x (which stay
 * in L1) in a block of accumulators, so the hardware prefetcher sees a few forward streams per
 * thread and each load of x serves every row of the block. That is llama.cpp's way for F32
 * weights as well.
 *
 * The vectors are simd.h's GCC / clang vector extensions of 16 floats: AVX-512 registers where
 * the CPU has them (-march=native), pairs of AVX2 registers, NEON quads, or plain loops
 * elsewhere; one code path, under simd.h's float rules.
 * Each output is one thread's dot product of its own W row, in a fixed order: the result is the
 * same bits for any thread count. Built into the w4a8 library (llminfra/kernels/build.py);
 * driven by llminfra/kernels/f32_skinny.py. Chapter 08.
 */
#include "simd.h"               /* first, as in every file of the library */
#include "llminfra_kernels.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    const float *x, *w, *r;
    float *y;
    int M, N, K;
} skinny_job;

/* The register block: BW rows of W against BR rows of x at a time, BW * BR accumulators of 16
   floats. Where the CPU has 32 vector registers of 16 floats (AVX-512) 4 x 6 fit with the loads;
   pairs of AVX2 registers (16 of them) or NEON quads hold fewer. Several W rows at once are also
   several forward streams, which is what keeps a core's memory requests in flight. */
#if defined(__AVX512F__)
#define BW 4
#define BR 6
#elif defined(__AVX2__) || defined(__aarch64__)
#define BW 2
#define BR 3
#else
#define BW 1
#define BR 2
#endif

/* s + w[0..n) . x[0..n) in order, each step one MUL_ADD: a dot product's scalar tail (K not a
   multiple of 16). Out of line: written inside dot_block, its fused multiply-adds changed how
   the compiler laid out the vector loop, and a one-row product took 15-25 % longer. */
static __attribute__((noinline)) float tail_dot(const float *w, const float *x, int n, float s) {
    for (int t = 0; t < n; t++) s = MUL_ADD(w[t], x[t], s);
    return s;
}

/* out[m * ldo + b] = x[m] . w[b] over K for BW rows of w (ld = K) and R rows of x (R <= BR; a
   constant where inlined: the accumulators live in registers). Each output is one 16-lane
   accumulator summed over k in order, then sum16 and the scalar tail: the same bits whatever the
   block, the row count or the thread that computes it. */
static inline __attribute__((always_inline)) void dot_block(
        const float *x, int K, const float *w, int nw, float *out, int ldo, int R) {
    v16 acc[BW][BR];
    for (int b = 0; b < nw; b++)
        for (int m = 0; m < R; m++) acc[b][m] = (v16){0};
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        v16 wv[BW];
        for (int b = 0; b < nw; b++) wv[b] = load16(w + (size_t)b * K + k);
        for (int m = 0; m < R; m++) {
            v16 xv = load16(x + (size_t)m * K + k);
            for (int b = 0; b < nw; b++) acc[b][m] += wv[b] * xv;
        }
    }
    for (int b = 0; b < nw; b++)
        for (int m = 0; m < R; m++) {
            float s = sum16(&acc[b][m]);
            if (k < K) s = tail_dot(w + (size_t)b * K + k, x + (size_t)m * K + k, K - k, s);
            out[m * ldo + b] = s;
        }
}

#define BLOCK_CASE(R) case R: dot_block(x, K, w, BW, out, BW, R); break;

/* W's rows c N / C .. (c + 1) N / C, for every row of x: blocks of BW rows of W, each met by
   every row of x in passes of up to BR rows while the block is in L1 (W is read once). */
static void skinny_part(void *arg, int c, int C) {
    const skinny_job *j = (const skinny_job *)arg;
    int N = j->N, K = j->K;
    int begin = (int)((long)N * c / C), end = (int)((long)N * (c + 1) / C);
    for (int n = begin; n < end; n += BW) {
        const float *w = j->w + (size_t)n * K;
        int nw = end - n < BW ? end - n : BW;
        for (int m0 = 0; m0 < j->M; m0 += BR) {
            int R = j->M - m0 < BR ? j->M - m0 : BR;
            const float *x = j->x + (size_t)m0 * K;
            float out[BR * BW];
            if (nw == BW) {
                switch (R) {
                    BLOCK_CASE(1) BLOCK_CASE(2)
#if BR > 2
                    BLOCK_CASE(3)
#endif
#if BR > 3
                    BLOCK_CASE(4) BLOCK_CASE(5) BLOCK_CASE(6)
#endif
                }
            } else {
                for (int m = 0; m < R; m++) dot_block(x + (size_t)m * K, K, w, nw,
                                                      out + m * BW, BW, 1);
            }
            for (int m = 0; m < R; m++)
                for (int b = 0; b < nw; b++) {
                    size_t at = (size_t)(m0 + m) * N + n + b;
                    j->y[at] = j->r ? j->r[at] + out[m * BW + b] : out[m * BW + b];
                }
        }
    }
}

/* The rows a product multiplies, formed from x: row m of a from row m of x (x_stride floats
   apart). With gated, x's row is [gate (K) | up (K)] and a = silu(gate) * up (a SwiGLU's
   product, w4a8_swiglu: vectorized, the same bits as the w4a8 kernel's); else a = x's first K
   values; then with norm (K gains, else NULL) a = a * norm / sqrt(mean(a^2) + eps) (RMSNorm):
   what a decode step does before its matmuls, here in the same call. form_part forms rows
   M c / C .. M (c + 1) / C: each row alone, so the same bits however they are split. */
typedef struct {
    const float *x, *norm;
    float *a, eps;
    int x_stride, M, K, gated;
} form_job;

static void form_part(void *arg, int c, int C) {
    const form_job *j = (const form_job *)arg;
    int K = j->K;
    for (int m = (int)((long)j->M * c / C); m < (int)((long)j->M * (c + 1) / C); m++) {
        const float *xr = j->x + (size_t)m * j->x_stride;
        float *ar = j->a + (size_t)m * K;
        if (j->gated)
            w4a8_swiglu(xr, xr + K, ar, K);
        else
            memcpy(ar, xr, sizeof(float) * (size_t)K);
        if (j->norm) {
            float part[16] = {0.f}, ss = 0.f;     /* 16 partial sums: the loop vectorizes */
            int k = 0;
            for (; k + 16 <= K; k += 16)
                for (int l = 0; l < 16; l++) part[l] += ar[k + l] * ar[k + l];
            for (; k < K; k++) ss = MUL_ADD(ar[k], ar[k], ss);
            for (int l = 0; l < 16; l++) ss += part[l];
            float inv = 1.f / sqrtf(ss / (float)K + j->eps);
            for (k = 0; k < K; k++) ar[k] = ar[k] * inv * j->norm[k];
        }
    }
}

/* rows of at least this many values in all are formed on the threads; fewer, on the caller's */
#define FORM_PARALLEL 16384

/* What f32_skinny_gemm and f32_panel_gemm (f32_panels.c) share: check the sizes, form the rows
   (form_part, into a stack buffer where they fit), point *rows at them (x's own where nothing
   is formed) and run part(job, c, C) over up to 4 chunks a thread of `units`. Returns 0, -1
   where memory ran out, or -2 for an M, N, K, x_stride or threads out of range. */
int f32_product(const float *x, int M, int N, int K, int x_stride, int gated, const float *norm,
                float eps, int threads, void *pool, pool_fn part, void *job, const float **rows,
                int units) {
    if (M < 0 || N < 0 || K < 0 || threads < 1 || threads > 64 ||
        x_stride < (gated ? 2 * K : K))
        return -2;
    if (!M || !N) return 0;
    float stack[16384];                         /* 64 kB: a decode step's rows fit */
    float *a = NULL;
    if (gated || norm) {
        size_t need = (size_t)M * K;
        a = need <= sizeof stack / sizeof *stack ? stack : malloc(sizeof(float) * need);
        if (!a) return -1;
        form_job f = {.x = x, .norm = norm, .a = a, .eps = eps, .x_stride = x_stride, .M = M,
                      .K = K, .gated = gated};
        pool_for((size_t)M * K >= FORM_PARALLEL ? threads : 1, pool, form_part, &f,
                 M < 2 * threads ? M : 2 * threads);
    } else if (x_stride != K) {
        return -2;
    }
    *rows = a ? a : x;
    pool_for(threads, pool, part, job, units < 4 * threads ? units : 4 * threads);
    if (a && a != stack) free(a);
    return 0;
}

/* y (M, N) = a (M, K) . W (N, K)^T, plus r (M, N) where r is not NULL (y may be r); W, r and y
   contiguous fp32. a is x's rows as they are (gated = 0, norm = NULL; x_stride = K) or formed
   from them as form_part says. threads (1 .. 64; pool: a w4a8_pool_new(threads) kept between
   calls, else NULL) split W's rows into up to 4 chunks a thread, claimed by whichever thread
   runs. Returns as f32_product. */
int f32_skinny_gemm(const float *x, const float *w, const float *r, float *y, int M, int N,
                    int K, int x_stride, int gated, const float *norm, float eps, int threads,
                    void *pool) {
    skinny_job j = {.w = w, .r = r, .y = y, .M = M, .N = N, .K = K};
    return f32_product(x, M, N, K, x_stride, gated, norm, eps, threads, pool, skinny_part, &j,
                       &j.x, N);
}
