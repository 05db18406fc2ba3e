/*
 * Phase 2 of an executor and, optionally, the stream's synchronisation, in one call: what a
 * plan call, a device-level call and an Executor's launch make per launch. The caller owns the
 * arguments for the length of the call (a plan's lock, a device-level call's kept executor, an
 * Executor's launch lock).
 */
#include "helper.h"

typedef struct {
    helper_phase2 phase2;
    __typeof__(aclrtSynchronizeStream) *synchronize;
    void *workspace;
    uint64_t workspace_size;
    aclOpExecutor *executor;
    aclrtStream stream;
} helper_launch;

/* What a result says in its upper 32 bits; the lower 32 hold the failed call's status. */
enum { LAUNCH_DONE = 0, LAUNCH_PHASE2_FAILED = 1, LAUNCH_SYNC_FAILED = 2 };

static int64_t result_of(int32_t kind, int32_t status)
{
    return (int64_t)(((uint64_t)(uint32_t)kind << 32) | (uint32_t)status);
}

/* The flags: wait for the stream after phase 2; the executor is single-use, so phase 2 hands it
 * to CANN whatever it returns. A handed-over executor's pointer is cleared by this very call, so
 * that its caller learns that it no longer owns it even if an exception interrupts it right after. */
enum { LAUNCH_SYNCHRONIZE = 1, LAUNCH_HANDS_OVER = 2 };

HELPER_EXPORT int64_t acl_swiglu_launch(helper_launch *launch, int32_t flags)
{
    aclnnStatus status = launch->phase2(launch->workspace, launch->workspace_size, launch->executor, launch->stream);
    if (flags & LAUNCH_HANDS_OVER) {
        launch->executor = NULL;
    }
    if (status != 0) {
        return result_of(LAUNCH_PHASE2_FAILED, status);
    }
    if (flags & LAUNCH_SYNCHRONIZE) {
        aclError synced = launch->synchronize(launch->stream);
        if (synced != 0) {
            return result_of(LAUNCH_SYNC_FAILED, synced);
        }
    }
    return result_of(LAUNCH_DONE, 0);
}
