/*
 * Emulated device memory. Allocations come from the host heap but are recorded, so that every
 * pointer handed to the emulator can be classified as device memory (inside one live allocation,
 * bounds included) or host memory, and copies are checked against what their kind claims.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/emu_internal.h"
#include "runtime/blocks.h"
#include "runtime/memory.h"

#define DEVICE_ALIGNMENT 64   /* what blocks.c guarantees */
/* Fresh device memory is not zeroed on a real device: fill it so nothing can depend on it. */
#define FRESH_MEMORY_BYTE 0xFF

typedef struct {
    uintptr_t base;
    size_t size;        /* as requested */
    uint32_t pins;      /* work in progress reading or writing it */
    int32_t device;     /* current when it was allocated */
    size_t mapped;      /* for aclEmu_block_put */
} allocation;

static pthread_mutex_t memory_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t unpinned = PTHREAD_COND_INITIALIZER;
static allocation *allocations;   /* sorted by base */
static size_t allocation_count;
static size_t allocation_capacity;
static uint64_t bytes_in_use;
static uint64_t capacity_bytes = (uint64_t)8 << 30;

void aclEmu_mem_set_capacity(uint64_t bytes)
{
    pthread_mutex_lock(&memory_lock);
    capacity_bytes = bytes;
    pthread_mutex_unlock(&memory_lock);
}

EMU_EXPORT int64_t aclEmuLiveBytes(void)
{
    pthread_mutex_lock(&memory_lock);
    int64_t n = (int64_t)bytes_in_use;
    pthread_mutex_unlock(&memory_lock);
    return n;
}

/* Index of the last allocation with base <= addr, or -1. Caller holds the lock. */
static ptrdiff_t find_floor(uintptr_t addr)
{
    ptrdiff_t lo = 0, hi = (ptrdiff_t)allocation_count - 1, found = -1;
    while (lo <= hi) {
        ptrdiff_t mid = lo + (hi - lo) / 2;
        if (allocations[mid].base <= addr) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

/* Caller holds the lock. Fills `at` with the index of the allocation concerned. */
static aclEmuRangeClass classify_locked(uintptr_t addr, size_t len, ptrdiff_t *at)
{
    if (len == 0) {
        len = 1;
    }
    uintptr_t end = addr + len;
    if (end < addr) {
        *at = -1;
        return EMU_RANGE_STRADDLES;
    }
    ptrdiff_t i = find_floor(addr);
    *at = i;
    if (i >= 0 && addr < allocations[i].base + allocations[i].size) {
        return end <= allocations[i].base + allocations[i].size ? EMU_RANGE_DEVICE
                                                                : EMU_RANGE_STRADDLES;
    }
    size_t next = (size_t)(i + 1);
    if (next < allocation_count && allocations[next].base < end) {
        *at = (ptrdiff_t)next;
        return EMU_RANGE_STRADDLES;
    }
    return EMU_RANGE_HOST;
}

aclEmuRangeClass aclEmu_mem_classify(const void *ptr, size_t len, aclEmuRegion *region)
{
    ptrdiff_t at;
    pthread_mutex_lock(&memory_lock);
    aclEmuRangeClass cls = classify_locked((uintptr_t)ptr, len, &at);
    if (region != NULL && at >= 0 && cls != EMU_RANGE_HOST) {
        region->base = allocations[at].base;
        region->size = allocations[at].size;
        region->offset = (uintptr_t)ptr >= allocations[at].base
                             ? (size_t)((uintptr_t)ptr - allocations[at].base)
                             : 0;
        region->device = allocations[at].device;
    }
    pthread_mutex_unlock(&memory_lock);
    return cls;
}

void aclEmu_mem_describe(const void *ptr, size_t len, char *buf, size_t size)
{
    aclEmuRegion region = {0, 0, 0, 0};
    switch (aclEmu_mem_classify(ptr, len, &region)) {
    case EMU_RANGE_DEVICE:
        snprintf(buf, size, "device memory (allocation %p of %zu bytes, offset %zu, device %d)",
                 (void *)region.base, region.size, region.offset, region.device);
        break;
    case EMU_RANGE_STRADDLES:
        if (region.size == 0) {   /* no allocation concerned: the range wraps */
            snprintf(buf, size, "a range of %zu bytes at %p that wraps past the top of the "
                     "address space", len, ptr);
            break;
        }
        snprintf(buf, size,
                 "a range of %zu bytes at %p that runs outside device allocation %p of %zu bytes",
                 len, ptr, (void *)region.base, region.size);
        break;
    default:
        snprintf(buf, size, "host memory, or device memory that was freed (%p)", ptr);
        break;
    }
}

size_t aclEmu_mem_pin(const void *const *ptrs, const size_t *lens, size_t n)
{
    pthread_mutex_lock(&memory_lock);
    for (size_t k = 0; k < n; k++) {
        ptrdiff_t at;
        if (classify_locked((uintptr_t)ptrs[k], lens[k], &at) != EMU_RANGE_DEVICE) {
            for (size_t j = 0; j < k; j++) {
                ptrdiff_t done = find_floor((uintptr_t)ptrs[j]);
                allocations[done].pins--;
            }
            pthread_mutex_unlock(&memory_lock);
            return k + 1;
        }
        allocations[at].pins++;
    }
    pthread_mutex_unlock(&memory_lock);
    return 0;
}

void aclEmu_mem_unpin(const void *const *ptrs, size_t n)
{
    pthread_mutex_lock(&memory_lock);
    for (size_t k = 0; k < n; k++) {
        ptrdiff_t at = find_floor((uintptr_t)ptrs[k]);
        if (at >= 0 && allocations[at].pins > 0) {
            allocations[at].pins--;
        }
    }
    pthread_cond_broadcast(&unpinned);
    pthread_mutex_unlock(&memory_lock);
}

static int record_allocation(uintptr_t base, size_t size, int32_t device, size_t mapped)
{
    if (allocation_count == allocation_capacity) {
        size_t capacity = allocation_capacity ? allocation_capacity * 2 : 64;
        allocation *grown = realloc(allocations, capacity * sizeof *grown);
        if (grown == NULL) {
            return -1;
        }
        allocations = grown;
        allocation_capacity = capacity;
    }
    ptrdiff_t below = find_floor(base);
    size_t at = (size_t)(below + 1);
    memmove(&allocations[at + 1], &allocations[at], (allocation_count - at) * sizeof *allocations);
    allocations[at] = (allocation){base, size, 0, device, mapped};
    allocation_count++;
    bytes_in_use += size;
    return 0;
}

EMU_EXPORT aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    static const char api[] = "aclrtMalloc";
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_device(api);
    if (rc != 0) return rc;
    if (devPtr == NULL) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api, "devPtr is NULL");
    }
    *devPtr = NULL;
    if (size == 0) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api, "size is 0");
    }
    if ((int)policy < ACL_MEM_MALLOC_HUGE_FIRST || (int)policy > ACL_MEM_MALLOC_NORMAL_ONLY) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api,
                           "policy %d is not an aclrtMemMallocPolicy (0, 1 or 2)", (int)policy);
    }
    if (size > SIZE_MAX - DEVICE_ALIGNMENT) {
        return aclEmu_fail(ACL_ERROR_RT_MEMORY_ALLOCATION, api, "size %zu is too large", size);
    }
    pthread_mutex_lock(&memory_lock);
    uint64_t in_use = bytes_in_use, capacity = capacity_bytes;
    int fits = size <= capacity && in_use <= capacity - size;
    pthread_mutex_unlock(&memory_lock);
    if (!fits) {
        return aclEmu_fail(ACL_ERROR_RT_MEMORY_ALLOCATION, api,
                           "cannot allocate %zu bytes: the emulated device has %" PRIu64
                           " bytes with %" PRIu64 " in use (set ACL_EMU_DEVICE_MEMORY to change)",
                           size, capacity, in_use);
    }
    size_t mapped = 0;
    void *block = aclEmu_block_get(size, FRESH_MEMORY_BYTE, &mapped);
    if (block == NULL) {
        return aclEmu_fail(ACL_ERROR_RT_MEMORY_ALLOCATION, api,
                           "cannot allocate %zu bytes: the host is out of memory", size);
    }
    pthread_mutex_lock(&memory_lock);
    rc = record_allocation((uintptr_t)block, size, aclEmu_current_device(), mapped);
    pthread_mutex_unlock(&memory_lock);
    if (rc != 0) {
        aclEmu_block_put(block, mapped);
        return aclEmu_fail(ACL_ERROR_RT_MEMORY_ALLOCATION, api,
                           "out of host memory recording the allocation");
    }
    aclEmu_handle_add(ACL_EMU_KIND_ALLOCATION, block);
    *devPtr = block;
    return ACL_SUCCESS;
}

EMU_EXPORT aclError aclrtFree(void *devPtr)
{
    static const char api[] = "aclrtFree";
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_device(api);
    if (rc != 0) return rc;
    if (devPtr == NULL) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api, "devPtr is NULL");
    }
    pthread_mutex_lock(&memory_lock);
    ptrdiff_t at;
    for (;;) {
        at = find_floor((uintptr_t)devPtr);
        if (at < 0 || allocations[at].base != (uintptr_t)devPtr) {
            int inside = at >= 0 && (uintptr_t)devPtr < allocations[at].base + allocations[at].size;
            uintptr_t base = inside ? allocations[at].base : 0;
            pthread_mutex_unlock(&memory_lock);
            if (inside) {
                return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api,
                                   "%p points inside allocation %p; free the address aclrtMalloc "
                                   "returned", devPtr, (void *)base);
            }
            return aclEmu_require_handle(api, ACL_ERROR_INVALID_PARAM, "devPtr",
                                         ACL_EMU_KIND_ALLOCATION, devPtr);
        }
        if (allocations[at].device != aclEmu_current_device()) {
            int32_t owner = allocations[at].device;
            pthread_mutex_unlock(&memory_lock);
            return aclEmu_require_owner(api, ACL_ERROR_RT_PARAM_INVALID, "the allocation", owner);
        }
        if (allocations[at].pins == 0) {
            break;
        }
        /* Work that is running on it finishes first, as a real free waits for the device. */
        pthread_cond_wait(&unpinned, &memory_lock);
    }
    bytes_in_use -= allocations[at].size;
    size_t mapped = allocations[at].mapped;
    memmove(&allocations[at], &allocations[at + 1],
            (allocation_count - (size_t)at - 1) * sizeof *allocations);
    allocation_count--;
    aclEmu_handle_remove(ACL_EMU_KIND_ALLOCATION, devPtr, "freed");
    pthread_mutex_unlock(&memory_lock);
    aclEmu_block_put(devPtr, mapped);
    return ACL_SUCCESS;
}

void aclEmu_mem_release_all(void)
{
    pthread_mutex_lock(&memory_lock);
    for (size_t i = 0; i < allocation_count; i++) {
        while (allocations[i].pins > 0) {
            pthread_cond_wait(&unpinned, &memory_lock);
        }
    }
    for (size_t i = 0; i < allocation_count; i++) {
        aclEmu_handle_remove(ACL_EMU_KIND_ALLOCATION, (void *)allocations[i].base,
                             "freed by aclFinalize");
        aclEmu_block_put((void *)allocations[i].base, allocations[i].mapped);
    }
    allocation_count = 0;
    bytes_in_use = 0;
    /* The list itself too, so that unloading the library after aclFinalize leaks nothing. */
    free(allocations);
    allocations = NULL;
    allocation_capacity = 0;
    pthread_mutex_unlock(&memory_lock);
    aclEmu_blocks_release_cached();
}

void aclEmu_mem_report(FILE *out)
{
    pthread_mutex_lock(&memory_lock);
    for (size_t i = 0; i < allocation_count; i++) {
        fprintf(out, "  device allocation %p holds %zu bytes\n", (void *)allocations[i].base,
                allocations[i].size);
    }
    pthread_mutex_unlock(&memory_lock);
}

void aclEmu_mem_lock_for_fork(void) { pthread_mutex_lock(&memory_lock); }
void aclEmu_mem_unlock_after_fork(void) { pthread_mutex_unlock(&memory_lock); }

void aclEmu_mem_reset_in_child(void)
{
    for (size_t i = 0; i < allocation_count; i++) {
        allocations[i].pins = 0;
    }
    /* A parent thread may have been waiting on it: start from a fresh condition variable. */
    pthread_cond_t fresh = PTHREAD_COND_INITIALIZER;
    memcpy(&unpinned, &fresh, sizeof fresh);
    pthread_mutex_unlock(&memory_lock);
}

