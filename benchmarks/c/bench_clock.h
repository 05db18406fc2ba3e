/* Timing helpers shared by the benchmark drivers: a monotonic clock in microseconds and the
 * median of a set of samples. */
#ifndef ACL_SWIGLU_BENCH_CLOCK_H
#define ACL_SWIGLU_BENCH_CLOCK_H

#include <stdlib.h>
#include <time.h>

static inline double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts samples[0..n) in place (so samples[0] is then the minimum) and returns the median. */
static inline double sorted_median(double *samples, size_t n)
{
    qsort(samples, n, sizeof *samples, compare_double);
    return samples[n / 2];
}

#endif
