/*
 * How the emulator spreads one piece of work over threads (a launch's rows in the kernels, a large
 * copy's or fill's bytes in the runtime): how many threads it is worth, and the run of one range
 * per thread. Internal to the emulator.
 */
#ifndef ACL_SWIGLU_WORK_THREADS_H
#define ACL_SWIGLU_WORK_THREADS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* Rows below this many elements per thread are not worth a thread. */
#define KERNEL_MIN_ELEMENTS_PER_THREAD ((uint64_t)1 << 16)
#define WORK_MAX_THREADS 256

/* The threads a piece of work of `units` units uses: the number asked for, within
 * [1, WORK_MAX_THREADS], no more than give each thread `min_per_thread` units, and no more than
 * `parts` (the pieces it cannot split: a launch's rows). */
static inline int work_thread_count(int threads, uint64_t units, uint64_t min_per_thread, uint64_t parts)
{
    uint64_t useful = units / min_per_thread;
    if (useful > parts) useful = parts;
    if (threads > WORK_MAX_THREADS) threads = WORK_MAX_THREADS;
    if (threads < 1 || (uint64_t)threads > useful) threads = useful > 1 ? (int)useful : 1;
    return threads;
}

/* Runs `run` on each of the `threads` (at most WORK_MAX_THREADS) ranges at `ranges`, each
 * `range_size` bytes: the first on this thread, the others on threads of their own. A range whose
 * thread cannot start runs here once the first is done, so the result never depends on how many
 * threads there were. */
static inline void work_run_ranges(void *(*run)(void *), void *ranges, size_t range_size, int threads)
{
    unsigned char *range = ranges;
    pthread_t ids[WORK_MAX_THREADS];
    int started[WORK_MAX_THREADS] = {0};
    for (int k = 1; k < threads; k++) {
        started[k] = pthread_create(&ids[k], NULL, run, range + (size_t)k * range_size) == 0;
    }
    run(range);
    for (int k = 1; k < threads; k++) {
        if (started[k]) {
            pthread_join(ids[k], NULL);
        } else {
            run(range + (size_t)k * range_size);
        }
    }
}

#endif
