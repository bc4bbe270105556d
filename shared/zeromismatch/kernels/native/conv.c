/* Mamba2's depthwise causal conv1d for the "aligned-native" kernel set (see conv.py).
 *
 * Per sequence s and channel c, over the window [state (W-1 values, zeros for a fresh sequence),
 * then the sequence's inputs], all read as fp32 (bf16 converts exactly):
 *   acc   = ((win[t] * w[0]) + win[t+1] * w[1]) + ... + win[t+W-1] * w[W-1]   (each product rounded)
 *   acc   = acc + bias
 *   y     = round(zm_silu(acc)) or round(acc)     (fixed_math.h; rounded to x's dtype as torch's
 *                                                 cast rounds, a bf16 nan included)
 *   state = the window's last W-1 values
 * The products and sums are the pure-torch aligned conv's, in its order, so without activation the
 * two sets give the same bits (tested); the silu is fixed_math.h's, so with it they differ. A
 * (sequence, channel) is computed alone, so nothing depends on the batch or the thread count.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "entry_points.h"
#include "fixed_math.h"
#include "threads.h"

#define MAX_TAPS 16

/* item (= sequence * channel chunks + chunk) of zm_causal_conv1d (below) */
static inline void conv_item(const void *x, int bf16, int64_t x_stride, int64_t channels, const float *weight,
                             int64_t width, const float *bias, const int64_t *cu, const void *state, int silu, void *y,
                             void *new_state, int64_t chunks, int64_t item) {
    const int64_t hist_len = width - 1;
    const int64_t s = item / chunks, c0 = (item % chunks) * LANES, start = cu[s], len = cu[s + 1] - cu[s];
    const int64_t n = channels - c0 < LANES ? channels - c0 : LANES;
    v16 w[MAX_TAPS], hist[MAX_TAPS], b = {0};
    for (int64_t i = 0; i < width; i++) {
        w[i] = (v16){0};
        for (int64_t l = 0; l < n; l++) w[i][l] = weight[(c0 + l) * width + i];
    }
    for (int64_t i = 0; i < hist_len; i++) {
        hist[i] = (v16){0};
        if (state)
            for (int64_t l = 0; l < n; l++) hist[i][l] = zm_load(state, bf16, ((s * channels + c0 + l) * hist_len) + i);
    }
    if (bias)
        for (int64_t l = 0; l < n; l++) b[l] = bias[c0 + l];
    for (int64_t t = 0; t < len; t++) {
        v16 xin = {0};
        const int64_t row = (start + t) * x_stride + c0;
        if (!bf16 && n == LANES)
            memcpy(&xin, (const float *)x + row, sizeof xin);
        else
            for (int64_t l = 0; l < n; l++) xin[l] = zm_load(x, bf16, row + l);
        v16 acc = hist[0] * w[0];
        for (int64_t i = 1; i < hist_len; i++) acc = acc + hist[i] * w[i];
        acc = acc + xin * w[hist_len];
        if (bias) acc = acc + b;
        if (silu) acc = zm_silu16(acc);
        for (int64_t l = 0; l < n; l++)
            zm_store(y, bf16, (start + t) * channels + c0 + l, acc[l]);
        for (int64_t i = 0; i + 1 < hist_len; i++) hist[i] = hist[i + 1];
        hist[hist_len - 1] = xin;
    }
    for (int64_t i = 0; i < hist_len; i++)
        for (int64_t l = 0; l < n; l++) zm_store(new_state, bf16, ((s * channels + c0 + l) * hist_len) + i, hist[i][l]);
}

/* x [T, C] (rows x_stride elements apart) and state [S, C, W-1] / new_state, y [T, C] (contiguous)
 * in one dtype (bf16 or fp32); weight fp32 [C, W]; bias fp32 [C] or NULL; state NULL = all fresh.
 * 16 channels per step, lane for lane the scalar rule above (zm_silu16 == zm_silu per lane).
 * Returns 0, or 1 for a width above MAX_TAPS. */
int zm_causal_conv1d(const void *x, int bf16, int64_t x_stride, int64_t channels, const float *weight,
                     int64_t width, const float *bias, const int64_t *cu, int64_t n_seq, const void *state,
                     int silu, void *y, void *new_state, int n_threads) {
    if (width < 2 || width > MAX_TAPS) return 1;
    const int64_t chunks = (channels + LANES - 1) / LANES;
    if (zm_serial(n_threads, n_seq * channels, 1 << 14)) {
        for (int64_t item = 0; item < n_seq * chunks; item++)
            conv_item(x, bf16, x_stride, channels, weight, width, bias, cu, state, silu, y, new_state, chunks, item);
        return 0;
    }
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t item = 0; item < n_seq * chunks; item++)
        conv_item(x, bf16, x_stride, channels, weight, width, bias, cu, state, silu, y, new_state, chunks, item);
    return 0;
}
