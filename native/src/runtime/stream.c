/*
 * Streams. Work queued on a stream (kernels, async copies) runs only when the stream or the
 * device is synchronised, in the synchronising thread, in queue order: a caller that reads
 * results without synchronising sees the memory as it was.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/emu_internal.h"
#include "runtime/runtime_internal.h"

typedef struct emu_stream {
    pthread_mutex_t queue_lock;   /* head, tail, refs */
    pthread_mutex_t run_lock;     /* held while the queue is drained */
    aclEmuTask *head;
    aclEmuTask *tail;
    int refs;
    int is_default;
    struct emu_stream *next_live; /* list of all streams, under streams_lock */
} emu_stream;

static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static emu_stream *live_streams;
static emu_stream *default_stream;

static emu_stream *stream_new(int is_default)
{
    emu_stream *s = calloc(1, sizeof *s);
    if (s == NULL) {
        return NULL;
    }
    pthread_mutex_init(&s->queue_lock, NULL);
    pthread_mutex_init(&s->run_lock, NULL);
    s->refs = 1;
    s->is_default = is_default;
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
    if (left == 0) {
        release_tasks(s->head);
        pthread_mutex_destroy(&s->queue_lock);
        pthread_mutex_destroy(&s->run_lock);
        free(s);
    }
}

void aclEmu_stream_unref(void *resolved_stream) { stream_unref(resolved_stream); }

/* Caller holds streams_lock. */
static void unlink_stream(emu_stream *s)
{
    for (emu_stream **link = &live_streams; *link != NULL; link = &(*link)->next_live) {
        if (*link == s) {
            *link = s->next_live;
            return;
        }
    }
}

int aclEmu_streams_init(void)
{
    pthread_mutex_lock(&streams_lock);
    if (default_stream == NULL) {
        default_stream = stream_new(1);
        if (default_stream != NULL) {
            default_stream->next_live = live_streams;
            live_streams = default_stream;
        }
    }
    int ok = default_stream != NULL;
    pthread_mutex_unlock(&streams_lock);
    return ok ? 0 : ACL_ERROR_BAD_ALLOC;
}

void aclEmu_streams_release_all(void)
{
    pthread_mutex_lock(&streams_lock);
    emu_stream *s = live_streams;
    live_streams = NULL;
    default_stream = NULL;
    pthread_mutex_unlock(&streams_lock);
    while (s != NULL) {
        emu_stream *next = s->next_live;
        /* Wait for a drain in progress, then drop what is still queued. */
        pthread_mutex_lock(&s->run_lock);
        pthread_mutex_lock(&s->queue_lock);
        aclEmuTask *dropped = s->head;
        s->head = s->tail = NULL;
        pthread_mutex_unlock(&s->queue_lock);
        pthread_mutex_unlock(&s->run_lock);
        release_tasks(dropped);
        if (!s->is_default) {
            aclEmu_handle_remove(ACL_EMU_KIND_STREAM, s, "destroyed by aclFinalize");
        }
        stream_unref(s);
        s = next;
    }
}

void *aclEmu_stream_resolve(aclrtStream stream, const char *api, int *code)
{
    pthread_mutex_lock(&streams_lock);
    emu_stream *s = stream == NULL ? default_stream : NULL;
    if (stream != NULL && aclEmu_handle_is(ACL_EMU_KIND_STREAM, stream)) {
        s = stream;
    }
    if (s != NULL) {
        pthread_mutex_lock(&s->queue_lock);
        s->refs++;
        pthread_mutex_unlock(&s->queue_lock);
    }
    pthread_mutex_unlock(&streams_lock);
    if (s == NULL) {
        char why[160];
        if (stream == NULL) {
            *code = aclEmu_fail(ACL_ERROR_UNINITIALIZE, api, "there is no default stream before aclInit");
        } else {
            aclEmu_handle_describe(ACL_EMU_KIND_STREAM, stream, why, sizeof why);
            *code = aclEmu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, api, "stream: %s", why);
        }
    }
    return s;
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
    emu_stream *s = stream_new(0);
    if (s == NULL) {
        return aclEmu_fail(ACL_ERROR_BAD_ALLOC, api, "out of host memory");
    }
    pthread_mutex_lock(&streams_lock);
    s->next_live = live_streams;
    live_streams = s;
    aclEmu_handle_add(ACL_EMU_KIND_STREAM, s);
    pthread_mutex_unlock(&streams_lock);
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
    pthread_mutex_lock(&streams_lock);
    int live = aclEmu_handle_remove(ACL_EMU_KIND_STREAM, stream, "destroyed");
    if (live) {
        unlink_stream(stream);
    }
    pthread_mutex_unlock(&streams_lock);
    if (!live) {
        char why[160];
        aclEmu_handle_describe(ACL_EMU_KIND_STREAM, stream, why, sizeof why);
        return aclEmu_fail(ACL_ERROR_INVALID_RESOURCE_HANDLE, api, "stream: %s", why);
    }
    /* Work already queued still completes, as on a device. */
    rc = drain(stream);
    stream_unref(stream);
    return rc;
}

EMU_EXPORT aclError aclrtSynchronizeStream(aclrtStream stream)
{
    static const char api[] = "aclrtSynchronizeStream";
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_device(api);
    if (rc != 0) return rc;
    emu_stream *s = aclEmu_stream_resolve(stream, api, &rc);
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
    pthread_mutex_lock(&streams_lock);
    size_t n = 0;
    for (emu_stream *s = live_streams; s != NULL; s = s->next_live) {
        n++;
    }
    emu_stream **held = calloc(n ? n : 1, sizeof *held);
    if (held == NULL) {
        pthread_mutex_unlock(&streams_lock);
        return aclEmu_fail(ACL_ERROR_BAD_ALLOC, api, "out of host memory");
    }
    n = 0;
    for (emu_stream *s = live_streams; s != NULL; s = s->next_live) {
        pthread_mutex_lock(&s->queue_lock);
        s->refs++;
        pthread_mutex_unlock(&s->queue_lock);
        held[n++] = s;
    }
    pthread_mutex_unlock(&streams_lock);
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

void aclEmu_streams_lock_for_fork(void) { pthread_mutex_lock(&streams_lock); }
void aclEmu_streams_unlock_after_fork(void) { pthread_mutex_unlock(&streams_lock); }
