/*
 * aclnnSwigluGroupQuantGrad: phase 1 validates everything and records an executor; phase 2
 * checks the launch (executor, stream, workspace, device addresses) and queues the kernel on the
 * stream, where it runs at the next synchronisation.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aclnnop/aclnn_swiglu_group_quant_grad.h"
#include "common/meta_internal.h"
#include "swiglu_kernel.h"

static const char PHASE1[] = "aclnnSwigluGroupQuantGradGetWorkspaceSize";
static const char PHASE2[] = "aclnnSwigluGroupQuantGrad";
static const char OP_NAME[] = "SwigluGroupQuantGrad";

/* Device tensor addresses must be 32-byte aligned on Ascend. */
#define ADDR_ALIGNMENT 32
/* Scratch the operator asks for whenever it has rows to process. */
#define WORKSPACE_BYTES ((uint64_t)16 << 10)

enum { IN_GRAD_Y, IN_X, IN_WEIGHT, IN_Y_ORIGIN, IN_GROUP_INDEX };
enum { OUT_GRAD_X, OUT_GRAD_WEIGHT };

static const char *const input_names[] = {"gradY", "x", "weightOptional", "yOriginOptional",
                                          "groupIndexOptional"};
static const char *const output_names[] = {"gradXOut", "gradWeightOutOptional"};

typedef struct {
    int abi;
    int clamp_on;
    float clamp;
    int64_t rows;
    int64_t hidden;
    swiglu_group_mode group_mode;
    uint64_t group_count;
    int64_t group_values[];   /* revision 1 only */
} op_data;

/* ---- small helpers ---- */

static int abi_revision(int *abi)
{
    const char *text = getenv("ACL_SWIGLU_ABI");
    if (text == NULL || *text == '\0' || strcmp(text, "2") == 0) {
        *abi = 2;
        return 0;
    }
    if (strcmp(text, "1") == 0) {
        *abi = 1;
        return 0;
    }
    return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE1,
                       "ACL_SWIGLU_ABI=\"%s\" is not a revision of this operator's ABI (1 or 2)",
                       text);
}

static size_t element_size(const aclTensor *t) { return aclEmu_dtype_size(t->dtype); }

static void format_shape(const aclTensor *t, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (uint64_t i = 0; i < t->ndim && used < size; i++) {
        used += (size_t)snprintf(buf + used, size - used, i ? ", %lld" : "%lld",
                                 (long long)t->dims[i]);
    }
    if (used < size) snprintf(buf + used, size - used, "]");
}

static int same_shape(const aclTensor *a, const aclTensor *b)
{
    if (a->ndim != b->ndim) return 0;
    for (uint64_t i = 0; i < a->ndim; i++) {
        if (a->dims[i] != b->dims[i]) return 0;
    }
    return 1;
}

static int live_tensor(const char *api, const char *name, const aclTensor *t)
{
    if (t == NULL || aclEmu_handle_is(ACL_EMU_KIND_TENSOR, t)) {
        return 0;
    }
    char why[200];
    aclEmu_handle_describe(ACL_EMU_KIND_TENSOR, t, why, sizeof why);
    return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api, "%s: %s", name, why);
}

static int shape_error(const char *fmt, ...) EMU_PRINTF(1, 2);
static int shape_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    aclEmu_vfail(ACLNN_ERR_INNER_TILING_ERROR, PHASE1, fmt, ap);
    va_end(ap);
    return ACLNN_ERR_INNER_TILING_ERROR;
}

/* Byte range a non-empty view covers: [*start, *start + *len). */
static void view_bytes(const aclTensor *t, uintptr_t *start, size_t *len)
{
    size_t es = element_size(t);
    *start = (uintptr_t)t->data + (uintptr_t)t->offset * es;
    *len = (size_t)(aclEmu_view_last_index(t) - t->offset + 1) * es;
}

/* A non-empty view's memory must be device memory, in bounds, from an aligned address. */
static int check_view_memory(const char *api, const char *name, const aclTensor *t,
                             int address_optional)
{
    if (t == NULL || aclEmu_numel(t->dims, t->ndim) == 0) {
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
    uintptr_t start;
    size_t len;
    view_bytes(t, &start, &len);
    aclEmuRegion region = {0, 0, 0};
    aclEmuRangeClass cls = aclEmu_mem_classify((const void *)start, len, &region);
    if (cls == EMU_RANGE_DEVICE) {
        return 0;
    }
    if (cls == EMU_RANGE_STRADDLES) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                           "%s's view covers %zu bytes from %p, which runs past the end of "
                           "device allocation %p of %zu bytes",
                           name, len, (void *)start, (void *)region.base, region.size);
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
        reach = strides[i] * dims[i];
    }
    return 0;
}

static int ranges_overlap(const aclTensor *a, const aclTensor *b)
{
    if (a == NULL || b == NULL || a->data == NULL || b->data == NULL ||
        aclEmu_numel(a->dims, a->ndim) == 0 || aclEmu_numel(b->dims, b->ndim) == 0) {
        return 0;
    }
    uintptr_t sa, sb;
    size_t la, lb;
    view_bytes(a, &sa, &la);
    view_bytes(b, &sb, &lb);
    return sa < sb + lb && sb < sa + la;
}

/* Outputs may not overlap each other or an input: the device writes tiles in parallel. */
static int check_aliasing(const char *api, const aclTensor *const inputs[5],
                          const aclTensor *const outputs[2])
{
    for (int o = 0; o < 2; o++) {
        int rc = check_no_self_overlap(api, output_names[o], outputs[o]);
        if (rc != 0) return rc;
        for (int i = 0; i < 5; i++) {
            if (ranges_overlap(outputs[o], inputs[i])) {
                return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                                   "%s overlaps %s in device memory; the operator does not "
                                   "work in place",
                                   output_names[o], input_names[i]);
            }
        }
    }
    if (ranges_overlap(outputs[0], outputs[1])) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                           "gradXOut and gradWeightOutOptional overlap in device memory");
    }
    return 0;
}

/* ---- phase 1 ---- */

static int check_dtypes(const aclTensor *grad_y, const aclTensor *x, const aclTensor *weight,
                        const aclTensor *y_origin, const aclTensor *group_index, int abi,
                        const aclTensor *grad_x, const aclTensor *grad_weight)
{
    const aclTensor *all[] = {grad_y, x, weight, y_origin, abi == 2 ? group_index : NULL,
                              grad_x, grad_weight};
    const char *names[] = {"gradY", "x", "weightOptional", "yOriginOptional",
                           "groupIndexOptional", "gradXOut", "gradWeightOutOptional"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (all[i] != NULL && all[i]->format != ACL_FORMAT_ND) {
            return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE1,
                               "%s has format %s; only ND is supported", names[i],
                               aclEmu_format_name(all[i]->format));
        }
    }
    aclDataType io = grad_y->dtype;
    if (io != ACL_FLOAT && io != ACL_FLOAT16 && io != ACL_BF16) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE1,
                           "gradY has dtype %s; it must be FLOAT, FLOAT16 or BF16",
                           aclEmu_dtype_name(io));
    }
    const aclTensor *same[] = {x, y_origin, grad_x};
    const char *same_names[] = {"x", "yOriginOptional", "gradXOut"};
    for (int i = 0; i < 3; i++) {
        if (same[i] != NULL && same[i]->dtype != io) {
            return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE1,
                               "%s has dtype %s but gradY has %s; they must match",
                               same_names[i], aclEmu_dtype_name(same[i]->dtype),
                               aclEmu_dtype_name(io));
        }
    }
    if (weight != NULL && weight->dtype != ACL_FLOAT) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE1,
                           "weightOptional has dtype %s; it must be FLOAT",
                           aclEmu_dtype_name(weight->dtype));
    }
    if (grad_weight != NULL && grad_weight->dtype != ACL_FLOAT) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE1,
                           "gradWeightOutOptional has dtype %s; it must be FLOAT",
                           aclEmu_dtype_name(grad_weight->dtype));
    }
    if (abi == 2 && group_index != NULL && group_index->dtype != ACL_INT64) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE1,
                           "groupIndexOptional has dtype %s; it must be INT64",
                           aclEmu_dtype_name(group_index->dtype));
    }
    return 0;
}

static int check_shapes(const aclTensor *grad_y, const aclTensor *x, const aclTensor *weight,
                        const aclTensor *y_origin, const aclTensor *group_index, int abi,
                        double clamp_limit, const aclTensor *grad_x,
                        const aclTensor *grad_weight, int64_t *rows, int64_t *hidden)
{
    char a[160], b[160];
    uint64_t min_rank = abi == 1 ? 2 : 1, max_rank = abi == 1 ? 3 : SWIGLU_MAX_RANK;
    format_shape(grad_y, a, sizeof a);
    if (grad_y->ndim < min_rank || grad_y->ndim > max_rank) {
        return shape_error("gradY has rank %llu (shape %s); ABI revision %d supports ranks %llu-%llu",
                           (unsigned long long)grad_y->ndim, a, abi,
                           (unsigned long long)min_rank, (unsigned long long)max_rank);
    }
    format_shape(x, b, sizeof b);
    if (x->ndim != grad_y->ndim) {
        return shape_error("x has rank %llu (shape %s) but gradY has rank %llu (shape %s)",
                           (unsigned long long)x->ndim, b, (unsigned long long)grad_y->ndim, a);
    }
    uint64_t last = grad_y->ndim - 1;
    for (uint64_t d = 0; d < last; d++) {
        if (x->dims[d] != grad_y->dims[d]) {
            return shape_error("x %s and gradY %s differ in dim %llu; all but the last dim must "
                               "match",
                               b, a, (unsigned long long)d);
        }
    }
    if (x->dims[last] % 2 != 0) {
        return shape_error("x's last dim is %lld; it must be even (2H)", (long long)x->dims[last]);
    }
    if (grad_y->dims[last] * 2 != x->dims[last]) {
        return shape_error("gradY's last dim is %lld but x's is %lld; gradY's must be half of x's",
                           (long long)grad_y->dims[last], (long long)x->dims[last]);
    }
    if (!same_shape(grad_x, x)) {
        format_shape(grad_x, a, sizeof a);
        return shape_error("gradXOut has shape %s but x has %s; they must match", a, b);
    }
    int64_t t_rows = aclEmu_numel(grad_y->dims, last);
    if (t_rows < 0) {
        return shape_error("gradY's leading dims overflow int64");
    }
    if (y_origin != NULL && !same_shape(y_origin, grad_y)) {
        format_shape(grad_y, a, sizeof a);
        format_shape(y_origin, b, sizeof b);
        return shape_error("yOriginOptional has shape %s but gradY has %s; they must match", b, a);
    }
    if (weight != NULL) {
        format_shape(weight, b, sizeof b);
        if (y_origin == NULL) {
            return shape_error("weightOptional is given without yOriginOptional; gradWeight needs "
                               "both");
        }
        if (grad_weight == NULL) {
            return shape_error("weightOptional is given without gradWeightOutOptional to receive "
                               "its gradient");
        }
        if (abi == 1) {
            int ok = weight->ndim == grad_y->ndim && weight->dims[last] == 1;
            for (uint64_t d = 0; ok && d < last; d++) {
                ok = weight->dims[d] == grad_y->dims[d];
            }
            if (!ok) {
                format_shape(grad_y, a, sizeof a);
                return shape_error("weightOptional has shape %s; with gradY %s it must be gradY's "
                                   "leading dims followed by 1 (ABI revision 1)",
                                   b, a);
            }
        } else {
            int64_t n = aclEmu_numel(weight->dims, weight->ndim);
            if (weight->ndim < 1 || weight->ndim > SWIGLU_MAX_RANK || n != t_rows) {
                return shape_error("weightOptional has shape %s (%lld elements); it must hold T = "
                                   "%lld elements, one per row, in 1-%d dims",
                                   b, (long long)n, (long long)t_rows, SWIGLU_MAX_RANK);
            }
        }
        if (!same_shape(grad_weight, weight)) {
            format_shape(grad_weight, a, sizeof a);
            return shape_error("gradWeightOutOptional has shape %s but weightOptional has %s; "
                               "they must match",
                               a, b);
        }
    } else if (grad_weight != NULL) {
        return shape_error("gradWeightOutOptional is given without weightOptional");
    }
    if (abi == 2 && group_index != NULL && group_index->ndim != 1) {
        format_shape(group_index, a, sizeof a);
        return shape_error("groupIndexOptional has shape %s; it must be 1-D [G]", a);
    }
    if (abi == 1) {
        if (!(clamp_limit >= 0.0)) {
            return shape_error("clampLimit is %g; ABI revision 1 needs clampLimit >= 0 (0 = off)",
                               clamp_limit);
        }
    } else if (clamp_limit != ACLNN_SWIGLU_CLAMP_OFF && !(clamp_limit > 0.0)) {
        return shape_error("clampLimit is %g; it must be > 0, or -1.0 for off", clamp_limit);
    }
    *rows = t_rows;
    *hidden = grad_y->dims[last];
    return 0;
}

static void copy_view(const aclTensor *t, aclEmuSlot *slot)
{
    slot->handle = t;
    if (t != NULL) {
        slot->view = *t;
    }
}

EMU_EXPORT aclnnStatus aclnnSwigluGroupQuantGradGetWorkspaceSize(
    const aclTensor *gradY, const aclTensor *x, const aclTensor *weightOptional,
    const aclTensor *yOriginOptional, const aclTensor *groupIndexOptional, double clampLimit,
    const aclTensor *gradXOut, const aclTensor *gradWeightOutOptional, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    int abi = 2;
    int rc = aclEmu_fault(PHASE1);
    if (rc == 0) rc = aclEmu_require_device(PHASE1);
    if (rc == 0) rc = abi_revision(&abi);
    if (rc != 0) return rc;
    if (executor != NULL) *executor = NULL;

    const char *missing = gradY == NULL ? "gradY" : x == NULL ? "x" : gradXOut == NULL ? "gradXOut"
                        : workspaceSize == NULL ? "workspaceSize" : executor == NULL ? "executor"
                        : NULL;
    if (missing != NULL) {
        return aclEmu_fail(ACLNN_ERR_PARAM_NULLPTR, PHASE1, "%s is NULL", missing);
    }
    const aclTensor *group_tensor = abi == 2 ? groupIndexOptional : NULL;
    const aclIntArray *group_array = abi == 1 ? (const aclIntArray *)groupIndexOptional : NULL;
    const aclTensor *inputs[5] = {gradY, x, weightOptional, yOriginOptional, group_tensor};
    const aclTensor *outputs[2] = {gradXOut, gradWeightOutOptional};
    for (int i = 0; i < 5 && rc == 0; i++) rc = live_tensor(PHASE1, input_names[i], inputs[i]);
    for (int o = 0; o < 2 && rc == 0; o++) rc = live_tensor(PHASE1, output_names[o], outputs[o]);
    if (rc == 0 && group_array != NULL && !aclEmu_handle_is(ACL_EMU_KIND_INT_ARRAY, group_array)) {
        char why[200];
        aclEmu_handle_describe(ACL_EMU_KIND_INT_ARRAY, group_array, why, sizeof why);
        rc = aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE1,
                         "groupIndexOptional: %s (ABI revision 1 takes an aclIntArray)", why);
    }
    if (rc != 0) return rc;

    rc = check_dtypes(gradY, x, weightOptional, yOriginOptional, group_tensor, abi, gradXOut,
                      gradWeightOutOptional);
    int64_t rows = 0, hidden = 0;
    if (rc == 0) {
        rc = check_shapes(gradY, x, weightOptional, yOriginOptional, group_tensor, abi, clampLimit,
                          gradXOut, gradWeightOutOptional, &rows, &hidden);
    }
    for (int i = 0; i < 5 && rc == 0; i++) {
        rc = check_view_memory(PHASE1, input_names[i], inputs[i], 1);
    }
    for (int o = 0; o < 2 && rc == 0; o++) {
        rc = check_view_memory(PHASE1, output_names[o], outputs[o], 1);
    }
    if (rc == 0) rc = check_aliasing(PHASE1, inputs, outputs);
    if (rc != 0) return rc;

    uint64_t group_count = group_array != NULL ? group_array->size : 0;
    op_data *data = malloc(sizeof *data + (size_t)group_count * sizeof(int64_t));
    aclOpExecutor *made = data != NULL ? aclEmu_executor_new(OP_NAME) : NULL;
    if (made == NULL) {
        free(data);
        return aclEmu_fail(ACLNN_ERR_INNER_CREATE_EXECUTOR, PHASE1, "out of host memory");
    }
    data->abi = abi;
    /* The kernel works with c = (float)clampLimit, and clamps when c > 0 (a tiny positive
     * limit that rounds to 0 in fp32 turns it off rather than masking everything). */
    data->clamp = swiglu_float_nearest(clampLimit);   /* the caller's rounding mode must not move the limit */
    data->clamp_on = clampLimit != ACLNN_SWIGLU_CLAMP_OFF && data->clamp > 0.0f;
    data->rows = rows;
    data->hidden = hidden;
    data->group_count = group_count;
    data->group_mode = group_array != NULL  ? SWIGLU_GROUPS_HOST
                       : group_tensor != NULL ? SWIGLU_GROUPS_DEVICE
                                              : SWIGLU_GROUPS_NONE;
    if (group_count > 0) {
        memcpy(data->group_values, group_array->values, (size_t)group_count * sizeof(int64_t));
    }
    made->op_data = data;
    made->op_data_free = free;
    made->input_count = abi == 2 ? 5 : 4;
    made->output_count = 2;
    for (size_t i = 0; i < made->input_count; i++) copy_view(inputs[i], &made->inputs[i]);
    for (int o = 0; o < 2; o++) copy_view(outputs[o], &made->outputs[o]);
    made->workspace_size = rows > 0 ? WORKSPACE_BYTES : 0;
    *workspaceSize = made->workspace_size;
    *executor = made;
    return ACLNN_SUCCESS;
}

/* ---- phase 2 ---- */

#define MAX_PINNED 8

typedef struct {
    aclEmuTask task;
    swiglu_kernel_args args;
    const char *range_names[MAX_PINNED];
    const void *ranges[MAX_PINNED];
    size_t range_lengths[MAX_PINNED];
    size_t range_count;
    void *workspace;
    uint64_t workspace_size;
    uint64_t launch_number;
    op_data *data;   /* owned copy (revision 1 group values live in it) */
} kernel_task;

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

static int run_kernel(aclEmuTask *task)
{
    kernel_task *k = (kernel_task *)task;
    size_t bad = aclEmu_mem_pin(k->ranges, k->range_lengths, k->range_count);
    if (bad != 0) {
        return aclEmu_fail(ACL_ERROR_RT_AICORE_EXCEPTION, "aclrtSynchronizeStream",
                           "the %s kernel queued by %s read %s at %p, which was freed (or no "
                           "longer fits its allocation) before the kernel ran",
                           OP_NAME, PHASE2, k->range_names[bad - 1], k->ranges[bad - 1]);
    }
    if (k->workspace_size > 0) {
        fill_garbage(k->workspace, k->workspace_size, k->launch_number);
    }
    int rc = swiglu_kernel_run(&k->args, aclEmu_thread_count(),
                               (swiglu_kernel_variant)aclEmu_kernel_variant());
    aclEmu_mem_unpin(k->ranges, k->range_count);
    if (rc != 0) {
        return aclEmu_fail(ACL_ERROR_RT_INTERNAL_ERROR, "aclrtSynchronizeStream",
                           "the %s kernel ran out of host memory for scratch", OP_NAME);
    }
    return 0;
}

static void release_kernel(aclEmuTask *task)
{
    kernel_task *k = (kernel_task *)task;
    free(k->data);
    free(k);
}

static void to_kernel_view(const aclTensor *t, swiglu_view *v)
{
    memset(v, 0, sizeof *v);
    if (t == NULL) return;
    v->data = (char *)t->data + (size_t)t->offset * element_size(t);
    v->ndim = (int64_t)t->ndim;
    for (uint64_t i = 0; i < t->ndim && i < SWIGLU_MAX_RANK; i++) {
        v->dims[i] = t->dims[i];
        v->strides[i] = t->strides[i];
    }
}

static void add_range(kernel_task *k, const char *name, const aclTensor *t)
{
    if (t == NULL || aclEmu_numel(t->dims, t->ndim) == 0) return;
    uintptr_t start;
    size_t len;
    view_bytes(t, &start, &len);
    k->range_names[k->range_count] = name;
    k->ranges[k->range_count] = (const void *)start;
    k->range_lengths[k->range_count] = len;
    k->range_count++;
}

EMU_EXPORT aclnnStatus aclnnSwigluGroupQuantGrad(void *workspace, uint64_t workspaceSize,
                                                 aclOpExecutor *executor, aclrtStream stream)
{
    /* Take what the executor holds; a single-use one is used up by this call either way. */
    aclEmuSlot inputs[EMU_EXECUTOR_MAX_SLOTS], outputs[EMU_EXECUTOR_MAX_SLOTS];
    uint64_t required = 0;
    op_data *data = NULL;
    int rc = 0;
    aclEmu_executor_lock();
    if (executor == NULL) {
        rc = aclEmu_fail(ACLNN_ERR_PARAM_NULLPTR, PHASE2, "executor is NULL");
    } else if (!aclEmu_handle_is(ACL_EMU_KIND_EXECUTOR, executor)) {
        char why[200];
        aclEmu_handle_describe(ACL_EMU_KIND_EXECUTOR, executor, why, sizeof why);
        rc = aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE2,
                         "executor: %s (executors are single-use unless made repeatable with "
                         "aclSetAclOpExecutorRepeatable)",
                         why);
    } else if (executor->op_name != OP_NAME) {
        rc = aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE2,
                         "executor was made for operator %s, not %s", executor->op_name, OP_NAME);
    } else {
        memcpy(inputs, executor->inputs, sizeof inputs);
        memcpy(outputs, executor->outputs, sizeof outputs);
        required = executor->workspace_size;
        const op_data *held = executor->op_data;
        size_t bytes = sizeof *held + (size_t)held->group_count * sizeof(int64_t);
        data = malloc(bytes);
        if (data != NULL) {
            memcpy(data, held, bytes);
        }
        executor->launches++;
        if (!executor->repeatable) {
            aclEmu_executor_consume_locked(executor, "consumed by aclnnSwigluGroupQuantGrad");
        }
        if (data == NULL) {
            rc = aclEmu_fail(ACLNN_ERR_INNER, PHASE2, "out of host memory");
        }
    }
    aclEmu_executor_unlock();
    if (rc == 0) rc = aclEmu_fault(PHASE2);
    if (rc == 0) rc = aclEmu_require_device(PHASE2);
    if (rc != 0) {
        free(data);
        return rc;
    }

    const aclTensor *in[5], *out[2];
    for (int i = 0; i < 5; i++) in[i] = (size_t)i < (data->abi == 2 ? 5u : 4u) && inputs[i].handle ? &inputs[i].view : NULL;
    for (int o = 0; o < 2; o++) out[o] = outputs[o].handle ? &outputs[o].view : NULL;
    for (int i = 0; i < 5 && rc == 0; i++) rc = check_view_memory(PHASE2, input_names[i], in[i], 0);
    for (int o = 0; o < 2 && rc == 0; o++) rc = check_view_memory(PHASE2, output_names[o], out[o], 0);
    if (rc == 0) rc = check_aliasing(PHASE2, in, out);
    if (rc == 0 && required > 0) {
        if (workspace == NULL) {
            rc = aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE2,
                             "workspace is NULL but phase 1 asked for %llu bytes",
                             (unsigned long long)required);
        } else if (workspaceSize < required) {
            rc = aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE2,
                             "workspaceSize %llu is smaller than the %llu bytes phase 1 asked for",
                             (unsigned long long)workspaceSize, (unsigned long long)required);
        } else if (aclEmu_mem_classify(workspace, (size_t)required, NULL) != EMU_RANGE_DEVICE) {
            char where[200];
            aclEmu_mem_describe(workspace, (size_t)required, where, sizeof where);
            rc = aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE2,
                             "workspace must be %llu bytes of device memory; it is %s",
                             (unsigned long long)required, where);
        }
    }
    void *resolved = rc == 0 ? aclEmu_stream_resolve(stream, PHASE2, &rc) : NULL;
    if (rc != 0) {
        if (rc == ACL_ERROR_INVALID_RESOURCE_HANDLE) {
            rc = ACLNN_ERR_PARAM_INVALID;   /* aclnn reports a bad stream as a bad parameter */
            char why[200];
            aclEmu_handle_describe(ACL_EMU_KIND_STREAM, stream, why, sizeof why);
            aclEmu_fail(rc, PHASE2, "stream: %s", why);
        }
        free(data);
        return rc;
    }
    if (data->rows == 0) {
        aclEmu_stream_unref(resolved);
        free(data);
        return ACLNN_SUCCESS;
    }

    kernel_task *k = calloc(1, sizeof *k);
    if (k == NULL) {
        aclEmu_stream_unref(resolved);
        free(data);
        return aclEmu_fail(ACLNN_ERR_INNER, PHASE2, "out of host memory");
    }
    k->task.run = run_kernel;
    k->task.release = release_kernel;
    k->data = data;
    k->launch_number = __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
    swiglu_kernel_args *a = &k->args;
    a->dtype = in[IN_GRAD_Y]->dtype;
    a->rows = data->rows;
    a->hidden = data->hidden;
    to_kernel_view(in[IN_GRAD_Y], &a->grad_y);
    to_kernel_view(in[IN_X], &a->x);
    to_kernel_view(in[IN_Y_ORIGIN], &a->y_origin);
    to_kernel_view(out[OUT_GRAD_X], &a->grad_x);
    a->has_weight = in[IN_WEIGHT] != NULL;
    to_kernel_view(in[IN_WEIGHT], &a->weight);
    to_kernel_view(out[OUT_GRAD_WEIGHT], &a->grad_weight);
    a->clamp_on = data->clamp_on;
    a->clamp = data->clamp;
    a->group_mode = data->group_mode;
    a->group_values = data->group_values;
    a->group_count = data->group_count;
    to_kernel_view(in[IN_GROUP_INDEX], &a->group_index);
    for (int i = 0; i < 5; i++) {
        if (i != IN_Y_ORIGIN || a->has_weight) add_range(k, input_names[i], in[i]);
    }
    for (int o = 0; o < 2; o++) add_range(k, output_names[o], out[o]);
    if (required > 0) {
        k->range_names[k->range_count] = "workspace";
        k->ranges[k->range_count] = workspace;
        k->range_lengths[k->range_count] = (size_t)required;
        k->range_count++;
        k->workspace = workspace;
        k->workspace_size = required;
    }
    aclEmu_stream_enqueue(resolved, &k->task);
    return ACLNN_SUCCESS;
}
