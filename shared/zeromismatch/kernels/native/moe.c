/* Routed MoE experts for the "aligned-native" kernel set in one call (see experts.py).
 *
 * For each (token t, slot j) with expert e = ids[t, j], the aligned MoE's structure with the native
 * rules (x's dtype is fp32 or bf16; "round" means to x's dtype, nothing for fp32):
 *   h      = round(x[t] @ W_up[e].T)            gate and up fused: [2I] (silu) or [I] (relu2),
 *                                               by the gemm.c rule (gemm.c's header)
 *   a      = round(silu(h_gate) * h_up)         silu = fixed_math.h's zm_silu, g / (1 + zm_exp(-g));
 *          | round(relu(h_up) * relu(h_up))     the product in fp32, then one rounding
 *   o_j    = round(a @ W_down[e].T)             [H], by the gemm.c rule
 *   out[t] = round(((w_0 * o_0) + w_1 * o_1) + ...)   fp32 products and sums, slots in order
 * The (token, slot) rows of one expert go through the GEMM together, but gemm.c's outputs depend on
 * their row and column alone, so a token's bits do not depend on which other tokens share an
 * expert, on the batch or on the thread count. relu2 is exact arithmetic plus one rounding, as in
 * torch (so relu2 experts gave the pure-torch aligned op's bits in the tests here, where gemm.c's fp32
 * rule matched oneDNN's order up to K = 512; not a promise); silu uses fixed_math.h's exp, so the silu
 * experts' bits differ from the aligned set's.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fixed_math.h"
#include "entry_points.h"

static inline float round_as(int bf16, float v) { return bf16 ? zm_round_bf16(v) : v; }

/* an fp32 value already rounded to bf16, as its bf16 bits */
static inline uint16_t bf16_bits(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return (uint16_t)(bits >> 16);
}

/* store n values (already rounded to x's dtype) as a GEMM input row: bf16 bits or fp32 */
static void store_row(void *dst, int as_bf16, const float *src, int64_t n) {
    if (as_bf16)
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = bf16_bits(src[i]);
    else memcpy(dst, src, sizeof(float) * n);
}

/* x [T, H] (x_bf16 ? bf16 : fp32), ids / weights [T, top_k] (int64 / fp32), packed weights of
 * expert e at up_panels + e * up_stride (elements of the rule's dtype; up_bf16 / down_bf16 say which
 * rule each GEMM takes), gated: silu on [gate | up] halves, else relu2 on [up].
 * out fp32 [T, H], each value rounded to x's dtype. Returns 0, -1 without memory, 1 if gemm.c refused,
 * 2 for an expert id outside [0, experts). */
int zm_moe_experts(const void *x, int x_bf16, int64_t tokens, int64_t hidden, const int64_t *ids,
                   const float *weights, int64_t top_k, int64_t experts, int64_t inter, int gated,
                   const void *up_panels, int64_t up_stride, int64_t up_npanels, int up_bf16,
                   const void *down_panels, int64_t down_stride, int64_t down_npanels, int down_bf16, float *out,
                   int threads) {
    const int64_t pairs = tokens * top_k, width = gated ? 2 * inter : inter;
    const size_t up_elem = up_bf16 ? 2 : 4, down_elem = down_bf16 ? 2 : 4, x_elem = x_bf16 ? 2 : 4;
    int64_t *count = calloc((size_t)experts + 1, sizeof(int64_t));
    int64_t *order = malloc(sizeof(int64_t) * (size_t)(pairs ? pairs : 1));
    int64_t *where = malloc(sizeof(int64_t) * (size_t)(pairs ? pairs : 1));
    char *rows_in = malloc(up_elem * (size_t)(pairs * hidden ? pairs * hidden : 1));
    float *h = malloc(sizeof(float) * (size_t)(pairs * width ? pairs * width : 1));
    char *act = malloc(down_elem * (size_t)(pairs * inter ? pairs * inter : 1));
    float *o = malloc(sizeof(float) * (size_t)(pairs * hidden ? pairs * hidden : 1));
    float *row = malloc(sizeof(float) * (size_t)(hidden > inter ? hidden : inter) + sizeof(float));
    int status = (count && order && where && rows_in && h && act && o && row) ? 0 : -1;
    for (int64_t p = 0; p < pairs && status == 0; p++) /* the caller checked; never index out of range */
        if (ids[p] < 0 || ids[p] >= experts) status = 2;
    if (status == 0) {
        /* a stable counting sort of the (token, slot) pairs by expert */
        for (int64_t p = 0; p < pairs; p++) count[ids[p] + 1]++;
        for (int64_t e = 0; e < experts; e++) count[e + 1] += count[e];
        for (int64_t p = 0; p < pairs; p++) where[p] = count[ids[p]]++;
        for (int64_t p = 0; p < pairs; p++) order[where[p]] = p;
        /* count[e] is now the end of expert e's rows; their start is count[e - 1] (0 for e = 0) */
        for (int64_t r = 0; r < pairs; r++) { /* the GEMM inputs, in sorted order */
            const int64_t t = order[r] / top_k;
            const char *src = (const char *)x + (size_t)(t * hidden) * x_elem;
            char *dst = rows_in + (size_t)(r * hidden) * up_elem;
            if (up_bf16 || !x_bf16) memcpy(dst, src, x_elem * (size_t)hidden);
            else
                for (int64_t i = 0; i < hidden; i++) ((float *)dst)[i] = bf16_to_f32(((const uint16_t *)src)[i]);
        }
        int64_t start = 0;
        for (int64_t e = 0; e < experts && status == 0; e++) {
            const int64_t end = count[e], c = end - start;
            if (c > 0) {
                status = zm_panel_gemm(rows_in + (size_t)(start * hidden) * up_elem, hidden,
                                       (const char *)up_panels + (size_t)(e * up_stride) * up_elem, up_npanels,
                                       hidden, up_bf16, c, width, 1, x_bf16, 0, h + start * width, threads);
                for (int64_t r = start; r < end && status == 0; r++) {
                    const float *hr = h + r * width;
                    for (int64_t i = 0; i < inter; i++) {
                        const float u = gated ? hr[inter + i] : hr[i];
                        const float relu = u <= 0.0f ? 0.0f : u; /* a nan stays nan, as torch.relu */
                        row[i] = round_as(x_bf16, gated ? zm_silu(hr[i]) * u : relu * relu);
                    }
                    store_row(act + (size_t)(r * inter) * down_elem, down_bf16, row, inter);
                }
                if (status == 0)
                    status = zm_panel_gemm(act + (size_t)(start * inter) * down_elem, inter,
                                           (const char *)down_panels + (size_t)(e * down_stride) * down_elem,
                                           down_npanels, inter, down_bf16, c, hidden, 1, x_bf16, 0,
                                           o + start * hidden, threads);
            }
            start = end;
        }
        for (int64_t t = 0; t < tokens && status == 0; t++) { /* slots in order, fp32, one rounding */
            float *dst = out + t * hidden;
            for (int64_t j = 0; j < top_k; j++) {
                const float w = weights[t * top_k + j];
                const float *oj = o + where[t * top_k + j] * hidden;
                for (int64_t i = 0; i < hidden; i++) dst[i] = j == 0 ? w * oj[i] : dst[i] + w * oj[i];
            }
            for (int64_t i = 0; i < hidden; i++) dst[i] = round_as(x_bf16, dst[i]);
        }
    }
    free(count);
    free(order);
    free(where);
    free(rows_in);
    free(h);
    free(act);
    free(o);
    free(row);
    return status;
}

/* ---- routing: the aligned moe_route's selection, exactly (see route.py) ----------------------------
 * Inputs are the aligned op's own scores (torch's softmax or the aligned sigmoid) and choice (scores,
 * or scores + correction bias); what is done here is comparisons and the few IEEE operations the
 * aligned op does after them, in its order, so the results are its bits:
 *   n_group > 1: group score = the sum of the group's two largest choices (one addition; the one
 *                largest for a group of one), the topk_group best groups kept, other experts -inf;
 *   ids        = the top_k largest choices, ties to the lower index (a stable descending sort);
 *   weights    = scores[ids]; normalized: w / (((w0 + w1) + ...) [+ 1e-20f]); then [* scale].
 * Orders are torch.sort's: nan ranks above every number, equal values (+0 and -0 too) keep their
 * index order. */
#define ROUTE_MAX_EXPERTS 1024

static inline int ranks_above(float a, float b) { return (a != a && b == b) || a > b; }

/* the k indices of the largest of v[0..n), in sort order (stable descending) */
static void stable_top(const float *v, int64_t n, int64_t k, int64_t *out, unsigned char *taken) {
    memset(taken, 0, (size_t)n);
    for (int64_t slot = 0; slot < k; slot++) {
        int64_t best = -1;
        for (int64_t i = 0; i < n; i++)
            if (!taken[i] && (best < 0 || ranks_above(v[i], v[best]))) best = i;
        taken[best] = 1;
        out[slot] = best;
    }
}

int zm_moe_route(const float *scores, const float *choice, int64_t tokens, int64_t experts, int64_t top_k,
                 int64_t n_group, int64_t topk_group, int normalize, int add_eps, int scale, float factor,
                 float *weights, int64_t *ids) {
    if (experts > ROUTE_MAX_EXPERTS || n_group > ROUTE_MAX_EXPERTS || top_k > experts) return 1;
    const int64_t per_group = experts / n_group;
    for (int64_t t = 0; t < tokens; t++) {
        const float *s = scores + t * experts, *c = choice + t * experts;
        float masked[ROUTE_MAX_EXPERTS], group_score[ROUTE_MAX_EXPERTS];
        unsigned char taken[ROUTE_MAX_EXPERTS];
        int64_t chosen[ROUTE_MAX_EXPERTS];
        const float *pick = c;
        if (n_group > 1) {
            for (int64_t g = 0; g < n_group; g++) {
                int64_t two[2];
                stable_top(c + g * per_group, per_group, per_group >= 2 ? 2 : 1, two, taken);
                const float first = c[g * per_group + two[0]];
                group_score[g] = per_group >= 2 ? first + c[g * per_group + two[1]] : first;
            }
            int64_t keep[ROUTE_MAX_EXPERTS];
            stable_top(group_score, n_group, topk_group, keep, taken);
            for (int64_t e = 0; e < experts; e++) masked[e] = -INFINITY;
            for (int64_t j = 0; j < topk_group; j++)
                memcpy(masked + keep[j] * per_group, c + keep[j] * per_group, sizeof(float) * (size_t)per_group);
            pick = masked;
        }
        stable_top(pick, experts, top_k, chosen, taken);
        float *w = weights + t * top_k;
        for (int64_t j = 0; j < top_k; j++) {
            ids[t * top_k + j] = chosen[j];
            w[j] = s[chosen[j]];
        }
        if (normalize) {
            float total = w[0];
            for (int64_t j = 1; j < top_k; j++) total = total + w[j];
            if (add_eps) total = total + 1e-20f;
            for (int64_t j = 0; j < top_k; j++) w[j] = w[j] / total;
        }
        if (scale)
            for (int64_t j = 0; j < top_k; j++) w[j] = w[j] * factor;
    }
    return 0;
}
