/* The native library's C entry points, one declaration each: every source includes this header, so
 * the compiler checks each definition against it, and so do pyshim.c's wrappers and moe.c's GEMM
 * calls (a prototype repeated by hand could drift from the definition unnoticed). The rules each
 * function follows are stated in its source file. */
#ifndef ZM_ENTRY_POINTS_H
#define ZM_ENTRY_POINTS_H

#include <stdint.h>

int zm_panel_gemm(const void *x, int64_t ldx, const void *wp, int64_t npanels, int64_t k, int is_bf16, int64_t m,
                  int64_t n, int64_t pieces, int round_bf16, int reduce, float *out, int threads);
int zm_attention(const float *, int64_t, const void *, const void *, int, int, const int64_t *, int64_t,
                 const int64_t *, int64_t, int64_t, const int64_t *, const int64_t *, const int64_t *, int64_t,
                 int64_t, int64_t, int64_t, int64_t, float, float *, int);
int zm_ssm_scan(const float *, const float *, const float *, const float *, const float *, const float *,
                const float *, const int64_t *, const int64_t *, const float *, const int64_t *, const uint8_t *,
                float *, float *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                float, float, int);
void zm_rms_norm(const void *, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, const void *, int,
                 float, void *, int, int);
int zm_rope(const void *, int, int64_t, int64_t, int64_t, int64_t, int64_t, const int64_t *, const float *,
            int64_t, int, void *, int);
int zm_moe_experts(const void *, int, int64_t, int64_t, const int64_t *, const float *, int64_t, int64_t, int64_t,
                   int, const void *, int64_t, int64_t, int, const void *, int64_t, int64_t, int, float *, int);
int zm_causal_conv1d(const void *, int, int64_t, int64_t, const float *, int64_t, const float *, const int64_t *,
                     int64_t, const void *, const int64_t *, const uint8_t *, int, void *, void *, int);
void zm_uniform_rows(const uint64_t *, int64_t, int64_t, float *);
void zm_race_argmax(const float *, const float *, int64_t, int64_t, int64_t *);
int zm_panel_gemm_reduced(const void *, int64_t, const void *, int64_t, int64_t, int, int64_t, int64_t, int64_t,
                          int, void *, int, int);
void zm_silu_mul(const void *, const void *, int, int64_t, int64_t, int64_t, int64_t, void *, int);
void zm_silu_mul_reference(const float *, const float *, int64_t, float *);
int zm_copy_rows(void *, int64_t, const int64_t *, int64_t, const void *, int64_t, const int64_t *, int64_t,
                 int64_t, int64_t);
void zm_add_f32(const float *, const float *, float *, int64_t);
void zm_copy_strided(void *, const void *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                     int64_t, int64_t, int64_t, int64_t, int64_t);
int zm_moe_route(const float *, const float *, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, float,
                 float *, int64_t *);

#endif
