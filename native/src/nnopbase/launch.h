/*
 * What every aclnn operator's two phases share, offered by libnnopbase.so: the checks of tensor
 * handles and device memory, aliasing, the executor's record of phase 1, and phase 2 itself
 * (executor, workspace and stream checks, and the queued task that pins the memory its kernel
 * uses). An operator describes itself once and supplies its validation and its kernel.
 */
#ifndef ACL_SWIGLU_NNOPBASE_LAUNCH_H
#define ACL_SWIGLU_NNOPBASE_LAUNCH_H

#include "common/meta_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The tensors of one launch, as they were when it was queued, and the operator's data. */
typedef struct {
    const aclTensor *inputs[EMU_EXECUTOR_MAX_SLOTS];    /* NULL for an absent optional */
    const aclTensor *outputs[EMU_EXECUTOR_MAX_SLOTS];
    size_t input_count;
    size_t output_count;
    const void *op_data;
} aclEmuLaunch;

typedef struct aclEmuOperator {
    const char *name;          /* "SwigluGroupQuantGrad" */
    const char *phase1_api;    /* "aclnn<Name>GetWorkspaceSize" */
    const char *phase2_api;    /* "aclnn<Name>" */
    const char *const *input_names;    /* as the prototype names them, in slot order */
    size_t max_inputs;
    const char *const *output_names;
    size_t max_outputs;
    /* Computes a launch when its stream is synchronised, with all its memory pinned; returns 0
     * or a runtime status after setting the message. */
    int (*kernel)(const aclEmuLaunch *launch);
} aclEmuOperator;

/* Byte range [*start, *start + *len) of a non-empty view from its data address; -1 (nothing
 * set) when the range does not fit the address space. */
EMU_EXPORT int aclEmu_view_bytes(const aclTensor *t, uintptr_t *start, size_t *len);

/* Phase 1: each non-NULL tensor is a live aclTensor (161002 otherwise). */
EMU_EXPORT int aclEmu_check_tensors_live(const aclEmuOperator *op, const aclTensor *const *inputs,
                                         size_t input_count, const aclTensor *const *outputs,
                                         size_t output_count);

/* Both phases: every non-empty tensor's view lies, from a 32-byte aligned address, in one live
 * allocation of the current device (a NULL address passes when `address_optional`); no output
 * overlaps itself, another output or an input. 161002 otherwise. */
EMU_EXPORT int aclEmu_check_launch_memory(const aclEmuOperator *op, const char *api,
                                          const aclTensor *const *inputs, size_t input_count,
                                          const aclTensor *const *outputs, size_t output_count,
                                          int address_optional);

/* Phase 1's result: a new single-use executor of the current device holding copies of the
 * tensor descriptions and of `op_data` (op_data_size bytes, copied again for every launch).
 * Inputs whose bit is set in `unread_inputs` are checked at launch but not read by the kernel.
 * NULL with 561101 and the message set when out of memory. */
EMU_EXPORT aclOpExecutor *aclEmu_executor_record(const aclEmuOperator *op,
                                                 const aclTensor *const *inputs,
                                                 size_t input_count,
                                                 const aclTensor *const *outputs,
                                                 size_t output_count, uint32_t unread_inputs,
                                                 uint64_t workspace_size, const void *op_data,
                                                 size_t op_data_size);

/* Phase 2, whole: checks the executor (consuming a single-use one), the device, every tensor's
 * memory, the workspace and the stream, then queues the kernel unless every output is empty. */
EMU_EXPORT aclnnStatus aclEmu_launch(const aclEmuOperator *op, void *workspace,
                                     uint64_t workspace_size, aclOpExecutor *executor,
                                     aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif
