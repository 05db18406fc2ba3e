/*
 * The calling thread's error texts, set by every failing call of all three libraries. They pile
 * up, newest first and one per line, until aclGetRecentErrMsg reads (and clears) them; the
 * oldest lines give way when the buffer is full.
 */
#include <stdio.h>
#include <string.h>

#include "common/emu_internal.h"

#define EMU_MSG_CAPACITY 4096
#define EMU_LINE_CAPACITY 1024

static __thread char tls_pending[EMU_MSG_CAPACITY];
static __thread size_t tls_pending_len;
/* What aclGetRecentErrMsg handed out last; valid until this thread's next call of it. */
static __thread char tls_returned[EMU_MSG_CAPACITY];

/* Puts `line` (len bytes) in front of the pending text, dropping whole old lines that no longer
 * fit. */
static void prepend(const char *line, size_t len)
{
    size_t keep = tls_pending_len;
    size_t room = sizeof tls_pending - 1 - len - (keep > 0 ? 1 : 0);
    if (keep > room) {
        const char *cut = NULL;
        for (const char *p = tls_pending; p < tls_pending + room; p++) {
            if (*p == '\n') cut = p;
        }
        keep = cut != NULL ? (size_t)(cut - tls_pending) : 0;
    }
    if (keep > 0) {
        memmove(tls_pending + len + 1, tls_pending, keep);
        tls_pending[len] = '\n';
        tls_pending_len = len + 1 + keep;
    } else {
        tls_pending_len = len;
    }
    memcpy(tls_pending, line, len);
    tls_pending[tls_pending_len] = '\0';
}

int aclEmu_vfail(int code, const char *api, const char *fmt, va_list ap)
{
    char line[EMU_LINE_CAPACITY];
    int used = snprintf(line, sizeof line, "%s: ", api ? api : "acl");
    if (used < 0 || (size_t)used >= sizeof line) {
        used = 0;
    }
    vsnprintf(line + used, sizeof line - (size_t)used, fmt, ap);
    size_t len = strlen(line);
    snprintf(line + len, sizeof line - len, " [status %d]", code);
    prepend(line, strlen(line));
    return code;
}

int aclEmu_fail(int code, const char *api, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    aclEmu_vfail(code, api, fmt, ap);
    va_end(ap);
    return code;
}

EMU_EXPORT const char *aclGetRecentErrMsg(void)
{
    if (tls_pending_len == 0) {
        return NULL;
    }
    memcpy(tls_returned, tls_pending, tls_pending_len + 1);
    tls_pending_len = 0;
    tls_pending[0] = '\0';
    return tls_returned;
}
