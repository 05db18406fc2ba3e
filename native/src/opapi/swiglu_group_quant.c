/*
 * aclnnSwigluGroupQuant: this operator's validation (phase 1) and its kernel call, for quant
 * modes 0 and 1 (docs/forward.md). Phase 1 refuses in the operator's own order: NULL pointers
 * (161001), the op definition's dtype combinations (161002), the modes the emulator does not
 * emulate (161002), then the tiling's checks of the emulated release (561002), then what only
 * the emulator refuses because the device would compute garbage (161002). The checks every
 * operator shares (handles, device memory, aliasing, workspace, stream) and phase 2 itself are in
 * libnnopbase.so (nnopbase/launch.h).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aclnnop/aclnn_swiglu_group_quant.h"
#include "common/emu_release.h"
#include "nnopbase/launch.h"
#include "shape_text.h"
#include "swiglu_kernel.h"
#include "swiglu_quant_kernel.h"
#include "swiglu_tiling.h"

/* What GetWorkspaceSize asks for on every call. */
#define WORKSPACE_BYTES 32u
#define MAX_RANK 8

enum { IN_X, IN_WEIGHT, IN_GROUP_INDEX, IN_SCALE, INPUTS };
enum { OUT_Y, OUT_Y_SCALE, OUT_Y_ORIGIN, OUTPUTS };

static const char *const input_names[INPUTS] = {"x", "weightOptional", "groupIndexOptional", "scaleOptional"};
static const char *const output_names[OUTPUTS] = {"yOut", "yScaleOut", "yOriginOut"};

static int run_kernel(const aclEmuLaunch *launch);

static const aclEmuOperator OP = {
    .name = "SwigluGroupQuant",
    .phase1_api = "aclnnSwigluGroupQuantGetWorkspaceSize",
    .phase2_api = "aclnnSwigluGroupQuant",
    .input_names = input_names,
    .max_inputs = INPUTS,
    .output_names = output_names,
    .max_outputs = OUTPUTS,
    .kernel = run_kernel,
};
#define PHASE1 OP.phase1_api

typedef struct {
    aclDataType x_dtype;
    aclDataType dst;
    int mode;
    int round_scale;
    int clamp_on;
    float clamp;
    int64_t rows;
    int64_t hidden;
} op_data;

/* ---- the emulated release ---- */

/* The checks of modes 0 and 1 come in two forms: releases before 9.2.0 (9.1.0, 9.1.1,
 * 9.2.0-beta.1, 9.2.0-beta.2) check dtypes, D and the attributes but no ranks, shapes or empty
 * inputs; 9.2.0 and later check them all. 9.1.0 and 9.1.1 also sum the group counts past their
 * end when G mod 128 is 97-127. */
typedef struct {
    int lighter_checks;
    int sum_overreads;
    char name[80];
} forward_release;

static pthread_once_t release_once = PTHREAD_ONCE_INIT;
static forward_release release;   /* written once, under release_once */

static void read_release(void)
{
    static const int64_t sum_fixed_from[EMU_RELEASE_KEY_PARTS] = {9, 2, 0, 1, 1};   /* 9.2.0-beta.1 */
    static const int64_t full_checks_from[EMU_RELEASE_KEY_PARTS] = {9, 2, 0, EMU_RELEASE_STAGE_FINAL, 0};  /* 9.2.0 */
    int64_t key[EMU_RELEASE_KEY_PARTS];
    const char *name = aclEmu_release(key);   /* (ACL_EMU_CANN_VERSION, as the whole emulator reads it) */
    release.lighter_checks = emu_release_before(key, full_checks_from);
    release.sum_overreads = emu_release_before(key, sum_fixed_from);
    snprintf(release.name, sizeof release.name, "%s", name);
}

static const forward_release *emulated_release(void)
{
    pthread_once(&release_once, read_release);
    return &release;
}

/* ---- messages ---- */

static int invalid(const char *fmt, ...) EMU_PRINTF(1, 2);
static int invalid(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    aclEmu_vfail(ACLNN_ERR_PARAM_INVALID, PHASE1, fmt, ap);
    va_end(ap);
    return ACLNN_ERR_PARAM_INVALID;
}

/* A tiling failure: the message ends with the release whose checks refused it. */
static int tiling_error(const char *fmt, ...) EMU_PRINTF(1, 2);
static int tiling_error(const char *fmt, ...)
{
    char text[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return aclEmu_fail(ACLNN_ERR_INNER_TILING_ERROR, PHASE1, "%s (tiling of CANN %s)", text,
                       emulated_release()->name);
}

static const char *dtype_name(aclDataType dtype) { return aclEmu_dtype_name(dtype); }

static int is_fp8(int64_t t) { return t == ACL_FLOAT8_E4M3FN || t == ACL_FLOAT8_E5M2; }
static int is_fp4(int64_t t) { return t == ACL_FLOAT4_E2M1 || t == ACL_FLOAT4_E1M2; }

/* ---- 161002: the op definition's dtype combinations ---- */

static int check_formats(const aclTensor *const in[INPUTS], const aclTensor *const out[OUTPUTS])
{
    for (int i = 0; i < INPUTS + OUTPUTS; i++) {
        const aclTensor *t = i < INPUTS ? in[i] : out[i - INPUTS];
        const char *name = i < INPUTS ? input_names[i] : output_names[i - INPUTS];
        if (t != NULL && t->format != ACL_FORMAT_ND) {
            return invalid("%s has format %s; only ND is supported", name, aclEmu_format_name(t->format));
        }
    }
    return 0;
}

static int check_dtype_combination(const aclTensor *const in[INPUTS], const aclTensor *const out[OUTPUTS])
{
    static const char combinations[] =
        "the operator takes x FLOAT16/BF16 with y FLOAT8_E4M3FN/FLOAT8_E5M2 and yScale FLOAT or FLOAT8_E8M0, "
        "x FLOAT16/BF16 with y FLOAT4_E2M1/FLOAT4_E1M2 and yScale FLOAT8_E8M0, or x FLOAT/FLOAT16/BF16 with y "
        "HIFLOAT8 and yScale FLOAT";
    aclDataType x = in[IN_X]->dtype, y = out[OUT_Y]->dtype, scale = out[OUT_Y_SCALE]->dtype;
    if (x != ACL_FLOAT16 && x != ACL_BF16 && x != ACL_FLOAT) {
        return invalid("x has dtype %s; it must be FLOAT16, BF16 or FLOAT (%s)", dtype_name(x), combinations);
    }
    if (!is_fp8(y) && !is_fp4(y) && y != ACL_HIFLOAT8) {
        return invalid("yOut has dtype %s; it must be FLOAT8_E4M3FN, FLOAT8_E5M2, FLOAT4_E2M1, FLOAT4_E1M2 or "
                       "HIFLOAT8 (%s)", dtype_name(y), combinations);
    }
    int narrow_x = x == ACL_FLOAT16 || x == ACL_BF16;
    int ok = is_fp8(y)   ? narrow_x && (scale == ACL_FLOAT || scale == ACL_FLOAT8_E8M0)
             : is_fp4(y) ? narrow_x && scale == ACL_FLOAT8_E8M0
                         : scale == ACL_FLOAT;
    if (!ok) {
        return invalid("x %s, yOut %s and yScaleOut %s are no dtype combination of the operator: %s",
                       dtype_name(x), dtype_name(y), dtype_name(scale), combinations);
    }
    if (out[OUT_Y_ORIGIN]->dtype != x) {
        return invalid("yOriginOut has dtype %s but x has %s; they must match",
                       dtype_name(out[OUT_Y_ORIGIN]->dtype), dtype_name(x));
    }
    const aclTensor *fp32[] = {in[IN_WEIGHT], in[IN_SCALE]};
    const char *fp32_names[] = {"weightOptional", "scaleOptional"};
    for (int i = 0; i < 2; i++) {
        if (fp32[i] != NULL && fp32[i]->dtype != ACL_FLOAT) {
            return invalid("%s has dtype %s; it must be FLOAT", fp32_names[i], dtype_name(fp32[i]->dtype));
        }
    }
    const aclTensor *group = in[IN_GROUP_INDEX];
    if (group != NULL && group->dtype != ACL_INT64) {
        return invalid("groupIndexOptional has dtype %s; it must be INT64", dtype_name(group->dtype));
    }
    return 0;
}

/* ---- 161002: what the emulator does not emulate ---- */

static int check_emulated_mode(int64_t quant_mode)
{
    if (quant_mode == 2 || quant_mode == 3) {
        return invalid("quantMode %lld (%s HiFloat8 quantisation, y HIFLOAT8) is not emulated: the emulator "
                       "emulates quant modes 0 (block FP8) and 1 (MX FP8/FP4) only",
                       (long long)quant_mode, quant_mode == 2 ? "static" : "dynamic");
    }
    if (quant_mode == 5) {
        return invalid("quantMode 5 (the dual-axis MX mode of aclnnSwigluGroupQuantV2) is not emulated: the "
                       "emulator emulates quant modes 0 (block FP8) and 1 (MX FP8/FP4) only");
    }
    return 0;
}

/* ---- 561002: the tiling of modes 0 and 1 ---- */

/* The fp32 clamp limit: -1.0f is off, anything else must be > 0 (+inf passes, NaN fails).
 * Decided on the bits: a comparison would run in the caller's floating-point environment. */
static int check_clamp(double clamp_limit, int *clamp_on, float *clamp)
{
    float c = swiglu_float_nearest(clamp_limit);
    uint32_t bits;
    memcpy(&bits, &c, sizeof bits);
    *clamp = c;
    *clamp_on = bits != 0xBF800000u;
    if (*clamp_on && (bits == 0 || bits > 0x7F800000u)) {
        return tiling_error("clampLimit is %.17g (%.9g in fp32); attr clamp_limit should be greater than 0.0, "
                            "or -1.0 for off", clamp_limit, (double)c);
    }
    return 0;
}

static int check_attributes(int64_t dst_type, int64_t quant_mode, int64_t block_size, bool round_scale,
                            bool output_origin, double clamp_limit, int *clamp_on, float *clamp)
{
    if (!is_fp8(dst_type) && !is_fp4(dst_type)) {
        return tiling_error("dstType is %lld; attr dst_type only supports 35 (FLOAT8_E5M2), 36 (FLOAT8_E4M3FN), "
                            "40 (FLOAT4_E2M1) or 41 (FLOAT4_E1M2) in quant modes 0 and 1%s",
                            (long long)dst_type,
                            dst_type == ACL_HIFLOAT8 ? " (HIFLOAT8 belongs to quant modes 2 and 3, which are "
                                                       "not emulated)" : "");
    }
    if (quant_mode != 0 && quant_mode != 1) {
        return tiling_error("quantMode is %lld; attr quant_mode only supports 0 (block_quant) or 1 (mx_quant)",
                            (long long)quant_mode);
    }
    if (is_fp4(dst_type) && quant_mode != 1) {
        return tiling_error("dstType %lld (%s) is an FP4 type; FP4 needs quantMode 1 (mx_quant), not %lld",
                            (long long)dst_type, dtype_name((aclDataType)dst_type), (long long)quant_mode);
    }
    int64_t block = quant_mode == 0 ? SWIGLU_QUANT_BLOCK : SWIGLU_QUANT_GROUP;
    if (block_size != 0 && block_size != block) {
        return tiling_error("blockSize is %lld; quantMode %lld takes 0 or %lld", (long long)block_size,
                            (long long)quant_mode, (long long)block);
    }
    if (quant_mode == 1 && !round_scale) {
        return tiling_error("roundScale is false; quantMode 1 (mx_quant) requires roundScale true");
    }
    if (output_origin) {
        return tiling_error("outputOrigin is true; attr output_origin must be false in quant modes 0 and 1");
    }
    return check_clamp(clamp_limit, clamp_on, clamp);
}

static int leading_dims_match(const aclTensor *t, const aclTensor *x)
{
    for (uint64_t d = 0; d + 1 < x->ndim; d++) {
        if (t->dims[d] != x->dims[d]) return 0;
    }
    return 1;
}

/* yOut [..., H] and yScaleOut [..., H/128] (mode 0) or [..., ceil(H/64), 2] (mode 1) with x's
 * leading dims. */
static int check_output_shapes(const aclTensor *x, const aclTensor *y, const aclTensor *scale, int64_t quant_mode,
                               int64_t hidden)
{
    char a[200], b[200];
    uint64_t rank = x->ndim;
    if (y->ndim != rank || !leading_dims_match(y, x) || y->dims[rank - 1] != hidden) {
        return tiling_error("yOut has shape %s; with x %s it must be x's leading dims and H = %lld (FP4 counted "
                            "in 4-bit elements)",
                            shape_text(y, a, sizeof a), shape_text(x, b, sizeof b), (long long)hidden);
    }
    if (quant_mode == 0) {
        int64_t blocks = (hidden + SWIGLU_QUANT_BLOCK - 1) / SWIGLU_QUANT_BLOCK;
        if (scale->ndim != rank || !leading_dims_match(scale, x) || scale->dims[rank - 1] != blocks) {
            return tiling_error("yScaleOut has shape %s; with x %s and quantMode 0 it must be x's leading dims "
                                "and ceil(H/128) = %lld",
                                shape_text(scale, a, sizeof a), shape_text(x, b, sizeof b), (long long)blocks);
        }
        return 0;
    }
    int64_t groups = (hidden + SWIGLU_QUANT_GROUP - 1) / SWIGLU_QUANT_GROUP, pairs = (groups + 1) / 2;
    if (scale->ndim != rank + 1 || !leading_dims_match(scale, x) || scale->dims[rank - 1] != pairs ||
        scale->dims[rank] != 2) {
        return tiling_error("yScaleOut has shape %s; with x %s and quantMode 1 it must be x's leading dims, then "
                            "[ceil(ceil(H/32)/2), 2] = [%lld, 2]",
                            shape_text(scale, a, sizeof a), shape_text(x, b, sizeof b), (long long)pairs);
    }
    return 0;
}

typedef struct {
    int64_t dst_type, quant_mode, block_size;
    bool round_scale, output_origin;
    double clamp_limit;
} attributes;

static int check_tiling(const aclTensor *const in[INPUTS], const aclTensor *const out[OUTPUTS],
                        const attributes *attr, int lighter, op_data *data)
{
    char a[200];
    const aclTensor *x = in[IN_X], *weight = in[IN_WEIGHT], *group = in[IN_GROUP_INDEX];
    if (x->dtype != ACL_FLOAT16 && x->dtype != ACL_BF16) {
        return tiling_error("x has dtype %s; input x dtype only supports FLOAT16 or BFLOAT16 in quant modes 0 "
                            "and 1", dtype_name(x->dtype));
    }
    if (x->ndim < 1 || (!lighter && (x->ndim < 2 || x->ndim > MAX_RANK))) {
        return tiling_error("x has rank %llu (shape %s); it must have rank %s",
                            (unsigned long long)x->ndim, shape_text(x, a, sizeof a), lighter ? "> 0" : "2-8");
    }
    uint64_t last = x->ndim - 1;
    int64_t rows = aclEmu_numel(x->dims, last);
    if (!lighter && rows == 0) {
        return tiling_error("x has shape %s, T = 0 rows: empty tensor is not supported", shape_text(x, a, sizeof a));
    }
    int64_t width = x->dims[last];
    if (width < 256 || width % 256 != 0) {
        return tiling_error("x's last dim is %lld; it must be a multiple of 256, at least 256 (2H with H a "
                            "multiple of 128)", (long long)width);
    }
    if (weight != NULL) {
        int64_t n = aclEmu_numel(weight->dims, weight->ndim);
        if (!lighter && (weight->ndim < 1 || weight->ndim > MAX_RANK)) {
            return tiling_error("weightOptional has rank %llu (shape %s); it must have rank 1-8",
                                (unsigned long long)weight->ndim, shape_text(weight, a, sizeof a));
        }
        if ((!lighter && n == 0) || n != rows) {
            return tiling_error("weightOptional has %lld elements (shape %s); it must hold T = %lld, one per row",
                                (long long)n, shape_text(weight, a, sizeof a), (long long)rows);
        }
    }
    if (group != NULL && !lighter && (group->ndim != 1 || group->dims[0] == 0)) {
        return tiling_error("groupIndexOptional has shape %s; it must be 1-D [G] with G > 0",
                            shape_text(group, a, sizeof a));
    }
    int rc = check_attributes(attr->dst_type, attr->quant_mode, attr->block_size, attr->round_scale,
                              attr->output_origin, attr->clamp_limit, &data->clamp_on, &data->clamp);
    if (rc != 0) return rc;
    if (!lighter && attr->quant_mode == 1 && x->ndim > MAX_RANK - 1) {
        return tiling_error("x has rank %llu; quantMode 1 takes ranks up to 7 (yScaleOut has one more dim)",
                            (unsigned long long)x->ndim);
    }
    const aclTensor *y = out[OUT_Y], *scale = out[OUT_Y_SCALE], *origin = out[OUT_Y_ORIGIN];
    if (y->dtype != attr->dst_type) {
        return tiling_error("yOut has dtype %s but dstType is %lld (%s); they must match", dtype_name(y->dtype),
                            (long long)attr->dst_type, dtype_name((aclDataType)attr->dst_type));
    }
    aclDataType scale_dtype = attr->quant_mode == 0 ? ACL_FLOAT : ACL_FLOAT8_E8M0;
    if (scale->dtype != scale_dtype) {
        return tiling_error("yScaleOut has dtype %s; quantMode %lld needs %s", dtype_name(scale->dtype),
                            (long long)attr->quant_mode, dtype_name(scale_dtype));
    }
    if (origin->dtype != x->dtype) {
        return tiling_error("yOriginOut has dtype %s but x has %s; they must match", dtype_name(origin->dtype),
                            dtype_name(x->dtype));
    }
    if (!lighter) {
        rc = check_output_shapes(x, y, scale, attr->quant_mode, width / 2);
        if (rc != 0) return rc;
    }
    data->x_dtype = x->dtype;
    data->dst = (aclDataType)attr->dst_type;
    data->mode = (int)attr->quant_mode;
    data->round_scale = attr->quant_mode == 1 || attr->round_scale;
    data->rows = rows;
    data->hidden = width / 2;
    return 0;
}

/* ---- 161002: what the device would get wrong ---- */

/* Releases that check no output shapes write T rows of codes and scales wherever y and yScale
 * start: the views must hold them. 9.1.0 and 9.1.1 sum the group counts with reads past their
 * end for some G: trunc would be unpredictable. */
static int check_device_hazards(const aclTensor *const in[INPUTS], const aclTensor *const out[OUTPUTS],
                                const op_data *data, const forward_release *rel)
{
    const aclTensor *group = in[IN_GROUP_INDEX];
    if (group != NULL && rel->sum_overreads) {
        int64_t count = aclEmu_numel(group->dims, group->ndim), rest = count % 128;
        if (rest >= 97) {
            return invalid("groupIndexOptional has G = %lld counts (G mod 128 = %lld): CANN %s sums them in "
                           "whole vectors past the end of the data when G mod 128 is 97-127, so the rows it "
                           "computes are unpredictable; the emulator refuses such a call (fixed from "
                           "9.2.0-beta.1)", (long long)count, (long long)rest, rel->name);
        }
    }
    int64_t per_scale = data->mode == 0 ? SWIGLU_QUANT_BLOCK : SWIGLU_QUANT_GROUP;
    int64_t needed[2] = {data->rows * data->hidden, data->rows * (data->hidden / per_scale)};
    for (int o = 0; o < 2; o++) {
        int64_t held = aclEmu_numel(out[o]->dims, out[o]->ndim);
        if (held < needed[o]) {
            char a[200];
            return invalid("%s has shape %s, %lld elements; the kernel writes %lld (T = %lld rows of %lld%s) and "
                           "CANN %s does not check %s's shape, so the device would write past the tensor",
                           output_names[o], shape_text(out[o], a, sizeof a), (long long)held,
                           (long long)needed[o], (long long)data->rows,
                           (long long)(o == 0 ? data->hidden : data->hidden / per_scale),
                           o == 0 && is_fp4(data->dst) ? " 4-bit elements" : "", rel->name, output_names[o]);
        }
    }
    return 0;
}

EMU_EXPORT aclnnStatus aclnnSwigluGroupQuantGetWorkspaceSize(
    const aclTensor *x, const aclTensor *weightOptional, const aclTensor *groupIndexOptional,
    const aclTensor *scaleOptional, int64_t dstType, int64_t quantMode, int64_t blockSize, bool roundScale,
    double clampLimit, double dstTypeMax, bool outputOrigin, const aclTensor *yOut, const aclTensor *yScaleOut,
    const aclTensor *yOriginOut, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    (void)dstTypeMax;   /* read by modes 2 and 3 only */
    int rc = aclEmu_fault(PHASE1);
    if (rc == 0) rc = aclEmu_require_device(PHASE1);
    if (rc != 0) return rc;
    if (executor != NULL) *executor = NULL;

    const char *missing = x == NULL ? "x" : yOut == NULL ? "yOut" : yScaleOut == NULL ? "yScaleOut"
                        : yOriginOut == NULL ? "yOriginOut" : workspaceSize == NULL ? "workspaceSize"
                        : executor == NULL ? "executor" : NULL;
    if (missing != NULL) {
        return aclEmu_fail(ACLNN_ERR_PARAM_NULLPTR, PHASE1, "%s is NULL%s", missing,
                           strcmp(missing, "yOriginOut") == 0 ? " (it is required even when outputOrigin is false; "
                                                                "an empty tensor will do)" : "");
    }
    const aclTensor *in[INPUTS] = {x, weightOptional, groupIndexOptional, scaleOptional};
    const aclTensor *out[OUTPUTS] = {yOut, yScaleOut, yOriginOut};
    const forward_release *rel = emulated_release();
    const attributes attr = {dstType, quantMode, blockSize, roundScale, outputOrigin, clampLimit};
    op_data data;
    memset(&data, 0, sizeof data);
    rc = aclEmu_check_tensors_live(&OP, in, INPUTS, out, OUTPUTS);
    if (rc == 0) rc = check_formats(in, out);
    if (rc == 0) rc = check_dtype_combination(in, out);
    if (rc == 0) rc = check_emulated_mode(quantMode);
    if (rc == 0) rc = check_tiling(in, out, &attr, rel->lighter_checks, &data);
    if (rc == 0) rc = check_device_hazards(in, out, &data, rel);
    if (rc == 0) rc = aclEmu_check_launch_memory(&OP, PHASE1, in, INPUTS, out, OUTPUTS, 1);
    if (rc != 0) return rc;

    /* scale is checked like every input but only modes 2 and 3 read it. */
    aclOpExecutor *made = aclEmu_executor_record(&OP, in, INPUTS, out, OUTPUTS, 1u << IN_SCALE, WORKSPACE_BYTES,
                                                 &data, sizeof data);
    if (made == NULL) return ACLNN_ERR_INNER_CREATE_EXECUTOR;
    *workspaceSize = WORKSPACE_BYTES;
    *executor = made;
    return ACLNN_SUCCESS;
}

/* ---- the kernel call ---- */

static void to_kernel_view(const aclTensor *t, swiglu_quant_view *v)
{
    memset(v, 0, sizeof *v);
    if (t == NULL) return;
    v->base = t->data;
    v->offset = t->offset;
    v->ndim = (int64_t)t->ndim;
    for (uint64_t i = 0; i < t->ndim && i < SWIGLU_QUANT_MAX_DIMS; i++) {
        v->dims[i] = t->dims[i];
        v->strides[i] = t->strides[i];
    }
}

static int run_kernel(const aclEmuLaunch *launch)
{
    const op_data *data = launch->op_data;
    const aclTensor *const *in = launch->inputs, *const *out = launch->outputs;
    swiglu_quant_args a;
    memset(&a, 0, sizeof a);
    a.x_dtype = data->x_dtype;
    a.dst = data->dst;
    a.mode = data->mode == 0 ? SWIGLU_QUANT_MODE_BLOCK : SWIGLU_QUANT_MODE_MX;
    a.round_scale = data->round_scale;
    a.rows = data->rows;
    a.hidden = data->hidden;
    a.clamp_on = data->clamp_on;
    a.clamp = data->clamp;
    to_kernel_view(in[IN_X], &a.x);
    a.has_weight = in[IN_WEIGHT] != NULL;
    to_kernel_view(in[IN_WEIGHT], &a.weight);
    a.has_groups = in[IN_GROUP_INDEX] != NULL;
    to_kernel_view(in[IN_GROUP_INDEX], &a.group_index);
    to_kernel_view(out[OUT_Y], &a.y);
    to_kernel_view(out[OUT_Y_SCALE], &a.y_scale);
    int rc = swiglu_quant_run(&a, aclEmu_thread_count(), (swiglu_kernel_variant)aclEmu_kernel_variant());
    if (rc == -1) {
        return aclEmu_fail(ACL_ERROR_RT_INTERNAL_ERROR, "aclrtSynchronizeStream",
                           "the %s kernel ran out of host memory for its threads", OP.name);
    }
    if (rc != 0) {
        return aclEmu_fail(ACL_ERROR_RT_INTERNAL_ERROR, "aclrtSynchronizeStream",
                           "the %s kernel refused its arguments (%d)", OP.name, rc);
    }
    return 0;
}

EMU_EXPORT aclnnStatus aclnnSwigluGroupQuant(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                             aclrtStream stream)
{
    return aclEmu_launch(&OP, workspace, workspaceSize, executor, stream);
}
