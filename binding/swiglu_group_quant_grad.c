/*
 * aclnnSwigluGroupQuantGrad's phase-1 thunk (helper.h): its prototype, checked against the
 * operator's header. groupIndexOptional is an aclTensor * in revision 2 and an aclIntArray * in
 * revision 1 (the header declares revision 2): one pointer either way.
 */
#include <string.h>

#include "aclnnop/aclnn_swiglu_group_quant_grad.h"
#include "helper.h"

enum { GRAD_Y, X, WEIGHT, Y_ORIGIN, GROUP_INDEX, GRAD_X, GRAD_WEIGHT };
enum { CLAMP_LIMIT };

_Static_assert(__builtin_types_compatible_p(__typeof__(&aclnnSwigluGroupQuantGrad), helper_phase2),
               "phase 2 has the common form");

HELPER_EXPORT aclnnStatus acl_swiglu_phase1_swiglu_group_quant_grad(const void *phase1, void *const *handles,
                                                                    const uint64_t *scalars,
                                                                    uint64_t *workspace_size,
                                                                    aclOpExecutor **executor)
{
    __typeof__(aclnnSwigluGroupQuantGradGetWorkspaceSize) *call;
    double clamp_limit;
    memcpy(&call, &phase1, sizeof call);   /* (an object pointer to a function pointer, as from dlsym) */
    memcpy(&clamp_limit, &scalars[CLAMP_LIMIT], sizeof clamp_limit);
    return call(handles[GRAD_Y], handles[X], handles[WEIGHT], handles[Y_ORIGIN], handles[GROUP_INDEX], clamp_limit,
                handles[GRAD_X], handles[GRAD_WEIGHT], workspace_size, executor);
}
