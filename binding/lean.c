/*
 * A device-level call repeated with the same arguments, in one C call: phase 1 through the
 * operator's own thunk (its prototype is the operator's), then phase 2 on the stream, with the
 * pooled workspace the Python side chose. Everything the call reads is fixed when the Python
 * side builds the record, so one record serves any number of threads at once.
 * This library links to no ACL library: it only calls what it is given.
 */
#include <stdint.h>

#include "lean.h"

#if defined(_WIN32)
#define LEAN_EXPORT
#else
#define LEAN_EXPORT __attribute__((visibility("default")))
#endif

/* What a call's result says in its upper 32 bits; the lower 32 hold a failed call's status. */
enum {
    LEAN_DONE = 0,         /* both phases made: the result is 0 */
    LEAN_PHASE1_FAILED,    /* phase 1 returned the status: nothing to release */
    LEAN_PHASE2_FAILED,    /* phase 2 returned the status (the executor is consumed either way) */
    LEAN_NO_WORKSPACE      /* phase 1 asked for more workspace than the record has: the executor
                              was destroyed (the status of that destroy below) and nothing was
                              launched; the Python side makes the call itself */
};

static int64_t result_of(int32_t kind, int32_t status)
{
    return (int64_t)(((uint64_t)(uint32_t)kind << 32) | (uint32_t)status);
}

LEAN_EXPORT int64_t acl_swiglu_lean_call(const lean_call *call)
{
    uint64_t size = 0;
    void *executor = 0;
    int32_t status = call->thunk(call->phase1, call->handles, call->scalars, &size, &executor);
    if (status != 0) {
        return result_of(LEAN_PHASE1_FAILED, status);
    }
    if (size > call->workspace_capacity) {
        return result_of(LEAN_NO_WORKSPACE, call->destroy(executor));
    }
    status = call->launch(size != 0 ? call->workspace : 0, size, executor, call->stream);
    if (status != 0) {
        return result_of(LEAN_PHASE2_FAILED, status);
    }
    return 0;
}
