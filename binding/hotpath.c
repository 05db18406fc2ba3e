/*
 * The binding's hot path in C: a plan call is phase 2 and, optionally, a stream
 * synchronisation, made here from function pointers the Python side took from whichever
 * libraries it loaded (real CANN or the emulator). One ctypes call instead of two keeps a
 * repeated plan call close to the cost of the same ACL calls made from C.
 * This library links to no ACL library: it only calls what it is given.
 */
#include <stdint.h>

#if defined(_WIN32)
#define HOTPATH_EXPORT
#else
#define HOTPATH_EXPORT __attribute__((visibility("default")))
#endif

typedef int32_t (*launch_fn)(void *workspace, uint64_t workspace_size, void *executor, void *stream);
typedef int (*synchronize_fn)(void *stream);

/* Laid out as the binding's ctypes structure of the same fields, in this order. */
typedef struct {
    launch_fn launch;            /* the operator's phase 2 */
    synchronize_fn synchronize;  /* aclrtSynchronizeStream */
    void *workspace;
    uint64_t workspace_size;
    void *executor;
    void *stream;
    int32_t failed;              /* set by each call: 0, 1 (phase 2 failed) or 2 (synchronize failed) */
} hot_launch;

/* Phase 2. Returns 0 or its status (call->failed says which call failed). */
HOTPATH_EXPORT int32_t acl_swiglu_hot_launch(hot_launch *call)
{
    int32_t status = call->launch(call->workspace, call->workspace_size, call->executor, call->stream);
    call->failed = status != 0 ? 1 : 0;
    return status;
}

/* Phase 2, then the synchronisation: one ctypes call for a plan(synchronize=True). */
HOTPATH_EXPORT int32_t acl_swiglu_hot_launch_synchronize(hot_launch *call)
{
    int32_t status = acl_swiglu_hot_launch(call);
    if (status != 0) {
        return status;
    }
    status = call->synchronize(call->stream);
    call->failed = status != 0 ? 2 : 0;
    return status;
}
