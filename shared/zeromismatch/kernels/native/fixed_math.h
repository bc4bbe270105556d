/* Fixed-rounding helpers shared by the native kernels (attention, ssm, gemm, pointwise, moe, conv): pure IEEE
 * mul/add/compare sequences, so every call gives the same bits for the same input on any
 * compiler target built with -ffp-contract=off and no fast-math. */
#ifndef ZM_FIXED_MATH_H
#define ZM_FIXED_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* the bit-for-bit argument needs every float operation rounded to fp32 once (no x87 extended
 * precision) and no fast-math rewriting; refuse to compile otherwise. FLT_EVAL_METHOD 16 (GCC on
 * CPUs with AVX512-FP16, ISO/IEC TS 18661-3) widens only _Float16 operations, which these sources do
 * not use: float and double still evaluate in their own type, as under 0. */
#if defined(__FLT_EVAL_METHOD__) && __FLT_EVAL_METHOD__ != 0 && __FLT_EVAL_METHOD__ != 16
#error "native kernels need FLT_EVAL_METHOD 0 (e.g. SSE math, not -mfpmath=387)"
#endif
#if defined(__FAST_MATH__) || defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__
#error "native kernels must not be built with fast-math"
#endif

#define LANES 16

/* GCC/clang vector of 16 floats; on targets without 512-bit registers the compiler splits it,
 * which changes no bits (lanes are independent). aligned(4): rows need no alignment. */
typedef float v16 __attribute__((vector_size(64), aligned(4)));

typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef float v4 __attribute__((vector_size(16), aligned(4)));

/* the 16 lanes summed in a fixed tree: i + (i+8), then i + (i+4), i + (i+2), then 0 + 1 */
static inline float lanes_tree(v16 a) {
    const v8 a8 = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
    const v4 a4 = __builtin_shufflevector(a8, a8, 0, 1, 2, 3) + __builtin_shufflevector(a8, a8, 4, 5, 6, 7);
    const float a0 = a4[0] + a4[2], a1 = a4[1] + a4[3];
    return a0 + a1;
}

/* exp(x) for -87 < x <= 88 (attention calls it with score - max <= 0; the scan's softplus and
 * decay with larger x), within 1.22 ulp over (-87, 0] and 1.12 ulp up to 88 (measured over every
 * float); exactly 0 at x <= -87 (true values below 1.7e-38) and at -inf; nan stays nan.
 * Cody-Waite reduction x = n*ln2 + r, |r| <= ln2/2, then a degree-7 Taylor polynomial in
 * Horner form, scaled by 2^n through the exponent bits. Pure mul/add/compare: vectorizable
 * and the same bits in every lane. */
static inline float zm_exp(float x) {
    if (x != x) return x; /* nan: a nan score must reach the output, as in torch */
    if (!(x > -87.0f)) return 0.0f; /* also -inf (masked keys) */
    /* round to nearest even by the 1.5 * 2^23 trick (|x * log2 e| < 2^22 here) */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t e = (int32_t)n + 127;
    uint32_t bits = (uint32_t)e << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* silu(g) = g / (1 + zm_exp(-g)), with +inf for -g > 88 (past zm_exp's range; g / inf = -0, where
 * the true value is below 1e-36 in magnitude) */
static inline float zm_silu(float g) {
    const float e = -g > 88.0f ? INFINITY : zm_exp(-g);
    return g / (1.0f + e);
}

typedef int32_t vi16 __attribute__((vector_size(64), aligned(4)));

/* zm_exp in 16 lanes: lane i is zm_exp(x[i]) bit for bit for every x <= 88 and nan (the same IEEE
 * operations; lanes zm_exp answers early compute on +0 instead and are replaced after; checked
 * against zm_exp over 3.2 million inputs, including -0, -87, -inf and nan) */
static inline v16 zm_exp16(v16 x) {
    const vi16 is_nan = x != x, flushed = ~(x > -87.0f) & ~is_nan;
    const v16 xc = (v16)((vi16)x & ~(is_nan | flushed));
    const v16 n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    v16 r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v16 p = (v16){0} + 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const vi16 e = __builtin_convertvector(n, vi16) + 127;
    const v16 result = p * (v16)(e << 23);
    return (v16)(((vi16)result & ~(is_nan | flushed)) | ((vi16)x & is_nan));
}

/* zm_silu in 16 lanes, lane for lane the same bits */
static inline v16 zm_silu16(v16 g) {
    const v16 minus = -g;
    const vi16 big = minus > 88.0f;
    const v16 e = (v16)(((vi16)zm_exp16((v16)((vi16)minus & ~big)) & ~big) | ((vi16)((v16){0} + INFINITY) & big));
    return g / (1.0f + e);
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* fp32 -> the nearest bf16 (ties to even), kept as fp32; a nan stays a quiet nan */
static inline float zm_round_bf16(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) bits = (bits | 0x00400000u) & 0xffff0000u;
    else bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* torch's float -> bfloat16 as its vectorized conversion does it: round to nearest even, and any
 * nan becomes 0xffff (measured for torch 2.13 on this CPU at every length; c10's scalar conversion
 * would give 0x7fc0) */
static inline uint16_t zm_torch_bf16(float f) {
    if (f != f) return 0xffff;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

#ifdef __AVX512F__
#include <immintrin.h>
/* zm_torch_bf16 on 16 lanes, with a nan written as nan_bits (0xffff is zm_torch_bf16's): each lane's
 * bf16 bits in the low half of its 32-bit lane, for _mm512_cvtepi32_epi16 to narrow */
static inline __m512i zm_torch_bf16_16(__m512 v, uint16_t nan_bits) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    return _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(nan_bits));
}
#endif

/* element i of an fp32 or bf16 buffer, as fp32 */
static inline float zm_load(const void *base, int bf16, int64_t i) {
    return bf16 ? bf16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

/* v into element i of an fp32 buffer, or of a bf16 one as torch's cast rounds it */
static inline void zm_store(void *base, int bf16, int64_t i, float v) {
    if (bf16) ((uint16_t *)base)[i] = zm_torch_bf16(v);
    else ((float *)base)[i] = v;
}

#endif
