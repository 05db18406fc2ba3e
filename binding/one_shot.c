/*
 * A one-shot call's device side in one C call: one device allocation (an arena) for every array
 * and the workspace, the copies in (and the zeroing of outputs), the tensors and int arrays,
 * phase 1 (through the operator's thunk), phase 2, the synchronisation, the copies back, and the
 * release of everything, whatever fails. Nothing it makes outlives the call, so an exception on
 * the Python side (an interrupt) can never find something half-made.
 */
#include <string.h>

#include "helper.h"

/* Which call failed first: the binding names it in its error. */
typedef enum {
    STEP_NONE = 0,
    STEP_MALLOC,            /* aclrtMalloc of the arena */
    STEP_COPY_IN,           /* aclrtMemcpy, host to device */
    STEP_CREATE_TENSOR,     /* aclCreateTensor returned NULL (its message names the code) */
    STEP_CREATE_INT_ARRAY,  /* aclCreateIntArray returned NULL */
    STEP_PHASE1,            /* the operator's phase 1 */
    STEP_MALLOC_WORKSPACE,  /* aclrtMalloc of a workspace larger than the arena holds */
    STEP_LAUNCH,            /* the operator's phase 2 */
    STEP_SYNCHRONIZE,       /* aclrtSynchronizeStream */
    STEP_COPY_OUT,          /* aclrtMemcpy, device to host */
    STEP_LAYOUT,            /* the layout itself is beyond what this helper takes */
    STEP_ZERO               /* aclrtMemset of an output the operator may leave partly unwritten */
} one_shot_step;

enum { ABSENT = -1, FIRST_HOST_LIST = -2 };   /* one_shot_layout.handles: host list k is -2 - k */
enum { NOT_MADE = -1 };                        /* the status of a constructor that returned NULL */

typedef struct {
    __typeof__(aclrtMalloc) *malloc;
    __typeof__(aclrtFree) *free;
    __typeof__(aclrtMemcpy) *copy;
    __typeof__(aclrtMemset) *zero;
    __typeof__(aclCreateTensor) *create_tensor;
    __typeof__(aclDestroyTensor) *destroy_tensor;
    __typeof__(aclCreateIntArray) *create_int_array;
    __typeof__(aclDestroyIntArray) *destroy_int_array;
    __typeof__(aclDestroyAclOpExecutor) *destroy_executor;
    __typeof__(aclrtSynchronizeStream) *synchronize;
    __typeof__(aclGetRecentErrMsg) *get_message;
    helper_phase1_thunk thunk;
    const void *phase1;
    helper_phase2 phase2;
} one_shot_api;

typedef struct {
    const int64_t *dims;
    const int64_t *strides;
    uint64_t ndim;
    int64_t storage_numel;   /* the elements the view spans: its storage, declared 1-D */
    int64_t offset;          /* byte offset in the arena; -1 for an empty array (no memory) */
    uint64_t nbytes;         /* bytes copied in (inputs) or out (outputs) */
    int32_t dtype;
    int32_t is_output;       /* an ARRAY_* kind */
} one_shot_array;

/* one_shot_array.is_output: an input (copied in), an output (copied out), or an output the
 * operator may leave partly unwritten (zeroed on the device first, then copied out). */
enum { ARRAY_INPUT = 0, ARRAY_OUTPUT = 1, ARRAY_OUTPUT_PRESET = 2 };

typedef struct {
    const one_shot_array *arrays;
    uint32_t array_count;
    uint32_t handle_count;   /* the operator's handle parameters */
    const int32_t *handles;  /* per handle parameter: an array index, ABSENT, or FIRST_HOST_LIST - k */
    uint32_t host_list_count;
    uint64_t arena_bytes;    /* the arrays' bytes, each 64-byte aligned; the workspace follows */
    const uint64_t *scalars; /* the operator's scalar parameters' bytes, as its thunk reads them */
} one_shot_layout;

/* The message of this thread's last failed call, read right after the failure (the releases
 * that follow must not mix their texts into it). */
static __thread char failure_message[8192];

/* Everything made so far, released in reverse. */
typedef struct {
    const one_shot_api *api;
    uint64_t *report;        /* [step, index, workspace size] of the first failure */
    char *arena;
    void *workspace;         /* a separate one, when phase 1 wanted more than the arena holds */
    aclTensor *tensors[HELPER_MAX_SLOTS];
    aclIntArray *lists[HELPER_MAX_SLOTS];
    aclOpExecutor *executor; /* made by phase 1 and not yet handed to phase 2 */
    int32_t status;
    uint32_t cleanup_failures;
} one_shot_state;

static int32_t fail(one_shot_state *state, int32_t status, one_shot_step step, uint32_t index)
{
    if (state->status == 0) {
        state->status = status;
        state->report[0] = step;
        state->report[1] = index;
        const char *text = state->api->get_message();
        size_t length = text == NULL ? 0 : strlen(text);
        if (length >= sizeof failure_message) {
            length = sizeof failure_message - 1;
        }
        memcpy(failure_message, text == NULL ? "" : text, length);
        failure_message[length] = '\0';
    }
    return status;
}

/* A release that failed: nothing can be done about it (the call's own outcome stands). */
static void cleanup_failed(one_shot_state *state)
{
    state->cleanup_failures++;
}

static void release(one_shot_state *state, uint32_t array_count, uint32_t list_count)
{
    const one_shot_api *api = state->api;
    if (state->executor != NULL) {
        int status = api->destroy_executor(state->executor);
        state->executor = NULL;
        if (status != 0) cleanup_failed(state);
    }
    for (uint32_t k = list_count; k-- > 0;) {
        if (state->lists[k] != NULL) {
            int status = api->destroy_int_array(state->lists[k]);
            if (status != 0) cleanup_failed(state);
        }
    }
    for (uint32_t i = array_count; i-- > 0;) {
        if (state->tensors[i] != NULL) {
            int status = api->destroy_tensor(state->tensors[i]);
            if (status != 0) cleanup_failed(state);
        }
    }
    void *memory[2] = {state->workspace, state->arena};
    for (int m = 0; m < 2; m++) {
        if (memory[m] != NULL) {
            int status = api->free(memory[m]);
            if (status != 0) cleanup_failed(state);
        }
    }
}

static void *address_in(const one_shot_state *state, const one_shot_array *array)
{
    return array->offset < 0 || state->arena == NULL ? NULL : state->arena + array->offset;
}

static int32_t make_everything(one_shot_state *state, const one_shot_layout *layout, const uint64_t *hosts,
                               const uint64_t *host_lists, uint64_t workspace_hint)
{
    const one_shot_api *api = state->api;
    uint64_t size = layout->arena_bytes + workspace_hint;
    if (size < layout->arena_bytes) {
        return fail(state, ACL_ERROR_INVALID_PARAM, STEP_LAYOUT, 0);
    }
    if (size != 0) {
        void *arena = NULL;
        int status = api->malloc(&arena, (size_t)size, ACL_MEM_MALLOC_HUGE_FIRST);
        if (status != 0) return fail(state, status, STEP_MALLOC, 0);
        state->arena = arena;
    }
    for (uint32_t i = 0; i < layout->array_count; i++) {
        const one_shot_array *array = &layout->arrays[i];
        void *device = address_in(state, array);
        const void *host = (const void *)(uintptr_t)hosts[i];
        if (array->is_output == ARRAY_INPUT && device != NULL && host != NULL && array->nbytes != 0) {
            int status = api->copy(device, (size_t)array->nbytes, host, (size_t)array->nbytes,
                                   ACL_MEMCPY_HOST_TO_DEVICE);
            if (status != 0) return fail(state, status, STEP_COPY_IN, i);
        } else if (array->is_output == ARRAY_OUTPUT_PRESET && device != NULL && array->nbytes != 0) {
            int status = api->zero(device, (size_t)array->nbytes, 0, (size_t)array->nbytes);
            if (status != 0) return fail(state, status, STEP_ZERO, i);
        }
        int64_t storage = array->storage_numel;
        state->tensors[i] = api->create_tensor(array->dims, array->ndim, (aclDataType)array->dtype, array->strides, 0,
                                               ACL_FORMAT_ND, &storage, 1, device);
        if (state->tensors[i] == NULL) return fail(state, NOT_MADE, STEP_CREATE_TENSOR, i);
    }
    for (uint32_t k = 0; k < layout->host_list_count; k++) {
        const int64_t *values = (const int64_t *)(uintptr_t)host_lists[2 * k];
        state->lists[k] = api->create_int_array(values, host_lists[2 * k + 1]);
        if (state->lists[k] == NULL) return fail(state, NOT_MADE, STEP_CREATE_INT_ARRAY, k);
    }
    return 0;
}

/* The failed call's message (this thread's last acl_swiglu_one_shot that failed). */
HELPER_EXPORT const char *acl_swiglu_one_shot_message(void)
{
    return failure_message;
}

/* The whole call. words: the workspace bytes to reserve in the arena, then per array the host
 * address it is copied from (an input) or to (an output), then (values, count) of each host
 * int list. Returns 0 or the first failing status (its message: acl_swiglu_one_shot_message),
 * report = [step, index, the workspace phase 1 asked for, releases that failed]. A release that fails changes nothing
 * else: its text is dropped, and the call's outcome stands. */
HELPER_EXPORT int32_t acl_swiglu_one_shot(const one_shot_api *api, const one_shot_layout *layout,
                                          const uint64_t *words, aclrtStream stream, uint64_t *report)
{
    one_shot_state state;
    memset(&state, 0, sizeof state);
    state.api = api;
    state.report = report;
    report[0] = report[1] = report[2] = report[3] = 0;
    if (layout->array_count > HELPER_MAX_SLOTS || layout->handle_count > HELPER_MAX_SLOTS ||
        layout->host_list_count > HELPER_MAX_SLOTS) {
        return fail(&state, ACL_ERROR_INVALID_PARAM, STEP_LAYOUT, 0);
    }
    uint64_t workspace_hint = words[0];
    const uint64_t *hosts = words + 1, *host_lists = hosts + layout->array_count;
    int launched = 0;
    if (make_everything(&state, layout, hosts, host_lists, workspace_hint) == 0) {
        void *handles[HELPER_MAX_SLOTS] = {0};
        for (uint32_t h = 0; h < layout->handle_count; h++) {
            int32_t at = layout->handles[h];
            if (at >= 0 && (uint32_t)at < layout->array_count) {
                handles[h] = state.tensors[at];
            } else if (at <= FIRST_HOST_LIST && (uint32_t)(FIRST_HOST_LIST - at) < layout->host_list_count) {
                handles[h] = state.lists[FIRST_HOST_LIST - at];
            }
        }
        uint64_t size = 0;
        aclOpExecutor *executor = NULL;
        int32_t status = api->thunk(api->phase1, handles, layout->scalars, &size, &executor);
        report[2] = size;
        void *workspace = NULL;
        if (status != 0) {
            fail(&state, status, STEP_PHASE1, 0);
        } else {
            state.executor = executor;   /* (destroyed by release unless phase 2 takes it) */
            if (size > workspace_hint) {
                int got = api->malloc(&state.workspace, (size_t)size, ACL_MEM_MALLOC_HUGE_FIRST);
                if (got != 0) fail(&state, got, STEP_MALLOC_WORKSPACE, 0);
                workspace = state.workspace;
            } else if (size != 0) {
                workspace = state.arena + layout->arena_bytes;
            }
        }
        if (state.status == 0) {
            state.executor = NULL;   /* phase 2 consumes it, failing or not */
            launched = 1;
            status = api->phase2(workspace, size, executor, stream);
            if (status != 0) fail(&state, status, STEP_LAUNCH, 0);
        }
        if (state.status == 0) {
            int synced = api->synchronize(stream);
            if (synced != 0) fail(&state, synced, STEP_SYNCHRONIZE, 0);
        }
        for (uint32_t i = 0; state.status == 0 && i < layout->array_count; i++) {
            const one_shot_array *array = &layout->arrays[i];
            void *device = address_in(&state, array);
            void *host = (void *)(uintptr_t)hosts[i];
            if (array->is_output != ARRAY_INPUT && device != NULL && host != NULL && array->nbytes != 0) {
                int copied = api->copy(host, (size_t)array->nbytes, device, (size_t)array->nbytes,
                                       ACL_MEMCPY_DEVICE_TO_HOST);
                if (copied != 0) fail(&state, copied, STEP_COPY_OUT, i);
            }
        }
    }
    if (launched && state.status != 0) {
        api->synchronize(stream);   /* nothing queued may outlive the arena (its failure is not the one to report) */
    }
    release(&state, layout->array_count, layout->host_list_count);
    if (state.cleanup_failures != 0 || (launched && state.status != 0)) {
        api->get_message();   /* (drops the texts of the drain and of failed releases) */
    }
    report[3] = state.cleanup_failures;
    return state.status;
}
