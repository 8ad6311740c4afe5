/* fp32 products of a decode step's rows, y = x . W^T (+ r), for 3 to a few dozen rows: a
 * register-blocked outer product on W packed once into panels of 16 output columns.
 *
 * f32_skinny.c takes one or two rows: there a step is a stream of W, and each output is a dot
 * product whose 16 lanes are summed at the end. With 16 rows (16 sequences decoding) the
 * arithmetic is 16 times as much for the same bytes, and those per-output sums, one per row
 * and column, cost as much as the products; oneDNN's prepacked product of 16 rows ran at
 * about 110 GFLOP/s on one Xeon core. Here W (N, K) is packed once into panels: panel p holds
 * columns 16 p .. 16 p + 15 as K vectors of 16 floats (k = 0 .. K-1), so that for each k one
 * load gives 16 columns of W, and each x value, broadcast, multiplies them into a row's 16
 * accumulators. A tile of MR rows and two panels keeps 2 MR accumulators in registers; every
 * output is a sum over k in order, in one lane, so it has the same bits whatever the tile, the
 * row count or the thread (not those of f32_skinny.c or oneDNN: a different order of adds).
 *
 * The vectors are simd.h's GCC / clang vector extensions of 16 floats (AVX-512 registers with
 * -march=native; pairs of AVX2 registers; NEON quads; plain loops elsewhere). Built into the
 * library (llminfra/kernels/build.py) beside f32_skinny.c, whose f32_product checks the sizes,
 * forms the rows (RMSNorm, SwiGLU) and splits the work over the threads for both; driven by
 * llminfra/runner/fused.py (SkinnyMatmul). Chapter 08.
 */
#include "simd.h"               /* first, as in every file of the library */
#include "llminfra_kernels.h"

/* Rows of x a tile takes: 2 MR accumulators of 16 floats, with the two panel loads, fill the
   32 registers of AVX-512; the 16 of AVX2 (two per vector here) or none hold fewer. */
#if defined(__AVX512F__)
#define MR 8
#elif defined(__AVX2__) || defined(__aarch64__)
#define MR 4
#else
#define MR 2
#endif

/* W (N, K) -> p (ceil(N / 16) panels of K x 16 floats): p[(n / 16) K 16 + k 16 + n % 16] =
   W[n, k], zeros past N. Returns 0, or -2 for N or K below 0. */
int f32_panel_pack(const float *w, float *p, int N, int K) {
    if (N < 0 || K < 0) return -2;
    int P = (N + 15) / 16;
    for (int q = 0; q < P; q++)
        for (int c = 0; c < 16; c++) {
            int n = 16 * q + c;
            for (int k = 0; k < K; k++)
                p[((size_t)q * K + k) * 16 + c] = n < N ? w[(size_t)n * K + k] : 0.f;
        }
    return 0;
}

/* rows (1 .. MR; a constant where inlined) rows of x (K floats apart) against panels p0 and,
   with two, p1: columns n0 .. n0 + 31 (or + 15) of those rows of y, plus r's where r is not
   NULL (y and r N floats a row apart; y may be r). */
static inline __attribute__((always_inline)) void tile(
        const float *x, int K, int rows, const float *p0, const float *p1, int two,
        const float *r, float *y, int N, int n0) {
    v16 a0[MR], a1[MR];
    for (int m = 0; m < rows; m++) a0[m] = a1[m] = (v16){0};
    for (int k = 0; k < K; k++) {
        v16 b0 = load16(p0 + 16 * (size_t)k);
        v16 b1 = two ? load16(p1 + 16 * (size_t)k) : b0;
        for (int m = 0; m < rows; m++) {
            v16 xm = x[(size_t)m * K + k] - (v16){0};   /* a broadcast (x - 0 is x) */
            a0[m] += xm * b0;
            if (two) a1[m] += xm * b1;
        }
    }
    int width = N - n0 < (two ? 32 : 16) ? N - n0 : (two ? 32 : 16);
    for (int m = 0; m < rows; m++) {
        float out[32];
        memcpy(out, &a0[m], sizeof a0[m]);
        memcpy(out + 16, &a1[m], sizeof a1[m]);
        float *ym = y + (size_t)m * N + n0;
        const float *rm = r ? r + (size_t)m * N + n0 : NULL;
        for (int c = 0; c < width; c++) ym[c] = rm ? rm[c] + out[c] : out[c];
    }
}

typedef struct {
    const float *x, *p, *r;
    float *y;
    int M, N, K;
} panel_job;

#define TILE_CASE(R)                                                   \
    case R:                                                            \
        if (two) tile(x, K, R, p0, p1, 1, r, y, N, 16 * q);            \
        else tile(x, K, R, p0, p1, 0, r, y, N, 16 * q);                \
        break;

/* Pairs of panels c P / C .. (c + 1) P / C (P = ceil(panels / 2)), each met by every row of x
   in tiles of MR while the pair is in L1 / L2: W is read once. */
static void panel_part(void *arg, int c, int C) {
    const panel_job *j = (const panel_job *)arg;
    int K = j->K, N = j->N, panels = (N + 15) / 16, pairs = (panels + 1) / 2;
    int begin = (int)((long)pairs * c / C), end = (int)((long)pairs * (c + 1) / C);
    for (int pair = begin; pair < end; pair++) {
        int q = 2 * pair, two = q + 1 < panels;
        const float *p0 = j->p + (size_t)q * K * 16, *p1 = p0 + (size_t)K * 16;
        for (int m0 = 0; m0 < j->M; m0 += MR) {
            int rows = j->M - m0 < MR ? j->M - m0 : MR;
            const float *x = j->x + (size_t)m0 * K;
            const float *r = j->r ? j->r + (size_t)m0 * N : NULL;
            float *y = j->y + (size_t)m0 * N;
            switch (rows) {
                TILE_CASE(1)
#if MR > 1
                TILE_CASE(2)
#endif
#if MR > 2
                TILE_CASE(3) TILE_CASE(4)
#endif
#if MR > 4
                TILE_CASE(5) TILE_CASE(6) TILE_CASE(7) TILE_CASE(8)
#endif
            }
        }
    }
}

/* y (M, N) = a (M, K) . W^T, plus r (M, N) where r is not NULL (y may be r); p is W packed by
   f32_panel_pack, y and r contiguous fp32. a is x's rows as they are (gated = 0, norm = NULL,
   x_stride = K) or formed from them (RMSNorm, SwiGLU) as f32_skinny.c's form_part says.
   threads (1 .. 64; pool: a w4a8_pool_new(threads) kept between calls, else NULL) split the
   pairs of panels into up to 4 chunks a thread. Returns as f32_product (f32_skinny.c). */
int f32_panel_gemm(const float *x, const float *p, const float *r, float *y, int M, int N,
                   int K, int x_stride, int gated, const float *norm, float eps, int threads,
                   void *pool) {
    panel_job j = {.p = p, .r = r, .y = y, .M = M, .N = N, .K = K};
    return f32_product(x, M, N, K, x_stride, gated, norm, eps, threads, pool, panel_part, &j,
                       &j.x, ((N + 15) / 16 + 1) / 2);
}
