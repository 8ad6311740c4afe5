/* Every kernel of llminfra/kernels/csrc/ on fixed pseudo-random inputs, one line of output per
 * case and thread count: "<case> threads=<T> rc=<code> <FNV-1a hash of the output's bits>".
 *
 * tests/test_kernels_portability.py builds this driver against the library with gcc and clang,
 * for x86 (portable and native) and for aarch64 (with and without the dot-product extension,
 * run under qemu-user), and compares the lines: a build that changes one bit of one output
 * changes its case's hash. The inputs are made with exact float operations only (an integer
 * times a power of two), so every compiler and target starts from the same bits; NaNs are
 * hashed as one canonical NaN (which NaN an operation returns differs between CPUs, and no
 * kernel promises it). Sizes are small and awkward (K not a multiple of 16, odd N, G = 9 query
 * heads a K/V head): qemu runs the whole driver in seconds.
 *
 * By hand (the test does the same for each compiler and target):
 *   gcc -O3 -fPIC -pthread llminfra/kernels/csrc/[a-z]*.c tests/csrc/kernels_driver.c -o drv -lm
 *   ./drv > x86.txt
 *   aarch64-linux-gnu-gcc -O3 -fPIC -pthread -march=armv8.2-a+dotprod \
 *       llminfra/kernels/csrc/[a-z]*.c tests/csrc/kernels_driver.c -o drv-arm -lm
 *   qemu-aarch64 -L /usr/aarch64-linux-gnu ./drv-arm | diff x86.txt -   (the isa line only)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../llminfra/kernels/csrc/llminfra_kernels.h"

/* ---- inputs: a 64-bit LCG (Knuth's MMIX constants) and exact conversions ---------------- */

static uint64_t lcg = 0x2545F4914F6CDD1DULL;

static uint32_t next_u32(void) {
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(lcg >> 32);
}

static void seed(uint64_t s) { lcg = s * 0x9E3779B97F4A7C15ULL + 1; }

/* a float in [-scale, scale): a 24-bit integer times scale / 2^23 (scale a power of two) */
static float uniform(float scale) {
    int32_t i = (int32_t)(next_u32() >> 8) - (1 << 23);
    return (float)i * (scale / 8388608.0f);
}

static float *floats(size_t n, float scale) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = uniform(scale);
    return p;
}

/* fp16 bits of a value of magnitude 2^(lo - 15) .. 2^(hi - 14), negative where sign */
static uint16_t half(int lo, int hi, int sign) {
    uint32_t r = next_u32();
    uint16_t e = (uint16_t)(lo + (int)(r % (uint32_t)(hi - lo + 1)));
    uint16_t s = sign && (r & 0x10000) ? 0x8000 : 0;
    return (uint16_t)(s | (e << 10) | ((r >> 20) & 0x3ff));
}

/* ---- the output's bits, hashed ------------------------------------------------------------ */

static uint64_t fnv(uint64_t h, const void *p, size_t bytes) {
    const unsigned char *b = p;
    for (size_t i = 0; i < bytes; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

static uint64_t hash_floats(const float *y, size_t n) {
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &y[i], 4);
        if (isnan(y[i])) bits = 0x7fc00000u;
        h = fnv(h, &bits, 4);
    }
    return h;
}

/* the thread counts every case runs on: one thread, two on a pool, three started per call */
static const int THREADS[3] = {1, 2, 3};

static void report(const char *name, int threads, int rc, const float *y, size_t n) {
    printf("%s threads=%d rc=%d %016llx\n", name, threads, rc,
           (unsigned long long)hash_floats(y, n));
}

static void *pool_of(int threads) { return threads == 2 ? w4a8_pool_new(2) : NULL; }

/* ---- the cases ----------------------------------------------------------------------------- */

static void swiglu_case(void) {
    int K = 16 * 7 + 5;
    seed(1);
    float *gate = floats((size_t)K, 16.f), *up = floats((size_t)K, 2.f), *a = floats(K, 1.f);
    gate[0] = 0.f, gate[1] = -0.f, gate[2] = 100.f, gate[3] = -100.f, gate[4] = NAN;
    w4a8_swiglu(gate, up, a, K);
    report("swiglu K=117", 1, 0, a, (size_t)K);
    free(gate), free(up), free(a);
}

static void w4a8_case(int M, int N, int K, int passes, int gated, int normed, int with_nan) {
    seed((uint64_t)(M * 1000003 + N * 1009 + K + 17 * passes + 5 * gated + normed));
    int G = K / 32, stride = gated ? 2 * K : K;
    uint8_t *u = malloc((size_t)N * K), *codes = malloc((size_t)N * K / 2);
    uint16_t *d = malloc(2 * (size_t)N * G), *m = malloc(2 * (size_t)N * G);
    for (size_t i = 0; i < (size_t)N * K; i++) u[i] = (uint8_t)(next_u32() >> 28);
    for (size_t i = 0; i < (size_t)N * G; i++) d[i] = half(8, 12, 0), m[i] = half(8, 13, 1);
    float *x = floats((size_t)M * stride, 4.f), *norm = floats((size_t)K, 1.f);
    if (with_nan) x[(size_t)(M - 1) * stride + 3] = INFINITY;
    int rc = w4a8_pack(u, codes, N, K);
    char name[128];
    snprintf(name, sizeof name, "w4a8 M=%d N=%d K=%d passes=%d gated=%d norm=%d nan=%d", M, N,
             K, passes, gated, normed, with_nan);
    for (int t = 0; t < 3; t++) {
        float *y = floats((size_t)M * N, 1.f);
        void *pool = pool_of(THREADS[t]);
        int r = rc ? rc : w4a8_gemm(x, codes, d, m, y, M, N, K, stride, gated,
                                    normed ? norm : NULL, 1e-5f, passes, THREADS[t], pool);
        report(name, THREADS[t], r, y, (size_t)M * N);
        w4a8_pool_free(pool);
        free(y);
    }
    free(u), free(codes), free(d), free(m), free(x), free(norm);
}

static void f32_case(int panels, int M, int N, int K, int with_r, int gated, int normed) {
    seed((uint64_t)(panels * 7919 + M * 104729 + N * 131 + K + with_r + 3 * gated + 9 * normed));
    int stride = gated ? 2 * K : K;
    float *w = floats((size_t)N * K, 1.f), *x = floats((size_t)M * stride, 2.f);
    float *r = floats((size_t)M * N, 1.f), *norm = floats((size_t)K, 1.f);
    float *p = malloc(sizeof(float) * (size_t)((N + 15) / 16) * 16 * (K ? K : 1));
    int rc = panels ? f32_panel_pack(w, p, N, K) : 0;
    char name[128];
    snprintf(name, sizeof name, "%s M=%d N=%d K=%d r=%d gated=%d norm=%d",
             panels ? "f32_panels" : "f32_skinny", M, N, K, with_r, gated, normed);
    for (int t = 0; t < 3; t++) {
        float *y = floats((size_t)M * N, 1.f);
        void *pool = pool_of(THREADS[t]);
        const float *rr = with_r ? r : NULL, *g = normed ? norm : NULL;
        int code = rc ? rc
                 : panels ? f32_panel_gemm(x, p, rr, y, M, N, K, stride, gated, g, 1e-5f,
                                           THREADS[t], pool)
                          : f32_skinny_gemm(x, w, rr, y, M, N, K, stride, gated, g, 1e-5f,
                                            THREADS[t], pool);
        report(name, THREADS[t], code, y, (size_t)M * N);
        w4a8_pool_free(pool);
        free(y);
    }
    free(w), free(x), free(r), free(norm), free(p);
}

/* n sequences of lengths 1 .. W B on a pool of blocks dealt out in a scrambled order */
static void paged_case(int n, int H, int H_kv, int d, int B, int W) {
    seed((uint64_t)(n * 31 + H * 7 + H_kv * 3 + d * 101 + B * 13 + W));
    int blocks = n * W + 1;
    size_t slot = (size_t)H_kv * d;
    float *q = floats((size_t)n * H * d, 1.f), *out = floats((size_t)n * H * d, 1.f);
    float *k = floats((size_t)blocks * B * slot, 2.f), *v = floats((size_t)blocks * B * slot, 1.f);
    int *tables = malloc(sizeof(int) * (size_t)n * W), *lens = malloc(sizeof(int) * n);
    for (int i = 0; i < n * W; i++) tables[i] = (i * 7 + 3) % blocks;
    for (int s = 0; s < n; s++) lens[s] = 1 + (int)(next_u32() % (uint32_t)(W * B));
    lens[0] = W * B;
    char name[128];
    snprintf(name, sizeof name, "paged_decode n=%d H=%d H_kv=%d d=%d B=%d W=%d", n, H, H_kv, d,
             B, W);
    for (int t = 0; t < 3; t++) {
        void *pool = pool_of(THREADS[t]);
        int rc = paged_decode_f32(q, (long)H * d, k, v, tables, lens, out, n, H, H_kv, d, B, W,
                                  blocks, 0.125f, THREADS[t], pool);
        report(name, THREADS[t], rc, out, (size_t)n * H * d);
        w4a8_pool_free(pool);
    }
    free(q), free(out), free(k), free(v), free(tables), free(lens);
}

static void rope_case(int N, int H, int H_kv, int d) {
    seed((uint64_t)(N + H * 11 + d * 5));
    long row = (long)(H + 2 * H_kv) * d, P = 40, S = 3L * N;
    float *qkv = floats((size_t)N * row, 2.f), *rot = floats((size_t)P * d, 1.f);
    float *k = floats((size_t)S * H_kv * d, 1.f), *v = floats((size_t)S * H_kv * d, 1.f);
    int64_t *pos = malloc(sizeof(int64_t) * N), *slots = malloc(sizeof(int64_t) * N);
    for (int i = 0; i < N; i++) pos[i] = next_u32() % P, slots[i] = (3 * i + 1) % S;
    int rc = rope_write_f32(qkv, N, row, pos, rot, P, H, H_kv, d, slots, S, k, v);
    char name[96];
    snprintf(name, sizeof name, "rope_write N=%d H=%d H_kv=%d d=%d", N, H, H_kv, d);
    uint64_t h = hash_floats(qkv, (size_t)N * row) ^ hash_floats(k, (size_t)S * H_kv * d) * 3 ^
                 hash_floats(v, (size_t)S * H_kv * d) * 5;
    printf("%s threads=1 rc=%d %016llx\n", name, rc, (unsigned long long)h);
    free(qkv), free(rot), free(k), free(v), free(pos), free(slots);
}

/* ---- a whole decode step (decode_stack.c) on a model of 2 tiny layers ---------------------- */

enum { L_N = 2, DIM = 64, HQ = 4, HKV = 2, HD = 16, FFN = 128, VOCAB = 50, BS = 4, WB = 4 };

/* one weight (N, K): int4 codes packed with fp16 d, m, or fp32 W and its panels */
static stack_weight weight(int int4, int N, int K, void **owned) {
    stack_weight w = {.N = N, .K = K, .skinny_rows = 2, .panel_rows = 64};
    if (int4) {
        uint8_t *u = malloc((size_t)N * K), *codes = malloc((size_t)N * K / 2);
        uint16_t *d = malloc(2 * (size_t)N * (K / 32)), *m = malloc(2 * (size_t)N * (K / 32));
        for (size_t i = 0; i < (size_t)N * K; i++) u[i] = (uint8_t)(next_u32() >> 28);
        for (size_t i = 0; i < (size_t)N * (K / 32); i++)
            d[i] = half(8, 11, 0), m[i] = half(7, 11, 1);
        w4a8_pack(u, codes, N, K);
        free(u);
        w.codes = codes, w.d = d, w.m = m;
        owned[0] = codes, owned[1] = d, owned[2] = m;
    } else {
        float *W = floats((size_t)N * K, 0.25f);
        float *p = malloc(sizeof(float) * (size_t)((N + 15) / 16) * 16 * K);
        f32_panel_pack(W, p, N, K);
        w.w = W, w.panels = p;
        owned[0] = W, owned[1] = p, owned[2] = NULL;
    }
    return w;
}

/* n tokens (n_rows of their logits, -1: all) through the model, int4 or fp32 */
static void stack_case(int int4, int n, int n_rows) {
    seed((uint64_t)(int4 * 77 + n * 5 + n_rows + 3));
    int blocks = n * WB + 1;
    long row = (HQ + 2 * HKV) * HD, kv = (long)blocks * BS * HKV * HD;
    void *owned[L_N * 4 + 1][3];
    stack_layer layers[L_N];
    float *pristine[L_N][2], *gains[L_N][2];
    for (int l = 0; l < L_N; l++) {
        stack_layer *L = &layers[l];
        gains[l][0] = floats(DIM, 2.f), gains[l][1] = floats(DIM, 2.f);
        L->attn_norm = gains[l][0], L->ffn_norm = gains[l][1];
        L->qkv = weight(int4, (int)row, DIM, owned[4 * l]);
        L->wo = weight(int4, DIM, HQ * HD, owned[4 * l + 1]);
        L->w13 = weight(int4, 2 * FFN, DIM, owned[4 * l + 2]);
        L->w2 = weight(int4, DIM, FFN, owned[4 * l + 3]);
        pristine[l][0] = floats((size_t)kv, 1.f), pristine[l][1] = floats((size_t)kv, 1.f);
        L->k = malloc(sizeof(float) * kv), L->v = malloc(sizeof(float) * kv);
    }
    stack_weight output = weight(int4, VOCAB, DIM, owned[4 * L_N]);
    float *rot = floats(32 * HD, 1.f), *emb = floats(VOCAB * DIM, 1.f), *fin = floats(DIM, 2.f);
    stack_model s = {.n_layers = L_N, .dim = DIM, .H = HQ, .H_kv = HKV, .d = HD, .ffn = FFN,
                     .passes = 1, .B = BS, .W = WB, .pool_blocks = blocks, .eps = 1e-5f,
                     .scale = 0.25f, .rot_rows = 32, .slots = (long)blocks * BS, .rot = rot,
                     .embedding = emb, .final_norm = fin};
    int64_t tokens[8], positions[8], slots[8], tables[8 * WB], rows[8];
    for (int i = 0; i < n; i++) {
        tokens[i] = next_u32() % VOCAB, positions[i] = (5 + 4 * i) % (WB * BS);
        for (int b = 0; b < WB; b++) tables[i * WB + b] = (i * WB + b) * 5 % blocks;
        slots[i] = tables[i * WB + positions[i] / BS] * BS + positions[i] % BS;
        rows[i] = n - 1 - i;
    }
    size_t wanted = (size_t)(n_rows < 0 ? n : n_rows) * VOCAB;
    float *x = malloc(sizeof(float) * n * DIM);
    float *work = malloc(sizeof(float) * n * (row + HQ * HD + 2 * FFN + DIM));
    char name[96];
    snprintf(name, sizeof name, "decode_stack %s n=%d rows=%d", int4 ? "int4" : "fp32", n,
             n_rows);
    for (int t = 0; t < 3; t++) {
        for (int l = 0; l < L_N; l++) {
            memcpy(layers[l].k, pristine[l][0], sizeof(float) * kv);
            memcpy(layers[l].v, pristine[l][1], sizeof(float) * kv);
        }
        float *logits = floats(wanted, 1.f);
        s.threads = THREADS[t], s.pool = pool_of(THREADS[t]);
        int rc = w4a8_decode_stack(&s, layers, &output, tokens, VOCAB, positions, slots, tables,
                                   n, WB, rows, n_rows, x, work, logits);
        report(name, THREADS[t], rc, logits, wanted);
        w4a8_pool_free(s.pool);
        free(logits);
    }
    for (int l = 0; l < L_N; l++) {
        free(layers[l].k), free(layers[l].v), free(pristine[l][0]), free(pristine[l][1]);
        free(gains[l][0]), free(gains[l][1]);
    }
    for (int i = 0; i < L_N * 4 + 1; i++)
        for (int j = 0; j < 3; j++) free(owned[i][j]);
    free(rot), free(emb), free(fin), free(x), free(work);
}

int main(void) {
    printf("isa %s lanes=%d\n", llminfra_kernels_isa(), w4a8_lanes());
    swiglu_case();
    static const int W4[][7] = {   /* M, N, K, passes, gated, norm, nan */
        {1, 1, 64, 1, 0, 0, 0},   {1, 37, 576, 1, 0, 1, 0}, {3, 7, 192, 2, 0, 0, 0},
        {3, 37, 896, 1, 1, 0, 0}, {5, 13, 576, 2, 0, 1, 0}, {9, 7, 1536, 1, 0, 0, 0},
        {9, 37, 128, 2, 1, 0, 0}, {4, 2, 896, 1, 0, 0, 1}, {12, 5, 64, 1, 0, 1, 0},
        {2, 64, 320, 1, 0, 0, 0}};
    for (size_t i = 0; i < sizeof W4 / sizeof *W4; i++)
        w4a8_case(W4[i][0], W4[i][1], W4[i][2], W4[i][3], W4[i][4], W4[i][5], W4[i][6]);
    static const int F[][7] = {    /* panels, M, N, K, r, gated, norm */
        {0, 1, 1, 16, 0, 0, 0},  {0, 1, 37, 67, 1, 0, 0},  {0, 2, 13, 130, 0, 1, 0},
        {0, 5, 37, 64, 1, 0, 1}, {0, 7, 9, 200, 0, 0, 1},  {1, 3, 5, 7, 0, 0, 0},
        {1, 9, 40, 64, 1, 0, 0}, {1, 17, 33, 67, 0, 1, 0}, {1, 4, 16, 130, 1, 0, 1}};
    for (size_t i = 0; i < sizeof F / sizeof *F; i++)
        f32_case(F[i][0], F[i][1], F[i][2], F[i][3], F[i][4], F[i][5], F[i][6]);
    static const int P[][6] = {    /* n, H, H_kv, d, B, W */
        {1, 4, 4, 64, 16, 3}, {3, 6, 2, 64, 16, 4}, {5, 9, 1, 40, 5, 6}, {9, 2, 1, 16, 8, 3},
        {2, 4, 2, 67, 4, 5}};
    for (size_t i = 0; i < sizeof P / sizeof *P; i++)
        paged_case(P[i][0], P[i][1], P[i][2], P[i][3], P[i][4], P[i][5]);
    rope_case(5, 4, 2, 16);
    rope_case(3, 6, 3, 64);
    stack_case(1, 3, 2);
    stack_case(1, 1, -1);
    stack_case(0, 1, 1);
    stack_case(0, 3, -1);
    return 0;
}
