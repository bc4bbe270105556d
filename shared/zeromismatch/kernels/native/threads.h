/* When a kernel's loop runs on the calling thread instead of in an OpenMP parallel region.
 *
 * Entering a parallel region costs ~0.3 us even with num_threads(1) or a false if() clause
 * (libgomp builds a team of one): a tenth of a one-row call, and the whole difference between
 * swiglu.c and torch's silu-then-multiply at one row (session 15). Which threads compute which
 * rows never changes a value in these kernels (each output has its own fixed order), so this
 * choice is about time only. */
#ifndef ZM_THREADS_H
#define ZM_THREADS_H

#include <stdint.h>

/* 1: run the loop serially. `work` is the loop's size in the kernel's own unit (elements, items);
 * below `min_parallel_work` threads do not pay for themselves. */
static inline int zm_serial(int n_threads, int64_t work, int64_t min_parallel_work) {
    return n_threads <= 1 || work < min_parallel_work;
}

#endif
