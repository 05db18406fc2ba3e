/*
 * What device memory costs in the emulator: aclrtMalloc + aclrtFree of one size, and the same
 * with a host-to-device copy filling the block (as a one-shot call does with its inputs).
 *
 *   alloc_cost REPEATS  ->  one JSON object: median microseconds per cycle, by size
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "acl/acl.h"
#include "bench_clock.h"

static void fail(const char *what, int status)
{
    const char *msg = aclGetRecentErrMsg();
    fprintf(stderr, "%s failed: %d %s\n", what, status, msg ? msg : "");
    exit(1);
}

/* Median microseconds of `repeats` cycles of malloc (+ copy) + free of `size` bytes. */
static double cycle_us(size_t size, int copy, int repeats, const void *host)
{
    double *samples = malloc((size_t)repeats * sizeof *samples);
    for (int r = 0; r < repeats; r++) {
        void *dev = NULL;
        double t0 = now_us();
        int rc = aclrtMalloc(&dev, size, ACL_MEM_MALLOC_HUGE_FIRST);
        if (rc != 0) fail("aclrtMalloc", rc);
        if (copy && (rc = aclrtMemcpy(dev, size, host, size, ACL_MEMCPY_HOST_TO_DEVICE)) != 0) {
            fail("aclrtMemcpy", rc);
        }
        if ((rc = aclrtFree(dev)) != 0) fail("aclrtFree", rc);
        samples[r] = now_us() - t0;
    }
    double median = sorted_median(samples, (size_t)repeats);
    free(samples);
    return median;
}

int main(int argc, char **argv)
{
    if (argc != 2 || atoi(argv[1]) < 1) {
        fprintf(stderr, "usage: alloc_cost REPEATS\n");
        return 2;
    }
    int repeats = atoi(argv[1]);
    static const size_t sizes[] = {(size_t)64 << 10, (size_t)1 << 20, (size_t)8 << 20,
                                   (size_t)64 << 20};
    const size_t count = sizeof sizes / sizeof sizes[0];
    void *host = malloc(sizes[count - 1]);
    memset(host, 0x3C, sizes[count - 1]);
    int rc = aclInit(NULL);
    if (rc == 0) rc = aclrtSetDevice(0);
    if (rc != 0) fail("aclInit/aclrtSetDevice", rc);
    printf("{\n");
    for (size_t i = 0; i < count; i++) {
        double bare = cycle_us(sizes[i], 0, repeats, host);
        double filled = cycle_us(sizes[i], 1, repeats, host);
        printf("  \"%zu\": {\"malloc_free_us\": %.2f, \"malloc_copy_free_us\": %.2f}%s\n", sizes[i],
               bare, filled, i + 1 < count ? "," : "");
    }
    printf("}\n");
    aclrtResetDevice(0);
    aclFinalize();
    free(host);
    return 0;
}
