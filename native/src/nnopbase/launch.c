/*
 * The launch checks and phase 2 every operator shares (see launch.h): tensor handles, device
 * memory of the current device, aliasing, the workspace, the stream, and the queued task that
 * pins the memory its kernel uses until it has run.
 */
#include <stdlib.h>
#include <string.h>

#include "nnopbase/launch.h"

/* Device tensor addresses must be 32-byte aligned on Ascend. */
#define ADDR_ALIGNMENT 32
#define MAX_PINNED (2 * EMU_EXECUTOR_MAX_SLOTS + 1)

int aclEmu_view_bytes(const aclTensor *t, uintptr_t *start, size_t *len)
{
    /* aclCreateTensor made sure the bytes up to the last element fit int64; a FLOAT4 view's
     * range takes in the whole bytes its first and last elements share with neighbours. */
    uint64_t skip, span;
    uintptr_t first, end;
    if (aclEmu_element_bytes(t->dtype, t->offset, aclEmu_view_last_index(t) - t->offset + 1, &skip,
                             &span) != 0 ||
        __builtin_add_overflow((uintptr_t)t->data, skip, &first) ||
        __builtin_add_overflow(first, span, &end)) {
        return -1;
    }
    *start = first;
    *len = (size_t)span;
    return 0;
}

static int is_empty(const aclTensor *t) { return t == NULL || aclEmu_numel(t->dims, t->ndim) == 0; }

int aclEmu_check_tensors_live(const aclEmuOperator *op, const aclTensor *const *inputs,
                              size_t input_count, const aclTensor *const *outputs,
                              size_t output_count)
{
    int rc = 0;
    for (size_t i = 0; i < input_count && rc == 0; i++) {
        if (inputs[i] != NULL) {
            rc = aclEmu_require_handle(op->phase1_api, ACLNN_ERR_PARAM_INVALID, op->input_names[i],
                                       ACL_EMU_KIND_TENSOR, inputs[i]);
        }
    }
    for (size_t o = 0; o < output_count && rc == 0; o++) {
        if (outputs[o] != NULL) {
            rc = aclEmu_require_handle(op->phase1_api, ACLNN_ERR_PARAM_INVALID,
                                       op->output_names[o], ACL_EMU_KIND_TENSOR, outputs[o]);
        }
    }
    return rc;
}

/* Where a view's bytes are: len 0 when it has none (absent, empty, or no address yet). */
typedef struct {
    uintptr_t start;
    size_t len;
} byte_range;

/* A non-empty view's memory must be device memory of the `current` device, in bounds, from an
 * aligned address. Fills `range` for the aliasing checks and the pins. */
static int check_view_memory(const char *api, const char *name, const aclTensor *t,
                             int address_optional, int32_t current, byte_range *range)
{
    range->start = 0;
    range->len = 0;
    if (is_empty(t)) {
        return 0;
    }
    if (t->data == NULL) {
        if (address_optional) {
            return 0;
        }
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                           "%s has no device address (NULL data) at launch", name);
    }
    if ((uintptr_t)t->data % ADDR_ALIGNMENT != 0) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                           "%s address %p is not %d-byte aligned (put the offset in the "
                           "tensor's offset instead)",
                           name, t->data, ADDR_ALIGNMENT);
    }
    if (aclEmu_view_bytes(t, &range->start, &range->len) != 0) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                           "%s's view (offset %lld elements from %p) runs past the end of the "
                           "address space",
                           name, (long long)t->offset, t->data);
    }
    aclEmuRegion region = {0, 0, 0, 0};
    aclEmuRangeClass cls = aclEmu_mem_classify((const void *)range->start, range->len, &region);
    if (cls == EMU_RANGE_DEVICE) {
        return region.device == current
                   ? 0
                   : aclEmu_require_owner(api, ACLNN_ERR_PARAM_INVALID, name, region.device);
    }
    if (cls == EMU_RANGE_STRADDLES) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                           "%s's view covers %zu bytes from %p, which runs past the end of "
                           "device allocation %p of %zu bytes",
                           name, range->len, (void *)range->start, (void *)region.base,
                           region.size);
    }
    return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                       "%s data %p is not device memory (a host pointer, or device memory "
                       "that was freed); copy it with aclrtMemcpy to an aclrtMalloc buffer",
                       name, t->data);
}

/* An output must not write one element twice: sorted by stride, each dim must step past the
 * whole extent of the smaller ones. */
static int check_no_self_overlap(const char *api, const char *name, const aclTensor *t)
{
    if (t == NULL || aclEmu_numel(t->dims, t->ndim) <= 1) {
        return 0;
    }
    int64_t strides[EMU_MAX_DIMS], dims[EMU_MAX_DIMS];
    size_t n = 0;
    for (uint64_t i = 0; i < t->ndim; i++) {
        if (t->dims[i] > 1) {
            size_t at = n++;
            while (at > 0 && strides[at - 1] > t->strides[i]) {
                strides[at] = strides[at - 1];
                dims[at] = dims[at - 1];
                at--;
            }
            strides[at] = t->strides[i];
            dims[at] = t->dims[i];
        }
    }
    int64_t reach = 1;
    for (size_t i = 0; i < n; i++) {
        if (strides[i] < reach) {
            return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                               "%s has strides that make several of its elements share one "
                               "address; an output must not overlap itself",
                               name);
        }
        /* Past int64 nothing further can overlap: every later stride is smaller than that. */
        if (__builtin_mul_overflow(strides[i], dims[i], &reach)) {
            break;
        }
    }
    return 0;
}

static int ranges_overlap(const byte_range *a, const byte_range *b)
{
    return a->len > 0 && b->len > 0 && a->start < b->start + b->len &&
           b->start < a->start + a->len;
}

/* Outputs may not overlap each other or an input: the device writes tiles in parallel. */
static int check_aliasing(const aclEmuOperator *op, const char *api,
                          const aclTensor *const *outputs, const byte_range *in_ranges,
                          size_t input_count, const byte_range *out_ranges, size_t output_count)
{
    for (size_t o = 0; o < output_count; o++) {
        int rc = check_no_self_overlap(api, op->output_names[o], outputs[o]);
        if (rc != 0) return rc;
        for (size_t i = 0; i < input_count; i++) {
            if (ranges_overlap(&out_ranges[o], &in_ranges[i])) {
                return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                                   "%s overlaps %s in device memory; the operator does not "
                                   "work in place",
                                   op->output_names[o], op->input_names[i]);
            }
        }
        for (size_t other = o + 1; other < output_count; other++) {
            if (ranges_overlap(&out_ranges[o], &out_ranges[other])) {
                return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                                   "%s and %s overlap in device memory", op->output_names[o],
                                   op->output_names[other]);
            }
        }
    }
    return 0;
}

/* The memory checks of both phases; fills each tensor's byte range. */
static int check_memory(const aclEmuOperator *op, const char *api, const aclTensor *const *inputs,
                        size_t input_count, const aclTensor *const *outputs, size_t output_count,
                        int address_optional, byte_range *in_ranges, byte_range *out_ranges)
{
    int32_t current = aclEmu_current_device();
    int rc = 0;
    for (size_t i = 0; i < input_count && rc == 0; i++) {
        rc = check_view_memory(api, op->input_names[i], inputs[i], address_optional, current,
                               &in_ranges[i]);
    }
    for (size_t o = 0; o < output_count && rc == 0; o++) {
        rc = check_view_memory(api, op->output_names[o], outputs[o], address_optional, current,
                               &out_ranges[o]);
    }
    if (rc == 0) {
        rc = check_aliasing(op, api, outputs, in_ranges, input_count, out_ranges, output_count);
    }
    return rc;
}

int aclEmu_check_launch_memory(const aclEmuOperator *op, const char *api,
                               const aclTensor *const *inputs, size_t input_count,
                               const aclTensor *const *outputs, size_t output_count,
                               int address_optional)
{
    byte_range in_ranges[EMU_EXECUTOR_MAX_SLOTS], out_ranges[EMU_EXECUTOR_MAX_SLOTS];
    return check_memory(op, api, inputs, input_count, outputs, output_count, address_optional,
                        in_ranges, out_ranges);
}

/* ---- phase 2 ---- */

/* A launch as queued: its own copies of the views and the operator's data, and the memory
 * ranges pinned while the kernel runs. */
typedef struct {
    aclEmuTask task;
    const aclEmuOperator *op;
    aclEmuLaunch launch;
    aclTensor input_views[EMU_EXECUTOR_MAX_SLOTS];
    aclTensor output_views[EMU_EXECUTOR_MAX_SLOTS];
    const char *range_names[MAX_PINNED];
    const void *ranges[MAX_PINNED];
    size_t range_lengths[MAX_PINNED];
    size_t range_count;
    void *workspace;
    uint64_t workspace_size;
    uint64_t launch_number;
    uint32_t unread_inputs;
    void *op_data;
} launch_task;

static uint64_t launches;

/* Pseudo-random bytes that change with every launch: 64 fresh bytes, repeated. */
static void fill_garbage(void *workspace, uint64_t size, uint64_t seed)
{
    uint64_t pattern[8];
    uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 0xD1B54A32D192ED03ULL;
    for (int i = 0; i < 8; i++) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        pattern[i] = state;
    }
    unsigned char *p = workspace;
    uint64_t done = 0;
    for (; done + sizeof pattern <= size; done += sizeof pattern) {
        memcpy(p + done, pattern, sizeof pattern);
    }
    memcpy(p + done, pattern, (size_t)(size - done));
}

static int run_launch(aclEmuTask *task)
{
    launch_task *k = (launch_task *)task;
    size_t bad = aclEmu_mem_pin(k->ranges, k->range_lengths, k->range_count);
    if (bad != 0) {
        return aclEmu_fail(ACL_ERROR_RT_AICORE_EXCEPTION, "aclrtSynchronizeStream",
                           "the %s kernel queued by %s read %s at %p, which was freed (or no "
                           "longer fits its allocation) before the kernel ran",
                           k->op->name, k->op->phase2_api, k->range_names[bad - 1],
                           k->ranges[bad - 1]);
    }
    if (k->workspace_size > 0) {
        fill_garbage(k->workspace, k->workspace_size, k->launch_number);
    }
    int rc = k->op->kernel(&k->launch);
    aclEmu_mem_unpin(k->ranges, k->range_count);
    return rc;
}

static void release_launch(aclEmuTask *task)
{
    launch_task *k = (launch_task *)task;
    free(k->op_data);
    free(k);
}

static void pin_range(launch_task *k, const char *name, const void *start, size_t len)
{
    k->range_names[k->range_count] = name;
    k->ranges[k->range_count] = start;
    k->range_lengths[k->range_count] = len;
    k->range_count++;
}


/* Takes what the executor holds into a new task (a single-use executor is used up by this,
 * whatever happens next). NULL with *rc set when the executor cannot be used. */
static launch_task *take_executor(const aclEmuOperator *op, aclOpExecutor *executor, int *rc)
{
    const char *api = op->phase2_api;
    launch_task *k = NULL;
    aclEmu_executor_lock();
    if (executor == NULL) {
        *rc = aclEmu_fail(ACLNN_ERR_PARAM_NULLPTR, api, "executor is NULL");
    } else if (!aclEmu_handle_is(ACL_EMU_KIND_EXECUTOR, executor)) {
        char why[200];
        aclEmu_handle_describe(ACL_EMU_KIND_EXECUTOR, executor, why, sizeof why);
        *rc = aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                          "executor: %s (executors are single-use unless made repeatable with "
                          "aclSetAclOpExecutorRepeatable)",
                          why);
    } else if (executor->op != op) {
        *rc = aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api, "executor was made for operator %s, not %s",
                          executor->op->name, op->name);
    } else {
        /* Not zeroed: only the views in use are copied (a whole task is several KiB). */
        k = malloc(sizeof *k);
        void *data = k != NULL ? malloc(executor->op_data_size ? executor->op_data_size : 1) : NULL;
        int32_t owner = executor->device;
        if (data != NULL) {
            memcpy(data, executor->op_data, executor->op_data_size);
            k->task.next = NULL;
            k->range_count = 0;
            k->workspace = NULL;
            k->op = op;
            k->op_data = data;
            k->launch.op_data = data;
            k->launch.input_count = executor->input_count;
            k->launch.output_count = executor->output_count;
            for (size_t i = 0; i < executor->input_count; i++) {
                k->input_views[i] = executor->inputs[i].view;
                k->launch.inputs[i] = executor->inputs[i].handle ? &k->input_views[i] : NULL;
            }
            for (size_t o = 0; o < executor->output_count; o++) {
                k->output_views[o] = executor->outputs[o].view;
                k->launch.outputs[o] = executor->outputs[o].handle ? &k->output_views[o] : NULL;
            }
            k->workspace_size = executor->workspace_size;
            k->unread_inputs = executor->unread_inputs;
        } else {
            free(k);
            k = NULL;
        }
        executor->launches++;
        if (!executor->repeatable) {
            aclEmu_executor_free_locked(executor, "consumed by a launch");
        }
        *rc = k == NULL ? aclEmu_fail(ACLNN_ERR_INNER, api, "out of host memory") : 0;
        int32_t current = aclEmu_current_device();
        if (*rc == 0 && current >= 0 && owner != current) {
            *rc = aclEmu_require_owner(api, ACLNN_ERR_PARAM_INVALID, "executor", owner);
        }
    }
    aclEmu_executor_unlock();
    if (*rc != 0 && k != NULL) {
        release_launch(&k->task);
        k = NULL;
    }
    return k;
}

static int check_workspace(const char *api, void *workspace, uint64_t workspace_size,
                           uint64_t required)
{
    if (required == 0) {
        return 0;
    }
    if (workspace == NULL) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                           "workspace is NULL but phase 1 asked for %llu bytes",
                           (unsigned long long)required);
    }
    if (workspace_size < required) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                           "workspaceSize %llu is smaller than the %llu bytes phase 1 asked for",
                           (unsigned long long)workspace_size, (unsigned long long)required);
    }
    aclEmuRegion region = {0, 0, 0, 0};
    if (aclEmu_mem_classify(workspace, (size_t)required, &region) != EMU_RANGE_DEVICE) {
        char where[200];
        aclEmu_mem_describe(workspace, (size_t)required, where, sizeof where);
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                           "workspace must be %llu bytes of device memory; it is %s",
                           (unsigned long long)required, where);
    }
    return region.device == aclEmu_current_device()
               ? 0
               : aclEmu_require_owner(api, ACLNN_ERR_PARAM_INVALID, "workspace", region.device);
}

aclnnStatus aclEmu_launch(const aclEmuOperator *op, void *workspace, uint64_t workspace_size,
                          aclOpExecutor *executor, aclrtStream stream)
{
    const char *api = op->phase2_api;
    int rc = 0;
    launch_task *k = take_executor(op, executor, &rc);
    if (rc == 0) rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_device(api);
    byte_range in_ranges[EMU_EXECUTOR_MAX_SLOTS], out_ranges[EMU_EXECUTOR_MAX_SLOTS];
    if (rc == 0) {
        rc = check_memory(op, api, k->launch.inputs, k->launch.input_count, k->launch.outputs,
                          k->launch.output_count, 0, in_ranges, out_ranges);
    }
    if (rc == 0) rc = check_workspace(api, workspace, workspace_size, k->workspace_size);
    /* aclnn reports a bad stream as a bad parameter. */
    void *resolved = rc == 0 ? aclEmu_stream_resolve(stream, api, ACLNN_ERR_PARAM_INVALID, &rc)
                             : NULL;
    if (rc != 0) {
        if (k != NULL) release_launch(&k->task);
        return rc;
    }
    int writes = 0;
    for (size_t o = 0; o < k->launch.output_count; o++) {
        writes |= out_ranges[o].len > 0;
    }
    if (!writes) {
        aclEmu_stream_unref(resolved);
        release_launch(&k->task);
        return ACLNN_SUCCESS;
    }
    for (size_t i = 0; i < k->launch.input_count; i++) {
        if (in_ranges[i].len > 0 && !(k->unread_inputs & (1u << i))) {
            pin_range(k, op->input_names[i], (const void *)in_ranges[i].start, in_ranges[i].len);
        }
    }
    for (size_t o = 0; o < k->launch.output_count; o++) {
        if (out_ranges[o].len > 0) {
            pin_range(k, op->output_names[o], (const void *)out_ranges[o].start,
                      out_ranges[o].len);
        }
    }
    if (k->workspace_size > 0) {
        pin_range(k, "workspace", workspace, (size_t)k->workspace_size);
        k->workspace = workspace;
    }
    k->task.run = run_launch;
    k->task.release = release_launch;
    k->launch_number = __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
    aclEmu_stream_enqueue(resolved, &k->task);
    return ACLNN_SUCCESS;
}
