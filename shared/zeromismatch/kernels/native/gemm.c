/* Fixed-order GEMM over a panel-packed weight, for the aligned-native linear, quant_linear,
 * lm_head and row-parallel linear.
 *
 *   out[p][i][c] = sum over k in piece p of x[i][k] * w[c][k]     (x [M, K] row major)
 *
 * The weight is packed (by gemm.py) into panels of 16 output columns: fp32 [panels][K][16],
 * bf16 [panels][K/2][16][2] (the pairs vdpbf16ps reads). The rule that fixes every output's
 * bits, whatever M, N, the row's position, the thread count or the register block it lands in
 * (each output has its own accumulator; blocks only share loads):
 *   fp32: acc = fma(x[k], w[c][k], acc) for k ascending over the piece, from acc = 0;
 *   bf16: for each pair k = 2q, 2q + 1 ascending over the piece, the product at 2q + 1 and then the
 *         one at 2q are added, each step rounded once to 24 bits as if the exponent were unbounded,
 *         then flushed to zero below FLT_MIN (denormal inputs count as zero): what an AVX512-BF16
 *         vdpbf16ps lane does (tests compare the portable path with it, boundary cases included);
 *   with round_bf16 the fp32 result is rounded to bf16 (nearest even; stored as fp32).
 * The AVX-512 paths (FMA with a broadcast x, vdpbf16ps with a broadcast x pair), the AVX2 paths
 * (FMA with a broadcast x; the bf16 steps emulated lane-wise) and the portable C path below follow
 * the same rule; the tests compare an -O0 build (portable C) with the
 * -O3 -march=native one. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "fixed_math.h"
#include "entry_points.h"
#include "threads.h"

#define PANEL 16 /* output columns per panel: one 512-bit vector of fp32 accumulators */
#define NV 4 /* panels per register block (gemm.py pads the panel count to a multiple) */
#define MR 6 /* x rows per register block */

/* ---- portable path: the rule, one output at a time ------------------------------------------ */
static inline float flush(float v) { return fabsf(v) < FLT_MIN ? copysignf(0.0f, v) : v; }

/* one vdpbf16ps step: acc + a*b rounded once to 24 bits with an unbounded exponent, then flushed
 * below FLT_MIN. fmaf rounds onto the denormal grid instead, which differs only when it lands on
 * exactly +-FLT_MIN: an exact result just below FLT_MIN that 24-bit rounding keeps below it (so the
 * instruction flushes it to zero). There the step is redone scaled by 2^24, where nothing underflows
 * (|a| is then tiny and acc is zero or normal, so the scaling is exact and cannot overflow). */
static inline float dot_step(float a, float b, float acc) {
    float r = fmaf(a, b, acc);
    if (fabsf(r) == FLT_MIN) {
        const float scaled = fmaf(a * 0x1p24f, b, acc * 0x1p24f);
        if (fabsf(scaled) < 0x1p-102f) r = copysignf(0.0f, scaled);
    }
    return flush(r);
}

static void block_c(const void *const *xr, int mr, const void *wp, int64_t ps, int is_bf16, int64_t kp, float *out,
                    int64_t ldo, int rnd) {
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NV; j++)
            for (int c = 0; c < PANEL; c++) {
                float acc = 0.0f;
                if (is_bf16) {
                    const uint16_t *x = (const uint16_t *)xr[i], *w = (const uint16_t *)wp + j * ps;
                    for (int64_t q = 0; q < kp / 2; q++)
                        for (int e = 1; e >= 0; e--) {
                            const float a = flush(bf16_to_f32(x[2 * q + e]));
                            const float b = flush(bf16_to_f32(w[(q * PANEL + c) * 2 + e]));
                            acc = dot_step(a, b, acc);
                        }
                } else {
                    const float *x = (const float *)xr[i], *w = (const float *)wp + j * ps;
                    for (int64_t k = 0; k < kp; k++) acc = fmaf(x[k], w[k * PANEL + c], acc);
                }
                out[i * ldo + j * PANEL + c] = rnd ? zm_round_bf16(acc) : acc;
            }
}

/* ---- AVX-512 paths ------------------------------------------------------------------------- */
#ifdef __AVX512F__
/* zm_round_bf16 on 16 lanes, nan included (rounding in registers: a scalar pass over the stored
 * partials took ~10% of a bf16 row-parallel call) */
static inline __m512 round_bf16_v(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), bits, _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

#define ZM_F32(R)                                                                                            \
    static inline __attribute__((always_inline)) void f32_##R(                                               \
        const float *const *xr, const float *wp, int64_t ps, int64_t kp, float *out, int64_t ldo, int rnd) { \
        __m512 acc[R][NV];                                                                                   \
        for (int i = 0; i < R; i++)                                                                          \
            for (int j = 0; j < NV; j++) acc[i][j] = _mm512_setzero_ps();                                    \
        for (int64_t k = 0; k < kp; k++) {                                                                   \
            __m512 wv[NV];                                                                                   \
            for (int j = 0; j < NV; j++) wv[j] = _mm512_loadu_ps(wp + j * ps + k * PANEL);                   \
            for (int i = 0; i < R; i++) {                                                                    \
                const __m512 xb = _mm512_set1_ps(xr[i][k]);                                                  \
                for (int j = 0; j < NV; j++) acc[i][j] = _mm512_fmadd_ps(xb, wv[j], acc[i][j]);              \
            }                                                                                                \
        }                                                                                                    \
        for (int i = 0; i < R; i++)                                                                          \
            for (int j = 0; j < NV; j++)                                                                     \
                _mm512_storeu_ps(out + i * ldo + j * PANEL, rnd ? round_bf16_v(acc[i][j]) : acc[i][j]);      \
    }
ZM_F32(1)
ZM_F32(2)
ZM_F32(3)
ZM_F32(4)
ZM_F32(5)
ZM_F32(6)
#endif

#ifdef __AVX512BF16__
/* round_bf16_v for values that are never denormal, as the bf16 rule's accumulators (flushed below
 * FLT_MIN at every step): vcvtneps2bf16 rounds to nearest even and quiets a nan as zm_round_bf16
 * does, and treats denormal inputs as zero, which then cannot occur. 3 instructions instead of 7
 * (the rounding of a bf16 row-parallel call's partials was ~10% of its time). */
static inline __m512 round_bf16_normal_v(__m512 v) {
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#define ZM_BF16(R)                                                                                              \
    static inline __attribute__((always_inline)) void bf16_##R(const uint16_t *const *xr, const uint16_t *wp,   \
                                                               int64_t ps, int64_t kp, float *out, int64_t ldo, \
                                                               int rnd) {                                       \
        __m512 acc[R][NV];                                                                                      \
        for (int i = 0; i < R; i++)                                                                             \
            for (int j = 0; j < NV; j++) acc[i][j] = _mm512_setzero_ps();                                       \
        for (int64_t q = 0; q < kp / 2; q++) {                                                                  \
            __m512bh wv[NV];                                                                                    \
            for (int j = 0; j < NV; j++) wv[j] = (__m512bh)_mm512_loadu_si512(wp + j * ps + q * 2 * PANEL);     \
            for (int i = 0; i < R; i++) {                                                                       \
                int32_t pair;                                                                                   \
                memcpy(&pair, xr[i] + 2 * q, sizeof pair);                                                      \
                const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);                                          \
                for (int j = 0; j < NV; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xb, wv[j]);                \
            }                                                                                                   \
        }                                                                                                       \
        for (int i = 0; i < R; i++)                                                                             \
            for (int j = 0; j < NV; j++)                                                                        \
                _mm512_storeu_ps(out + i * ldo + j * PANEL, rnd ? round_bf16_normal_v(acc[i][j]) : acc[i][j]);  \
    }
ZM_BF16(1)
ZM_BF16(2)
ZM_BF16(3)
ZM_BF16(4)
ZM_BF16(5)
ZM_BF16(6)
#endif

/* ---- AVX2 + FMA paths (CPUs without AVX-512: the portable path's k loop is one FMA chain per
 * output, ~1.5 GFLOP/s; these run 8 outputs per instruction with the same per-output rule). A
 * register block is at most 2 rows x 2 panels (8 accumulators of 8 lanes: AVX2 has 16 registers). */
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>
#define ZM_AVX2 1

/* zm_round_bf16 on 8 lanes, nan included */
static inline __m256 round_bf16_v8(__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i q = _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000));
    return _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_blendv_epi8(r, q, nan), _mm256_set1_epi32((int)0xffff0000u)));
}

static inline void store8(float *dst, __m256 v, int rnd) { _mm256_storeu_ps(dst, rnd ? round_bf16_v8(v) : v); }

/* rows xr[0..r) x the 2 panels at wp (32 columns): acc = fma(x[k], w[c][k], acc), k ascending */
static inline __attribute__((always_inline)) void f32_avx2(const float *const *xr, int r, const float *wp,
                                                           int64_t ps, int64_t kp, float *out, int64_t ldo,
                                                           int rnd) {
    __m256 acc[2][4];
    for (int i = 0; i < 2; i++)
        for (int h = 0; h < 4; h++) acc[i][h] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kp; k++) {
        const __m256 w0 = _mm256_loadu_ps(wp + k * PANEL), w1 = _mm256_loadu_ps(wp + k * PANEL + 8);
        const __m256 w2 = _mm256_loadu_ps(wp + ps + k * PANEL), w3 = _mm256_loadu_ps(wp + ps + k * PANEL + 8);
        for (int i = 0; i < r; i++) {
            const __m256 xb = _mm256_set1_ps(xr[i][k]);
            acc[i][0] = _mm256_fmadd_ps(xb, w0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(xb, w1, acc[i][1]);
            acc[i][2] = _mm256_fmadd_ps(xb, w2, acc[i][2]);
            acc[i][3] = _mm256_fmadd_ps(xb, w3, acc[i][3]);
        }
    }
    for (int i = 0; i < r; i++)
        for (int h = 0; h < 4; h++) store8(out + i * ldo + h * 8, acc[i][h], rnd);
}

/* flush on 8 lanes: |v| < FLT_MIN becomes a zero of v's sign */
static inline __m256 flush_v8(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 tiny = _mm256_cmp_ps(_mm256_andnot_ps(sign, v), _mm256_set1_ps(FLT_MIN), _CMP_LT_OQ);
    return _mm256_blendv_ps(v, _mm256_and_ps(v, sign), tiny);
}

/* dot_step on 8 lanes (the 2^24-scaled redo only when some lane lands on exactly +-FLT_MIN) */
static inline __m256 dot_step_v8(__m256 a, __m256 b, __m256 acc) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 r = _mm256_fmadd_ps(a, b, acc);
    const __m256 at_min = _mm256_cmp_ps(_mm256_andnot_ps(sign, r), _mm256_set1_ps(FLT_MIN), _CMP_EQ_OQ);
    if (_mm256_movemask_ps(at_min)) {
        const __m256 s24 = _mm256_set1_ps(0x1p24f);
        const __m256 scaled = _mm256_fmadd_ps(_mm256_mul_ps(a, s24), b, _mm256_mul_ps(acc, s24));
        const __m256 gone = _mm256_cmp_ps(_mm256_andnot_ps(sign, scaled), _mm256_set1_ps(0x1p-102f), _CMP_LT_OQ);
        r = _mm256_blendv_ps(r, _mm256_and_ps(scaled, sign), _mm256_and_ps(at_min, gone));
    }
    return flush_v8(r);
}

/* the bf16 rule for rows xr[0..r) x the 2 panels at wp: per pair q, the odd product then the even */
static inline __attribute__((always_inline)) void bf16_avx2(const uint16_t *const *xr, int r, const uint16_t *wp,
                                                            int64_t ps, int64_t kp, float *out, int64_t ldo,
                                                            int rnd) {
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    __m256 acc[2][4];
    for (int i = 0; i < 2; i++)
        for (int h = 0; h < 4; h++) acc[i][h] = _mm256_setzero_ps();
    for (int64_t q = 0; q < kp / 2; q++) {
        __m256 odd[4], even[4];
        for (int h = 0; h < 4; h++) {
            const uint16_t *src = wp + (h / 2) * ps + q * 2 * PANEL + (h % 2) * 16;
            const __m256i v = _mm256_loadu_si256((const __m256i *)src);
            odd[h] = flush_v8(_mm256_castsi256_ps(_mm256_and_si256(v, hi)));
            even[h] = flush_v8(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        }
        for (int i = 0; i < r; i++) {
            const __m256 x1 = _mm256_set1_ps(flush(bf16_to_f32(xr[i][2 * q + 1])));
            const __m256 x0 = _mm256_set1_ps(flush(bf16_to_f32(xr[i][2 * q])));
            for (int h = 0; h < 4; h++) acc[i][h] = dot_step_v8(x0, even[h], dot_step_v8(x1, odd[h], acc[i][h]));
        }
    }
    for (int i = 0; i < r; i++)
        for (int h = 0; h < 4; h++) store8(out + i * ldo + h * 8, acc[i][h], rnd);
}

/* mr rows x NV panels as 2-row x 2-panel register blocks (rnd a constant in each inlined call) */
#define ZM_AVX2_BLOCKS(KERNEL, X_TYPE, W_TYPE)                            \
    do {                                                                  \
        const X_TYPE *const *x = (const X_TYPE *const *)xr;               \
        const W_TYPE *w = (const W_TYPE *)wp;                             \
        for (int j = 0; j < NV; j += 2)                                   \
            for (int i = 0; i < mr; i += 2) {                             \
                const int r = mr - i < 2 ? 1 : 2;                         \
                float *o = out + i * ldo + j * PANEL;                     \
                if (rnd) KERNEL(x + i, r, w + j * ps, ps, kp, o, ldo, 1); \
                else KERNEL(x + i, r, w + j * ps, ps, kp, o, ldo, 0);     \
            }                                                             \
        return;                                                           \
    } while (0)
#endif

/* the register-block variant for mr rows (1..MR): KERNEL##_mr(x, w, ps, kp, out, ldo, rnd), inlined
 * with rnd a constant (a runtime rnd in the kernel cost the unrounded calls ~10%) */
#define ZM_CALL(K) (rnd ? K(x, w, ps, kp, out, ldo, 1) : K(x, w, ps, kp, out, ldo, 0))
#define ZM_DISPATCH(KERNEL, X_TYPE, W_TYPE)                 \
    do {                                                    \
        const X_TYPE *const *x = (const X_TYPE *const *)xr; \
        const W_TYPE *w = (const W_TYPE *)wp;               \
        switch (mr) {                                       \
        case 6: ZM_CALL(KERNEL##_6); return;                \
        case 5: ZM_CALL(KERNEL##_5); return;                \
        case 4: ZM_CALL(KERNEL##_4); return;                \
        case 3: ZM_CALL(KERNEL##_3); return;                \
        case 2: ZM_CALL(KERNEL##_2); return;                \
        default: ZM_CALL(KERNEL##_1); return;               \
        }                                                   \
    } while (0)

static void block(const void *const *xr, int mr, const void *wp, int64_t ps, int is_bf16, int64_t kp, float *out,
                  int64_t ldo, int rnd) {
#ifdef __AVX512BF16__
    if (is_bf16) ZM_DISPATCH(bf16, uint16_t, uint16_t);
#endif
#ifdef __AVX512F__
    if (!is_bf16) ZM_DISPATCH(f32, float, float);
#endif
#ifdef ZM_AVX2
    if (is_bf16) ZM_AVX2_BLOCKS(bf16_avx2, uint16_t, uint16_t);
    ZM_AVX2_BLOCKS(f32_avx2, float, float);
#endif
    block_c(xr, mr, wp, ps, is_bf16, kp, out, ldo, rnd);
}

/* The fixed pairwise tree of collectives.tree_sum, elementwise over ``count`` tiles of ``len``
 * values, in place into tile 0: ((t0+t1)+(t2+t3))+...; an odd last tile carries up a level. */
static void tree_sum_tiles(float (*t)[MR * NV * PANEL], int64_t count, int64_t len) {
    while (count > 1) {
        int64_t half = 0;
        for (int64_t i = 0; i + 1 < count; i += 2, half++)
            for (int64_t e = 0; e < len; e++) t[half][e] = t[i][e] + t[i + 1][e];
        if (count % 2) {
            if (half != count - 1) memcpy(t[half], t[count - 1], (size_t)len * sizeof(float));
            half++;
        }
        count = half;
    }
}

/* x [m, k] fp32 or bf16 bits (is_bf16), rows ldx elements apart; wp the packed weight with
 * npanels panels (a multiple of NV) over k; k / pieces must be whole (and even for bf16).
 * reduce = 0: out [pieces, m, n] fp32, the partials; reduce = 1 (pieces <= ZM_MAX_TREE_PIECES):
 * out [m, n] fp32, the partials summed by tree_sum in piece order. Returns 0, or 1 when pieces
 * is not a whole divisor of k (with an even quotient for bf16), or reduce asks for too many. */
#define ZM_MAX_TREE_PIECES 16

/* n fp32 values as bf16 as torch's cast rounds them: nearest even, and a nan as `nan_bits` (torch's
 * vectorized cast writes 0xffff, its scalar one 0x7fc0; the caller passes the encoding this process's
 * torch uses, gemm.py::torch_bf16_nan_bits). The reduced output of a bf16 call is written in x's
 * dtype here, not rounded by a second pass in torch. */
static void store_bf16(uint16_t *dst, const float *src, int64_t n, uint16_t nan_bits) {
    int64_t i = 0;
#ifdef __AVX512F__
    for (; i + PANEL <= n; i += PANEL) {
        const __m512i r = zm_torch_bf16_16(_mm512_loadu_ps(src + i), nan_bits);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(r));
    }
#endif
    for (; i < n; i++) dst[i] = src[i] != src[i] ? nan_bits : zm_torch_bf16(src[i]);
}

/* one panel_gemm call's operands (below), shared by the blocks of NV panels it computes */
struct gemm_call {
    const void *x, *wp;
    void *out;
    int64_t ldx, k, m, n, pieces, kp, ps;
    int is_bf16, round_bf16, reduce, out_bf16;
    uint16_t nan_bits;
};

/* output columns [nb * NV * PANEL, +NV * PANEL) of every row */
static void panel_block(const struct gemm_call *c, int64_t nb) {
    const size_t elem = c->is_bf16 ? sizeof(uint16_t) : sizeof(float);
    const int64_t c0 = nb * NV * PANEL, n = c->n, m = c->m;
    const int64_t ncols = n - c0 < NV * PANEL ? n - c0 : NV * PANEL;
    const int64_t tiles = c->reduce ? c->pieces : 1;
    float tile[ZM_MAX_TREE_PIECES][MR * NV * PANEL];
    if (ncols <= 0) return;
    for (int64_t m0 = 0; m0 < m; m0 += MR) {
        const int mr = m - m0 < MR ? (int)(m - m0) : MR;
        for (int64_t p = 0; p < c->pieces; p++) {
            const char *wblk = (const char *)c->wp + (size_t)(nb * NV * c->ps + p * c->kp * PANEL) * elem;
            const void *xr[MR];
            for (int i = 0; i < mr; i++)
                xr[i] = (const char *)c->x + (size_t)((m0 + i) * c->ldx + p * c->kp) * elem;
            float *t = tile[c->reduce ? p : 0];
            block(xr, mr, wblk, c->ps, c->is_bf16, c->kp, t, NV * PANEL, c->round_bf16);
            if (!c->reduce) {
                float *dst = (float *)c->out + (p * m + m0) * n + c0;
                for (int i = 0; i < mr; i++) memcpy(dst + i * n, t + i * NV * PANEL, ncols * sizeof(float));
            }
        }
        if (c->reduce) {
            tree_sum_tiles(tile, tiles, mr * NV * PANEL);
            for (int i = 0; i < mr; i++) {
                if (c->out_bf16)
                    store_bf16((uint16_t *)c->out + (m0 + i) * n + c0, tile[0] + i * NV * PANEL, ncols,
                               c->nan_bits);
                else memcpy((float *)c->out + (m0 + i) * n + c0, tile[0] + i * NV * PANEL, ncols * sizeof(float));
            }
        }
    }
}

static int panel_gemm(const void *x, int64_t ldx, const void *wp, int64_t npanels, int64_t k, int is_bf16,
                      int64_t m, int64_t n, int64_t pieces, int round_bf16, int reduce, void *out, int out_bf16,
                      uint16_t nan_bits, int threads) {
    if (pieces < 1 || k % pieces != 0 || (is_bf16 && (k / pieces) % 2 != 0) ||
        (reduce && pieces > ZM_MAX_TREE_PIECES) || (out_bf16 && !reduce))
        return 1;
    const struct gemm_call call = {
        .x = x,
        .wp = wp,
        .out = out,
        .ldx = ldx,
        .k = k,
        .m = m,
        .n = n,
        .pieces = pieces,
        .kp = k / pieces,
        .ps = k * PANEL,
        .is_bf16 = is_bf16,
        .round_bf16 = round_bf16,
        .reduce = reduce,
        .out_bf16 = out_bf16,
        .nan_bits = nan_bits,
    };
    const int64_t nblocks = npanels / NV;
    if (zm_serial(threads, nblocks, 2)) {
        for (int64_t nb = 0; nb < nblocks; nb++) panel_block(&call, nb);
        return 0;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t nb = 0; nb < nblocks; nb++) panel_block(&call, nb);
    return 0;
}

int zm_panel_gemm(const void *x, int64_t ldx, const void *wp, int64_t npanels, int64_t k, int is_bf16, int64_t m,
                  int64_t n, int64_t pieces, int round_bf16, int reduce, float *out, int threads) {
    return panel_gemm(x, ldx, wp, npanels, k, is_bf16, m, n, pieces, round_bf16, reduce, out, 0, 0, threads);
}

/* zm_panel_gemm with reduce = 1 and the output written in fp32 (bf16_nan_bits < 0) or in bf16, a nan
 * encoded as bf16_nan_bits (0..0xffff): the engine's call, which returns x's dtype. Returns 1 as
 * zm_panel_gemm does, and for an encoding outside 16 bits. */
int zm_panel_gemm_reduced(const void *x, int64_t ldx, const void *wp, int64_t npanels, int64_t k, int is_bf16,
                          int64_t m, int64_t n, int64_t pieces, int round_bf16, void *out, int bf16_nan_bits,
                          int threads) {
    if (bf16_nan_bits > 0xffff) return 1;
    const int out_bf16 = bf16_nan_bits >= 0;
    return panel_gemm(x, ldx, wp, npanels, k, is_bf16, m, n, pieces, round_bf16, 1, out, out_bf16,
                      (uint16_t)(out_bf16 ? bf16_nan_bits : 0), threads);
}
