/*
 * acl-swiglu: aclnnSwigluGroupQuant, the SwiGLU forward with weight, clamp and group truncation
 * followed by FP8 / FP4 quantisation. Written for this project from the facts in docs/forward.md.
 *
 * x [..., 2H] (FLOAT16 or BF16; the first half is the gate), weight FLOAT with one element per
 * row, groupIndex INT64 [G] (per-group row counts: rows past their sum are left untouched),
 * scale FLOAT (modes 2 and 3 only). dstType is an aclDataType code (FLOAT8_E4M3FN 36,
 * FLOAT8_E5M2 35, FLOAT4_E2M1 40, FLOAT4_E1M2 41, HIFLOAT8 34); quantMode 0 is per-128 block
 * FP8 with FLOAT scales, 1 is MX (per-32 groups, FLOAT8_E8M0 scales). The doubles are used as
 * fp32 (clampLimit -1.0 is "off"). yOriginOut is required even when outputOrigin is false.
 */
#ifndef ACL_SWIGLU_ACLNN_SWIGLU_GROUP_QUANT_H
#define ACL_SWIGLU_ACLNN_SWIGLU_GROUP_QUANT_H

#include "aclnn/acl_meta.h"

#ifndef __cplusplus
#include <stdbool.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

ACL_FUNC_VISIBILITY aclnnStatus aclnnSwigluGroupQuantGetWorkspaceSize(
    const aclTensor *x, const aclTensor *weightOptional, const aclTensor *groupIndexOptional,
    const aclTensor *scaleOptional, int64_t dstType, int64_t quantMode, int64_t blockSize,
    bool roundScale, double clampLimit, double dstTypeMax, bool outputOrigin, const aclTensor *yOut,
    const aclTensor *yScaleOut, const aclTensor *yOriginOut, uint64_t *workspaceSize,
    aclOpExecutor **executor);

/* A non-repeatable executor is consumed by this call, whether it succeeds or fails. */
ACL_FUNC_VISIBILITY aclnnStatus aclnnSwigluGroupQuant(void *workspace, uint64_t workspaceSize,
                                                      aclOpExecutor *executor, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* ACL_SWIGLU_ACLNN_SWIGLU_GROUP_QUANT_H */
