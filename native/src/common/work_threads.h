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
#define KERNEL_MIN_ELEMENTS_PER_THREAD ((int64_t)1 << 16)
#define WORK_MAX_THREADS 256

/* The threads a launch of `rows` rows and `elements` elements uses: the number asked for, within
 * [1, WORK_MAX_THREADS], no more than the elements make worth it and no more than the rows. */
static inline int kernel_thread_count(int threads, int64_t elements, int64_t rows)
{
    int64_t useful = elements / KERNEL_MIN_ELEMENTS_PER_THREAD;
    if (threads < 1) threads = 1;
    if (threads > WORK_MAX_THREADS) threads = WORK_MAX_THREADS;
    if (threads > useful) threads = useful > 1 ? (int)useful : 1;
    if (threads > rows) threads = (int)rows;
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
