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
 * Layouts: q fp32 [Tq, Hq, Dqk], each token's rows contiguous, tokens q_stride elements apart (a
 * slice of a fused projection is read in place); k_rows / v_rows: one row per token or cache slot, all heads
 * ([N, Hkv*Dqk] / [N, Hkv*Dv]), each fp32 or bf16. The row holding position j of sequence s is
 * key_index[s * key_stride + j] (packed K/V), or, with a block table (paged cache),
 * block_table[s * key_stride + j / block_size] * block_size + j % block_size, the block id of
 * every position below kv_len checked against num_blocks. The q_len queries of sequence s (rows q_start .. q_start+q_len-1) are its
 * last q_len positions (bottom-right aligned causal mask). out fp32 [Tq, Hq, Dv].
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "entry_points.h"
#include "fixed_math.h"
#include "threads.h"

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
                       const int64_t *keys_of_seq, int64_t pos, int64_t k_stride, int64_t v_stride, int64_t k_off,
                       int64_t v_off, int64_t dqk, int64_t dv, float scale, float *scores, float *o) {
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

/* ---- the same row, specialised: head dims in whole chunks (Dqk % 16 == 0, Dv % 64 == 0) ---------
 * attend_row's operations in attend_row's order, with the dtype branches and the partial-chunk
 * logic taken out of the key loops (the generic loops spilled them to the stack every key: about
 * a third of a decode step's attention time). bf16 widens exactly, as bf16_to_f32 does. */
typedef uint16_t u16x16 __attribute__((vector_size(32), aligned(2)));
/* Prefetching: inside an engine step this layer's K/V has usually left the cache (the step's other
 * layers and the rest of the step evict it), and a paged sequence's rows sit in blocks scattered
 * over the cache, where the hardware prefetcher loses the stride at each block edge. The first
 * query row of an item prefetches the next 16-key block's K rows and the current block's V rows
 * (its later rows find the keys in cache; prefetching for them cost a cache-warm prefill ~10 %).
 * Measured in-engine with one key at a time (tiny-qwen3 decode, interleaved A/B runs): 245 us per
 * call without, 222 at 8 keys ahead, 223 at 16. Since keys are scored 16 at a time, A/B runs with
 * and without it, two blocks ahead, or every KV head's row at once were within this machine's noise
 * (session 18); it stays. No bits change: prefetches only move data. */
/* query rows an item needs before its bf16 K/V rows are widened to fp32 once (a decode item has
 * Hq/Hkv rows, which would not repay the copy) */
#define WIDEN_MIN_ROWS 16
typedef uint32_t u32x16 __attribute__((vector_size(64)));

static inline __attribute__((always_inline)) v16 load16(const char *row, int bf16, int64_t d) {
    if (bf16) {
        u16x16 h;
        memcpy(&h, (const uint16_t *)row + d, sizeof h);
        return (v16)(__builtin_convertvector(h, u32x16) << 16);
    }
    v16 x;
    memcpy(&x, (const float *)row + d, sizeof x);
    return x;
}

/* the lanes_tree of 16 vectors at once: lane t of the result is lanes_tree(a[t]), by the same
 * additions (each level adds the same pairs lanes_tree adds, for 16, 8, 4, then 2 vectors' worth of
 * lanes in one register), so the same bits; a key block's 16 scores cost 15 vector additions
 * instead of 16 horizontal trees */
static inline __attribute__((always_inline)) v16 lanes_tree16(const v16 a[16]) {
    v16 x[8], y[4], z[2];
    for (int t = 0; t < 8; t++) /* x[t]: lanes_tree's a8 of key 2t (lanes 0-7) and 2t+1 (8-15) */
        x[t] = __builtin_shufflevector(a[2 * t], a[2 * t + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22,
                                       23) +
               __builtin_shufflevector(a[2 * t], a[2 * t + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28,
                                       29, 30, 31);
    for (int u = 0; u < 4; u++) /* y[u]: a4 of keys 4u .. 4u+3, four lanes each */
        y[u] = __builtin_shufflevector(x[2 * u], x[2 * u + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25,
                                       26, 27) +
               __builtin_shufflevector(x[2 * u], x[2 * u + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29,
                                       30, 31);
    for (int w = 0; w < 2; w++) /* z[w]: (a0, a1) = (a4[0] + a4[2], a4[1] + a4[3]) of keys 8w .. 8w+7 */
        z[w] = __builtin_shufflevector(y[2 * w], y[2 * w + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25,
                                       28, 29) +
               __builtin_shufflevector(y[2 * w], y[2 * w + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27,
                                       30, 31);
    return __builtin_shufflevector(z[0], z[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           __builtin_shufflevector(z[0], z[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

static inline __attribute__((always_inline)) void prefetch_row(const char *row, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b);
}

/* attend_row's arithmetic, keys taken 16 at a time: each key's 16 lane sums are accumulated as
 * attend_row accumulates them (ascending chunks from +0), the 16 trees summed at once
 * (lanes_tree16), the scores scaled, their exponentials taken 16 lanes at a time (zm_exp16, lane
 * for lane zm_exp's bits; its argument score - m is <= 0 or nan here). The running maximum is
 * order-free: the exact maximum (it could differ from attend_row's only in the sign of a zero
 * maximum, and exp(score - (+-0)) is the same for every score; nor can a score be -0: the lane sums
 * start at +0), or, once a score is nan, attend_row's: the last nan score. The sum l and P @ V
 * keep attend_row's ascending serial order. Keys past the last whole block take attend_row's
 * one-key path. */
static inline __attribute__((always_inline)) void
whole_scores(const float *qv, const char *kb, const char *vb, const int k_bf16, const int v_bf16,
             const int64_t *keys, int64_t pos, int64_t k_stride, int64_t v_stride, int64_t k_off, int64_t v_off,
             int64_t dqk, int64_t dv, float scale, const int prefetch, float *scores) {
    const int64_t k_size = k_bf16 ? 2 : 4, v_size = v_bf16 ? 2 : 4, n_keys = pos + 1;
    const int64_t k_bytes = dqk * k_size, v_bytes = dv * v_size;
    for (int64_t j = 0; prefetch && j < LANES && j < n_keys; j++)
        prefetch_row(kb + (keys[j] * k_stride + k_off) * k_size, k_bytes);
    v16 m16 = (v16){0} - INFINITY;
    vi16 nan_seen = {0};
    int64_t j = 0;
    for (; j + LANES <= n_keys; j += LANES) {
        const char *rows[LANES];
        for (int t = 0; t < LANES; t++) rows[t] = kb + (keys[j + t] * k_stride + k_off) * k_size;
        if (prefetch) {
            for (int t = 0; t < LANES && j + LANES + t < n_keys; t++)
                prefetch_row(kb + (keys[j + LANES + t] * k_stride + k_off) * k_size, k_bytes);
            for (int t = 0; t < LANES; t++) prefetch_row(vb + (keys[j + t] * v_stride + v_off) * v_size, v_bytes);
        }
        v16 acc[LANES];
        for (int t = 0; t < LANES; t++) acc[t] = (v16){0};
        for (int64_t d = 0; d < dqk; d += LANES) {
            v16 q16;
            memcpy(&q16, qv + d, sizeof q16);
#pragma GCC unroll 16
            for (int t = 0; t < LANES; t++) acc[t] = acc[t] + q16 * load16(rows[t], k_bf16, d);
        }
        const v16 sc = lanes_tree16(acc) * scale;
        memcpy(scores + j, &sc, sizeof sc);
        nan_seen |= sc != sc;
        const vi16 larger = sc > m16;
        m16 = (v16)(((vi16)sc & larger) | ((vi16)m16 & ~larger));
    }
    float m = -INFINITY;
    for (int t = 0; t < LANES; t++) m = m16[t] > m ? m16[t] : m;
    const int64_t whole = j;
    int any_nan = 0;
    for (int t = 0; t < LANES; t++) any_nan |= nan_seen[t];
    /* attend_row's maximum is then its last nan score, payload and sign included (the x86 nan of
     * 0 * inf is negative): the same bits for the row's nan outputs, and for any build */
    for (int64_t i = 0; any_nan && i < whole; i++)
        if (scores[i] != scores[i]) m = scores[i];
    for (; j < n_keys; j++) {
        const char *row = kb + (keys[j] * k_stride + k_off) * k_size;
        if (prefetch) prefetch_row(vb + (keys[j] * v_stride + v_off) * v_size, v_bytes);
        v16 acc = {0};
        for (int64_t d = 0; d < dqk; d += LANES) {
            v16 q16;
            memcpy(&q16, qv + d, sizeof q16);
            acc = acc + q16 * load16(row, k_bf16, d);
        }
        const float sc = lanes_tree(acc) * scale;
        scores[j] = sc;
        m = (sc > m || sc != sc) ? sc : m;
    }
    const v16 m_vec = (v16){0} + m;
    for (j = 0; j < whole; j += LANES) {
        v16 sc;
        memcpy(&sc, scores + j, sizeof sc);
        sc = zm_exp16(sc - m_vec);
        memcpy(scores + j, &sc, sizeof sc);
    }
    for (; j < n_keys; j++) scores[j] = zm_exp(scores[j] - m);
}

/* attend_row's l and P @ V for one row's exponentiated scores -- or for two rows of the same keys at
 * once (GQA: query heads sharing a KV head), each V chunk loaded once for both; every row's sums are
 * its own, in attend_row's order, so pairing changes no bit */
static inline __attribute__((always_inline)) void
whole_output(const char *vb, const int v_bf16, const int64_t *keys, int64_t n_keys, int64_t v_stride,
             int64_t v_off, int64_t dv, const float *scores, float *o, const float *scores2, float *o2) {
    const int64_t v_size = v_bf16 ? 2 : 4;
    /* l, attend_row's ascending sum, is taken inside the first pass over V: its chain of dependent
     * additions then overlaps that pass instead of running alone (~10 % of a decode call) */
    float l = 0.0f, l2 = 0.0f;
    for (int64_t d0 = 0; d0 < dv; d0 += 4 * LANES) {
        v16 acc0 = {0}, acc1 = {0}, acc2 = {0}, acc3 = {0};
        v16 bcc0 = {0}, bcc1 = {0}, bcc2 = {0}, bcc3 = {0};
        const int first = d0 == 0;
        if (!scores2) {
            for (int64_t j = 0; j < n_keys; j++) {
                if (first) l = l + scores[j];
                const v16 p = (v16){0} + scores[j];
                const char *row = vb + (keys[j] * v_stride + v_off) * v_size;
                acc0 = acc0 + p * load16(row, v_bf16, d0);
                acc1 = acc1 + p * load16(row, v_bf16, d0 + LANES);
                acc2 = acc2 + p * load16(row, v_bf16, d0 + 2 * LANES);
                acc3 = acc3 + p * load16(row, v_bf16, d0 + 3 * LANES);
            }
        } else {
            for (int64_t j = 0; j < n_keys; j++) {
                if (first) {
                    l = l + scores[j];
                    l2 = l2 + scores2[j];
                }
                const v16 p = (v16){0} + scores[j], p2 = (v16){0} + scores2[j];
                const char *row = vb + (keys[j] * v_stride + v_off) * v_size;
                const v16 v0 = load16(row, v_bf16, d0), v1 = load16(row, v_bf16, d0 + LANES);
                const v16 v2 = load16(row, v_bf16, d0 + 2 * LANES), v3 = load16(row, v_bf16, d0 + 3 * LANES);
                acc0 = acc0 + p * v0;
                acc1 = acc1 + p * v1;
                acc2 = acc2 + p * v2;
                acc3 = acc3 + p * v3;
                bcc0 = bcc0 + p2 * v0;
                bcc1 = bcc1 + p2 * v1;
                bcc2 = bcc2 + p2 * v2;
                bcc3 = bcc3 + p2 * v3;
            }
            const v16 l2_vec = (v16){0} + l2;
            const v16 outs2[4] = {bcc0 / l2_vec, bcc1 / l2_vec, bcc2 / l2_vec, bcc3 / l2_vec};
            memcpy(o2 + d0, outs2, sizeof outs2);
        }
        const v16 l_vec = (v16){0} + l;
        const v16 outs[4] = {acc0 / l_vec, acc1 / l_vec, acc2 / l_vec, acc3 / l_vec};
        memcpy(o + d0, outs, sizeof outs);
    }
}

/* attend_row for one row (qv2 NULL) or two rows of the same keys and position, in whole chunks */
static inline __attribute__((always_inline)) void
attend_rows_whole(const float *qv, const float *qv2, const char *kb, const char *vb, const int k_bf16,
                  const int v_bf16, const int64_t *keys, int64_t pos, int64_t k_stride, int64_t v_stride,
                  int64_t k_off, int64_t v_off, int64_t dqk, int64_t dv, float scale, const int prefetch,
                  float *scores, float *scores2, float *o, float *o2) {
    whole_scores(qv, kb, vb, k_bf16, v_bf16, keys, pos, k_stride, v_stride, k_off, v_off, dqk, dv, scale, prefetch,
                 scores);
    if (qv2) /* its keys are in cache now: no prefetching */
        whole_scores(qv2, kb, vb, k_bf16, v_bf16, keys, pos, k_stride, v_stride, k_off, v_off, dqk, dv, scale, 0,
                     scores2);
    whole_output(vb, v_bf16, keys, pos + 1, v_stride, v_off, dv, scores, o, qv2 ? scores2 : NULL, o2);
}

/* attend_row, through the specialised copy where the head dims allow (one per dtype pair, so
 * the compiler drops the dtype branches) */
static void attend(const float *qv, const float *qv2, const void *k_rows, const void *v_rows, int k_bf16,
                   int v_bf16, const int64_t *keys, int64_t pos, int64_t k_stride, int64_t v_stride, int64_t k_off,
                   int64_t v_off, int64_t dqk, int64_t dv, float scale, int prefetch, float *scores,
                   float *scores2, float *o, float *o2) {
    const char *kb = (const char *)k_rows, *vb = (const char *)v_rows;
#define ZM_WHOLE(KB, VB)                                                                                    \
    attend_rows_whole(qv, qv2, kb, vb, KB, VB, keys, pos, k_stride, v_stride, k_off, v_off, dqk, dv, scale, \
                      prefetch, scores, scores2, o, o2)
    if (dqk % LANES == 0 && dv % (4 * LANES) == 0) {
        if (!k_bf16 && !v_bf16) ZM_WHOLE(0, 0);
        else if (k_bf16 && v_bf16) ZM_WHOLE(1, 1);
        else if (k_bf16) ZM_WHOLE(1, 0);
        else ZM_WHOLE(0, 1);
        return;
    }
#undef ZM_WHOLE
    attend_row(qv, k_rows, v_rows, k_bf16, v_bf16, keys, pos, k_stride, v_stride, k_off, v_off, dqk, dv, scale,
               scores, o);
    if (qv2)
        attend_row(qv2, k_rows, v_rows, k_bf16, v_bf16, keys, pos, k_stride, v_stride, k_off, v_off, dqk, dv,
                   scale, scores, o2);
}

/* one zm_attention call's operands (below) */
struct attention_call {
    const float *q;
    int64_t q_stride; /* elements from one query token's [Hq, Dqk] rows to the next */
    const void *k_rows, *v_rows;
    int k_bf16, v_bf16;
    const int64_t *key_index, *block_table, *q_start, *q_len, *kv_len;
    int64_t key_stride, block_size, num_blocks, hq, hkv, dqk, dv, group, max_kv, max_q_rows;
    float scale;
    float *out;
};

/* one thread's scratch; a pointer is NULL when its malloc failed (or it is not needed) */
struct attention_scratch {
    float *scores, *widened;
    int64_t *rows, *identity;
};

static struct attention_scratch scratch_new(const struct attention_call *c) {
    struct attention_scratch sc;
    sc.scores = malloc(sizeof(float) * 2 * c->max_kv); /* two rows' scores: attend pairs GQA rows */
    sc.rows = c->block_table ? malloc(sizeof(int64_t) * c->max_kv) : NULL;
    /* bf16 K/V widened per item (prefill-sized items only); without the memory, rows read bf16 */
    const int widen = (c->k_bf16 || c->v_bf16) && c->max_q_rows >= WIDEN_MIN_ROWS;
    sc.widened = widen ? malloc(sizeof(float) * c->max_kv * (c->dqk + c->dv)) : NULL;
    sc.identity = widen ? malloc(sizeof(int64_t) * c->max_kv) : NULL;
    return sc;
}

static void scratch_free(struct attention_scratch *sc) {
    free(sc->scores);
    free(sc->rows);
    free(sc->widened);
    free(sc->identity);
}

/* item (= sequence * hkv + kv head): its query rows' outputs. Returns 0, -1 without scratch, -2
 * for a block id out of range (see zm_attention). */
static int attention_item(const struct attention_call *c, const struct attention_scratch *sc, int64_t item) {
    const int64_t s = item / c->hkv, kh = item % c->hkv, hkv = c->hkv, hq = c->hq, dqk = c->dqk, dv = c->dv;
    const int64_t group = c->group, kv_len = c->kv_len[s], q_len = c->q_len[s], q_start = c->q_start[s];
    int64_t *rows = sc->rows;
    if (!sc->scores || (c->block_table && !rows)) return -1;
    const int64_t *keys = c->key_index ? c->key_index + s * c->key_stride : rows;
    if (c->block_table) { /* this sequence's slots, once per item (shared by its query rows) */
        /* block by block: no division per key (a 64-bit division per key was ~a quarter of a
         * decode step's attention) */
        const int64_t block_size = c->block_size;
        for (int64_t b = 0, j = 0; j < kv_len; b++) {
            const int64_t block = c->block_table[s * c->key_stride + b];
            if (block < 0 || block >= c->num_blocks) return -2; /* checked before the product can overflow */
            for (int64_t o = 0; o < block_size && j < kv_len; o++, j++) rows[j] = block * block_size + o;
        }
    }
    const int64_t item_rows = q_len * group;
    if ((c->k_bf16 || c->v_bf16) && item_rows >= WIDEN_MIN_ROWS && sc->widened && sc->identity) {
        /* this item's K and V rows widened to fp32 once (exactly), then read by all its query
         * rows: a prefill row reads up to every key, and widening bf16 per read cost ~40%
         * over fp32 there. The same values in the same order, so the same bits. */
        float *kw = sc->widened, *vw = sc->widened + kv_len * dqk;
        for (int64_t j = 0; j < kv_len; j++) {
            sc->identity[j] = j;
            for (int64_t d = 0; d < dqk; d++)
                kw[j * dqk + d] = zm_load(c->k_rows, c->k_bf16, keys[j] * hkv * dqk + kh * dqk + d);
            for (int64_t d = 0; d < dv; d++)
                vw[j * dv + d] = zm_load(c->v_rows, c->v_bf16, keys[j] * hkv * dv + kh * dv + d);
        }
        for (int64_t r = 0; r < item_rows; r++) {
            const int64_t t = q_start + r / group, h = kh * group + r % group;
            attend(c->q + t * c->q_stride + h * dqk, NULL, kw, vw, 0, 0, sc->identity, kv_len - q_len + r / group,
                   dqk, dv, 0, 0, dqk, dv, c->scale, 0, sc->scores, NULL, c->out + (t * hq + h) * dv, NULL);
        }
        return 0;
    }
    for (int64_t r = 0; r < item_rows;) {
        const int64_t t = q_start + r / group, h = kh * group + r % group;
        /* two query heads of one token (GQA) go together: each V row is read once for both */
        const int pair = r + 1 < item_rows && (r + 1) / group == r / group;
        /* only the item's first row prefetches: it brings the keys in for the rows after it */
        attend(c->q + t * c->q_stride + h * dqk, pair ? c->q + t * c->q_stride + (h + 1) * dqk : NULL, c->k_rows,
               c->v_rows, c->k_bf16, c->v_bf16, keys, kv_len - q_len + r / group, hkv * dqk, hkv * dv, kh * dqk,
               kh * dv, dqk, dv, c->scale, r == 0, sc->scores, sc->scores + c->max_kv, c->out + (t * hq + h) * dv,
               pair ? c->out + (t * hq + h + 1) * dv : NULL);
        r += pair ? 2 : 1;
    }
    return 0;
}

/* Returns 0, -1 if scratch memory could not be allocated, or -2 if the block table holds a block
 * id outside [0, num_blocks) for a position below a sequence's kv_len (out is then not fully
 * written; when both happen, -2 wins the min reduction: either is an error for the caller). */
int zm_attention(const float *q, int64_t q_stride, const void *k_rows, const void *v_rows, int k_bf16, int v_bf16,
                 const int64_t *key_index, int64_t key_stride, const int64_t *block_table, int64_t block_size,
                 int64_t num_blocks, const int64_t *q_start, const int64_t *q_len, const int64_t *kv_len,
                 int64_t n_seq, int64_t hq, int64_t hkv, int64_t dqk, int64_t dv, float scale, float *out,
                 int n_threads) {
    int64_t max_kv = 1;
    for (int64_t s = 0; s < n_seq; s++) max_kv = kv_len[s] > max_kv ? kv_len[s] : max_kv;
    const int64_t group = hq / hkv;
    int64_t max_q_rows = 0;
    for (int64_t s = 0; s < n_seq; s++) max_q_rows = q_len[s] * group > max_q_rows ? q_len[s] * group : max_q_rows;
    /* (designated: 22 fields, several of one type, where a positional slip would still compile) */
    const struct attention_call c = {
        .q = q,
        .q_stride = q_stride,
        .k_rows = k_rows,
        .v_rows = v_rows,
        .k_bf16 = k_bf16,
        .v_bf16 = v_bf16,
        .key_index = key_index,
        .block_table = block_table,
        .q_start = q_start,
        .q_len = q_len,
        .kv_len = kv_len,
        .key_stride = key_stride,
        .block_size = block_size,
        .num_blocks = num_blocks,
        .hq = hq,
        .hkv = hkv,
        .dqk = dqk,
        .dv = dv,
        .group = group,
        .max_kv = max_kv,
        .max_q_rows = max_q_rows,
        .scale = scale,
        .out = out,
    };
    int failed = 0;
    if (zm_serial(n_threads, n_seq * hkv, 2)) {
        struct attention_scratch sc = scratch_new(&c);
        for (int64_t item = 0; item < n_seq * hkv; item++) {
            const int status = attention_item(&c, &sc, item);
            failed = status < failed ? status : failed;
        }
        scratch_free(&sc);
        return failed;
    }
#pragma omp parallel num_threads(n_threads) reduction(min : failed)
    {
        struct attention_scratch sc = scratch_new(&c);
        /* every thread takes part in the loop (a thread leaving a worksharing loop early is
           undefined); one that has no scratch only reports the failure */
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < n_seq * hkv; item++) {
            const int status = attention_item(&c, &sc, item);
            failed = status < failed ? status : failed;
        }
        scratch_free(&sc);
    }
    return failed;
}
