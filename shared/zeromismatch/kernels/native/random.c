/* The sampler's noise in C: torch's CPU generator stream, bit for bit (see random.py).
 *
 * torch.Generator on the CPU is MT19937: manual_seed(s) initialises the 624-word state from the
 * low 32 bits of s (the reference init_genrand recurrence), and uniform_ on an fp32 tensor draws
 * one 32-bit output per element, in order, and keeps its low 24 bits: u = (y & 0xffffff) * 2^-24.
 * This file runs that recurrence, twist and tempering for 16 seeds at once (one per vector lane),
 * so each row is what `generator.manual_seed(seed); row.uniform_(generator=generator)` writes.
 * Integer operations only, so nothing depends on the compiler's floating-point choices (the one
 * conversion, a 24-bit integer to float times 2^-24, is exact).
 */
#include <stdint.h>

#include "entry_points.h"

#define MT_N 624
#define MT_M 397
#define MT_LANES 16

typedef uint32_t u32v __attribute__((vector_size(64), aligned(4)));

static inline u32v twist(u32v u, u32v v) {
    const u32v mixed = (u & 0x80000000u) | (v & 0x7fffffffu);
    return (mixed >> 1) ^ ((-(v & 1u)) & 0x9908b0dfu);
}

/* out[r, c] for r < rows, c < cols (contiguous fp32): the c-th uniform of a generator seeded seeds[r] */
void zm_uniform_rows(const uint64_t *seeds, int64_t rows, int64_t cols, float *out) {
    for (int64_t r0 = 0; r0 < rows; r0 += MT_LANES) {
        const int64_t lanes = rows - r0 < MT_LANES ? rows - r0 : MT_LANES;
        u32v state[MT_N];
        u32v first = {0};
        for (int64_t i = 0; i < lanes; i++) first[i] = (uint32_t)seeds[r0 + i];
        state[0] = first;
        for (uint32_t j = 1; j < MT_N; j++) state[j] = 1812433253u * (state[j - 1] ^ (state[j - 1] >> 30)) + j;
        int next = MT_N;
        for (int64_t c = 0; c < cols; c++) {
            if (next == MT_N) {
                /* the last refill computes only the words it will read: new word k depends on old
                   words k and k+1 and on word k+M (old below N-M, else the new word k+M-N) */
                const int64_t left = cols - c;
                const int need = left < MT_N ? (int)left : MT_N;
                int k = 0;
                for (; k < MT_N - MT_M && k < need; k++)
                    state[k] = state[k + MT_M] ^ twist(state[k], state[k + 1]);
                for (; k < MT_N - 1 && k < need; k++)
                    state[k] = state[k + MT_M - MT_N] ^ twist(state[k], state[k + 1]);
                if (need == MT_N) state[MT_N - 1] = state[MT_M - 1] ^ twist(state[MT_N - 1], state[0]);
                next = 0;
            }
            u32v y = state[next++];
            y ^= y >> 11;
            y ^= (y << 7) & 0x9d2c5680u;
            y ^= (y << 15) & 0xefc60000u;
            y ^= y >> 18;
            for (int64_t i = 0; i < lanes; i++)
                out[(r0 + i) * cols + c] = (float)(y[i] & 0xffffffu) * (1.0f / 16777216.0f);
        }
    }
}

/* The sampler's race (engine/sampler.py): per row, torch.argmax(processed - log_e) -- each
 * difference one IEEE subtraction, the first maximum, and the first nan where there is one (torch's
 * argmax ranks nan above every number; -0 and +0 tie, so the first wins) -- in one pass, without
 * the [rows, cols] difference torch materialises. */
void zm_race_argmax(const float *processed, const float *log_e, int64_t rows, int64_t cols, int64_t *tokens) {
    for (int64_t r = 0; r < rows; r++) {
        const float *p = processed + r * cols, *e = log_e + r * cols;
        float best = p[0] - e[0];
        int64_t at = 0;
        for (int64_t c = 1; c < cols && best == best; c++) {
            const float v = p[c] - e[c];
            if (v != v || v > best) {
                best = v;
                at = c;
            }
        }
        tokens[r] = at;
    }
}
