/*
 * aclOpExecutor: what phase 1 prepared for phase 2. Single-use unless made repeatable; a
 * repeatable one lives until aclDestroyAclOpExecutor and has its tensor addresses refreshed
 * with aclSetInputTensorAddr / aclSetOutputTensorAddr on the handles used at phase 1. Each
 * belongs to the device that was current at phase 1.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/meta_internal.h"
#include "nnopbase/launch.h"

/* Device addresses of tensors must be 32-byte aligned on Ascend. */
#define TENSOR_ADDR_ALIGNMENT 32

static pthread_mutex_t executor_lock = PTHREAD_MUTEX_INITIALIZER;

void aclEmu_executor_lock(void) { pthread_mutex_lock(&executor_lock); }
void aclEmu_executor_unlock(void) { pthread_mutex_unlock(&executor_lock); }

static void lock_for_fork(void) { pthread_mutex_lock(&executor_lock); }
static void unlock_after_fork(void) { pthread_mutex_unlock(&executor_lock); }

/* libascendcl.so registered its handlers first, so this prepare handler runs before its
 * ones: the executor lock is taken outermost, as in every call that nests the locks. */
__attribute__((constructor)) static void register_fork_handlers(void)
{
    pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork);
}

static void record_slots(aclEmuSlot *slots, const aclTensor *const *tensors, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        slots[i].handle = tensors[i];
        if (tensors[i] != NULL) {
            slots[i].view = *tensors[i];
        }
    }
}

aclOpExecutor *aclEmu_executor_record(const aclEmuOperator *op, const aclTensor *const *inputs,
                                      size_t input_count, const aclTensor *const *outputs,
                                      size_t output_count, uint32_t unread_inputs,
                                      uint64_t workspace_size, const void *op_data,
                                      size_t op_data_size)
{
    aclOpExecutor *executor = calloc(1, sizeof *executor);
    void *data = malloc(op_data_size ? op_data_size : 1);
    if (executor == NULL || data == NULL) {
        free(executor);
        free(data);
        aclEmu_fail(ACLNN_ERR_INNER_CREATE_EXECUTOR, op->phase1_api, "out of host memory");
        return NULL;
    }
    memcpy(data, op_data, op_data_size);
    executor->op = op;
    executor->device = aclEmu_current_device();
    executor->input_count = input_count;
    executor->output_count = output_count;
    record_slots(executor->inputs, inputs, input_count);
    record_slots(executor->outputs, outputs, output_count);
    executor->unread_inputs = unread_inputs;
    executor->workspace_size = workspace_size;
    executor->op_data = data;
    executor->op_data_size = op_data_size;
    aclEmu_handle_add(ACL_EMU_KIND_EXECUTOR, executor);
    return executor;
}

void aclEmu_executor_free_locked(aclOpExecutor *executor, const char *reason)
{
    aclEmu_handle_remove(ACL_EMU_KIND_EXECUTOR, executor, reason);
    free(executor->op_data);
    free(executor);
}

/* With the lock held: 0 when `executor` is live, else the status with the message set. */
static int check_live(const char *api, const aclOpExecutor *executor)
{
    if (executor == NULL) {
        return aclEmu_fail(ACLNN_ERR_PARAM_NULLPTR, api, "executor is NULL");
    }
    return aclEmu_require_handle(api, ACLNN_ERR_PARAM_INVALID, "executor", ACL_EMU_KIND_EXECUTOR,
                                 executor);
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
        aclEmu_executor_free_locked(executor, "destroyed");
    }
    pthread_mutex_unlock(&executor_lock);
    return rc;
}

/* With the lock held and the executor live: the slot `index` of one side, checked against the
 * tensor handle given for it. */
static int check_slot(const char *api, const char *side, const aclOpExecutor *executor,
                      const aclEmuSlot *slots, size_t count, size_t index, const aclTensor *tensor)
{
    if (!executor->repeatable) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                           "executor is not repeatable; call aclSetAclOpExecutorRepeatable right "
                           "after phase 1 to refresh addresses");
    }
    if (index >= count) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                           "index %zu is out of range: %s has %zu %s tensor(s) (0..%zu)", index,
                           executor->op->name, count, side, count - 1);
    }
    if (slots[index].handle == NULL) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                           "%s %zu was NULL at phase 1, so it has no address to refresh", side,
                           index);
    }
    if (slots[index].handle != tensor) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                           "tensor %p is not the handle given as %s %zu at phase 1 (%p)",
                           (const void *)tensor, side, index, (const void *)slots[index].handle);
    }
    if (slots[index].view.serial != tensor->serial) {
        return aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api,
                           "tensor %p is a new tensor at the address of the one given as %s %zu "
                           "at phase 1, which was destroyed since",
                           (const void *)tensor, side, index);
    }
    return 0;
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
    /* Read the executor only once it is known to be live (a dead one was freed). */
    if (rc == 0) {
        rc = aclEmu_require_owner(api, ACLNN_ERR_PARAM_INVALID, "executor", executor->device);
    }
    if (rc == 0) {
        rc = aclEmu_require_handle(api, ACLNN_ERR_PARAM_INVALID, "tensor", ACL_EMU_KIND_TENSOR,
                                   tensor);
    }
    aclEmuSlot *slots = NULL;
    if (rc == 0) {
        slots = is_input ? executor->inputs : executor->outputs;
        rc = check_slot(api, side, executor, slots,
                        is_input ? executor->input_count : executor->output_count, index, tensor);
    }
    if (rc == 0) {
        slots[index].view.data = addr;
        tensor->data = addr;
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
