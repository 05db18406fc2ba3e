/*
 * Streams. Work queued on a stream (kernels, async copies) runs only when the stream or the
 * device is synchronised, in the synchronising thread, in queue order: a caller that reads
 * results without synchronising sees the memory as it was. Each stream belongs to the device
 * that was current when it was made; each device has its own default stream (NULL).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/emu_internal.h"
#include "runtime/device.h"
#include "runtime/stream.h"

typedef struct emu_stream {
    pthread_mutex_t queue_lock;   /* head, tail, refs */
    pthread_mutex_t run_lock;     /* held while the queue is drained */
    aclEmuTask *head;
    aclEmuTask *tail;
    int refs;
    int live;                     /* not destroyed yet; under streams_lock */
    int is_default;
    int32_t device;
    /* Every stream not yet freed, under streams_lock (the fork handlers lock them all). */
    struct emu_stream *prev;
    struct emu_stream *next;
} emu_stream;

static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static emu_stream *all_streams;
static emu_stream *default_streams[EMU_MAX_DEVICES];

/* Caller holds streams_lock. */
static emu_stream *stream_new_locked(int is_default, int32_t device)
{
    emu_stream *s = calloc(1, sizeof *s);
    if (s == NULL) {
        return NULL;
    }
    pthread_mutex_init(&s->queue_lock, NULL);
    pthread_mutex_init(&s->run_lock, NULL);
    s->refs = 1;
    s->live = 1;
    s->is_default = is_default;
    s->device = device;
    s->next = all_streams;
    if (all_streams != NULL) all_streams->prev = s;
    all_streams = s;
    return s;
}

static void release_tasks(aclEmuTask *task)
{
    while (task != NULL) {
        aclEmuTask *next = task->next;
        task->release(task);
        task = next;
    }
}

static void stream_unref(emu_stream *s)
{
    pthread_mutex_lock(&s->queue_lock);
    int left = --s->refs;
    pthread_mutex_unlock(&s->queue_lock);
    if (left != 0) {
        return;
    }
    pthread_mutex_lock(&streams_lock);
    if (s->prev != NULL) s->prev->next = s->next;
    else all_streams = s->next;
    if (s->next != NULL) s->next->prev = s->prev;
    pthread_mutex_unlock(&streams_lock);
    release_tasks(s->head);
    pthread_mutex_destroy(&s->queue_lock);
    pthread_mutex_destroy(&s->run_lock);
    free(s);
}

void aclEmu_stream_unref(void *resolved_stream) { stream_unref(resolved_stream); }

int aclEmu_streams_init(uint32_t devices)
{
    int ok = 1;
    pthread_mutex_lock(&streams_lock);
    for (uint32_t d = 0; d < devices && d < EMU_MAX_DEVICES && ok; d++) {
        if (default_streams[d] == NULL) {
            default_streams[d] = stream_new_locked(1, (int32_t)d);
            ok = default_streams[d] != NULL;
        }
    }
    pthread_mutex_unlock(&streams_lock);
    if (!ok) {
        aclEmu_streams_release_all();
    }
    return ok ? 0 : ACL_ERROR_BAD_ALLOC;
}

/* Takes a reference on every live stream (of `device`, or all when it is -1) into a new array;
 * NULL when out of memory. */
static emu_stream **hold_live_streams(int32_t device, size_t *count)
{
    pthread_mutex_lock(&streams_lock);
    size_t n = 0;
    for (emu_stream *s = all_streams; s != NULL; s = s->next) {
        n += s->live && (device < 0 || s->device == device);
    }
    emu_stream **held = calloc(n ? n : 1, sizeof *held);
    n = 0;
    for (emu_stream *s = all_streams; held != NULL && s != NULL; s = s->next) {
        if (s->live && (device < 0 || s->device == device)) {
            pthread_mutex_lock(&s->queue_lock);
            s->refs++;
            pthread_mutex_unlock(&s->queue_lock);
            held[n++] = s;
        }
    }
    pthread_mutex_unlock(&streams_lock);
    *count = n;
    return held;
}

void aclEmu_streams_release_all(void)
{
    size_t n = 0;
    emu_stream **held = hold_live_streams(-1, &n);
    pthread_mutex_lock(&streams_lock);
    for (size_t i = 0; i < EMU_MAX_DEVICES; i++) {
        default_streams[i] = NULL;
    }
    pthread_mutex_unlock(&streams_lock);
    for (size_t i = 0; held != NULL && i < n; i++) {
        emu_stream *s = held[i];
        /* Wait for a drain in progress, then drop what is still queued. */
        pthread_mutex_lock(&s->run_lock);
        pthread_mutex_lock(&s->queue_lock);
        aclEmuTask *dropped = s->head;
        s->head = s->tail = NULL;
        pthread_mutex_unlock(&s->queue_lock);
        pthread_mutex_unlock(&s->run_lock);
        release_tasks(dropped);
        pthread_mutex_lock(&streams_lock);
        int was_live = s->live;
        s->live = 0;
        pthread_mutex_unlock(&streams_lock);
        if (was_live && !s->is_default) {
            aclEmu_handle_remove(ACL_EMU_KIND_STREAM, s, "destroyed by aclFinalize");
        }
        if (was_live) {
            stream_unref(s);   /* the reference its creator held */
        }
        stream_unref(s);       /* ours */
    }
    free(held);
}

void *aclEmu_stream_resolve(aclrtStream stream, const char *api, int invalid_code, int *code)
{
    int32_t current = aclEmu_current_device();
    pthread_mutex_lock(&streams_lock);
    emu_stream *s = NULL;
    if (stream == NULL) {
        s = current >= 0 ? default_streams[current] : NULL;
    } else if (aclEmu_handle_is(ACL_EMU_KIND_STREAM, stream)) {
        s = stream;
    }
    int32_t owner = s != NULL ? s->device : current;
    if (s != NULL && owner == current) {
        pthread_mutex_lock(&s->queue_lock);
        s->refs++;
        pthread_mutex_unlock(&s->queue_lock);
    }
    pthread_mutex_unlock(&streams_lock);
    if (s != NULL && owner == current) {
        return s;
    }
    if (s != NULL) {
        *code = aclEmu_require_owner(api, ACL_ERROR_RT_STREAM_CONTEXT, "stream", owner);
    } else if (stream == NULL) {
        *code = aclEmu_fail(ACL_ERROR_UNINITIALIZE, api,
                            "there is no default stream before aclInit");
    } else {
        *code = aclEmu_require_handle(api, invalid_code, "stream", ACL_EMU_KIND_STREAM, stream);
    }
    return NULL;
}

void aclEmu_stream_enqueue(void *resolved_stream, aclEmuTask *task)
{
    emu_stream *s = resolved_stream;
    task->next = NULL;
    pthread_mutex_lock(&s->queue_lock);
    if (s->tail != NULL) {
        s->tail->next = task;
    } else {
        s->head = task;
    }
    s->tail = task;
    pthread_mutex_unlock(&s->queue_lock);
    stream_unref(s);
}

/* Runs everything queued, including work queued meanwhile; after a failure the rest of the
 * queue is dropped, as a device stream stops at an exception. Returns the first error. */
static int drain(emu_stream *s)
{
    int first_error = 0;
    pthread_mutex_lock(&s->run_lock);
    for (;;) {
        pthread_mutex_lock(&s->queue_lock);
        aclEmuTask *task = s->head;
        s->head = s->tail = NULL;
        pthread_mutex_unlock(&s->queue_lock);
        if (task == NULL) {
            break;
        }
        while (task != NULL) {
            aclEmuTask *next = task->next;
            if (first_error == 0) {
                first_error = task->run(task);
            }
            task->release(task);
            task = next;
        }
    }
    pthread_mutex_unlock(&s->run_lock);
    return first_error;
}

EMU_EXPORT aclError aclrtCreateStream(aclrtStream *stream)
{
    static const char api[] = "aclrtCreateStream";
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_device(api);
    if (rc != 0) return rc;
    if (stream == NULL) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api, "stream is NULL");
    }
    pthread_mutex_lock(&streams_lock);
    emu_stream *s = stream_new_locked(0, aclEmu_current_device());
    if (s != NULL) {
        aclEmu_handle_add(ACL_EMU_KIND_STREAM, s);
    }
    pthread_mutex_unlock(&streams_lock);
    if (s == NULL) {
        return aclEmu_fail(ACL_ERROR_BAD_ALLOC, api, "out of host memory");
    }
    *stream = s;
    return ACL_SUCCESS;
}

EMU_EXPORT aclError aclrtDestroyStream(aclrtStream stream)
{
    static const char api[] = "aclrtDestroyStream";
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_device(api);
    if (rc != 0) return rc;
    if (stream == NULL) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api, "stream is NULL");
    }
    emu_stream *s = aclEmu_stream_resolve(stream, api, ACL_ERROR_INVALID_RESOURCE_HANDLE, &rc);
    if (s == NULL) {
        return rc;
    }
    pthread_mutex_lock(&streams_lock);
    int was_live = s->live && aclEmu_handle_remove(ACL_EMU_KIND_STREAM, s, "destroyed");
    s->live = 0;
    pthread_mutex_unlock(&streams_lock);
    if (!was_live) {   /* another thread destroyed it meanwhile */
        stream_unref(s);
        return aclEmu_require_handle(api, ACL_ERROR_INVALID_RESOURCE_HANDLE, "stream",
                                     ACL_EMU_KIND_STREAM, stream);
    }
    /* Work already queued still completes, as on a device. */
    rc = drain(s);
    stream_unref(s);   /* the resolve's reference */
    stream_unref(s);   /* the creator's */
    return rc;
}

EMU_EXPORT aclError aclrtSynchronizeStream(aclrtStream stream)
{
    static const char api[] = "aclrtSynchronizeStream";
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_device(api);
    if (rc != 0) return rc;
    emu_stream *s = aclEmu_stream_resolve(stream, api, ACL_ERROR_INVALID_RESOURCE_HANDLE, &rc);
    if (s == NULL) {
        return rc;
    }
    rc = drain(s);
    stream_unref(s);
    return rc;
}

EMU_EXPORT aclError aclrtSynchronizeDevice(void)
{
    static const char api[] = "aclrtSynchronizeDevice";
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_device(api);
    if (rc != 0) return rc;
    size_t n = 0;
    emu_stream **held = hold_live_streams(aclEmu_current_device(), &n);
    if (held == NULL) {
        return aclEmu_fail(ACL_ERROR_BAD_ALLOC, api, "out of host memory");
    }
    int first_error = 0;
    for (size_t i = 0; i < n; i++) {
        int err = drain(held[i]);
        if (first_error == 0) {
            first_error = err;
        }
        stream_unref(held[i]);
    }
    free(held);
    return first_error;
}

void aclEmu_streams_lock_for_fork(void)
{
    pthread_mutex_lock(&streams_lock);
    for (emu_stream *s = all_streams; s != NULL; s = s->next) {
        pthread_mutex_lock(&s->run_lock);
        pthread_mutex_lock(&s->queue_lock);
    }
}

void aclEmu_streams_unlock_after_fork(void)
{
    for (emu_stream *s = all_streams; s != NULL; s = s->next) {
        pthread_mutex_unlock(&s->queue_lock);
        pthread_mutex_unlock(&s->run_lock);
    }
    pthread_mutex_unlock(&streams_lock);
}
