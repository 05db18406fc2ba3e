/*
 * Device memory traffic (aclrtMemcpy, aclrtMemset, the fill of fresh allocations) split over the
 * emulator's threads, as a launch's rows are: one thread reaches about half of what a host's
 * memory moves, and a device's copy engines do not queue behind one another. Small transfers, and
 * copies whose two sides overlap, stay on the calling thread.
 */
#include <stdint.h>
#include <string.h>

#include "common/emu_internal.h"
#include "common/work_threads.h"
#include "runtime/bulk.h"

/* Below this many bytes per thread a thread costs more than it moves. */
#define BULK_MIN_BYTES_PER_THREAD ((size_t)8 << 20)
/* Ranges start on page boundaries, so no two threads write one page. */
#define BULK_RANGE_ALIGNMENT ((size_t)4096)

typedef struct {
    unsigned char *dst;
    const unsigned char *src;   /* NULL: a fill */
    int byte;
    size_t count;
} bulk_range;

static void *run_range(void *arg)
{
    bulk_range *range = arg;
    if (range->src != NULL) {
        memcpy(range->dst, range->src, range->count);
    } else {
        memset(range->dst, range->byte, range->count);
    }
    return NULL;
}

static int bulk_thread_count(size_t count)
{
    return work_thread_count(aclEmu_thread_count(), count, BULK_MIN_BYTES_PER_THREAD, UINT64_MAX);
}

static void bulk(unsigned char *dst, const unsigned char *src, int byte, size_t count, int threads)
{
    bulk_range ranges[WORK_MAX_THREADS];
    /* count / threads rounded up, then to a page: `threads` shares cover count, the last the rest */
    size_t share = count / (size_t)threads + (count % (size_t)threads != 0);
    share = (share + BULK_RANGE_ALIGNMENT - 1) / BULK_RANGE_ALIGNMENT * BULK_RANGE_ALIGNMENT;
    int used = 0;
    for (size_t at = 0; at < count; at += share, used++) {
        size_t length = count - at < share ? count - at : share;
        ranges[used] = (bulk_range){dst + at, src != NULL ? src + at : NULL, byte, length};
    }
    work_run_ranges(run_range, ranges, sizeof ranges[0], used);
}

void aclEmu_bulk_copy(void *dst, const void *src, size_t count)
{
    uintptr_t to = (uintptr_t)dst, from = (uintptr_t)src;
    int overlapping = to < from + count && from < to + count;
    int threads = overlapping ? 1 : bulk_thread_count(count);
    if (threads == 1) {
        memmove(dst, src, count);
    } else {
        bulk(dst, src, 0, count, threads);
    }
}

void aclEmu_bulk_fill(void *dst, int byte, size_t count)
{
    int threads = bulk_thread_count(count);
    if (threads == 1) {
        memset(dst, byte, count);
    } else {
        bulk(dst, NULL, byte, count, threads);
    }
}
