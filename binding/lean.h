/* The record of a repeated device-level call (binding/lean.c) and the thunk type each
 * operator provides for its phase 1. Laid out as the binding's ctypes structure. */
#ifndef ACL_SWIGLU_LEAN_H
#define ACL_SWIGLU_LEAN_H

#include <stdint.h>

enum { LEAN_MAX_HANDLES = 16, LEAN_MAX_SCALARS = 4 };

/* Calls `phase1` with the operator's prototype: its tensor (or int array) parameters from
 * handles, in the order inputs then outputs, its scalar parameters from scalars (each slot the
 * bytes of one C scalar, in order), then the workspace size and executor out-parameters. */
typedef int32_t (*lean_phase1_thunk)(const void *phase1, void *const *handles, const uint64_t *scalars,
                                     uint64_t *workspace_size, void **executor);
typedef int32_t (*lean_launch_fn)(void *workspace, uint64_t workspace_size, void *executor, void *stream);
typedef int32_t (*lean_destroy_fn)(void *executor);

typedef struct {
    lean_phase1_thunk thunk;
    const void *phase1;
    lean_launch_fn launch;        /* the operator's phase 2 */
    lean_destroy_fn destroy;      /* aclDestroyAclOpExecutor */
    void *workspace;              /* the pooled workspace, or NULL */
    uint64_t workspace_capacity;  /* its bytes (0 without one) */
    void *stream;
    void *handles[LEAN_MAX_HANDLES];
    uint64_t scalars[LEAN_MAX_SCALARS];
} lean_call;

#endif
