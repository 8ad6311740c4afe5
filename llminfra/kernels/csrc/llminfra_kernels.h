/* The llminfra kernel library's interface: every function another file of the library or the
 * Python side (ctypes, llminfra/kernels/) calls is declared here, once, and defined in one .c
 * file beside this one. Every .c file of the library includes this header (through simd.h, its
 * first include), so a definition whose signature drifts from its declaration no longer
 * compiles: it used to compile and crash. tests/test_kernels_portability.py fails where a .c
 * file declares one of these itself, or where the built library exports a function not
 * declared here.
 *
 * LLMINFRA_API marks what the shared library exports (Python's ctypes calls these, with the
 * argument types of llminfra/kernels/); LLMINFRA_INTERNAL what the library's files share but
 * do not export. Return codes: 0 done; -1 memory ran out; -2 a size, K, thread count or
 * passes out of range; the other codes each function's comment gives. Threads: 1 .. 64, and
 * `pool` a w4a8_pool_new(threads) kept between calls or NULL (threads then start per call);
 * every result has the same bits for any thread count. Chapter 12.
 */
#ifndef LLMINFRA_KERNELS_H
#define LLMINFRA_KERNELS_H

#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define LLMINFRA_API __attribute__((visibility("default")))
#define LLMINFRA_INTERNAL __attribute__((visibility("hidden")))
#else
#define LLMINFRA_API
#define LLMINFRA_INTERNAL
#endif

/* ---- what the library was built for (w4a8.c) ---------------------------------------------- */

/* the widest K w4a8_pack and w4a8_gemm take (a multiple of 64 up to it) */
LLMINFRA_API int w4a8_max_k(void);
/* the int4 kernel's packed layout: groups a vector lane holds, 16 (AVX-512 VNNI) or 8 (AVX2);
   0 for the portable layout, which the portable loop and the NEON path both read */
LLMINFRA_API int w4a8_lanes(void);
/* the int4 kernel's code path compiled in: "avx512-vnni", "avx2", "neon-dotprod" or
   "portable" (a static string) */
LLMINFRA_API const char *llminfra_kernels_isa(void);

/* ---- int4 weights x int8 activations (w4a8.c) ---------------------------------------------- */

/* codes u (N, K) in 0..15 -> packed (N, K / 2) in the kernel's order; -2 for a bad K or N */
LLMINFRA_API int w4a8_pack(const uint8_t *u, uint8_t *packed, int N, int K);
/* a = silu(gate) * up over K values, the same bits on every build */
LLMINFRA_API void w4a8_swiglu(const float *gate, const float *up, float *a, int K);
/* y (M, N) = a (M, K) . W^T, W as w4a8_pack leaves it with fp16 d, m (N, K / 32); a is x's
   rows, SwiGLU'd (gated) and RMSNormed (norm) as w4a8.c says; passes 1 or 2 */
LLMINFRA_API int w4a8_gemm(const float *x, const uint8_t *codes, const uint16_t *d,
                           const uint16_t *m, float *y, int M, int N, int K, int x_stride,
                           int gated, const float *norm, float eps, int passes, int threads,
                           void *pool);

/* ---- fp32 products (f32_skinny.c, f32_panels.c) ------------------------------------------- */

/* y (M, N) = a (M, K) . W (N, K)^T (+ r): one or a few rows, W read once front to back */
LLMINFRA_API int f32_skinny_gemm(const float *x, const float *w, const float *r, float *y, int M,
                                 int N, int K, int x_stride, int gated, const float *norm,
                                 float eps, int threads, void *pool);
/* W (N, K) -> panels of 16 columns (ceil(N / 16) K 16 floats) */
LLMINFRA_API int f32_panel_pack(const float *w, float *p, int N, int K);
/* y (M, N) = a (M, K) . W^T (+ r) on W packed by f32_panel_pack: a decode step's many rows */
LLMINFRA_API int f32_panel_gemm(const float *x, const float *p, const float *r, float *y, int M,
                                int N, int K, int x_stride, int gated, const float *norm,
                                float eps, int threads, void *pool);

/* ---- attention (paged_decode.c) ------------------------------------------------------------ */

/* out (n, H, d) = softmax(q k^T scale) v, each query against its sequence's keys read in place
   from the paged K/V pools; -3 a length, -4 a block out of range, -5 a thread's state */
LLMINFRA_API int paged_decode_f32(const float *q, long q_row, const float *k, const float *v,
                                  const int *tables, const int *lens, float *out, int n, int H,
                                  int H_kv, int d, int B, int W, int pool_blocks, float scale,
                                  int threads, void *pool);
/* RoPE on the query and key heads of N rows of qkv, in place, and their keys and values into
   pool slots; -3 a position, -4 a slot out of range (nothing written) */
LLMINFRA_API int rope_write_f32(float *qkv, int N, long row_stride, const int64_t *positions,
                                const float *rot, long P, int H, int H_kv, int d,
                                const int64_t *slots, long S, float *k, float *v);

/* ---- a whole decode step (decode_stack.c) -------------------------------------------------- */

/* one weight (N, K): int4 as w4a8_pack leaves it (codes, d, m), or fp32 (codes NULL): W itself
   for products of up to skinny_rows rows (f32_skinny.c), its panels (f32_panel_pack) for more,
   up to panel_rows (SkinnyMatmul's routes) */
typedef struct {
    const uint8_t *codes;
    const uint16_t *d, *m;
    const float *w, *panels;
    int N, K, skinny_rows, panel_rows;
} stack_weight;

/* one layer: its norms' gains, its four products and its K and V pools */
typedef struct {
    const float *attn_norm, *ffn_norm;
    stack_weight qkv, wo, w13, w2;
    float *k, *v;
} stack_layer;

/* the model's sizes and the step's shared settings */
typedef struct {
    int n_layers, dim, H, H_kv, d, ffn, passes, threads, B, W, pool_blocks;   /* W: per step */
    float eps, scale;
    long rot_rows, slots;
    const float *rot, *embedding, *final_norm;
    void *pool;
} stack_model;

/* logits of one token per sequence through every layer, in the Python step's order; -6 a bad
   token, table entry or row (nothing run), else the first refusal, offset as decode_stack.c
   says */
LLMINFRA_API int w4a8_decode_stack(const stack_model *s, const stack_layer *layers,
                                   const stack_weight *output, const int64_t *tokens, long vocab,
                                   const int64_t *positions, const int64_t *slots,
                                   const int64_t *tables, int n, int W, const int64_t *rows,
                                   int n_rows, float *x, float *work, float *logits);

/* ---- the thread pool (thread_pool.c) ------------------------------------------------------- */

/* a pool running jobs on `threads` threads, the caller's included; NULL where threads < 2 or a
   thread cannot be started */
LLMINFRA_API void *w4a8_pool_new(int threads);
/* stop and join the workers, then free the pool (NULL: nothing) */
LLMINFRA_API void w4a8_pool_free(void *handle);
/* the threads a pool runs on (1 for NULL) */
LLMINFRA_API int w4a8_pool_size(const void *handle);

/* a job's part: chunk c of C */
typedef void (*pool_fn)(void *arg, int c, int C);
/* fn(arg, c, C) for every chunk c < C on `threads` threads (the pool where it has that many):
   what every kernel splits its work with */
LLMINFRA_INTERNAL void pool_for(int threads, void *pool, pool_fn fn, void *arg, int C);

/* ---- shared by the fp32 products (f32_skinny.c) -------------------------------------------- */

/* check the sizes, form the rows (RMSNorm, SwiGLU), point *rows at them and run part(job, c, C)
   over up to 4 chunks a thread of `units`: f32_skinny_gemm's and f32_panel_gemm's common part */
LLMINFRA_INTERNAL int f32_product(const float *x, int M, int N, int K, int x_stride, int gated,
                                  const float *norm, float eps, int threads, void *pool,
                                  pool_fn part, void *job, const float **rows, int units);

#endif
