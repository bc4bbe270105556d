/* SwiGLU's product for the "aligned-native" kernel set: out = silu(gate) * up (see swiglu.py).
 *
 * Per element, g and u read as fp32 (bf16 converts exactly):
 *   x   = -g
 *   e   = +inf                                   if x > 88
 *         exp(max(x, -87)) by the rule below     otherwise (a nan x: exp(-87); g / (...) is nan)
 *   s   = g / (1 + e)
 *   out = round(s * u), or s when s is nan       each operation rounded once to fp32, then to the
 *                                                output dtype (bf16: torch's cast, a nan -> 0xffff)
 * exp(y), -87 <= y <= 88: n = (fma(y, log2 e, 1.5 * 2^23) - 1.5 * 2^23) (round to nearest even),
 * r = fma(n, -C1, y), r = fma(n, C2, r) (Cody-Waite, C1 + C2 = ln 2), p = Horner of the degree-7
 * Taylor polynomial with one fused multiply-add per step, times 2^n through the exponent bits.
 * That is fixed_math.h's zm_exp with each mul-then-add fused: half the instructions, and a
 * different (single) rounding per step, so these bits are not zm_silu's. 1 + exp(-87) rounds to
 * 1 exactly, so clamping at -87 changes nothing; past x = 88 the true value of silu is below 1e-36
 * in magnitude and this gives -0 (g / inf), as zm_silu does.
 *
 * A fused multiply-add is one IEEE operation (exact product and sum, rounded once): the AVX-512
 * path (vfmadd, 16 lanes, masked loads for a row's tail) and the portable path (fmaf per element;
 * the -O0 test build) give the same bits, so an element's bits do not depend on where its row
 * starts, the row count, the thread count or the build.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "entry_points.h"
#include "fixed_math.h"
#include "threads.h"

#define LOG2E 1.44269504088896341f
#define SHIFTER 12582912.0f /* 1.5 * 2^23 */
#define LN2_HI 0.693359375f
#define LN2_LO 2.12194440e-4f

static inline float silu_fma(float g) {
    const float x = -g;
    if (x > 88.0f) return g / INFINITY;
    const float y = fmaxf(x, -87.0f); /* (fmaxf of a nan is -87) */
    const float n = fmaf(y, LOG2E, SHIFTER) - SHIFTER;
    float r = fmaf(n, -LN2_HI, y);
    r = fmaf(n, LN2_LO, r);
    float p = fmaf(1.0f / 5040.0f, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return g / (1.0f + p * scale);
}

/* s * u, except that a nan s is the result itself: with both operands nan, which payload a product
 * keeps depends on the operand order the compiler picked (the -O0 build kept u's, found in review) */
static inline float times_up(float s, float u) { return s != s ? s : s * u; }

static inline void silu_mul_row_c(const char *g, const char *u, char *o, int64_t cols, int bf16) {
    for (int64_t j = 0; j < cols; j++)
        zm_store(o, bf16, j, times_up(silu_fma(zm_load(g, bf16, j)), zm_load(u, bf16, j)));
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) /* (the masked 16-bit loads) */
static inline __m512 silu_fma16(__m512 g) {
    const __m512 x = _mm512_sub_ps(_mm512_setzero_ps(), g);
    const __m512 y = _mm512_max_ps(x, _mm512_set1_ps(-87.0f)); /* a nan x gives -87, as fmaxf */
    const __m512 shifter = _mm512_set1_ps(SHIFTER);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(y, _mm512_set1_ps(LOG2E), shifter), shifter);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), y);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 5040.0f), r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 denom = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
    denom = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(88.0f), _CMP_GT_OQ), denom,
                                 _mm512_set1_ps(INFINITY));
    return _mm512_div_ps(g, denom);
}

static inline __m512 load16(const char *base, int bf16, int64_t j, __mmask16 mask) {
    if (!bf16) return _mm512_maskz_loadu_ps(mask, (const float *)base + j);
    const __m256i h = _mm256_maskz_loadu_epi16(mask, (const uint16_t *)base + j);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 values (those in mask) into an fp32 buffer, or a bf16 one as zm_store writes them */
static inline void store16(char *base, int bf16, int64_t j, __m512 v, __mmask16 mask) {
    if (!bf16) {
        _mm512_mask_storeu_ps((float *)base + j, mask, v);
        return;
    }
    _mm256_mask_storeu_epi16((uint16_t *)base + j, mask, _mm512_cvtepi32_epi16(zm_torch_bf16_16(v, 0xffff)));
}

/* times_up on 16 lanes */
static inline __m512 times_up16(__m512 s, __m512 u) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(s, s, _CMP_UNORD_Q), _mm512_mul_ps(s, u), s);
}

static inline void silu_mul_row(const char *g, const char *u, char *o, int64_t cols, const int bf16) {
    int64_t j = 0;
    for (; j + LANES <= cols; j += LANES)
        store16(o, bf16, j, times_up16(silu_fma16(load16(g, bf16, j, 0xffff)), load16(u, bf16, j, 0xffff)),
                0xffff);
    if (j < cols) {
        const __mmask16 tail = (__mmask16)((1u << (cols - j)) - 1u);
        store16(o, bf16, j, times_up16(silu_fma16(load16(g, bf16, j, tail)), load16(u, bf16, j, tail)), tail);
    }
}
#else
static inline void silu_mul_row(const char *g, const char *u, char *o, int64_t cols, const int bf16) {
    silu_mul_row_c(g, u, o, cols, bf16);
}
#endif

/* gate, up: rows of `cols` values of one dtype (bf16 or fp32), unit inner stride, rows
 * gate_stride / up_stride elements apart; out: contiguous [rows, cols] of that dtype. */
static void silu_mul_rows(const char *gate, const char *up, int bf16, int64_t row0, int64_t row1, int64_t cols,
                          int64_t gate_stride, int64_t up_stride, char *out) {
    const int64_t size = bf16 ? 2 : 4;
    for (int64_t row = row0; row < row1; row++) {
        const char *g = gate + row * gate_stride * size, *u = up + row * up_stride * size;
        char *o = out + row * cols * size;
        if (bf16) silu_mul_row(g, u, o, cols, 1);
        else silu_mul_row(g, u, o, cols, 0);
    }
}

void zm_silu_mul(const void *gate, const void *up, int bf16, int64_t rows, int64_t cols, int64_t gate_stride,
                 int64_t up_stride, void *out, int n_threads) {
    if (zm_serial(n_threads, rows * cols, 1 << 16)) {
        silu_mul_rows(gate, up, bf16, 0, rows, cols, gate_stride, up_stride, out);
        return;
    }
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t row = 0; row < rows; row++)
        silu_mul_rows(gate, up, bf16, row, row + 1, cols, gate_stride, up_stride, out);
}

/* the portable rule on n contiguous fp32 values (tests pin the AVX-512 path to it in one build) */
void zm_silu_mul_reference(const float *gate, const float *up, int64_t n, float *out) {
    silu_mul_row_c((const char *)gate, (const char *)up, (char *)out, n, 0);
}
