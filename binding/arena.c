/*
 * A one-shot call's device side in C: the arena allocated, every input copied in and every
 * tensor made in one call (open); phase 2, the synchronisation, the copies back and every
 * release in another (finish); or all of it, phase 1 too (through the operator's thunk), in one
 * (run). They run from function pointers the Python side took from whichever libraries it
 * loaded, so a small one-shot call costs one or two ctypes calls instead of one per step.
 * This library links to no ACL library: it only calls what it is given.
 */
#include <stddef.h>
#include <stdint.h>

#include "lean.h"

#if defined(_WIN32)
#define ARENA_EXPORT
#else
#define ARENA_EXPORT __attribute__((visibility("default")))
#endif

enum { MEMCPY_HOST_TO_DEVICE = 1, MEMCPY_DEVICE_TO_HOST = 2 };
enum { TENSOR_NOT_MADE = -1 };   /* returned when aclCreateTensor gave NULL (its message says why) */

/* Which call failed first: the binding names it in its error. */
typedef enum {
    STEP_NONE = 0,
    STEP_MALLOC,          /* aclrtMalloc */
    STEP_COPY_IN,         /* aclrtMemcpy, host to device */
    STEP_CREATE_TENSOR,   /* aclCreateTensor */
    STEP_PHASE1,          /* the operator's phase 1 (made here by acl_swiglu_arena_run) */
    STEP_LAUNCH,          /* the operator's phase 2 */
    STEP_SYNCHRONIZE,     /* aclrtSynchronizeStream */
    STEP_COPY_OUT,        /* aclrtMemcpy, device to host */
    STEP_DESTROY_TENSOR,  /* aclDestroyTensor */
    STEP_FREE             /* aclrtFree */
} arena_step;

typedef int (*malloc_fn)(void **ptr, size_t size, int policy);
typedef int (*free_fn)(void *ptr);
typedef int (*memcpy_fn)(void *dst, size_t dst_max, const void *src, size_t count, int kind);
typedef void *(*create_tensor_fn)(const int64_t *dims, uint64_t ndim, int dtype, const int64_t *strides,
                                  int64_t offset, int format, const int64_t *storage_dims, uint64_t storage_ndim,
                                  void *data);
typedef int (*destroy_tensor_fn)(void *tensor);
typedef int32_t (*launch_fn)(void *workspace, uint64_t workspace_size, void *executor, void *stream);
typedef int (*synchronize_fn)(void *stream);

/* Laid out as the binding's ctypes structures of the same fields, in this order. */
typedef struct {
    malloc_fn malloc;                /* aclrtMalloc */
    free_fn free;                    /* aclrtFree */
    memcpy_fn copy;                  /* aclrtMemcpy */
    create_tensor_fn create_tensor;  /* aclCreateTensor */
    destroy_tensor_fn destroy_tensor;/* aclDestroyTensor */
    launch_fn launch;                /* the operator's phase 2 */
    synchronize_fn synchronize;      /* aclrtSynchronizeStream */
    int32_t malloc_policy;
} arena_api;

typedef struct {
    const int64_t *dims;
    const int64_t *strides;
    const int64_t *storage_dims;     /* one value: the elements the view spans */
    uint64_t ndim;
    int64_t offset;                  /* byte offset in the arena, -1 for an empty array */
    uint64_t nbytes;
    int32_t dtype;
    int32_t format;
} arena_array;

/* One call's state. slots[0 .. count) are the host addresses (the source of an input, the
 * destination of an output, or NULL), slots[count .. 2 count) the tensors made (NULL before). */
typedef struct {
    char *base;                      /* the arena; NULL when not allocated (or released) */
    uint64_t size;                   /* its bytes: the arrays, then workspace_capacity */
    uint64_t workspace_offset;       /* where the workspace starts in it */
    uint64_t workspace_capacity;
    int32_t step;                    /* the first failure's arena_step */
    uint32_t index;                  /* the array it failed on */
    void **slots;
    void *executor;                  /* set by acl_swiglu_arena_run when phase 1 needs more workspace */
    uint64_t workspace_size;         /* what it needs then */
    /* >= 0: each non-NULL host slot is an array object, whose data pointer is this many bytes in
     * (open reads them, then sets -1); -1: the host slots are the addresses themselves. */
    int64_t host_data_offset;
} arena_call;

/* Phase 1 of a one-shot layout, for acl_swiglu_arena_run: the operator's thunk and what it
 * passes (the tensor of each operator slot, by arena index; the scalars' bytes). */
typedef struct {
    lean_phase1_thunk thunk;
    const void *phase1;
    uint32_t slot_count;
    int32_t slots[LEAN_MAX_HANDLES];   /* per operator slot: its array's index, or -1 (absent) */
    uint64_t scalars[LEAN_MAX_SCALARS];
} arena_phase1;

static void *address_in(const char *base, const arena_array *array)
{
    return array->offset < 0 || base == NULL ? NULL : (void *)(base + array->offset);
}

static int32_t fail(arena_call *call, int32_t status, arena_step step, uint32_t index)
{
    if (call->step == STEP_NONE) {
        call->step = (int32_t)step;
        call->index = index;
    }
    return status;
}

/* Every tensor made destroyed (in reverse order), then the arena freed; all of it even when a
 * call fails. Returns 0 or the first failing status (recorded unless one came earlier). */
static int32_t release(const arena_api *api, uint32_t count, arena_call *call)
{
    int32_t first = 0;
    void **tensors = call->slots + count;
    for (uint32_t i = count; i-- > 0;) {
        if (tensors[i] != NULL) {
            int status = api->destroy_tensor(tensors[i]);
            tensors[i] = NULL;
            if (status != 0 && first == 0) {
                first = fail(call, status, STEP_DESTROY_TENSOR, i);
            }
        }
    }
    if (call->base != NULL) {
        int status = api->free(call->base);
        call->base = NULL;
        if (status != 0 && first == 0) {
            first = fail(call, status, STEP_FREE, 0);
        }
    }
    return first;
}

/* Allocates the arena, copies each input (arrays[0 .. first_output)) with a host source to its
 * place and makes every array's tensor (slots[count + i], which the caller zeroed). Returns 0,
 * or the failing status (call->step and call->index say where) with what was made still held:
 * the caller reads the failure's message first, then calls acl_swiglu_arena_close. */
ARENA_EXPORT int32_t acl_swiglu_arena_open(const arena_api *api, const arena_array *arrays, uint32_t count,
                                           uint32_t first_output, arena_call *call)
{
    void **hosts = call->slots, **tensors = call->slots + count;
    if (call->host_data_offset >= 0) {
        for (uint32_t i = 0; i < count; i++) {
            if (hosts[i] != NULL) {
                hosts[i] = *(void *const *)((const char *)hosts[i] + call->host_data_offset);
            }
        }
        call->host_data_offset = -1;
    }
    if (call->size != 0) {
        void *base = NULL;
        int status = api->malloc(&base, (size_t)call->size, api->malloc_policy);
        if (status != 0) {
            return fail(call, status, STEP_MALLOC, 0);
        }
        call->base = base;
    }
    for (uint32_t i = 0; i < count; i++) {
        const arena_array *array = &arrays[i];
        void *device = address_in(call->base, array);
        if (i < first_output && hosts[i] != NULL && device != NULL && array->nbytes != 0) {
            int status = api->copy(device, (size_t)array->nbytes, hosts[i], (size_t)array->nbytes,
                                   MEMCPY_HOST_TO_DEVICE);
            if (status != 0) {
                return fail(call, status, STEP_COPY_IN, i);
            }
        }
        tensors[i] = api->create_tensor(array->dims, array->ndim, array->dtype, array->strides, 0, array->format,
                                        array->storage_dims, 1, device);
        if (tensors[i] == NULL) {
            return fail(call, TENSOR_NOT_MADE, STEP_CREATE_TENSOR, i);
        }
    }
    return 0;
}

/* Phase 2 of the single-use executor phase 1 made on these tensors (consumed whatever
 * happens), with `workspace` (NULL: the arena's own, workspace_size <= workspace_capacity), on
 * `stream`; then the synchronisation, the copy of each output (arrays[first_output ..]) to its
 * host destination, and the release of everything. Returns 0, or the first failing status
 * (call->step and call->index say where). A failure before the release leaves everything held,
 * as after acl_swiglu_arena_open; a failed release has released all it could. */
ARENA_EXPORT int32_t acl_swiglu_arena_finish(const arena_api *api, const arena_array *arrays, uint32_t count,
                                             uint32_t first_output, arena_call *call, void *executor,
                                             uint64_t workspace_size, void *workspace, void *stream)
{
    void **hosts = call->slots;
    if (workspace == NULL && workspace_size != 0 && call->base != NULL) {
        workspace = call->base + call->workspace_offset;
    }
    int32_t status = api->launch(workspace, workspace_size, executor, stream);
    if (status != 0) {
        return fail(call, status, STEP_LAUNCH, 0);
    }
    status = api->synchronize(stream);
    if (status != 0) {
        return fail(call, status, STEP_SYNCHRONIZE, 0);
    }
    for (uint32_t i = first_output; i < count; i++) {
        const arena_array *array = &arrays[i];
        void *device = address_in(call->base, array);
        if (hosts[i] != NULL && device != NULL && array->nbytes != 0) {
            int copied = api->copy(hosts[i], (size_t)array->nbytes, device, (size_t)array->nbytes,
                                   MEMCPY_DEVICE_TO_HOST);
            if (copied != 0) {
                return fail(call, copied, STEP_COPY_OUT, i);
            }
        }
    }
    return release(api, count, call);
}

/* Releases what the call still holds when it ends in a failure; once the launch was tried the
 * stream is drained first (nothing it queued may outlive the arena). Returns 0 or the first
 * failing status. */
ARENA_EXPORT int32_t acl_swiglu_arena_close(const arena_api *api, uint32_t count, arena_call *call, void *stream)
{
    int32_t drained = 0;
    if (call->step >= STEP_LAUNCH) {   /* (a failed synchronisation may not have waited) */
        drained = api->synchronize(stream);
    }
    int32_t released = release(api, count, call);
    return drained != 0 ? drained : released;
}

/* The whole call: acl_swiglu_arena_open, phase 1, then acl_swiglu_arena_finish with the arena's
 * own workspace. Returns 0 when it is done (everything released), or a failing status as they
 * do (STEP_PHASE1: phase 1 failed, nothing to destroy). When phase 1 asks for more workspace than
 * the arena holds it returns 0 with call->executor and call->workspace_size set and nothing
 * launched: the caller finds a workspace and calls acl_swiglu_arena_finish itself. */
ARENA_EXPORT int32_t acl_swiglu_arena_run(const arena_api *api, const arena_array *arrays, uint32_t count,
                                          uint32_t first_output, arena_call *call, const arena_phase1 *phase1,
                                          void *stream)
{
    int32_t status = acl_swiglu_arena_open(api, arrays, count, first_output, call);
    if (status != 0) {
        return status;
    }
    void *handles[LEAN_MAX_HANDLES] = {0};
    void *const *tensors = call->slots + count;
    for (uint32_t i = 0; i < phase1->slot_count && i < LEAN_MAX_HANDLES; i++) {
        int32_t index = phase1->slots[i];
        handles[i] = index >= 0 && (uint32_t)index < count ? tensors[index] : NULL;
    }
    uint64_t size = 0;
    void *executor = NULL;
    status = phase1->thunk(phase1->phase1, handles, phase1->scalars, &size, &executor);
    if (status != 0) {
        return fail(call, status, STEP_PHASE1, 0);
    }
    if (size > call->workspace_capacity) {
        call->executor = executor;
        call->workspace_size = size;
        return 0;
    }
    return acl_swiglu_arena_finish(api, arrays, count, first_output, call, executor, size, NULL, stream);
}
