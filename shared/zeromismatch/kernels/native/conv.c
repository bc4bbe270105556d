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

/* one sequence's tokens for the 16 channels from c0 (n of them), taps w and bias b already loaded */
static inline void conv_sequence(const void *x, int bf16, int64_t x_stride, int64_t channels, const v16 *w,
                                 int64_t width, v16 b, int has_bias, int64_t start, int64_t len, const void *state,
                                 int64_t state_row, int fresh, int silu, void *y, void *new_state, int64_t c0,
                                 int64_t n) {
    const int64_t hist_len = width - 1;
    v16 hist[MAX_TAPS];
    for (int64_t i = 0; i < hist_len; i++) {
        hist[i] = (v16){0};
        if (!fresh)
            for (int64_t l = 0; l < n; l++)
                hist[i][l] = zm_load(state, bf16, ((state_row * channels + c0 + l) * hist_len) + i);
    }
    for (int64_t t = 0; t < len; t++) {
        v16 xin = {0};
        const int64_t row = (start + t) * x_stride + c0;
        if (!bf16 && n == LANES) memcpy(&xin, (const float *)x + row, sizeof xin);
        else
            for (int64_t l = 0; l < n; l++) xin[l] = zm_load(x, bf16, row + l);
        v16 acc = hist[0] * w[0];
        for (int64_t i = 1; i < hist_len; i++) acc = acc + hist[i] * w[i];
        acc = acc + xin * w[hist_len];
        if (has_bias) acc = acc + b;
        if (silu) acc = zm_silu16(acc);
        if (!bf16 && n == LANES) memcpy((float *)y + (start + t) * channels + c0, &acc, sizeof acc);
        else
            for (int64_t l = 0; l < n; l++) zm_store(y, bf16, (start + t) * channels + c0 + l, acc[l]);
        for (int64_t i = 0; i + 1 < hist_len; i++) hist[i] = hist[i + 1];
        hist[hist_len - 1] = xin;
    }
    for (int64_t i = 0; i < hist_len; i++)
        for (int64_t l = 0; l < n; l++)
            zm_store(new_state, bf16, ((state_row * channels + c0 + l) * hist_len) + i, hist[i][l]);
}

/* item (= channel chunk) of zm_causal_conv1d (below): its 16 channels' taps loaded once, then every
 * sequence */
static void conv_chunk(const void *x, int bf16, int64_t x_stride, int64_t channels, const float *weight,
                       int64_t width, const float *bias, const int64_t *cu, int64_t n_seq, const void *state,
                       const int64_t *state_index, const uint8_t *has_state, int silu, void *y, void *new_state,
                       int64_t chunk) {
    const int64_t c0 = chunk * LANES, n = channels - c0 < LANES ? channels - c0 : LANES;
    v16 w[MAX_TAPS], b = {0};
    for (int64_t i = 0; i < width; i++) {
        w[i] = (v16){0};
        for (int64_t l = 0; l < n; l++) w[i][l] = weight[(c0 + l) * width + i];
    }
    if (bias)
        for (int64_t l = 0; l < n; l++) b[l] = bias[c0 + l];
    for (int64_t s = 0; s < n_seq; s++) {
        /* the sequence's state row: its slot in a per-slot store, or row s; none (zeros) when fresh */
        const int64_t state_row = state_index ? state_index[s] : s;
        const int fresh = !state || (has_state && !has_state[s]);
        conv_sequence(x, bf16, x_stride, channels, w, width, b, bias != NULL, cu[s], cu[s + 1] - cu[s], state,
                      state_row, fresh, silu, y, new_state, c0, n);
    }
}

/* x [T, C] (rows x_stride elements apart) and state [S, C, W-1] / new_state, y [T, C] (contiguous)
 * in one dtype (bf16 or fp32); weight fp32 [C, W]; bias fp32 [C] or NULL; state NULL = all fresh.
 * With state_index (int64 [S], distinct), state and new_state are per-slot stores [N, C, W-1]
 * (the engine's cache; they may be one buffer, updated in place) and sequence s reads and writes its
 * row state_index[s]; has_state (bytes [S], or NULL = all) 0 marks a fresh sequence, which starts
 * from zeros whatever its row holds. (An item reads its window before it writes it.)
 * 16 channels per step, lane for lane the scalar rule above (zm_silu16 == zm_silu per lane).
 * Returns 0, or 1 for a width above MAX_TAPS. */
int zm_causal_conv1d(const void *x, int bf16, int64_t x_stride, int64_t channels, const float *weight,
                     int64_t width, const float *bias, const int64_t *cu, int64_t n_seq, const void *state,
                     const int64_t *state_index, const uint8_t *has_state, int silu, void *y, void *new_state,
                     int n_threads) {
    if (width < 2 || width > MAX_TAPS) return 1;
    const int64_t chunks = (channels + LANES - 1) / LANES;
    if (zm_serial(n_threads, n_seq * channels, 1 << 14)) {
        for (int64_t chunk = 0; chunk < chunks; chunk++)
            conv_chunk(x, bf16, x_stride, channels, weight, width, bias, cu, n_seq, state, state_index, has_state,
                       silu, y, new_state, chunk);
        return 0;
    }
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t chunk = 0; chunk < chunks; chunk++)
        conv_chunk(x, bf16, x_stride, channels, weight, width, bias, cu, n_seq, state, state_index, has_state,
                   silu, y, new_state, chunk);
    return 0;
}
