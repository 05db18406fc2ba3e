/*
 * acl-swiglu: aclnnSwigluGroupQuantGrad, ABI revision 2 (groupIndex is an INT64 aclTensor).
 * Written for this project from the facts in docs/operator.md and docs/c_abi.md.
 *
 * Revision 1 (the first published form of the operator) passes an aclIntArray * in the
 * groupIndex slot and uses clampLimit == 0 for "off"; the emulator implements it when
 * ACL_EMU_ABI=1 (or, with ACL_EMU_ABI unset, ACL_SWIGLU_ABI=1).
 */
#ifndef ACL_SWIGLU_ACLNN_SWIGLU_GROUP_QUANT_GRAD_H
#define ACL_SWIGLU_ACLNN_SWIGLU_GROUP_QUANT_GRAD_H

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Clamp "off" in revision 2, compared after conversion to fp32: (float)clampLimit == -1.0f. */
#define ACLNN_SWIGLU_CLAMP_OFF (-1.0)

ACL_FUNC_VISIBILITY aclnnStatus aclnnSwigluGroupQuantGradGetWorkspaceSize(
    const aclTensor *gradY, const aclTensor *x, const aclTensor *weightOptional,
    const aclTensor *yOriginOptional, const aclTensor *groupIndexOptional, double clampLimit,
    const aclTensor *gradXOut, const aclTensor *gradWeightOutOptional, uint64_t *workspaceSize,
    aclOpExecutor **executor);

/* A non-repeatable executor is consumed by this call, whether it succeeds or fails. */
ACL_FUNC_VISIBILITY aclnnStatus aclnnSwigluGroupQuantGrad(void *workspace, uint64_t workspaceSize,
                                                          aclOpExecutor *executor,
                                                          aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* ACL_SWIGLU_ACLNN_SWIGLU_GROUP_QUANT_GRAD_H */
