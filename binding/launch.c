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
    aclOpExecutor *executor;   /* the package's copy of the handle: NULL once handed to CANN */
    aclrtStream stream;
    int64_t repeatable;        /* set by acl_swiglu_make_repeatable, in the call that makes it so */
} helper_launch;

/* What a result says in its upper 32 bits; the lower 32 hold the failed call's status. */
enum { LAUNCH_DONE = 0, LAUNCH_PHASE2_FAILED = 1, LAUNCH_SYNC_FAILED = 2 };

static int64_t result_of(int32_t kind, int32_t status)
{
    return (int64_t)(((uint64_t)(uint32_t)kind << 32) | (uint32_t)status);
}

/* Phase 2 hands a single-use executor to CANN, whatever it returns: its pointer is cleared by this
 * very call, so that the caller learns it no longer owns it even if an exception interrupts it
 * right after. */
HELPER_EXPORT int64_t acl_swiglu_launch(helper_launch *launch, int32_t synchronize)
{
    aclnnStatus status = launch->phase2(launch->workspace, launch->workspace_size, launch->executor, launch->stream);
    if (!launch->repeatable) {
        launch->executor = NULL;
    }
    if (status != 0) {
        return result_of(LAUNCH_PHASE2_FAILED, status);
    }
    if (synchronize) {
        aclError synced = launch->synchronize(launch->stream);
        if (synced != 0) {
            return result_of(LAUNCH_SYNC_FAILED, synced);
        }
    }
    return result_of(LAUNCH_DONE, 0);
}

/* aclSetAclOpExecutorRepeatable, recorded where acl_swiglu_launch reads it in the same call: an
 * exception right after cannot leave the caller believing a repeatable executor single-use. */
HELPER_EXPORT int32_t acl_swiglu_make_repeatable(helper_launch *launch,
                                                 __typeof__(aclSetAclOpExecutorRepeatable) *set_repeatable)
{
    aclnnStatus status = set_repeatable(launch->executor);
    if (status == 0) {
        launch->repeatable = 1;
    }
    return status;
}
