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
    launch_fn launch;            /* aclnnSwigluGroupQuantGrad */
    synchronize_fn synchronize;  /* aclrtSynchronizeStream */
    void *workspace;
    uint64_t workspace_size;
    void *executor;
    void *stream;
} hot_launch;

/* Phase 2, then (when asked) the synchronisation. Returns 0, or the failing call's status
 * with *failed set to 1 (phase 2) or 2 (synchronize); the error text is the library's. */
HOTPATH_EXPORT int32_t acl_swiglu_hot_launch(const hot_launch *call, int32_t synchronize, int32_t *failed)
{
    int32_t status = call->launch(call->workspace, call->workspace_size, call->executor, call->stream);
    if (status != 0) {
        *failed = 1;
        return status;
    }
    if (synchronize) {
        status = call->synchronize(call->stream);
        if (status != 0) {
            *failed = 2;
            return status;
        }
    }
    *failed = 0;
    return 0;
}
