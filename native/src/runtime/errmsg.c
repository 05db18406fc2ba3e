/* The calling thread's recent error text, set by every failing call of all three libraries. */
#include <stdio.h>
#include <string.h>

#include "common/emu_internal.h"

#define EMU_MSG_CAPACITY 1024

static __thread char tls_message[EMU_MSG_CAPACITY];
static __thread int tls_has_message;
/* What aclGetRecentErrMsg handed out last; valid until this thread's next call of it. */
static __thread char tls_returned[EMU_MSG_CAPACITY];

int aclEmu_vfail(int code, const char *api, const char *fmt, va_list ap)
{
    int used = snprintf(tls_message, sizeof tls_message, "%s: ", api ? api : "acl");
    if (used < 0 || (size_t)used >= sizeof tls_message) {
        used = 0;
    }
    vsnprintf(tls_message + used, sizeof tls_message - (size_t)used, fmt, ap);
    size_t len = strlen(tls_message);
    snprintf(tls_message + len, sizeof tls_message - len, " [status %d]", code);
    tls_has_message = 1;
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
    if (!tls_has_message) {
        return NULL;
    }
    memcpy(tls_returned, tls_message, sizeof tls_returned);
    tls_has_message = 0;
    return tls_returned;
}
