/*
 * Host memory for device allocations. Small blocks come from the heap. Large ones are mapped
 * on 2 MiB boundaries and offered to transparent huge pages, so that filling a fresh block takes
 * a few page faults instead of one per 4 KiB; freed large blocks are kept in a small cache and
 * handed out again, refilled, instead of being unmapped and faulted in anew. Every block is
 * filled before use: device memory is never zero and never shows an earlier owner's data.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "runtime/blocks.h"
#include "runtime/bulk.h"

/* Device allocations are 32-byte aligned on Ascend; use 64 so vector loads never split lines. */
#define BLOCK_ALIGNMENT 64
#define HUGE_PAGE ((size_t)2 << 20)
/* From this size up, blocks are mapped and cached. */
#define LARGE_BLOCK HUGE_PAGE
#define CACHE_SLOTS 16
#define CACHE_LIMIT_BYTES ((size_t)1 << 30)

typedef struct {
    void *base;
    size_t mapped;
} cached_block;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static cached_block cache[CACHE_SLOTS];
static size_t cache_count;
static size_t cache_bytes;

/* A cached block of `mapped` bytes or up to a quarter more (smallest first); NULL if none. */
static void *take_cached(size_t mapped, size_t *got)
{
    pthread_mutex_lock(&cache_lock);
    size_t best = CACHE_SLOTS;
    for (size_t i = 0; i < cache_count; i++) {
        if (cache[i].mapped >= mapped && cache[i].mapped - mapped <= mapped / 4 &&
            (best == CACHE_SLOTS || cache[i].mapped < cache[best].mapped)) {
            best = i;
        }
    }
    void *base = NULL;
    if (best != CACHE_SLOTS) {
        base = cache[best].base;
        *got = cache[best].mapped;
        cache_bytes -= cache[best].mapped;
        cache[best] = cache[--cache_count];
    }
    pthread_mutex_unlock(&cache_lock);
    return base;
}

/* A fresh mapping of `mapped` bytes (a multiple of HUGE_PAGE) on a HUGE_PAGE boundary. */
static void *map_aligned(size_t mapped)
{
    size_t span = mapped + HUGE_PAGE;
    if (span < mapped) return NULL;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uintptr_t start = ((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    size_t head = (size_t)(start - (uintptr_t)raw), tail = span - head - mapped;
    if (head > 0) munmap(raw, head);
    if (tail > 0) munmap((char *)start + mapped, tail);
    madvise((void *)start, mapped, MADV_HUGEPAGE);   /* a hint: without THP it changes nothing */
    return (void *)start;
}

void *aclEmu_block_get(size_t size, int fill, size_t *mapped)
{
    size_t rounded = (size + BLOCK_ALIGNMENT - 1) / BLOCK_ALIGNMENT * BLOCK_ALIGNMENT;
    if (rounded < size) return NULL;
    void *block;
    if (rounded < LARGE_BLOCK) {
        *mapped = 0;
        block = aligned_alloc(BLOCK_ALIGNMENT, rounded);
    } else {
        size_t want = (rounded + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
        if (want < rounded) return NULL;
        block = take_cached(want, mapped);
        if (block == NULL) {
            *mapped = want;
            block = map_aligned(want);
        }
    }
    if (block != NULL) {
        aclEmu_bulk_fill(block, fill, rounded);
    }
    return block;
}

void aclEmu_block_put(void *block, size_t mapped)
{
    if (mapped == 0) {
        free(block);
        return;
    }
    pthread_mutex_lock(&cache_lock);
    int keep = cache_count < CACHE_SLOTS && cache_bytes + mapped <= CACHE_LIMIT_BYTES;
    if (keep) {
        cache[cache_count++] = (cached_block){block, mapped};
        cache_bytes += mapped;
    }
    pthread_mutex_unlock(&cache_lock);
    if (!keep) {
        munmap(block, mapped);
    }
}

void aclEmu_blocks_release_cached(void)
{
    pthread_mutex_lock(&cache_lock);
    cached_block dropped[CACHE_SLOTS];
    size_t n = cache_count;
    memcpy(dropped, cache, n * sizeof dropped[0]);
    cache_count = 0;
    cache_bytes = 0;
    pthread_mutex_unlock(&cache_lock);
    for (size_t i = 0; i < n; i++) {
        munmap(dropped[i].base, dropped[i].mapped);
    }
}

void aclEmu_blocks_lock_for_fork(void) { pthread_mutex_lock(&cache_lock); }
void aclEmu_blocks_unlock_after_fork(void) { pthread_mutex_unlock(&cache_lock); }
