/* The library's SIMD vocabulary, shared by its kernels: which instruction set a build targets,
 * the float rules every build follows, 16-float vectors and their helpers. Each .c file of the
 * library includes this header first, before any other: the float rules below must hold for
 * every function of the file, the system headers' inline functions included.
 *
 * The instruction sets (ggml keeps the same split: one vocabulary, a generic C reference per
 * kernel, the ISA variants beside it): LLMINFRA_AVX512_VNNI and LLMINFRA_AVX2 (x86, the int4
 * kernel's intrinsics), LLMINFRA_NEON_DOTPROD (aarch64 with ARMv8.2's dot product, the int4
 * kernel's vdotq_s32 path); none of them: the portable C loops. LLMINFRA_ISA names the one
 * compiled in (llminfra_kernels_isa()).
 *
 * The float rules. A compiler may fuse a * b + c into one fused multiply-add (one rounding, not
 * two): GCC anywhere in a function, clang within one expression, GCC's vectorizer not in the
 * reductions it vectorizes. Left to them, the same source gives different bits on different
 * compilers and CPUs. So:
 *  - on x86 with FMA (-march=native, x86-64-v3) the vector loops' a += b * c are fused, as
 *    GCC and clang both fuse them; the scalar tails of dot products, which GCC's vectorizer
 *    would leave partly unfused where clang fuses them, are written MUL_ADD: fused where the
 *    build has FMA, two roundings where not;
 *  - everywhere else contraction is off (the pragmas below), so the portable C loops take the
 *    same float steps on aarch64 (whose FMA would otherwise be used) as on an x86 build
 *    without FMA: the same bits, which tests/test_kernels_portability.py checks under qemu;
 *  - exp, the int4 kernel's float steps and the lanes' sums are written out in a fixed order.
 */
#ifndef LLMINFRA_SIMD_H
#define LLMINFRA_SIMD_H

#if !defined(__x86_64__) && !defined(__i386__)
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "llminfra_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)
#define LLMINFRA_AVX512_VNNI 1
#define LLMINFRA_ISA "avx512-vnni"
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define LLMINFRA_AVX2 1
#define LLMINFRA_ISA "avx2"
#elif defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#define LLMINFRA_NEON_DOTPROD 1
#define LLMINFRA_ISA "neon-dotprod"
#include <arm_neon.h>
#else
#define LLMINFRA_ISA "portable"
#endif

/* vectors of 16 floats are passed between this library's static inline functions only, never
   across a library boundary: GCC's and clang's notes on their ABI do not apply (after the
   intrinsics' headers, whose option pragmas would set the warning back) */
#pragma GCC diagnostic ignored "-Wpsabi"

/* a * b + c: one rounding where the build has FMA, else two (see the float rules above) */
#if defined(__FMA__)
#define MUL_ADD(a, b, c) __builtin_fmaf((a), (b), (c))
#else
#define MUL_ADD(a, b, c) ((a) * (b) + (c))
#endif

/* a spinning thread's pause: the core's hint that this is a wait loop */
#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ volatile("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

/* a helper inlined wherever it is called. The helpers take their vectors by pointer: a vector
   of 64 bytes passed by value makes GCC note, on every build without AVX-512, that its ABI
   changed in GCC 4.6 (no pragma silences the note) */
#define LLMINFRA_INLINE static inline __attribute__((always_inline))

/* GCC / clang vector extensions: 16 floats are one AVX-512 register, two AVX2 ones, four NEON
   quads, or plain loops where there is no vector unit; one code path for all */
typedef float v16 __attribute__((vector_size(64)));
typedef int vi16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

LLMINFRA_INLINE v16 load16(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

LLMINFRA_INLINE void store16(float *p, const v16 *v) { memcpy(p, v, sizeof *v); }

/* Where the compiler has __builtin_shufflevector (clang, GCC 12+), lanes move between
   registers; elsewhere through memory. */
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define LLMINFRA_SHUFFLE 1
#define SV __builtin_shufflevector
#endif
#endif

/* The 16 lanes' sum as a tree: lanes j + (j + 8), then of those j + (j + 4), then
   (0 + 2) + (1 + 3). The same adds in the same order on both branches, so the same bits; a
   chain of 16 scalar adds would cost more than a short row's dot product itself. */
LLMINFRA_INLINE float sum16(const v16 *lanes) {
    v16 v = *lanes;
#ifdef LLMINFRA_SHUFFLE
    v8 a = SV(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + SV(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 c = SV(a, a, 0, 1, 2, 3) + SV(a, a, 4, 5, 6, 7);
#else
    v8 a, b;
    memcpy(&a, &v, sizeof a);
    memcpy(&b, (char *)&v + sizeof a, sizeof b);
    a += b;
    v4 c, d;
    memcpy(&c, &a, sizeof c);
    memcpy(&d, (char *)&a + sizeof c, sizeof d);
    c += d;
#endif
    return (c[0] + c[2]) + (c[1] + c[3]);
}

#endif
