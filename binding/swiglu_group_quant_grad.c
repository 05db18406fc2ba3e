/*
 * aclnnSwigluGroupQuantGrad's phase-1 thunk for binding/lean.c: its prototype, so that a
 * repeated device-level call makes phase 1 from C. groupIndexOptional is an aclTensor * in
 * revision 2 and an aclIntArray * in revision 1: one pointer either way.
 */
#include <stdint.h>
#include <string.h>

#include "lean.h"

#if defined(_WIN32)
#define THUNK_EXPORT
#else
#define THUNK_EXPORT __attribute__((visibility("default")))
#endif

typedef int32_t (*swiglu_group_quant_grad_phase1)(const void *grad_y, const void *x, const void *weight,
                                                   const void *y_origin, const void *group_index, double clamp_limit,
                                                   void *grad_x, void *grad_weight, uint64_t *workspace_size,
                                                   void **executor);

enum { GRAD_Y, X, WEIGHT, Y_ORIGIN, GROUP_INDEX, GRAD_X, GRAD_WEIGHT };

THUNK_EXPORT int32_t acl_swiglu_phase1_swiglu_group_quant_grad(const void *phase1, void *const *handles,
                                                                const uint64_t *scalars, uint64_t *workspace_size,
                                                                void **executor)
{
    swiglu_group_quant_grad_phase1 call;
    double clamp_limit;
    memcpy(&call, &phase1, sizeof call);   /* (an object pointer to a function pointer, as dlsym's) */
    memcpy(&clamp_limit, &scalars[0], sizeof clamp_limit);
    return call(handles[GRAD_Y], handles[X], handles[WEIGHT], handles[Y_ORIGIN], handles[GROUP_INDEX], clamp_limit,
                handles[GRAD_X], handles[GRAD_WEIGHT], workspace_size, executor);
}
