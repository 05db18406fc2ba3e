/*
 * aclOpExecutor: what phase 1 prepared for phase 2. Single-use unless made repeatable; a
 * repeatable one lives until aclDestroyAclOpExecutor and has its tensor addresses refreshed
 * with aclSetInputTensorAddr / aclSetOutputTensorAddr on the handles used at phase 1.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/meta_internal.h"

/* Device addresses of tensors must be 32-byte aligned on Ascend. */
#define TENSOR_ADDR_ALIGNMENT 32

static pthread_mutex_t executor_lock = PTHREAD_MUTEX_INITIALIZER;

void aclEmu_executor_lock(void) { pthread_mutex_lock(&executor_lock); }
void aclEmu_executor_unlock(void) { pthread_mutex_unlock(&executor_lock); }

aclOpExecutor *aclEmu_executor_new(const char *op_name)
{
    aclOpExecutor *executor = calloc(1, sizeof *executor);
    if (executor != NULL) {
        executor->op_name = op_name;
        aclEmu_handle_add(ACL_EMU_KIND_EXECUTOR, executor);
    }
    return executor;
}

static void executor_free(aclOpExecutor *executor)
{
    if (executor->op_data_free != NULL) {
        executor->op_data_free(executor->op_data);
    }
    free(executor);
}

void aclEmu_executor_discard(aclOpExecutor *executor)
{
    if (executor != NULL) {
        aclEmu_handle_remove(ACL_EMU_KIND_EXECUTOR, executor, "discarded");
        executor_free(executor);
    }
}

void aclEmu_executor_consume_locked(aclOpExecutor *executor, const char *reason)
{
    aclEmu_handle_remove(ACL_EMU_KIND_EXECUTOR, executor, reason);
    executor_free(executor);
}

/* With the lock held: 0 when `executor` is live, else the status with the message set. */
static int check_live(const char *api, const aclOpExecutor *executor)
{
    if (executor == NULL) {
        return aclEmu_fail(ACLNN_ERR_PARAM_NULLPTR, api, "executor is NULL");
    }
    if (!aclEmu_handle_is(ACL_EMU_KIND_EXECUTOR, executor)) {
        char why[200];
        aclEmu_handle_describe(ACL_EMU_KIND_EXECUTOR, executor, why, sizeof why);
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api, "executor: %s", why);
    }
    return 0;
}

EMU_EXPORT aclnnStatus aclSetAclOpExecutorRepeatable(aclOpExecutor *executor)
{
    static const char api[] = "aclSetAclOpExecutorRepeatable";
    int rc = aclEmu_fault(api);
    if (rc != 0) {
        return rc;
    }
    pthread_mutex_lock(&executor_lock);
    rc = check_live(api, executor);
    if (rc == 0) {
        executor->repeatable = 1;
    }
    pthread_mutex_unlock(&executor_lock);
    return rc;
}

EMU_EXPORT aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor)
{
    static const char api[] = "aclDestroyAclOpExecutor";
    int rc = aclEmu_fault(api);
    if (rc != 0 || executor == NULL) {
        return rc;
    }
    pthread_mutex_lock(&executor_lock);
    rc = check_live(api, executor);
    if (rc == 0) {
        aclEmu_handle_remove(ACL_EMU_KIND_EXECUTOR, executor, "destroyed");
        executor_free(executor);
    }
    pthread_mutex_unlock(&executor_lock);
    return rc;
}

static aclnnStatus set_slot_addr(const char *api, const char *side, aclOpExecutor *executor,
                                 size_t index, aclTensor *tensor, void *addr, int is_input)
{
    int rc = aclEmu_fault(api);
    if (rc != 0) {
        return rc;
    }
    if (executor == NULL || tensor == NULL) {
        return aclEmu_fail(ACLNN_ERR_INNER_NULLPTR, api, "%s is NULL",
                           executor == NULL ? "executor" : "tensor");
    }
    if (((uintptr_t)addr % TENSOR_ADDR_ALIGNMENT) != 0) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                           "addr %p is not %d-byte aligned (device tensor addresses must be)",
                           addr, TENSOR_ADDR_ALIGNMENT);
    }
    pthread_mutex_lock(&executor_lock);
    rc = check_live(api, executor);
    if (rc == 0 && !executor->repeatable) {
        rc = aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                         "executor is not repeatable; call aclSetAclOpExecutorRepeatable right "
                         "after phase 1 to refresh addresses");
    }
    /* Read the executor only once it is known to be live (a dead one was freed). */
    size_t count = 0;
    aclEmuSlot *slots = NULL;
    if (rc == 0) {
        count = is_input ? executor->input_count : executor->output_count;
        slots = is_input ? executor->inputs : executor->outputs;
    }
    if (rc == 0 && index >= count) {
        rc = aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                         "index %zu is out of range: %s has %zu %s tensor(s) (0..%zu)", index,
                         executor->op_name, count, side, count - 1);
    }
    if (rc == 0 && slots[index].handle == NULL) {
        rc = aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                         "%s %zu was NULL at phase 1, so it has no address to refresh", side,
                         index);
    }
    if (rc == 0 && slots[index].handle != tensor) {
        rc = aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                         "tensor %p is not the handle given as %s %zu at phase 1 (%p)",
                         (void *)tensor, side, index, (const void *)slots[index].handle);
    }
    if (rc == 0) {
        slots[index].view.data = addr;
        if (aclEmu_handle_is(ACL_EMU_KIND_TENSOR, tensor)) {
            tensor->data = addr;
        }
    }
    pthread_mutex_unlock(&executor_lock);
    return rc;
}

EMU_EXPORT aclnnStatus aclSetInputTensorAddr(aclOpExecutor *executor, const size_t index,
                                             aclTensor *tensor, void *addr)
{
    return set_slot_addr("aclSetInputTensorAddr", "input", executor, index, tensor, addr, 1);
}

EMU_EXPORT aclnnStatus aclSetOutputTensorAddr(aclOpExecutor *executor, const size_t index,
                                              aclTensor *tensor, void *addr)
{
    return set_slot_addr("aclSetOutputTensorAddr", "output", executor, index, tensor, addr, 0);
}
