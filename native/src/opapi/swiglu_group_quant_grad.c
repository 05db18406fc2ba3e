/*
 * aclnnSwigluGroupQuantGrad: this operator's validation (phase 1) and its kernel call. The
 * checks every operator shares (handles, device memory, aliasing, workspace, stream) and phase 2
 * itself are in libnnopbase.so (nnopbase/launch.h).
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aclnnop/aclnn_swiglu_group_quant_grad.h"
#include "common/emu_release.h"
#include "nnopbase/launch.h"
#include "shape_text.h"
#include "swiglu_kernel.h"
#include "swiglu_tiling.h"

/* Scratch the operator asks for whenever it has rows to process. */
#define WORKSPACE_BYTES ((uint64_t)16 << 10)

enum { IN_GRAD_Y, IN_X, IN_WEIGHT, IN_Y_ORIGIN, IN_GROUP_INDEX, INPUTS };
enum { OUT_GRAD_X, OUT_GRAD_WEIGHT, OUTPUTS };

static const char *const input_names[INPUTS] = {"gradY", "x", "weightOptional",
                                                "yOriginOptional", "groupIndexOptional"};
static const char *const output_names[OUTPUTS] = {"gradXOut", "gradWeightOutOptional"};

static int run_kernel(const aclEmuLaunch *launch);

static const aclEmuOperator OP = {
    .name = "SwigluGroupQuantGrad",
    .phase1_api = "aclnnSwigluGroupQuantGradGetWorkspaceSize",
    .phase2_api = "aclnnSwigluGroupQuantGrad",
    .input_names = input_names,
    .max_inputs = INPUTS,
    .output_names = output_names,
    .max_outputs = OUTPUTS,
    .kernel = run_kernel,
};
#define PHASE1 OP.phase1_api

typedef struct {
    int clamp_on;
    float clamp;
    int64_t rows;
    int64_t hidden;
    swiglu_tiling tiling;     /* of the release the emulator stands in for (aclEmu_release) */
    int hangs_on_partial_trunc;
    swiglu_group_mode group_mode;
    uint64_t group_count;
    int64_t group_values[];   /* revision 1 only */
} op_data;

/* ---- phase 1 ---- */

static int same_shape(const aclTensor *a, const aclTensor *b)
{
    if (a->ndim != b->ndim) return 0;
    for (uint64_t i = 0; i < a->ndim; i++) {
        if (a->dims[i] != b->dims[i]) return 0;
    }
    return 1;
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

static int check_dtypes(const aclTensor *const in[INPUTS], const aclTensor *const out[OUTPUTS])
{
    const aclTensor *all[INPUTS + OUTPUTS];
    const char *names[INPUTS + OUTPUTS];
    for (int i = 0; i < INPUTS; i++) { all[i] = in[i]; names[i] = input_names[i]; }
    for (int o = 0; o < OUTPUTS; o++) { all[INPUTS + o] = out[o]; names[INPUTS + o] = output_names[o]; }
    for (size_t i = 0; i < INPUTS + OUTPUTS; i++) {
        if (all[i] != NULL && all[i]->format != ACL_FORMAT_ND) {
            return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE1,
                               "%s has format %s; only ND is supported", names[i],
                               aclEmu_format_name(all[i]->format));
        }
    }
    aclDataType io = in[IN_GRAD_Y]->dtype;
    if (io != ACL_FLOAT && io != ACL_FLOAT16 && io != ACL_BF16) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE1,
                           "gradY has dtype %s; it must be FLOAT, FLOAT16 or BF16",
                           aclEmu_dtype_name(io));
    }
    const aclTensor *same[] = {in[IN_X], in[IN_Y_ORIGIN], out[OUT_GRAD_X]};
    const char *same_names[] = {"x", "yOriginOptional", "gradXOut"};
    for (int i = 0; i < 3; i++) {
        if (same[i] != NULL && same[i]->dtype != io) {
            return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE1,
                               "%s has dtype %s but gradY has %s; they must match",
                               same_names[i], aclEmu_dtype_name(same[i]->dtype),
                               aclEmu_dtype_name(io));
        }
    }
    const aclTensor *fp32[] = {in[IN_WEIGHT], out[OUT_GRAD_WEIGHT]};
    const char *fp32_names[] = {"weightOptional", "gradWeightOutOptional"};
    for (int i = 0; i < 2; i++) {
        if (fp32[i] != NULL && fp32[i]->dtype != ACL_FLOAT) {
            return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE1, "%s has dtype %s; it must be FLOAT",
                               fp32_names[i], aclEmu_dtype_name(fp32[i]->dtype));
        }
    }
    const aclTensor *group = in[IN_GROUP_INDEX];
    if (group != NULL && group->dtype != ACL_INT64) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE1,
                           "groupIndexOptional has dtype %s; it must be INT64",
                           aclEmu_dtype_name(group->dtype));
    }
    return 0;
}

static int check_weight(const aclTensor *grad_y, const aclTensor *weight,
                        const aclTensor *y_origin, const aclTensor *grad_weight, int abi,
                        int64_t rows)
{
    char a[160], b[160];
    uint64_t last = grad_y->ndim - 1;
    if (weight == NULL) {
        /* torch_npu passes an empty gradWeight when there is no weight: accepted, untouched. */
        if (grad_weight != NULL && aclEmu_numel(grad_weight->dims, grad_weight->ndim) != 0) {
            return shape_error("gradWeightOutOptional is given without weightOptional and has "
                               "shape %s; without weight it must be empty (it is left untouched)",
                               shape_text(grad_weight, a, sizeof a));
        }
        return 0;
    }
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
            return shape_error("weightOptional has shape %s; with gradY %s it must be gradY's "
                               "leading dims followed by 1 (ABI revision 1)",
                               shape_text(weight, b, sizeof b), shape_text(grad_y, a, sizeof a));
        }
    } else {
        int64_t n = aclEmu_numel(weight->dims, weight->ndim);
        if (weight->ndim < 1 || weight->ndim > SWIGLU_MAX_RANK || n != rows) {
            return shape_error("weightOptional has shape %s (%lld elements); it must hold T = "
                               "%lld elements, one per row, in 1-%d dims",
                               shape_text(weight, b, sizeof b), (long long)n, (long long)rows,
                               SWIGLU_MAX_RANK);
        }
    }
    if (!same_shape(grad_weight, weight)) {
        return shape_error("gradWeightOutOptional has shape %s but weightOptional has %s; they "
                           "must match",
                           shape_text(grad_weight, a, sizeof a), shape_text(weight, b, sizeof b));
    }
    return 0;
}

/* The one clamp rule: the kernel works with c = (float)clampLimit, so "on" means c > 0 in fp32
 * (a positive double that rounds to 0 in fp32 is refused, not taken as "off"). Revision 2 is off
 * when c == -1.0f, revision 1 when clampLimit == 0. From 9.2.0 (`band`) revision 2 is off when
 * |c + 1| <= 1e-6 in fp32, as that release's tiling tests it: a NaN limit fails the test too, so
 * it is off there as well. */
static int check_clamp(double clamp_limit, int abi, int band, int *clamp_on)
{
    float c = swiglu_float_nearest(clamp_limit);   /* as the kernel converts it, whatever the caller's mode */
    /* Decided on the bits: a comparison here runs in the caller's environment, where DAZ would
     * take a subnormal limit for 0. */
    uint32_t c_bits;
    uint64_t limit_bits;
    memcpy(&c_bits, &c, sizeof c_bits);
    memcpy(&limit_bits, &clamp_limit, sizeof limit_bits);
    int off;
    if (abi == 1) {
        off = (limit_bits << 1) == 0;   /* +-0.0 */
    } else if (band) {
        /* c + 1 is exact in double (and in fp32 wherever it could come near 1e-6: c in [-2, -0.5]),
         * so neither the caller's rounding mode nor DAZ can move the answer. */
        double distance = (double)c + 1.0;
        off = !(fabs(distance) > (double)1e-6f);
    } else {
        off = c_bits == 0xBF800000u;    /* -1.0f */
    }
    if (off) {
        *clamp_on = 0;
        return 0;
    }
    if (c_bits == 0 || c_bits > 0x7F800000u) {   /* not in (0, +inf]: zero, negative or NaN */
        const char *rule = abi == 1 ? "ABI revision 1 needs clampLimit >= 0 (0 for off; a limit "
                                      "that is on must be > 0 in fp32)"
                           : band   ? "it must be > 0 in fp32, or -1.0 for off (this release also "
                                      "takes |c + 1| <= 1e-6 for off)"
                                    : "it must be > 0 in fp32, or -1.0 for off";
        return shape_error("clampLimit is %.17g (%.9g in fp32); %s", clamp_limit, (double)c, rule);
    }
    *clamp_on = 1;
    return 0;
}

static int check_shapes(const aclTensor *const in[INPUTS], const aclTensor *const out[OUTPUTS],
                        int abi, int64_t *rows, int64_t *hidden)
{
    char a[160], b[160];
    const aclTensor *grad_y = in[IN_GRAD_Y], *x = in[IN_X], *grad_x = out[OUT_GRAD_X];
    uint64_t min_rank = abi == 1 ? 2 : 1, max_rank = abi == 1 ? 3 : SWIGLU_MAX_RANK;
    if (grad_y->ndim < min_rank || grad_y->ndim > max_rank) {
        return shape_error("gradY has rank %llu (shape %s); ABI revision %d supports ranks %llu-%llu",
                           (unsigned long long)grad_y->ndim, shape_text(grad_y, a, sizeof a), abi,
                           (unsigned long long)min_rank, (unsigned long long)max_rank);
    }
    if (x->ndim != grad_y->ndim) {
        return shape_error("x has rank %llu (shape %s) but gradY has rank %llu (shape %s)",
                           (unsigned long long)x->ndim, shape_text(x, b, sizeof b),
                           (unsigned long long)grad_y->ndim, shape_text(grad_y, a, sizeof a));
    }
    uint64_t last = grad_y->ndim - 1;
    for (uint64_t d = 0; d < last; d++) {
        if (x->dims[d] != grad_y->dims[d]) {
            return shape_error("x %s and gradY %s differ in dim %llu; all but the last dim must "
                               "match",
                               shape_text(x, b, sizeof b), shape_text(grad_y, a, sizeof a),
                               (unsigned long long)d);
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
        return shape_error("gradXOut has shape %s but x has %s; they must match",
                           shape_text(grad_x, a, sizeof a), shape_text(x, b, sizeof b));
    }
    int64_t t_rows = aclEmu_numel(grad_y->dims, last);
    if (t_rows < 0) {
        return shape_error("gradY's leading dims overflow int64");
    }
    const aclTensor *y_origin = in[IN_Y_ORIGIN];
    if (y_origin != NULL && !same_shape(y_origin, grad_y)) {
        return shape_error("yOriginOptional has shape %s but gradY has %s; they must match",
                           shape_text(y_origin, b, sizeof b), shape_text(grad_y, a, sizeof a));
    }
    int rc = check_weight(grad_y, in[IN_WEIGHT], y_origin, out[OUT_GRAD_WEIGHT], abi, t_rows);
    if (rc != 0) {
        return rc;
    }
    const aclTensor *group = in[IN_GROUP_INDEX];
    if (group != NULL && group->ndim != 1) {
        return shape_error("groupIndexOptional has shape %s; it must be 1-D [G]",
                           shape_text(group, a, sizeof a));
    }
    *rows = t_rows;
    *hidden = grad_y->dims[last];
    return 0;
}

EMU_EXPORT aclnnStatus aclnnSwigluGroupQuantGradGetWorkspaceSize(
    const aclTensor *gradY, const aclTensor *x, const aclTensor *weightOptional,
    const aclTensor *yOriginOptional, const aclTensor *groupIndexOptional, double clampLimit,
    const aclTensor *gradXOut, const aclTensor *gradWeightOutOptional, uint64_t *workspaceSize,
    aclOpExecutor **executor)
{
    int abi = 2;
    swiglu_release_traits release = {SWIGLU_TILING_CURRENT, 0, 0};
    int64_t release_key[EMU_RELEASE_KEY_PARTS];
    aclEmu_release(release_key);
    (void)tiling_traits_of_key(release_key, &release);   /* every release the runtime names has traits */
    int rc = aclEmu_fault(PHASE1);
    if (rc == 0) rc = aclEmu_require_device(PHASE1);
    if (rc == 0) rc = aclEmu_abi_revision(PHASE1, ACLNN_ERR_PARAM_INVALID, &abi);
    if (rc != 0) return rc;
    if (executor != NULL) *executor = NULL;

    const char *missing = gradY == NULL ? "gradY" : x == NULL ? "x" : gradXOut == NULL ? "gradXOut"
                        : workspaceSize == NULL ? "workspaceSize" : executor == NULL ? "executor"
                        : NULL;
    if (missing != NULL) {
        return aclEmu_fail(ACLNN_ERR_PARAM_NULLPTR, PHASE1, "%s is NULL", missing);
    }
    /* Revision 1 passes the groups as host values in an aclIntArray: no fifth input tensor. */
    const aclIntArray *group_array = abi == 1 ? (const aclIntArray *)groupIndexOptional : NULL;
    const size_t input_count = abi == 1 ? IN_GROUP_INDEX : INPUTS;
    const aclTensor *in[INPUTS] = {gradY, x, weightOptional, yOriginOptional,
                                   abi == 2 ? groupIndexOptional : NULL};
    const aclTensor *out[OUTPUTS] = {gradXOut, gradWeightOutOptional};
    rc = aclEmu_check_tensors_live(&OP, in, input_count, out, OUTPUTS);
    if (rc == 0 && group_array != NULL && !aclEmu_handle_is(ACL_EMU_KIND_INT_ARRAY, group_array)) {
        char why[200];
        aclEmu_handle_describe(ACL_EMU_KIND_INT_ARRAY, group_array, why, sizeof why);
        rc = aclEmu_fail(ACLNN_ERR_PARAM_INVALID, PHASE1,
                         "groupIndexOptional: %s (ABI revision 1 takes an aclIntArray)", why);
    }
    if (rc == 0) rc = check_dtypes(in, out);
    int64_t rows = 0, hidden = 0;
    int clamp_on = 0;
    if (rc == 0) rc = check_shapes(in, out, abi, &rows, &hidden);
    if (rc == 0) rc = check_clamp(clampLimit, abi, release.clamp_off_band, &clamp_on);
    if (rc == 0) rc = aclEmu_check_launch_memory(&OP, PHASE1, in, input_count, out, OUTPUTS, 1);
    if (rc != 0) return rc;

    uint64_t group_count = group_array != NULL ? group_array->size : 0;
    union {
        op_data data;
        unsigned char bytes[sizeof(op_data) + 64 * sizeof(int64_t)];
    } small;
    size_t size = sizeof(op_data) + (size_t)group_count * sizeof(int64_t);
    op_data *data = size <= sizeof small ? &small.data : malloc(size);
    if (data == NULL) {
        return aclEmu_fail(ACLNN_ERR_INNER_CREATE_EXECUTOR, PHASE1, "out of host memory");
    }
    data->clamp_on = clamp_on;
    data->clamp = swiglu_float_nearest(clampLimit);   /* the caller's rounding mode must not move the limit */
    data->rows = rows;
    data->hidden = hidden;
    data->tiling = release.tiling;
    data->hangs_on_partial_trunc = release.hangs_on_partial_trunc;
    data->group_count = group_count;
    data->group_mode = group_array != NULL   ? SWIGLU_GROUPS_HOST
                       : in[IN_GROUP_INDEX] ? SWIGLU_GROUPS_DEVICE
                                            : SWIGLU_GROUPS_NONE;
    if (group_count > 0) {
        memcpy(data->group_values, group_array->values, (size_t)group_count * sizeof(int64_t));
    }
    /* yOrigin without weight is checked like every input but never read. */
    uint32_t unread = weightOptional == NULL ? 1u << IN_Y_ORIGIN : 0;
    uint64_t workspace = rows > 0 ? WORKSPACE_BYTES : 0;
    aclOpExecutor *made = aclEmu_executor_record(&OP, in, input_count, out, OUTPUTS, unread,
                                                 workspace, data, size);
    if (data != &small.data) free(data);
    if (made == NULL) {
        return ACLNN_ERR_INNER_CREATE_EXECUTOR;
    }
    *workspaceSize = workspace;
    *executor = made;
    return ACLNN_SUCCESS;
}

/* ---- the kernel call ---- */

static void to_kernel_view(const aclTensor *t, swiglu_view *v)
{
    memset(v, 0, sizeof *v);
    if (t == NULL) return;
    v->data = (char *)t->data + (size_t)t->offset * aclEmu_dtype_size(t->dtype);
    v->ndim = (int64_t)t->ndim;
    for (uint64_t i = 0; i < t->ndim && i < SWIGLU_MAX_RANK; i++) {
        v->dims[i] = t->dims[i];
        v->strides[i] = t->strides[i];
    }
}

/* The releases before the group_index fix deadlock when the groups leave fewer rows than the
 * kernel has blocks (0 < trunc < min(T, vector cores)). A hang is no use in an emulator: the
 * launch fails as the device's timeout would end it, with the status a vector-core timeout
 * reports, and writes nothing. */
static int refuse_deadlock(const swiglu_kernel_args *a)
{
    int64_t trunc = swiglu_trunc(a);
    int64_t cores = aclEmu_vector_cores();
    int64_t blocks = a->rows < cores ? a->rows : cores;
    if (trunc <= 0 || trunc >= blocks) {
        return 0;
    }
    return aclEmu_fail(ACL_ERROR_RT_VECTOR_CORE_TIMEOUT, "aclrtSynchronizeStream",
                       "the %s kernel of CANN %s deadlocks here and the device would hang: groupIndex sums to "
                       "trunc = %lld of T = %lld rows, and 0 < trunc < min(T, %lld vector cores) = %lld; the "
                       "emulator (ACL_EMU_CANN_VERSION, ACL_EMU_VECTOR_CORES) stops it as the device's timeout "
                       "would, with nothing written (the fix is in CANN 9.2.0-beta.2)",
                       OP.name, aclEmu_release(NULL), (long long)trunc, (long long)a->rows, (long long)cores,
                       (long long)blocks);
}

static int run_kernel(const aclEmuLaunch *launch)
{
    const op_data *data = launch->op_data;
    const aclTensor *const *in = launch->inputs, *const *out = launch->outputs;
    swiglu_kernel_args a;
    memset(&a, 0, sizeof a);
    a.dtype = in[IN_GRAD_Y]->dtype;
    a.rows = data->rows;
    a.hidden = data->hidden;
    a.tiling = data->tiling;
    to_kernel_view(in[IN_GRAD_Y], &a.grad_y);
    to_kernel_view(in[IN_X], &a.x);
    to_kernel_view(out[OUT_GRAD_X], &a.grad_x);
    a.has_weight = in[IN_WEIGHT] != NULL;
    if (a.has_weight) {
        to_kernel_view(in[IN_Y_ORIGIN], &a.y_origin);
        to_kernel_view(in[IN_WEIGHT], &a.weight);
        to_kernel_view(out[OUT_GRAD_WEIGHT], &a.grad_weight);
    }
    a.clamp_on = data->clamp_on;
    a.clamp = data->clamp;
    a.group_mode = data->group_mode;
    a.group_values = data->group_values;
    a.group_count = data->group_count;
    if (launch->input_count > IN_GROUP_INDEX) {
        to_kernel_view(in[IN_GROUP_INDEX], &a.group_index);
    }
    if (data->hangs_on_partial_trunc) {
        int rc = refuse_deadlock(&a);
        if (rc != 0) return rc;
    }
    int rc = swiglu_kernel_run(&a, aclEmu_thread_count(),
                               (swiglu_kernel_variant)aclEmu_kernel_variant());
    if (rc != 0) {
        return aclEmu_fail(ACL_ERROR_RT_INTERNAL_ERROR, "aclrtSynchronizeStream",
                           "the %s kernel ran out of host memory for scratch", OP.name);
    }
    return 0;
}

EMU_EXPORT aclnnStatus aclnnSwigluGroupQuantGrad(void *workspace, uint64_t workspaceSize,
                                                 aclOpExecutor *executor, aclrtStream stream)
{
    return aclEmu_launch(&OP, workspace, workspaceSize, executor, stream);
}
