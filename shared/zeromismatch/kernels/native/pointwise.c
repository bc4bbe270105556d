/* Row-local ops of the "aligned-native" kernel set in fixed-order C: RMSNorm and RoPE
 * (see pointwise.py).
 *
 * RMSNorm, per row of h values (x fp32 or bf16, read as fp32):
 *   lane[i]  = ((0 + x[i]^2) + x[i+16]^2) + ...        (i < 16, ascending, zeros past h)
 *   ss       = the fixed 16-lane tree of fixed_math.h (lanes_tree)
 *   r        = 1 / sqrt(ss / h + eps)                  (IEEE div, sqrt, div: each rounded once)
 *   n[j]     = x[j] * r, rounded to x's dtype (the gated norm: to the dtype of the input it was
 *              computed from, as the aligned op does)
 *   out[j]   = n[j] * w[j], rounded to the output dtype (fp32, or bf16 round-to-nearest-even;
 *              a bf16 x bf16 product is exact in fp32, so that is one rounding, as torch's)
 * Grouped (gated) RMSNorm for Mamba2 runs the same rule over each group of a row.
 *
 * RoPE, per (token, head) row: the rotation of the pair (a, b) -- elements (i, i + half), or
 * (2i, 2i + 1) when interleaved -- by the angle of (position, i):
 *   out_a = a*c - b*s,  out_b = b*c + a*s             (each product rounded, then the sum)
 * with c and s read from a table of cos/sin values (one row per position, computed once by
 * torch), rounded to x's dtype (bf16: round to nearest even, nan as torch's vectorized cast). That is the pure-torch aligned rope's arithmetic exactly, so the
 * two sets give the same bits (tests).
 *
 * Every value is this sequence of IEEE operations wherever its row sits (the build passes
 * -ffp-contract=off and no fast-math; fixed_math.h refuses otherwise), so the bits depend on
 * the row alone: not on the batch, the row's position in it, or the thread count.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "entry_points.h"
#include "fixed_math.h"
#include "threads.h"

/* v rounded to bf16 and back when bf16, else v */
static inline float round_as(int bf16, float v) { return bf16 ? bf16_to_f32(zm_torch_bf16(v)) : v; }

static float sum_of_squares(const void *row, int bf16, int64_t h) {
    v16 acc = {0};
    int64_t j = 0;
    for (; j + LANES <= h; j += LANES) {
        v16 v;
        if (bf16) {
            for (int i = 0; i < LANES; i++) v[i] = bf16_to_f32(((const uint16_t *)row)[j + i]);
        } else {
            memcpy(&v, (const float *)row + j, sizeof v);
        }
        acc = acc + v * v;
    }
    if (j < h) {
        v16 v = {0};
        for (int64_t i = 0; j + i < h; i++) v[i] = zm_load(row, bf16, j + i);
        acc = acc + v * v;
    }
    return lanes_tree(acc);
}

/* out[g + j] = round(round(x[j] * r) * w[g + j]); inlined with constant flags where they are known */
static inline void scale_row(const char *xg, float r, const void *weight, char *orow, int64_t g, int64_t group,
                             const int x_bf16, const int n_bf16, const int w_bf16, const int out_bf16) {
    for (int64_t j = 0; j < group; j++) {
        const float n = round_as(n_bf16, zm_load(xg, x_bf16, j) * r);
        zm_store(orow, out_bf16, g + j, n * zm_load(weight, w_bf16, g + j));
    }
}

/* row (< rows_a * rows_b) of zm_rms_norm (below) */
static inline void rms_norm_row(const void *x, int x_bf16, int64_t rows_b, int64_t stride_a, int64_t stride_b,
                                int64_t h, int64_t group, int n_bf16, const void *weight, int w_bf16, float eps,
                                void *out, int out_bf16, int64_t row) {
    const float inv_count = (float)group; /* divided by, not multiplied by its reciprocal */
    const int64_t x_size = x_bf16 ? 2 : 4, o_size = out_bf16 ? 2 : 4;
    const char *xr = (const char *)x + ((row / rows_b) * stride_a + (row % rows_b) * stride_b) * x_size;
    char *orow = (char *)out + row * h * o_size;
    for (int64_t g = 0; g < h; g += group) {
        const char *xg = xr + g * x_size;
        const float r = 1.0f / sqrtf(sum_of_squares(xg, x_bf16, group) / inv_count + eps);
        if (!x_bf16 && !n_bf16 && !w_bf16 && !out_bf16) scale_row(xg, r, weight, orow, g, group, 0, 0, 0, 0);
        else if (x_bf16 && n_bf16 && w_bf16 && out_bf16) scale_row(xg, r, weight, orow, g, group, 1, 1, 1, 1);
        else scale_row(xg, r, weight, orow, g, group, x_bf16, n_bf16, w_bf16, out_bf16);
    }
}

/* x: rows of h values at x + a * stride_a + b * stride_b (elements) for a < rows_a, b < rows_b;
 * groups of `group` values (group divides h) are normalized separately, all by weight[0..h);
 * n_bf16: round the normalized values to bf16 before the weight.
 * out: contiguous [rows_a * rows_b, h] of out_bf16 ? bf16 : fp32. */
void zm_rms_norm(const void *x, int x_bf16, int64_t rows_a, int64_t rows_b, int64_t stride_a, int64_t stride_b,
                 int64_t h, int64_t group, int n_bf16, const void *weight, int w_bf16, float eps, void *out,
                 int out_bf16, int n_threads) {
    const int64_t rows = rows_a * rows_b;
    if (zm_serial(n_threads, rows * h, 1 << 16)) {
        for (int64_t row = 0; row < rows; row++)
            rms_norm_row(x, x_bf16, rows_b, stride_a, stride_b, h, group, n_bf16, weight, w_bf16, eps, out,
                         out_bf16, row);
        return;
    }
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t row = 0; row < rows; row++)
        rms_norm_row(x, x_bf16, rows_b, stride_a, stride_b, h, group, n_bf16, weight, w_bf16, eps, out, out_bf16,
                     row);
}

/* one (token, head) row; inlined with constant bf16 / interleaved so each variant vectorizes */
static inline void rope_row(const char *xr, char *orow, const float *cos_row, const float *sin_row, int64_t half,
                            const int bf16, const int interleaved) {
    for (int64_t i = 0; i < half; i++) {
        const int64_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
        const float a = zm_load(xr, bf16, ia), b = zm_load(xr, bf16, ib), c = cos_row[i], s = sin_row[i];
        const float ac = a * c, bs = b * s, bc = b * c, as = a * s;
        zm_store(orow, bf16, ia, ac - bs);
        zm_store(orow, bf16, ib, bc + as);
    }
}

/* row (= token * heads + head) of zm_rope (below) */
static inline void rope_token_head(const void *x, int bf16, int64_t heads, int64_t stride_t, int64_t stride_h,
                                   int64_t half, const int64_t *positions, const float *table, int interleaved,
                                   void *out, int64_t size, int64_t row) {
    const int64_t t = row / heads, hd = row % heads;
    const char *xr = (const char *)x + (t * stride_t + hd * stride_h) * size;
    char *orow = (char *)out + row * 2 * half * size;
    const float *cos_row = table + positions[t] * 2 * half, *sin_row = cos_row + half;
    if (bf16)
        interleaved ? rope_row(xr, orow, cos_row, sin_row, half, 1, 1)
                    : rope_row(xr, orow, cos_row, sin_row, half, 1, 0);
    else
        interleaved ? rope_row(xr, orow, cos_row, sin_row, half, 0, 1)
                    : rope_row(xr, orow, cos_row, sin_row, half, 0, 0);
}

/* x: [T, H, 2*half] rows at x + t * stride_t + hd * stride_h (elements, unit inner stride);
 * table: fp32 [table_len, 2, half] (cos then sin per position); out contiguous [T, H, 2*half] in
 * x's dtype. Returns 0, or 1 when a position is outside [0, table_len) (nothing is written then:
 * the caller computes the rotation another way). */
int zm_rope(const void *x, int bf16, int64_t tokens, int64_t heads, int64_t stride_t, int64_t stride_h,
            int64_t half, const int64_t *positions, const float *table, int64_t table_len, int interleaved,
            void *out, int n_threads) {
    for (int64_t t = 0; t < tokens; t++)
        if (positions[t] < 0 || positions[t] >= table_len) return 1;
    const int64_t size = bf16 ? 2 : 4, d = 2 * half;
    if (zm_serial(n_threads, tokens * heads * d, 1 << 16)) {
        for (int64_t row = 0; row < tokens * heads; row++)
            rope_token_head(x, bf16, heads, stride_t, stride_h, half, positions, table, interleaved, out, size,
                            row);
        return 0;
    }
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t row = 0; row < tokens * heads; row++)
        rope_token_head(x, bf16, heads, stride_t, stride_h, half, positions, table, interleaved, out, size, row);
    return 0;
}

/* ---- what a step graph's replay runs in place of some torch ops (kernels/step_graph.py) --------
 * Copies are exact, and an fp32 add is one IEEE addition per element (torch's add with alpha 1 is
 * the same addition), so each gives the bits of the torch op it stands for, without the ~5 us of
 * torch dispatch per op. */

/* row r of src for a gather index, which counts from the end when negative (torch's t[idx]) */
static inline int64_t gather_row(const int64_t *src_index, int64_t r, int64_t src_rows) {
    if (!src_index) return r;
    const int64_t s = src_index[r];
    return s < 0 ? s + src_rows : s;
}

/* n rows of row_bytes: row r of dst (at dst_index[r], or r: index_copy_, whose indices must lie in
 * [0, dst_rows)) takes row r of src (at src_index[r], or r: a gather, whose negative indices count
 * from the end); row strides in bytes. Returns 1, writing nothing, when an index is outside its
 * tensor (where the torch op raises). */
int zm_copy_rows(void *dst, int64_t dst_stride, const int64_t *dst_index, int64_t dst_rows, const void *src,
                 int64_t src_stride, const int64_t *src_index, int64_t src_rows, int64_t n, int64_t row_bytes) {
    for (int64_t r = 0; r < n; r++) {
        const int64_t d = dst_index ? dst_index[r] : r, s = gather_row(src_index, r, src_rows);
        if (d < 0 || d >= dst_rows || s < 0 || s >= src_rows) return 1;
    }
    for (int64_t r = 0; r < n; r++) {
        const int64_t d = dst_index ? dst_index[r] : r, s = gather_row(src_index, r, src_rows);
        memcpy((char *)dst + d * dst_stride, (const char *)src + s * src_stride, (size_t)row_bytes);
    }
    return 0;
}

/* out = a + b over n fp32 values (out may be a or b) */
void zm_add_f32(const float *a, const float *b, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* dst[i0, i1, i2, i3] = src[i0, i1, i2, i3] for sizes n0..n3, element strides ds* / ss* (a stride may
 * be 0: an expanded source), elements of elem_bytes; rows of contiguous elements copied whole */
void zm_copy_strided(void *dst, const void *src, int64_t elem_bytes, int64_t n0, int64_t n1, int64_t n2,
                     int64_t n3, int64_t ds0, int64_t ds1, int64_t ds2, int64_t ds3, int64_t ss0, int64_t ss1,
                     int64_t ss2, int64_t ss3) {
    char *d = (char *)dst;
    const char *s = (const char *)src;
    const int rows = ds3 == 1 && ss3 == 1;
    for (int64_t i0 = 0; i0 < n0; i0++)
        for (int64_t i1 = 0; i1 < n1; i1++)
            for (int64_t i2 = 0; i2 < n2; i2++) {
                char *drow = d + (i0 * ds0 + i1 * ds1 + i2 * ds2) * elem_bytes;
                const char *srow = s + (i0 * ss0 + i1 * ss1 + i2 * ss2) * elem_bytes;
                if (rows) {
                    memcpy(drow, srow, (size_t)(n3 * elem_bytes));
                    continue;
                }
                for (int64_t i3 = 0; i3 < n3; i3++)
                    memcpy(drow + i3 * ds3 * elem_bytes, srow + i3 * ss3 * elem_bytes, (size_t)elem_bytes);
            }
}
