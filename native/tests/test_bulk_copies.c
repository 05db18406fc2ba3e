/* Large copies and fills (aclrtMemcpy, aclrtMemcpyAsync, aclrtMemset, the fill of fresh
 * memory), which the emulator splits over its threads: every byte lands where a plain
 * memmove/memset would put it, whatever the thread count, the size or the alignment, overlapping
 * copies included; and nothing outside the range is touched. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "acl_emu/acl_emu.h"
#include "emu_test.h"

#define MIB ((size_t)1 << 20)

static void pattern(unsigned char *p, size_t n, uint32_t seed)
{
    uint32_t state = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        state = state * 1664525u + 1013904223u;
        p[i] = (unsigned char)(state >> 24);
    }
}

static void *dev_alloc(size_t size)
{
    void *p = NULL;
    CHECK_EQ_INT(aclrtMalloc(&p, size, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK(p != NULL);
    return p;
}

static size_t first_difference(const unsigned char *a, const unsigned char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (a[i] != b[i]) return i;
    }
    return n;
}

/* Fresh memory is 0xFF to its last byte; an upload and a download give the bytes back. */
static void round_trip(size_t size, int threads)
{
    CHECK_EQ_INT(aclEmuSetThreads(threads), ACL_SUCCESS);
    unsigned char *host = malloc(size), *back = malloc(size), *dev = dev_alloc(size);
    CHECK(host != NULL && back != NULL);
    CHECK_EQ_INT(aclrtMemcpy(back, size, dev, size, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
    size_t not_ff = size;
    for (size_t i = 0; i < size; i++) {
        if (back[i] != 0xFF) { not_ff = i; break; }
    }
    if (not_ff != size) fprintf(stderr, "fresh %zu bytes, %d threads: byte %zu is not 0xFF\n", size, threads, not_ff);
    CHECK_EQ_INT(not_ff, size);
    pattern(host, size, (uint32_t)size);
    CHECK_EQ_INT(aclrtMemcpy(dev, size, host, size, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
    memset(back, 0, size);
    CHECK_EQ_INT(aclrtMemcpy(back, size, dev, size, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
    CHECK_EQ_INT(first_difference(host, back, size), size);
    CHECK_EQ_INT(aclrtFree(dev), ACL_SUCCESS);
    free(host);
    free(back);
}

/* A memset of [offset, offset + count) inside a patterned buffer changes exactly those bytes. */
static void partial_fill(size_t size, size_t offset, size_t count, int threads)
{
    CHECK_EQ_INT(aclEmuSetThreads(threads), ACL_SUCCESS);
    unsigned char *expected = malloc(size), *back = malloc(size);
    unsigned char *dev = dev_alloc(size);
    CHECK(expected != NULL && back != NULL);
    pattern(expected, size, 7);
    CHECK_EQ_INT(aclrtMemcpy(dev, size, expected, size, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtMemset(dev + offset, size - offset, 0x5A, count), ACL_SUCCESS);
    memset(expected + offset, 0x5A, count);
    CHECK_EQ_INT(aclrtMemcpy(back, size, dev, size, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
    CHECK_EQ_INT(first_difference(expected, back, size), size);
    CHECK_EQ_INT(aclrtFree(dev), ACL_SUCCESS);
    free(expected);
    free(back);
}

/* A device-to-device copy between overlapping ranges of one allocation (either direction) and
 * between two allocations, synchronous and queued, against memmove on a host copy. */
static void device_copies(size_t size, size_t shift, int threads)
{
    CHECK_EQ_INT(aclEmuSetThreads(threads), ACL_SUCCESS);
    unsigned char *expected = malloc(size), *back = malloc(size), *dev = dev_alloc(size), *other = dev_alloc(size);
    CHECK(expected != NULL && back != NULL);
    size_t count = size - shift;
    pattern(expected, size, 11);
    CHECK_EQ_INT(aclrtMemcpy(dev, size, expected, size, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);

    CHECK_EQ_INT(aclrtMemcpy(dev + shift, count, dev, count, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS);
    memmove(expected + shift, expected, count);
    CHECK_EQ_INT(aclrtMemcpy(dev, size, dev + shift, count, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS);
    memmove(expected, expected + shift, count);
    CHECK_EQ_INT(aclrtMemcpy(back, size, dev, size, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
    CHECK_EQ_INT(first_difference(expected, back, size), size);

    aclrtStream stream = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&stream), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtMemcpyAsync(other, size, dev, size, ACL_MEMCPY_DEVICE_TO_DEVICE, stream), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(stream), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtDestroyStream(stream), ACL_SUCCESS);
    memset(back, 0, size);
    CHECK_EQ_INT(aclrtMemcpy(back, size, other, size, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
    CHECK_EQ_INT(first_difference(expected, back, size), size);

    CHECK_EQ_INT(aclrtFree(dev), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(other), ACL_SUCCESS);
    free(expected);
    free(back);
}

int main(void)
{
    CHECK_EQ_INT(aclInit(NULL), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSetDevice(0), ACL_SUCCESS);
    const size_t sizes[] = {4096, 16 * MIB - 1, 16 * MIB, 24 * MIB + 4097, 41 * MIB + 13};
    const int thread_counts[] = {1, 2, 3, 7, 0};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        for (size_t t = 0; t < sizeof thread_counts / sizeof thread_counts[0]; t++) {
            round_trip(sizes[s], thread_counts[t]);
        }
    }
    for (size_t t = 0; t < sizeof thread_counts / sizeof thread_counts[0]; t++) {
        partial_fill(41 * MIB + 13, 4095, 33 * MIB + 1, thread_counts[t]);
        partial_fill(41 * MIB + 13, 1, 41 * MIB + 11, thread_counts[t]);
        device_copies(41 * MIB + 13, 1, thread_counts[t]);
        device_copies(41 * MIB + 13, 3 * MIB + 5, thread_counts[t]);
        device_copies(41 * MIB + 13, 20 * MIB + 7, thread_counts[t]);
    }
    CHECK_EQ_INT(aclEmuSetThreads(0), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtResetDevice(0), ACL_SUCCESS);
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);
    return emu_test_finish("test_bulk_copies");
}
