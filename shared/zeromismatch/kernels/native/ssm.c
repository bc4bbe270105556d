/* Fixed-order Mamba2 selective scan for the "aligned-native" kernel set (see ssm.py).
 *
 * The recurrent order of kernels/aligned/ssm.py, token by token, for every phase:
 *   dt_t   = clamp(softplus(dt_t + dt_bias), lo, hi)       softplus below
 *   decay  = zm_exp(dt_t * A)
 *   h[p,n] = (h[p,n] * decay) + ((dt_t * B_t[g,n]) * x_t[p])  (two roundings, then the add)
 *   y[p]   = readout(h[p,:], C_t[g,:]) + D * x_t[p]
 * where readout sums h[p,n]*C[n] in 16 strided lanes (lane i: n = i, i+16, ... ascending, a
 * partial last chunk zero-padded) joined by a fixed tree, as attention.c's scores. A token's
 * output depends only on the state it starts from and its own inputs, so one call over a
 * sequence, any split of it (carrying the returned state) and one token at a time give the same
 * bits; one (sequence, head) item is one thread's work. Built with -ffp-contract=off and no
 * fast-math (kernels/native/_build.py), so the bits follow from this source.
 *
 * softplus(v) = v > 20 ? v : log1p(zm_exp(v)), with log1p(u) = log(1+u) * u / ((1+u) - 1)
 * (exactly u where 1 + u rounds to 1), as kernels/aligned/ssm.py::stable_softplus, and
 * log = zm_log below; unlike torch's exp, zm_exp flushes to 0 below v = -87 (softplus values
 * under 1.7e-38, which torch still returns as subnormals).
 *
 * Layouts (all fp32): x [T, Hs, P], dt [T, Hs], B and C [T, G, N], each contiguous within a token
 * and x_row, dt_row, b_row, c_row elements from one token to the next (column slices of one
 * projection, read in place); A, D, dt_bias [Hs]; sequence s is rows start[s] .. start[s]+len[s]-1;
 * state_in (or NULL for zeros) and state_out [S, Hs, P, N]; y [T, Hs, P]. With state_index (int64 [S]), state_in is a per-slot
 * store [N, Hs, P, N], and so is state_out (they may be one buffer, updated in place): sequence s
 * reads and writes row state_index[s] (distinct); has_state (bytes [S], or NULL = all) 0 marks a
 * fresh sequence, which starts from zeros.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "entry_points.h"
#include "fixed_math.h"
#include "threads.h"

/* exp for any x: zm_exp up to 88; above, zm_exp(x - ln 2) * 2 (zm_exp's exponent field would
 * overflow at 2^128) up to the fp32 limit 88.72, then +inf. Flushes to 0 at x <= -87 as zm_exp. */
static inline float exp_any(float x) {
    if (!(x > 88.0f)) return zm_exp(x);
    return x > 88.7228391f ? INFINITY : zm_exp(x - 0.693147181f) * 2.0f;
}

/* log(y) for finite y >= 1 (1 + u here): y = m * 2^e with m in [sqrt(1/2), sqrt(2)), then
 * log m = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.172, odd series to s^11 in Horner form, and
 * e * ln2 in two parts (Cody-Waite). Within a few ulp. */
static inline float zm_log(float y) {
    uint32_t bits;
    memcpy(&bits, &y, sizeof bits);
    int32_t e = (int32_t)((bits >> 23) & 0xff) - 127;
    uint32_t mantissa_bits = (bits & 0x7fffffu) | 0x3f800000u;
    float m;
    memcpy(&m, &mantissa_bits, sizeof m);
    if (m > 1.41421356f) {
        m = m * 0.5f;
        e = e + 1;
    }
    const float s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
    float p = 1.0f / 11.0f;
    p = p * s2 + 1.0f / 9.0f;
    p = p * s2 + 1.0f / 7.0f;
    p = p * s2 + 0.2f;
    p = p * s2 + 1.0f / 3.0f;
    p = p * s2 + 1.0f;
    const float ef = (float)e;
    return ef * 0.693359375f + (ef * -2.12194440e-4f + 2.0f * s * p);
}

static inline float softplus(float v) {
    if (v > 20.0f) return v;
    const float u = zm_exp(v), one_plus = 1.0f + u, denom = one_plus - 1.0f;
    return denom == 0.0f ? u : zm_log(one_plus) * (u / denom);
}

static inline float readout(const float *h, const float *c, int64_t n) {
    v16 acc = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        v16 hv, cv;
        memcpy(&hv, h + i, sizeof hv);
        memcpy(&cv, c + i, sizeof cv);
        acc = acc + hv * cv;
    }
    if (i < n) {
        v16 hv = {0}, cv = {0};
        memcpy(&hv, h + i, sizeof(float) * (n - i));
        memcpy(&cv, c + i, sizeof(float) * (n - i));
        acc = acc + hv * cv;
    }
    return lanes_tree(acc);
}

/* one zm_ssm_scan call's operands (below) */
struct ssm_call {
    const float *x, *dt, *A, *B, *C, *D, *dt_bias, *state_in;
    const int64_t *start, *len, *state_index;
    const uint8_t *has_state;
    float *state_out, *y;
    int64_t heads, head_dim, groups, n_state, x_row, dt_row, b_row, c_row;
    float dt_lo, dt_hi;
};

/* item (= sequence * heads + head): its tokens in order, from its initial state; d_b: n_state
 * floats of scratch */
static void ssm_item(const struct ssm_call *c, float *d_b, int64_t item) {
    const int64_t heads = c->heads, head_dim = c->head_dim, n_state = c->n_state, state_numel = head_dim * n_state;
    const int64_t s = item / heads, h = item % heads, g = h / (heads / c->groups);
    const float dt_lo = c->dt_lo, dt_hi = c->dt_hi;
    const int64_t state_row = c->state_index ? c->state_index[s] : s,
                  offset = (state_row * heads + h) * state_numel;
    float *st = c->state_out + offset; /* the state lives in the output buffer */
    if (c->state_in && !(c->has_state && !c->has_state[s])) {
        if (c->state_in + offset != st) memcpy(st, c->state_in + offset, sizeof(float) * state_numel);
    } else {
        memset(st, 0, sizeof(float) * state_numel);
    }
    for (int64_t t = c->start[s]; t < c->start[s] + c->len[s]; t++) {
        float d = softplus(c->dt[t * c->dt_row + h] + c->dt_bias[h]);
        /* torch.clamp(min, max): a nan value or a nan bound gives nan */
        d = d < dt_lo ? dt_lo : d;
        d = d > dt_hi ? dt_hi : d;
        if (dt_lo != dt_lo || dt_hi != dt_hi) d = NAN;
        const float decay = exp_any(d * c->A[h]);
        const float *b = c->B + t * c->b_row + g * n_state, *cr = c->C + t * c->c_row + g * n_state;
        for (int64_t n = 0; n < n_state; n++) d_b[n] = d * b[n];
        const float *xt = c->x + t * c->x_row + h * head_dim;
        float *yt = c->y + (t * heads + h) * head_dim;
        for (int64_t p = 0; p < head_dim; p++) {
            float *row = st + p * n_state;
            const float xp = xt[p];
            for (int64_t n = 0; n < n_state; n++) row[n] = row[n] * decay + d_b[n] * xp;
            yt[p] = readout(row, cr, n_state) + c->D[h] * xp;
        }
    }
}

/* Returns 0, or -1 if scratch memory could not be allocated. */
int zm_ssm_scan(const float *x, const float *dt, const float *A, const float *B, const float *C, const float *D,
                const float *dt_bias, const int64_t *start, const int64_t *len, const float *state_in,
                const int64_t *state_index, const uint8_t *has_state, float *state_out, float *y, int64_t n_seq,
                int64_t heads, int64_t head_dim, int64_t groups, int64_t n_state, int64_t x_row, int64_t dt_row,
                int64_t b_row, int64_t c_row, float dt_lo, float dt_hi, int n_threads) {
    const struct ssm_call c = {
        .x = x,
        .dt = dt,
        .A = A,
        .B = B,
        .C = C,
        .D = D,
        .dt_bias = dt_bias,
        .state_in = state_in,
        .state_index = state_index,
        .has_state = has_state,
        .start = start,
        .len = len,
        .state_out = state_out,
        .y = y,
        .heads = heads,
        .head_dim = head_dim,
        .groups = groups,
        .n_state = n_state,
        .x_row = x_row,
        .dt_row = dt_row,
        .b_row = b_row,
        .c_row = c_row,
        .dt_lo = dt_lo,
        .dt_hi = dt_hi,
    };
    const size_t scratch = sizeof(float) * (n_state > 0 ? n_state : 1);
    if (zm_serial(n_threads, n_seq * heads, 2)) {
        float *d_b = malloc(scratch);
        if (!d_b) return -1;
        for (int64_t item = 0; item < n_seq * heads; item++) ssm_item(&c, d_b, item);
        free(d_b);
        return 0;
    }
    int failed = 0;
#pragma omp parallel num_threads(n_threads) reduction(| : failed)
    {
        float *d_b = malloc(scratch);
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < n_seq * heads; item++) {
            if (!d_b) {
                failed = 1;
                continue;
            }
            ssm_item(&c, d_b, item);
        }
        free(d_b);
    }
    return failed ? -1 : 0;
}
