/* A whole decode step in one call: every layer's products (w4a8.c for int4 weights, or
 * f32_skinny.c and f32_panels.c for fp32 ones), RoPE and K/V write and paged attention
 * (paged_decode.c), and the residual adds, in the order the Python step
 * (llminfra/runner/fast_step.py, _layer) calls them one by one.
 *
 * At batch 1 the products of SmolLM2-135M read 84 MB in about 3 ms on two cores; the Python
 * step around them made 6 ctypes calls and two torch adds a layer, some 240 calls of 5-15 us
 * each: nearly as long again. Here the calls are C calls. Each one is the
 * same function on the same inputs as in the Python step, and a residual add is the same float
 * add torch does (or the fp32 kernels do, r + y), so the logits are the same bits
 * (tests/test_decode_stack.py). Built into the w4a8 library; llminfra/runner/decode_stack.py
 * drives it. Chapter 05.
 */
#include "simd.h"               /* first, as in every file of the library */
#include "llminfra_kernels.h"

#include <limits.h>
#include <stdlib.h>

/* y = x . W^T on the kernel the weight's kind and the row count choose: int4 w4a8_gemm; fp32
   f32_skinny_gemm up to skinny_rows rows, f32_panel_gemm up to panel_rows (the structures are
   llminfra_kernels.h's, filled field by field by llminfra/runner/decode_stack.py) */
static int product(const stack_model *s, const float *x, const stack_weight *w, float *y, int n,
                   int x_stride, int gated, const float *norm) {
    if (w->codes)
        return w4a8_gemm(x, w->codes, w->d, w->m, y, n, w->N, w->K, x_stride, gated, norm,
                         s->eps, s->passes, s->threads, s->pool);
    if (n <= w->skinny_rows)
        return f32_skinny_gemm(x, w->w, NULL, y, n, w->N, w->K, x_stride, gated, norm, s->eps,
                               s->threads, s->pool);
    if (!w->panels || n > w->panel_rows) return -2;
    return f32_panel_gemm(x, w->panels, NULL, y, n, w->N, w->K, x_stride, gated, norm, s->eps,
                          s->threads, s->pool);
}

static void add_to(float *x, const float *y, size_t count) {
    for (size_t i = 0; i < count; i++) x[i] = x[i] + y[i];
}

/* Layer l on x (n, dim) in place; work holds qkv (n, row), attention (n, H d), gate|up
   (n, 2 ffn) and a product (n, dim). Returns 0, or the code of the call that refused, offset
   by -10 for a product (w4a8_gemm or the fp32 kernels), -20 for RoPE and the K/V write, -30
   for attention. */
static int layer(const stack_model *s, const stack_layer *L, float *x, int n,
                 const int64_t *positions, const int64_t *slots, const int *tables,
                 const int *lens, float *work) {
    int H = s->H, H_kv = s->H_kv, d = s->d, rc;
    long row = (long)(H + 2 * H_kv) * d;
    float *qkv = work, *attn = qkv + (size_t)n * row, *gate_up = attn + (size_t)n * H * d;
    float *y = gate_up + (size_t)n * 2 * s->ffn;
    size_t xs = (size_t)n * s->dim;
    if ((rc = product(s, x, &L->qkv, qkv, n, s->dim, 0, L->attn_norm))) return rc - 10;
    if ((rc = rope_write_f32(qkv, n, row, positions, s->rot, s->rot_rows, H, H_kv, d, slots,
                             s->slots, L->k, L->v)))
        return rc - 20;
    if ((rc = paged_decode_f32(qkv, row, L->k, L->v, tables, lens, attn, n, H, H_kv, d, s->B,
                               s->W, s->pool_blocks, s->scale, s->threads, s->pool)))
        return rc - 30;
    if ((rc = product(s, attn, &L->wo, y, n, H * d, 0, NULL))) return rc - 10;
    add_to(x, y, xs);
    if ((rc = product(s, x, &L->w13, gate_up, n, s->dim, 0, L->ffn_norm))) return rc - 10;
    if ((rc = product(s, gate_up, &L->w2, y, n, 2 * s->ffn, 1, NULL))) return rc - 10;
    add_to(x, y, xs);
    return 0;
}

/* Logits (n, output->N) of one token per sequence: tokens[i] at positions[i] written to pool
   slot slots[i], attending to keys 0 .. positions[i] through its row of tables (n, W) -- of
   the rows rows[0 .. n_rows - 1] only where n_rows >= 0 (logits (n_rows, output->N); none
   for 0, where rows may be NULL): the rows of a prompt chunk come as rows too, each with its
   sequence's table.
   x and work: the caller's buffers of n dim and n (row + H d + 2 ffn + dim) floats. Returns 0,
   -1 where memory ran out, -6 for a token outside 0 .. vocab - 1, a table entry outside int or
   a row outside 0 .. n - 1 (nothing run), else the first refusal (see layer). */
int w4a8_decode_stack(const stack_model *s, const stack_layer *layers,
                      const stack_weight *output, const int64_t *tokens, long vocab,
                      const int64_t *positions, const int64_t *slots, const int64_t *tables,
                      int n, int W, const int64_t *rows, int n_rows, float *x, float *work,
                      float *logits) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab || positions[i] < 0 || positions[i] >= INT_MAX)
            return -6;
    for (long i = 0; i < (long)n * W; i++)
        if (tables[i] < INT_MIN || tables[i] > INT_MAX) return -6;
    if (n_rows > 0 && !rows) return -6;
    for (int i = 0; i < n_rows; i++)
        if (rows[i] < 0 || rows[i] >= n) return -6;
    int *t32 = malloc(sizeof(int) * ((size_t)n * W + (size_t)n + 1)), *lens = t32 + (size_t)n * W;
    if (!t32) return -1;
    for (long i = 0; i < (long)n * W; i++) t32[i] = (int)tables[i];     /* paged_decode's ints */
    for (int i = 0; i < n; i++) lens[i] = (int)positions[i] + 1;
    for (int i = 0; i < n; i++)
        memcpy(x + (size_t)i * s->dim, s->embedding + (size_t)tokens[i] * s->dim,
               sizeof(float) * s->dim);
    stack_model step = *s;
    step.W = W;
    int rc = 0;
    for (int l = 0; l < s->n_layers && !rc; l++)
        rc = layer(&step, layers + l, x, n, positions, slots, t32, lens, work);
    if (!rc && n_rows >= 0) {       /* the rows wanted, side by side (work is free again) */
        for (int i = 0; i < n_rows; i++)
            memcpy(work + (size_t)i * s->dim, x + (size_t)rows[i] * s->dim,
                   sizeof(float) * s->dim);
        x = work, n = n_rows;
    }
    if (!rc && n && (rc = product(&step, x, output, logits, n, s->dim, 0, s->final_norm)))
        rc -= 10;
    free(t32);
    return rc;
}
