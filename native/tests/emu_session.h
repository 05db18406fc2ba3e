/* The opening and closing of an emulator C test: the runtime initialised on the default ABI
 * revision, device 0 and a stream when the test wants them, and at the end a check that the
 * test left no handle of any kind behind before everything is released again. */
#ifndef ACL_SWIGLU_EMU_SESSION_H
#define ACL_SWIGLU_EMU_SESSION_H

#include <stdint.h>
#include <stdlib.h>

#include "acl/acl.h"
#include "acl_emu/acl_emu.h"
#include "emu_test.h"

/* Live handles of every kind, to check that a test left none behind. */
typedef struct {
    int64_t count[ACL_EMU_KIND_COUNT];
} live_counts;

static inline live_counts live_counts_now(void)
{
    live_counts c;
    for (int k = 0; k < ACL_EMU_KIND_COUNT; k++) c.count[k] = aclEmuLiveCount((aclEmuHandleKind)k);
    return c;
}

static inline void check_live_counts(const live_counts *before)
{
    for (int k = 0; k < ACL_EMU_KIND_COUNT; k++) {
        CHECK_EQ_INT(aclEmuLiveCount((aclEmuHandleKind)k), before->count[k]);
    }
}

/* How much of the runtime a test starts with. */
typedef enum {
    EMU_SESSION_RUNTIME,         /* aclInit only: the test sets devices itself */
    EMU_SESSION_DEVICE,          /* and device 0 set on this thread */
    EMU_SESSION_DEVICE_STREAM,   /* and a stream created on it */
} emu_session_scope;

typedef struct {
    emu_session_scope scope;
    aclrtStream stream;   /* NULL below EMU_SESSION_DEVICE_STREAM */
    live_counts start;    /* taken once the session's own handles exist */
} emu_session;

/* The ABI variables are cleared so that the caller's environment cannot pick the revision;
 * a test that wants one sets it itself. */
static inline emu_session emu_session_begin(emu_session_scope scope)
{
    emu_session s = {scope, NULL, {{0}}};
    unsetenv("ACL_SWIGLU_ABI");
    unsetenv("ACL_EMU_ABI");
    CHECK_EQ_INT(aclInit(NULL), ACL_SUCCESS);
    if (scope >= EMU_SESSION_DEVICE) CHECK_EQ_INT(aclrtSetDevice(0), ACL_SUCCESS);
    if (scope >= EMU_SESSION_DEVICE_STREAM) CHECK_EQ_INT(aclrtCreateStream(&s.stream), ACL_SUCCESS);
    s.start = live_counts_now();
    return s;
}

/* Checks that the live counts are back where they started and destroys the session's stream;
 * the device stays set and the runtime initialised, for a test of what aclFinalize does to
 * what is left. */
static inline void emu_session_release(emu_session *s)
{
    check_live_counts(&s->start);
    if (s->stream != NULL) CHECK_EQ_INT(aclrtDestroyStream(s->stream), ACL_SUCCESS);
    s->stream = NULL;
}

/* emu_session_release, then the device reset and aclFinalize. */
static inline void emu_session_end(emu_session *s)
{
    emu_session_release(s);
    if (s->scope >= EMU_SESSION_DEVICE) CHECK_EQ_INT(aclrtResetDevice(0), ACL_SUCCESS);
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);
}

#endif
