/* Fixed-order causal attention for the "aligned-native" kernel set (see attention.py).
 *
 * One rule makes every query's output independent of the batch, the phase and the cache
 * layout: each floating-point value is produced by the same sequence of IEEE operations
 * wherever the query sits. With LANES = 16 and D the head dim:
 *   lane[i]      = (((0 + q[i]*k[i]) + q[i+16]*k[i+16]) + q[i+32]*k[i+32]) + ...   (i < 16,
 *                  ascending, a partial last chunk padded with zeros)
 *   score(q, k)  = a fixed tree over the 16 lanes: i + (i+8), then i + (i+4), i + (i+2), 0 + 1;
 *                  then * scale
 *   m            = max_j score_j                    (exact)
 *   p_j          = zm_exp(score_j - m)              (a fixed polynomial, below)
 *   l            = ((0 + p_0) + p_1) + ...          (ascending j)
 *   acc[d]       = ((0 + p_0*v_0[d]) + p_1*v_1[d]) + ...   (ascending j)
 *   out[d]       = acc[d] / l
 * Every query runs this code on its own keys 0..pos, whatever else the call holds. The build
 * passes -ffp-contract=off (no fused multiply-add contraction) and no fast-math flag (no
 * reassociation), and SIMD lanes only ever hold independent values, so the bits follow from
 * this source alone: the same for any compiler target and at any thread count (one
 * (sequence, kv head) item is computed by one thread).
 *
 * Layouts: q fp32 [Tq, Hq, Dqk]; k_rows / v_rows: one row per token or cache slot, all heads
 * ([N, Hkv*Dqk] / [N, Hkv*Dv]), each fp32 or bf16; key_index[s * key_stride + j] = the row holding
 * position j of sequence s; the q_len queries of sequence s (rows q_start .. q_start+q_len-1)
 * are its last q_len positions (bottom-right aligned causal mask). out fp32 [Tq, Hq, Dv].
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16

/* GCC/clang vector of 16 floats; on targets without 512-bit registers the compiler splits it,
 * which changes no bits (lanes are independent). aligned(4): rows need no alignment. */
typedef float v16 __attribute__((vector_size(64), aligned(4)));

/* exp(x) for x <= 0 (x = score - max), within 1.22 ulp over (-87, 0] (measured over every
 * float); exactly 0 at x <= -87 (true values below 1.7e-38) and at -inf; nan stays nan.
 * Cody-Waite reduction x = n*ln2 + r, |r| <= ln2/2, then a degree-7 Taylor polynomial in
 * Horner form, scaled by 2^n through the exponent bits. Pure mul/add/compare: vectorizable
 * and the same bits in every lane. */
static inline float zm_exp(float x) {
    if (x != x) return x;            /* nan: a nan score must reach the output, as in torch */
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

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* elements [d, d + n) of a row (n <= LANES) as fp32, zeros after n */
static inline v16 chunk(const void *row, int bf16, int64_t d, int64_t n) {
    v16 x = {0};
    if (bf16) {
        const uint16_t *h = (const uint16_t *)row + d;
        for (int64_t i = 0; i < n; i++) x[i] = bf16_to_f32(h[i]);
    } else if (n == LANES) {
        memcpy(&x, (const float *)row + d, sizeof x);
    } else {
        memcpy(&x, (const float *)row + d, sizeof(float) * n);
    }
    return x;
}

typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef float v4 __attribute__((vector_size(16), aligned(4)));

static inline float lanes_tree(v16 a) {
    const v8 a8 = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7)
                  + __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
    const v4 a4 = __builtin_shufflevector(a8, a8, 0, 1, 2, 3) + __builtin_shufflevector(a8, a8, 4, 5, 6, 7);
    const float a0 = a4[0] + a4[2], a1 = a4[1] + a4[3];
    return a0 + a1;
}

/* the dot product of the header: 16 strided lane sums, then the fixed tree */
static inline float dot(const float *q, const void *k, int bf16, int64_t n) {
    v16 acc = {0};
    int64_t d = 0;
    for (; d + LANES <= n; d += LANES) {
        v16 qv;
        memcpy(&qv, q + d, sizeof qv);
        acc = acc + qv * chunk(k, bf16, d, LANES);
    }
    if (d < n) {
        v16 qv = {0};
        memcpy(&qv, q + d, sizeof(float) * (n - d));
        acc = acc + qv * chunk(k, bf16, d, n - d);
    }
    return lanes_tree(acc);
}

/* one query row: scores over keys 0..pos, softmax, P @ V */
static void attend_row(const float *qv, const void *k_rows, const void *v_rows, int k_bf16, int v_bf16,
                       const int64_t *keys_of_seq, int64_t pos, int64_t k_stride, int64_t v_stride,
                       int64_t k_off, int64_t v_off, int64_t dqk, int64_t dv, float scale,
                       float *scores, float *o) {
    const int64_t k_size = k_bf16 ? 2 : 4, v_size = v_bf16 ? 2 : 4;
    const char *kb = (const char *)k_rows, *vb = (const char *)v_rows;
    float m = -INFINITY;
    for (int64_t j = 0; j <= pos; j++) {
        const float sc = dot(qv, kb + (keys_of_seq[j] * k_stride + k_off) * k_size, k_bf16, dqk) * scale;
        scores[j] = sc;
        m = (sc > m || sc != sc) ? sc : m; /* a nan score wins, so the row comes out nan */
    }
    for (int64_t j = 0; j <= pos; j++) scores[j] = zm_exp(scores[j] - m);
    float l = 0.0f;
    for (int64_t j = 0; j <= pos; j++) l = l + scores[j];
    const v16 l_vec = (v16){0} + l; /* broadcast */
    for (int64_t d0 = 0; d0 < dv; d0 += 4 * LANES) {
        /* up to 4 chunks of 16 output dims stay in registers over the whole key loop */
        int64_t n[4];
        for (int c = 0; c < 4; c++) {
            const int64_t left = dv - (d0 + c * LANES);
            n[c] = left <= 0 ? 0 : left < LANES ? left : LANES;
        }
        v16 acc0 = {0}, acc1 = {0}, acc2 = {0}, acc3 = {0};
        for (int64_t j = 0; j <= pos; j++) {
            const v16 p = (v16){0} + scores[j]; /* broadcast */
            const char *row = vb + (keys_of_seq[j] * v_stride + v_off) * v_size;
            acc0 = acc0 + p * chunk(row, v_bf16, d0, n[0]);
            if (n[1]) acc1 = acc1 + p * chunk(row, v_bf16, d0 + LANES, n[1]);
            if (n[2]) acc2 = acc2 + p * chunk(row, v_bf16, d0 + 2 * LANES, n[2]);
            if (n[3]) acc3 = acc3 + p * chunk(row, v_bf16, d0 + 3 * LANES, n[3]);
        }
        const v16 outs[4] = {acc0 / l_vec, acc1 / l_vec, acc2 / l_vec, acc3 / l_vec};
        for (int c = 0; c < 4 && n[c]; c++) memcpy(o + d0 + c * LANES, &outs[c], sizeof(float) * n[c]);
    }
}

/* Returns 0, or -1 if scratch memory could not be allocated. */
int zm_attention(const float *q, const void *k_rows, const void *v_rows, int k_bf16, int v_bf16,
                 const int64_t *key_index, int64_t key_stride, const int64_t *q_start,
                 const int64_t *q_len, const int64_t *kv_len, int64_t n_seq, int64_t hq,
                 int64_t hkv, int64_t dqk, int64_t dv, float scale, float *out, int n_threads) {
    int64_t max_kv = 1;
    for (int64_t s = 0; s < n_seq; s++) max_kv = kv_len[s] > max_kv ? kv_len[s] : max_kv;
    const int64_t group = hq / hkv;
    int failed = 0;
#pragma omp parallel num_threads(n_threads) reduction(| : failed)
    {
        float *scores = malloc(sizeof(float) * max_kv);
        /* every thread takes part in the loop (a thread leaving a worksharing loop early is
           undefined); one that has no scratch only reports the failure */
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < n_seq * hkv; item++) {
            const int64_t s = item / hkv, kh = item % hkv;
            if (!scores) {
                failed = 1;
                continue;
            }
            for (int64_t r = 0; r < q_len[s] * group; r++) {
                const int64_t t = q_start[s] + r / group, h = kh * group + r % group;
                attend_row(q + (t * hq + h) * dqk, k_rows, v_rows, k_bf16, v_bf16, key_index + s * key_stride,
                           kv_len[s] - q_len[s] + r / group, hkv * dqk, hkv * dv, kh * dqk, kh * dv, dqk,
                           dv, scale, scores, out + (t * hq + h) * dv);
            }
        }
        free(scores);
    }
    return failed ? -1 : 0;
}
