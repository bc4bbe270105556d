/* The panel GEMM of gemm.c, for the kernels that call it from C (moe.c); gemm.c states the rule. */
#ifndef ZM_GEMM_H
#define ZM_GEMM_H

#include <stdint.h>

int zm_panel_gemm(const void *x, int64_t ldx, const void *wp, int64_t npanels, int64_t k, int is_bf16, int64_t m,
                  int64_t n, int64_t pieces, int round_bf16, int reduce, float *out, int threads);

#endif
