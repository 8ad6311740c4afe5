/* Paged decode attention on the CPU: one query per sequence against its keys, read in place
 * from the block pool up to the sequence's length.
 *
 * The torch path of a decode step (llminfra/runner/fast_step.py, decode_attention) first copies
 * every sequence's K and V blocks out of the pool with index_select, padded to the longest
 * table, then runs scaled_dot_product_attention with a mask over that padded length: on
 * SmolLM2-135M at 16 sequences a third of the step. This is the CPU counterpart of the Triton
 * kernel (llminfra/attention/paged_triton.py) the same step runs on CUDA. For each sequence n
 * and K/V head h it walks n's block table up to n's length, and for each tile of up to 16 keys
 * of a block (where they lie in the pool) it scores the G = H / H_kv query heads of h against
 * them and keeps a running softmax in fp32 (Milakov & Gimelshein, 2018, arXiv:1805.02867;
 * FlashAttention, Dao et al., 2022, arXiv:2205.14135, Alg. 1):
 *
 *     m_new = max(m, max_j s_j),   l = l e^(m - m_new) + sum_j e^(s_j - m_new),
 *     acc = acc e^(m - m_new) + sum_j e^(s_j - m_new) v_j,        o = acc / l
 *
 * adding the tile's V rows into acc. No copy of K/V, no padded keys. A work unit is a sequence
 * (all its K/V heads, tile by tile: a block's rows, where the heads interleave, are read front
 * to back, and the next block is prefetched) or, where there are fewer than 4 sequences a
 * thread, one (sequence, K/V head); the units go to the w4a8 library's thread pool
 * (thread_pool.c), claimed one at a time (the lengths differ). Each head's arithmetic is the
 * same whichever unit holds it, so the result is the same bits for any thread count. A tile's
 * exponentials are one vector polynomial (Cephes' expf, about 1 ulp).
 *
 * SmolLM2-135M's attention of a decode step, 16 sequences of 100 - 450 tokens (276 on average),
 * its 30 layers each on a pool of its own: 60 ms gathered + SDPA against 25 ms here on one
 * thread, 29 against 14 on two (AMD EPYC, 2 cores, 2026-12-05, the fastest of repeated runs).
 *
 * Vectors are simd.h's GCC / clang vector extensions of 16 floats, under its float rules.
 * Built into the library (llminfra/kernels/build.py); driven by llminfra/runner/fast_step.py.
 * Chapter 04.
 */
#include "simd.h"               /* first, as in every file of the library */
#include "llminfra_kernels.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#define PD_TILE 16           /* keys a tile: one vector of scores per query head */
#define PD_GROUP 8           /* query heads of a K/V head taken in one pass over its keys */
#define PD_MAX_HEAD_DIM 4096 /* a bound on d (and on the state a unit allocates) */

/* Where the compiler has __builtin_shufflevector (simd.h's SV), lanes move between registers;
   elsewhere through memory and scalars (slower). A NaN lane is passed over (never the max):
   the softmax's exponentials carry it, NaN in, NaN out. */
#ifdef LLMINFRA_SHUFFLE
LLMINFRA_INLINE float max16(const v16 *lanes) {
    v16 v = *lanes;
    v8 a = SV(v, v, 0, 1, 2, 3, 4, 5, 6, 7), a2 = SV(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    float m = -INFINITY;
    for (int i = 0; i < 8; i++) {
        float x = a[i] > a2[i] ? a[i] : a2[i];
        m = x > m ? x : m;
    }
    return m;
}

/* lane t: the sum of x[t]'s 16 lanes. Each level adds the halves of pairs of vectors: 16
   vectors of 16 partial sums, 8 of 2 x 8, 4 of 4 x 4, 2 of 8 x 2, one of 16 x 1. */
LLMINFRA_INLINE v16 sum16x16(const v16 *x) {
    v16 c[8], e[4], f[2];
    for (int i = 0; i < 8; i++)
        c[i] = SV(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               SV(x[2 * i], x[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29,
                  30, 31);
    for (int i = 0; i < 4; i++)
        e[i] = SV(c[2 * i], c[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26,
                  27) +
               SV(c[2 * i], c[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                  31);
    for (int i = 0; i < 2; i++)
        f[i] = SV(e[2 * i], e[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28,
                  29) +
               SV(e[2 * i], e[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30,
                  31);
    return SV(f[0], f[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           SV(f[0], f[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
#else
LLMINFRA_INLINE float max16(const v16 *v) {
    float m = -INFINITY;
    for (int i = 0; i < 16; i++) m = (*v)[i] > m ? (*v)[i] : m;
    return m;
}

LLMINFRA_INLINE v16 sum16x16(const v16 *x) {
    v16 s;
    for (int t = 0; t < 16; t++) s[t] = sum16(&x[t]);
    return s;
}
#endif

/* lanes of v where keep is set (-1), else `other` */
LLMINFRA_INLINE v16 select16(const vi16 *keep, const v16 *v, float other) {
    vi16 a, b;
    v16 o = (v16){0} + other, r;
    memcpy(&a, v, sizeof a);
    memcpy(&b, &o, sizeof b);
    a = (a & *keep) | (b & ~*keep);
    memcpy(&r, &a, sizeof r);
    return r;
}

LLMINFRA_INLINE vi16 first_lanes(int nt) {
    vi16 lane;
    for (int t = 0; t < 16; t++) lane[t] = t;
    return lane < nt;
}

/* e^x for x <= 0 (a score minus the running max), lane by lane: x = n ln 2 + r with n an integer
   and |r| <= ln 2 / 2, e^r a degree-7 polynomial (Cephes' expf), 2^n built in the exponent bits.
   Below -87.3 (e^x under 2^-126) it gives about 1e-38: the caller zeroes the lanes past a
   sequence's end itself. NaN in a lane is NaN out (the clamp alone made it 1e-38). */
LLMINFRA_INLINE v16 exp16(const v16 *at) {
    vi16 above = *at >= -87.3365447504f;                          /* lanes -1 where true */
    v16 x = select16(&above, at, -87.3365447504f);
    v16 fx = x * 1.44269504088896341f + 0.5f;
    v16 t = __builtin_convertvector(__builtin_convertvector(fx, vi16), v16);
    t += __builtin_convertvector(t > fx, v16);                     /* floor: -1 where above */
    v16 r = x - t * 0.693359375f + t * 2.12194440e-4f;
    v16 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vi16 e = (__builtin_convertvector(t, vi16) + 127) << 23;
    v16 scale;
    memcpy(&scale, &e, sizeof scale);
    v16 out = p * scale;
    vi16 number = *at == *at;                                     /* -1 but where NaN */
    return select16(&number, &out, NAN);
}

typedef struct {
    const float *q, *k, *v;
    const int *tables, *lens;
    float *out;
    long q_row;              /* floats from one sequence's query heads to the next */
    int n, H, H_kv, d, B, W;
    int parts;               /* work units a sequence: 1 (all its K/V heads) or H_kv */
    float scale;
    atomic_int failed;       /* a thread could not allocate its state */
} decode_job;

/* The running state of R query heads (R a constant where it is inlined): q (R, d), times the
   softmax scale; acc (R, d); m, l (R,); p (R, PD_TILE) a tile's scores, then probabilities. */
typedef struct {
    const float *q;
    float *acc, *m, *l;
    float (*p)[PD_TILE];
} heads_state;

/* p[g][t] = q_g . k_t for the nt keys at k (rows `row` floats apart), -inf past nt: key by key,
   each query head's 16 lanes of partial sums (a key row is loaded once for the R heads), then
   one transposing reduction a head for the tile. */
static inline __attribute__((always_inline)) void tile_scores(
        heads_state st, const float *k, long row, int nt, int d, int R) {
    int d16 = d / 16 * 16;
    v16 x[PD_GROUP][PD_TILE];
    for (int t = 0; t < PD_TILE; t++) {
        const float *kt = k + (size_t)t * row;
        v16 a[PD_GROUP];
        for (int g = 0; g < R; g++) a[g] = (v16){0};
        for (int i = 0; i < d16 && t < nt; i += 16) {
            v16 kv = load16(kt + i);
            for (int g = 0; g < R; g++) a[g] += kv * load16(st.q + (size_t)g * d + i);
        }
        for (int g = 0; g < R; g++) x[g][t] = a[g];
    }
    vi16 keep = first_lanes(nt);
    for (int g = 0; g < R; g++) {
        const float *q = st.q + (size_t)g * d;
        v16 s = sum16x16(x[g]);
        for (int t = 0; t < nt && d16 < d; t++)
            for (int i = d16; i < d; i++) s[t] = MUL_ADD(k[(size_t)t * row + i], q[i], s[t]);
        v16 kept = select16(&keep, &s, -INFINITY);
        store16(st.p[g], &kept);
    }
}

/* The online-softmax update of a tile: probabilities in p (0 past nt), m, l and acc rescaled. */
static inline __attribute__((always_inline)) void tile_softmax(heads_state st, int nt, int d,
                                                               int R) {
    vi16 keep = first_lanes(nt);
    for (int g = 0; g < R; g++) {
        v16 s = load16(st.p[g]);
        float m_tile = max16(&s), m_new = m_tile > st.m[g] ? m_tile : st.m[g];
        v16 shifted = s - m_new, ex = exp16(&shifted), e = select16(&keep, &ex, 0.0f);
        store16(st.p[g], &e);
        if (m_new != st.m[g]) {             /* a larger score: earlier terms shrink */
            float alpha = expf(st.m[g] - m_new), *acc = st.acc + (size_t)g * d;
            st.l[g] *= alpha;
            for (int i = 0; i < d; i++) acc[i] *= alpha;
            st.m[g] = m_new;
        }
        st.l[g] += sum16(&e);
    }
}

/* acc_g += sum_t p[g][t] v_t over the nt V rows at v: each 16 floats of acc stay in registers
   while the tile's rows go by. */
static inline __attribute__((always_inline)) void tile_values(
        heads_state st, const float *v, long row, int nt, int d, int R) {
    int i = 0;
    for (; i + 16 <= d; i += 16) {
        v16 a[PD_GROUP];
        for (int g = 0; g < R; g++) a[g] = load16(st.acc + (size_t)g * d + i);
        for (int t = 0; t < nt; t++) {
            v16 vv = load16(v + (size_t)t * row + i);
            for (int g = 0; g < R; g++) a[g] += st.p[g][t] * vv;
        }
        for (int g = 0; g < R; g++) store16(st.acc + (size_t)g * d + i, &a[g]);
    }
    for (; i < d; i++)
        for (int t = 0; t < nt; t++)
            for (int g = 0; g < R; g++)
                st.acc[(size_t)g * d + i] = MUL_ADD(st.p[g][t], v[(size_t)t * row + i],
                                                    st.acc[(size_t)g * d + i]);
}

static inline __attribute__((always_inline)) void tile(heads_state st, const float *k,
                                                       const float *v, long row, int nt, int d,
                                                       int R) {
    tile_scores(st, k, row, nt, d, R);
    tile_softmax(st, nt, d, R);
    tile_values(st, v, row, nt, d, R);
}

#define TILE_CASE(D, R) case R: tile(st, k, v, row, nt, D, R); break;
#define TILE_CASES(D) switch (R) { \
        TILE_CASE(D, 1) TILE_CASE(D, 2) TILE_CASE(D, 3) TILE_CASE(D, 4) \
        default: tile(st, k, v, row, nt, d, R); }

/* One tile of keys (nt rows at k and v) for R <= PD_GROUP query heads of one K/V head. Where
   the CPU has wide vectors, head dim 64 (SmolLM2's, most small models') is a constant for R up
   to 4 (the query rows and accumulators then stay in registers); any other d and R run as they
   come. Each constant case is compiled apart: on 128-bit vectors (the portable build) they
   took the compiler seconds apiece, for a path that is only meant to be correct. */
static void tile_heads(heads_state st, const float *k, const float *v, long row, int nt, int d,
                       int R) {
#if defined(__AVX2__) || defined(__AVX512F__) || defined(__aarch64__)
    if (d == 64)
        TILE_CASES(64)
    else
#endif
        tile(st, k, v, row, nt, d, R);
}

/* Ask for the nt key rows of the next block (at `at` in K and V) while this one is computed: a
   block lies anywhere in the pool, and the hardware's prefetcher starts over at each page. */
static void prefetch_block(const decode_job *j, size_t at, long row, int nt) {
    size_t bytes = (size_t)nt * row * sizeof(float);
    const char *k = (const char *)(j->k + at), *v = (const char *)(j->v + at);
    for (size_t b = 0; b < bytes; b += 64) {
        __builtin_prefetch(k + b);
        __builtin_prefetch(v + b);
    }
}

/* Sequence n's query heads of K/V heads h_begin .. h_end - 1, all against its keys: block by
   block, tile by tile, and within a tile head by head (a block's rows are read front to back),
   then o = acc / l into out. state: 2 R d + 2 R floats for the R = (h_end - h_begin) G heads. */
static void attend_unit(const decode_job *j, float *state, int n, int h_begin, int h_end) {
    int d = j->d, B = j->B, len = j->lens[n], G = j->H / j->H_kv, R = (h_end - h_begin) * G;
    long row = (long)j->H_kv * d;                       /* floats from one key to the next */
    float *q = state, *acc = q + (size_t)R * d, *m = acc + (size_t)R * d, *l = m + R;
    const float *q_in = j->q + (size_t)n * j->q_row + (size_t)h_begin * G * d;
    for (size_t i = 0; i < (size_t)R * d; i++) {
        q[i] = q_in[i] * j->scale;
        acc[i] = 0.0f;
    }
    for (int r = 0; r < R; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    float p[PD_GROUP][PD_TILE] __attribute__((aligned(64)));
    const int *table = j->tables + (size_t)n * j->W;
    for (int start = 0; start < len; start += B) {
        size_t at = (size_t)table[start / B] * B * row;            /* the block's key 0 */
        int in_block = len - start < B ? len - start : B;
        if (start + B < len) prefetch_block(j, (size_t)table[start / B + 1] * B * row, row,
                                            len - start - B < B ? len - start - B : B);
        for (int t0 = 0; t0 < in_block; t0 += PD_TILE) {
            int nt = in_block - t0 < PD_TILE ? in_block - t0 : PD_TILE;
            for (int h = h_begin; h < h_end; h++) {
                size_t off = at + (size_t)t0 * row + (size_t)h * d;
                for (int g0 = 0; g0 < G; g0 += PD_GROUP) {
                    int r = (h - h_begin) * G + g0;
                    heads_state st = {q + (size_t)r * d, acc + (size_t)r * d, m + r, l + r, p};
                    tile_heads(st, j->k + off, j->v + off, row, nt, d,
                               G - g0 < PD_GROUP ? G - g0 : PD_GROUP);
                }
            }
        }
    }
    float *out = j->out + ((size_t)n * j->H + (size_t)h_begin * G) * d;
    for (int r = 0; r < R; r++)
        for (int i = 0; i < d; i++) out[(size_t)r * d + i] = acc[(size_t)r * d + i] / l[r];
}

/* Units c U / C .. (c + 1) U / C of the U = n parts units (a sequence, or one of its K/V heads). */
static void decode_part(void *arg, int c, int C) {
    decode_job *j = (decode_job *)arg;
    int U = j->n * j->parts, per = j->H_kv / j->parts;
    int begin = (int)((long)U * c / C), end = (int)((long)U * (c + 1) / C);
    if (begin >= end) return;
    float *state = malloc(sizeof(float) * (size_t)per * (j->H / j->H_kv) * (2 * j->d + 2));
    if (!state) {
        atomic_store(&j->failed, 1);
        return;
    }
    for (int u = begin; u < end; u++) {
        int n = u / j->parts, h = u % j->parts * per;
        attend_unit(j, state, n, h, h + per);
    }
    free(state);
}

/* out (n, H, d) = softmax(q k^T scale) v for each sequence's query q (n, H, d: head rows of d
   floats, sequences q_row floats apart) against its keys 0 .. lens[n] - 1, key t in block
   tables[n][t / B] (n, W) at row t % B of the K and V pools (pool_blocks, B, H_kv, d). All fp32
   (int32 tables and lens) and contiguous but q's rows. threads (1 .. 64; pool: a
   w4a8_pool_new(threads) kept between calls, else NULL) claim the units one at a time: a
   sequence each where there are at least 4 a thread, else a (sequence, K/V head) each. Returns
   0; -2 for a size or thread count out of range, -3 for a length outside 1 .. W B, -4 for a
   block of a table (one a length reaches) outside 0 .. pool_blocks - 1 (checked before anything
   is read), -5 where a thread could not allocate its 2 H d floats of state. */
int paged_decode_f32(const float *q, long q_row, const float *k, const float *v,
                     const int *tables, const int *lens, float *out, int n, int H, int H_kv,
                     int d, int B, int W, int pool_blocks, float scale, int threads,
                     void *pool) {
    if (n < 0 || H < 1 || H_kv < 1 || H % H_kv || H > 4096 || d < 1 || d > PD_MAX_HEAD_DIM ||
        B < 1 || W < 1 || pool_blocks < 1 || q_row < (long)H * d || threads < 1 ||
        threads > 64 || (long)n * H_kv > 1L << 30)
        return -2;
    for (int s = 0; s < n; s++) {
        if (lens[s] < 1 || (long)lens[s] > (long)W * B) return -3;
        for (int b = 0; b < (lens[s] + B - 1) / B; b++) {
            int block = tables[(size_t)s * W + b];
            if (block < 0 || block >= pool_blocks) return -4;
        }
    }
    if (!n) return 0;
    decode_job j = {.q = q, .k = k, .v = v, .tables = tables, .lens = lens, .out = out,
                    .q_row = q_row, .n = n, .H = H, .H_kv = H_kv, .d = d, .B = B, .W = W,
                    .scale = scale};
    /* a sequence's heads in one unit read each of its blocks front to back (K/V heads
       interleave in a block's rows); split them only where sequences are too few to share */
    j.parts = threads > 1 && n < 4 * threads ? H_kv : 1;
    atomic_init(&j.failed, 0);
    pool_for(threads, pool, decode_part, &j, n * j.parts);   /* a unit a chunk: lengths differ */
    return atomic_load(&j.failed) ? -5 : 0;
}

/* What a decode step does between its q/k/v product and attention, in one call instead of some
   ten torch calls a layer: rows i < N of qkv (row_stride floats apart: H query heads, then H_kv
   key heads, then H_kv value heads, d floats each) get their query and key heads turned in place
   by RoPE at position positions[i] — each pair (x_2j, x_2j+1) by the angle of rot, whose row m
   holds (cos m θ_j, sin m θ_j) for j < d / 2 (a complex table viewed as real; rows 0 .. P - 1) —
   and the row's keys and values are copied to pool slot slots[i] (the slot's H_kv * d floats at
   k + slot * H_kv * d, and the same in v; slots 0 .. S - 1). The multiply is torch's complex one,
   (x_2j + i x_2j+1)(c + i s). Returns 0, or -2 for a size out of range, -3 for a position
   outside 0 .. P - 1, -4 for a slot outside 0 .. S - 1 (checked first: nothing is written). */
int rope_write_f32(float *qkv, int N, long row_stride, const int64_t *positions,
                   const float *rot, long P, int H, int H_kv, int d, const int64_t *slots,
                   long S, float *k, float *v) {
    if (N < 0 || H < 1 || H_kv < 1 || d < 2 || d % 2 || d > PD_MAX_HEAD_DIM ||
        row_stride < (long)(H + 2 * H_kv) * d)
        return -2;
    for (int i = 0; i < N; i++) {
        if (positions[i] < 0 || positions[i] >= P) return -3;
        if (slots[i] < 0 || slots[i] >= S) return -4;
    }
    int half = d / 2;
    size_t kv = (size_t)H_kv * d;
    for (int i = 0; i < N; i++) {
        float *row = qkv + (size_t)i * row_stride;
        const float *cs = rot + (size_t)positions[i] * d;      /* (cos, sin) pairs */
        for (int h = 0; h < H + H_kv; h++) {
            float *x = row + (size_t)h * d;
            for (int j = 0; j < half; j++) {
                float a = x[2 * j], b = x[2 * j + 1], c = cs[2 * j], s = cs[2 * j + 1];
                x[2 * j] = a * c - b * s;
                x[2 * j + 1] = a * s + b * c;
            }
        }
        memcpy(k + (size_t)slots[i] * kv, row + (size_t)H * d, sizeof(float) * kv);
        memcpy(v + (size_t)slots[i] * kv, row + (size_t)(H + H_kv) * d, sizeof(float) * kv);
    }
    return 0;
}
