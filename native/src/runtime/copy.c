/*
 * Copies and fills: aclrtMemcpy, aclrtMemcpyAsync and aclrtMemset, checked against where their
 * pointers live (device memory of the current device, or host memory) and what their kind says.
 */
#include <stdlib.h>

#include "common/emu_internal.h"
#include "runtime/bulk.h"

static const char *memcpy_kind_name(int kind)
{
    switch (kind) {
    case ACL_MEMCPY_HOST_TO_HOST: return "ACL_MEMCPY_HOST_TO_HOST";
    case ACL_MEMCPY_HOST_TO_DEVICE: return "ACL_MEMCPY_HOST_TO_DEVICE";
    case ACL_MEMCPY_DEVICE_TO_HOST: return "ACL_MEMCPY_DEVICE_TO_HOST";
    case ACL_MEMCPY_DEVICE_TO_DEVICE: return "ACL_MEMCPY_DEVICE_TO_DEVICE";
    case ACL_MEMCPY_DEFAULT: return "ACL_MEMCPY_DEFAULT";
    default: return "unknown";
    }
}

/* One side of a copy must be device memory (want_device) or host memory; checks it and
 * records in *is_device whether it is device memory now. */
static int check_side(const char *api, const char *side, const void *ptr, size_t count,
                      int want_device, int kind, int *is_device)
{
    aclEmuRegion region = {0, 0, 0, 0};
    aclEmuRangeClass cls = aclEmu_mem_classify(ptr, count, &region);
    *is_device = cls == EMU_RANGE_DEVICE;
    if (cls == EMU_RANGE_STRADDLES && region.size == 0) {   /* no allocation: the range wraps */
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api,
                           "%s range [%p, +%zu) wraps past the top of the address space", side,
                           ptr, count);
    }
    if (cls == EMU_RANGE_STRADDLES) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api,
                           "%s range [%p, +%zu) runs past the end of device allocation %p of "
                           "%zu bytes (offset %zu)",
                           side, ptr, count, (void *)region.base, region.size, region.offset);
    }
    if (cls == EMU_RANGE_DEVICE && want_device != 0) {
        int rc = aclEmu_require_owner(api, ACL_ERROR_RT_PARAM_INVALID, side, region.device);
        if (rc != 0) return rc;
    }
    if (want_device < 0) {
        return 0;   /* ACL_MEMCPY_DEFAULT: either is fine */
    }
    if (want_device && cls != EMU_RANGE_DEVICE) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api,
                           "kind %s needs %s in device memory, but %p is host memory or freed "
                           "device memory",
                           memcpy_kind_name(kind), side, ptr);
    }
    if (!want_device && cls != EMU_RANGE_HOST) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api,
                           "kind %s needs %s in host memory, but %p is device memory "
                           "(allocation %p)",
                           memcpy_kind_name(kind), side, ptr, (void *)region.base);
    }
    return 0;
}

/* Checks a copy; fills which sides are device memory, so that the copy can insist on it
 * when it runs (a side freed meanwhile must fail, not be written as if it were host memory). */
static int check_copy(const char *api, void *dst, size_t destMax, const void *src, size_t count,
                      aclrtMemcpyKind kind, int *dst_is_device, int *src_is_device)
{
    *dst_is_device = 0;
    *src_is_device = 0;
    if (dst == NULL || src == NULL) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api, "%s is NULL", dst == NULL ? "dst" : "src");
    }
    if (count > destMax) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api, "count %zu is larger than destMax %zu",
                           count, destMax);
    }
    int dst_device, src_device;
    switch ((int)kind) {
    case ACL_MEMCPY_HOST_TO_HOST: dst_device = 0; src_device = 0; break;
    case ACL_MEMCPY_HOST_TO_DEVICE: dst_device = 1; src_device = 0; break;
    case ACL_MEMCPY_DEVICE_TO_HOST: dst_device = 0; src_device = 1; break;
    case ACL_MEMCPY_DEVICE_TO_DEVICE: dst_device = 1; src_device = 1; break;
    case ACL_MEMCPY_DEFAULT: dst_device = -1; src_device = -1; break;
    default:
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api, "kind %d is not an aclrtMemcpyKind (0..4)",
                           (int)kind);
    }
    if (count == 0) {
        return 0;
    }
    int rc = check_side(api, "dst", dst, count, dst_device, kind, dst_is_device);
    if (rc == 0) rc = check_side(api, "src", src, count, src_device, kind, src_is_device);
    return rc;
}

/* Copies with the device sides (as classified when the copy was checked) pinned; fails if
 * one of them was freed since. */
static int pinned_copy(const char *api, void *dst, const void *src, size_t count,
                       int dst_is_device, int src_is_device)
{
    const void *ptrs[2];
    size_t lens[2];
    size_t n = 0;
    if (dst_is_device) {
        ptrs[n] = dst; lens[n] = count; n++;
    }
    if (src_is_device) {
        ptrs[n] = src; lens[n] = count; n++;
    }
    if (aclEmu_mem_pin(ptrs, lens, n) != 0) {
        return aclEmu_fail(ACL_ERROR_RT_INTERNAL_ERROR, api,
                           "device memory of the copy was freed before the copy ran");
    }
    aclEmu_bulk_copy(dst, src, count);
    aclEmu_mem_unpin(ptrs, n);
    return 0;
}

EMU_EXPORT aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
                                aclrtMemcpyKind kind)
{
    static const char api[] = "aclrtMemcpy";
    int dst_is_device = 0, src_is_device = 0;
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_device(api);
    if (rc == 0) {
        rc = check_copy(api, dst, destMax, src, count, kind, &dst_is_device, &src_is_device);
    }
    if (rc != 0 || count == 0) return rc;
    /* Synchronous for the host, but it does not wait for queued stream work: reading results
     * that were not synchronised gives what the memory held before. */
    return pinned_copy(api, dst, src, count, dst_is_device, src_is_device);
}

typedef struct {
    aclEmuTask task;
    void *dst;
    const void *src;
    size_t count;
    int dst_is_device;
    int src_is_device;
} copy_task;

static int run_copy(aclEmuTask *task)
{
    copy_task *copy = (copy_task *)task;
    return pinned_copy("aclrtMemcpyAsync", copy->dst, copy->src, copy->count, copy->dst_is_device,
                       copy->src_is_device);
}

static void release_copy(aclEmuTask *task) { free(task); }

EMU_EXPORT aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
                                     aclrtMemcpyKind kind, aclrtStream stream)
{
    static const char api[] = "aclrtMemcpyAsync";
    int dst_is_device = 0, src_is_device = 0;
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_device(api);
    if (rc == 0) {
        rc = check_copy(api, dst, destMax, src, count, kind, &dst_is_device, &src_is_device);
    }
    if (rc != 0) return rc;
    void *resolved = aclEmu_stream_resolve(stream, api, ACL_ERROR_INVALID_RESOURCE_HANDLE, &rc);
    if (resolved == NULL) return rc;
    if (count == 0) {
        aclEmu_stream_unref(resolved);   /* nothing to queue: drop the reference resolve took */
        return ACL_SUCCESS;
    }
    copy_task *copy = calloc(1, sizeof *copy);
    if (copy == NULL) {
        aclEmu_stream_unref(resolved);
        return aclEmu_fail(ACL_ERROR_BAD_ALLOC, api, "out of host memory queueing the copy");
    }
    copy->task.run = run_copy;
    copy->task.release = release_copy;
    copy->dst = dst;
    copy->src = src;
    copy->count = count;
    copy->dst_is_device = dst_is_device;
    copy->src_is_device = src_is_device;
    aclEmu_stream_enqueue(resolved, &copy->task);
    return ACL_SUCCESS;
}

EMU_EXPORT aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count)
{
    static const char api[] = "aclrtMemset";
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_device(api);
    if (rc != 0) return rc;
    if (devPtr == NULL) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api, "devPtr is NULL");
    }
    if (count > maxCount) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api, "count %zu is larger than maxCount %zu",
                           count, maxCount);
    }
    if (count == 0) {
        return ACL_SUCCESS;
    }
    aclEmuRegion region = {0, 0, 0, 0};
    if (aclEmu_mem_classify(devPtr, count, &region) == EMU_RANGE_DEVICE) {
        rc = aclEmu_require_owner(api, ACL_ERROR_RT_PARAM_INVALID, "devPtr", region.device);
        if (rc != 0) return rc;
    }
    const void *ptrs[1] = {devPtr};
    size_t lens[1] = {count};
    if (aclEmu_mem_pin(ptrs, lens, 1) != 0) {
        char where[200];
        aclEmu_mem_describe(devPtr, count, where, sizeof where);
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api,
                           "[devPtr, devPtr + %zu) must lie in one device allocation; it is %s",
                           count, where);
    }
    aclEmu_bulk_fill(devPtr, value & 0xff, count);
    aclEmu_mem_unpin(ptrs, 1);
    return ACL_SUCCESS;
}
