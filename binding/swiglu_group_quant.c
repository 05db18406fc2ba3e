/*
 * aclnnSwigluGroupQuant's phase-1 thunk (helper.h): its prototype, checked against the operator's
 * header. Its scalars are int64s, bools and doubles, in the order of the prototype.
 */
#include <stdbool.h>
#include <string.h>

#include "aclnnop/aclnn_swiglu_group_quant.h"
#include "helper.h"

enum { X, WEIGHT, GROUP_INDEX, SCALE, Y, Y_SCALE, Y_ORIGIN };
enum { DST_TYPE, QUANT_MODE, BLOCK_SIZE, ROUND_SCALE, CLAMP_LIMIT, DST_TYPE_MAX, OUTPUT_ORIGIN };

_Static_assert(__builtin_types_compatible_p(__typeof__(&aclnnSwigluGroupQuant), helper_phase2),
               "phase 2 has the common form");

static double as_double(const uint64_t *slot)
{
    double value;
    memcpy(&value, slot, sizeof value);
    return value;
}

HELPER_EXPORT aclnnStatus acl_swiglu_phase1_swiglu_group_quant(const void *phase1, void *const *handles,
                                                               const uint64_t *scalars, uint64_t *workspace_size,
                                                               aclOpExecutor **executor)
{
    __typeof__(aclnnSwigluGroupQuantGetWorkspaceSize) *call;
    memcpy(&call, &phase1, sizeof call);   /* (an object pointer to a function pointer, as from dlsym) */
    return call(handles[X], handles[WEIGHT], handles[GROUP_INDEX], handles[SCALE], (int64_t)scalars[DST_TYPE],
                (int64_t)scalars[QUANT_MODE], (int64_t)scalars[BLOCK_SIZE], scalars[ROUND_SCALE] != 0,
                as_double(&scalars[CLAMP_LIMIT]), as_double(&scalars[DST_TYPE_MAX]), scalars[OUTPUT_ORIGIN] != 0,
                handles[Y], handles[Y_SCALE], handles[Y_ORIGIN], workspace_size, executor);
}
