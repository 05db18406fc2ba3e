/*
 * Layout of the meta objects, shared by libnnopbase.so (which owns them) and libopapi.so
 * (which reads tensors and builds executors). Not part of any public API.
 */
#ifndef ACL_SWIGLU_META_INTERNAL_H
#define ACL_SWIGLU_META_INTERNAL_H

#include <pthread.h>

#include "aclnn/acl_meta.h"
#include "common/emu_internal.h"

#define EMU_MAX_DIMS 16
#define EMU_EXECUTOR_MAX_SLOTS 8

struct aclTensor {
    aclDataType dtype;
    aclFormat format;
    uint64_t ndim;
    int64_t dims[EMU_MAX_DIMS];
    int64_t strides[EMU_MAX_DIMS];   /* elements */
    int64_t offset;                  /* elements from data */
    int64_t storage_numel;
    void *data;
    /* Unique per aclCreateTensor, so that a new tensor that reuses a destroyed one's address is
     * not mistaken for it (an executor's slot records the serial of its phase-1 handle). */
    uint64_t serial;
};

struct aclIntArray {
    uint64_t size;
    int64_t values[];
};

typedef struct {
    const aclTensor *handle;   /* the handle given at phase 1; NULL for an absent optional */
    aclTensor view;            /* its description, copied at phase 1, address kept current */
} aclEmuSlot;

struct aclEmuOperator;

struct aclOpExecutor {
    const struct aclEmuOperator *op;
    int32_t device;            /* current when phase 1 made it */
    int repeatable;
    uint64_t launches;
    size_t input_count;
    size_t output_count;
    aclEmuSlot inputs[EMU_EXECUTOR_MAX_SLOTS];
    aclEmuSlot outputs[EMU_EXECUTOR_MAX_SLOTS];
    uint32_t unread_inputs;    /* bit i: input i is checked at launch but not read */
    uint64_t workspace_size;
    void *op_data;             /* one malloc block of op_data_size bytes */
    size_t op_data_size;
};

#ifdef __cplusplus
extern "C" {
#endif

/* Element count of a view (0 when any dim is 0); -1 on overflow. Every view aclCreateTensor
 * accepted has an extent that fits int64 in bytes, offset included. */
EMU_EXPORT int64_t aclEmu_numel(const int64_t *dims, uint64_t ndim);
/* Highest element index a non-empty view reaches from its offset (offset included). */
EMU_EXPORT int64_t aclEmu_view_last_index(const aclTensor *t);

/* Serialises every use of executors: launches, address updates and destruction. */
void aclEmu_executor_lock(void);
void aclEmu_executor_unlock(void);
/* With the executor lock held: unregisters and frees an executor. */
void aclEmu_executor_free_locked(aclOpExecutor *executor, const char *reason);

#ifdef __cplusplus
}
#endif

#endif /* ACL_SWIGLU_META_INTERNAL_H */
