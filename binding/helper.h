/*
 * The binding's native helper: what its files share. The helper links to no ACL library; it
 * calls only the function pointers the Python side hands it, taken from whichever CANN (or
 * emulator) was loaded. Its ACL types and prototypes come from the emulator's headers
 * (native/include), so the compiler checks each pointer's type against them.
 */
#ifndef ACL_SWIGLU_HELPER_H
#define ACL_SWIGLU_HELPER_H

#include <stdint.h>

#include "acl/acl.h"
#include "aclnn/acl_meta.h"

#define HELPER_EXPORT __attribute__((visibility("default")))

enum { HELPER_MAX_SLOTS = 24, HELPER_MAX_SCALARS = 8 };

/* An operator's phase 2: every aclnn operator has this form. */
typedef aclnnStatus (*helper_phase2)(void *workspace, uint64_t workspace_size, aclOpExecutor *executor,
                                     aclrtStream stream);

/* Calls `phase1` with its operator's own prototype: handles[i] is the tensor (or int array) of
 * the operator's i-th handle parameter, in the order of its prototype (NULL when absent);
 * scalars[i] holds the bytes of its i-th scalar parameter (a double, an int64 or a bool as 0/1),
 * in order. Each operator's file defines one (binding/<operator>.c). */
typedef aclnnStatus (*helper_phase1_thunk)(const void *phase1, void *const *handles, const uint64_t *scalars,
                                           uint64_t *workspace_size, aclOpExecutor **executor);


#endif
