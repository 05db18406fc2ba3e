/*
 * Fault injection: "name:N:code[,...]" makes the Nth call of API `name`, counted from the moment
 * the plan is set, fail with `code`. Set from ACL_EMU_FAIL at load or by aclEmuSetFaults.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/emu_internal.h"
#include "runtime/fault.h"

#define MAX_FAULTS 32
#define MAX_API_NAME 64

typedef struct {
    char api[MAX_API_NAME];
    uint64_t nth;
    int code;
    uint64_t calls;
} fault_rule;

static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;
static fault_rule rules[MAX_FAULTS];
static size_t rule_count;
/* Read without the lock on every call, so that an empty plan costs one load. */
static int plan_active;
static int64_t injected;
/* Who set the plan, for the injected failure's message (under fault_lock). */
static const char *plan_source = "ACL_EMU_FAIL";

static int parse_rule(const char *text, size_t len, fault_rule *out)
{
    const char *first = memchr(text, ':', len);
    if (first == NULL) return -1;
    const char *second = memchr(first + 1, ':', len - (size_t)(first + 1 - text));
    if (second == NULL) return -1;
    size_t name_len = (size_t)(first - text);
    if (name_len == 0 || name_len >= MAX_API_NAME) return -1;

    char number[32];
    size_t nth_len = (size_t)(second - first - 1);
    size_t code_len = len - (size_t)(second + 1 - text);
    if (nth_len == 0 || nth_len >= sizeof number || code_len == 0 || code_len >= sizeof number) {
        return -1;
    }
    char *end = NULL;
    memcpy(number, first + 1, nth_len);
    number[nth_len] = '\0';
    errno = 0;
    unsigned long long nth = strtoull(number, &end, 10);
    if (errno != 0 || *end != '\0' || nth == 0 || number[0] == '-') return -1;
    memcpy(number, second + 1, code_len);
    number[code_len] = '\0';
    long code = strtol(number, &end, 10);
    if (errno != 0 || *end != '\0' || code == 0 || code > 0x7fffffffL || code < -0x7fffffffL) {
        return -1;
    }
    memcpy(out->api, text, name_len);
    out->api[name_len] = '\0';
    out->nth = nth;
    out->code = (int)code;
    out->calls = 0;
    return 0;
}

static int set_plan(const char *spec, const char *source)
{
    fault_rule parsed[MAX_FAULTS];
    size_t count = 0;
    if (spec != NULL) {
        const char *p = spec;
        while (*p != '\0') {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            if (len > 0) {
                if (count == MAX_FAULTS || parse_rule(p, len, &parsed[count]) != 0) {
                    return -1;
                }
                count++;
            }
            p += len + (comma ? 1 : 0);
        }
    }
    pthread_mutex_lock(&fault_lock);
    memcpy(rules, parsed, count * sizeof parsed[0]);
    rule_count = count;
    injected = 0;
    plan_source = source;
    __atomic_store_n(&plan_active, count > 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&fault_lock);
    return 0;
}

EMU_EXPORT aclError aclEmuSetFaults(const char *spec)
{
    if (set_plan(spec, "aclEmuSetFaults") != 0) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, "aclEmuSetFaults",
                           "cannot parse \"%s\": expected name:N:code[,name:N:code...] with N >= 1",
                           spec);
    }
    return ACL_SUCCESS;
}

__attribute__((constructor)) static void plan_from_environment(void)
{
    const char *faults = getenv("ACL_EMU_FAIL");
    if (faults != NULL && *faults != '\0' && set_plan(faults, "ACL_EMU_FAIL") != 0) {
        fprintf(stderr, "acl-swiglu emulator: ignoring ACL_EMU_FAIL=%s (%s)\n", faults,
                "expected name:N:code[,name:N:code...]");
    }
}

EMU_EXPORT int64_t aclEmuFaultsInjected(void)
{
    pthread_mutex_lock(&fault_lock);
    int64_t n = injected;
    pthread_mutex_unlock(&fault_lock);
    return n;
}

int aclEmu_fault(const char *api)
{
    if (!__atomic_load_n(&plan_active, __ATOMIC_ACQUIRE)) {
        return 0;
    }
    int code = 0;
    uint64_t nth = 0;
    const char *source = NULL;
    pthread_mutex_lock(&fault_lock);
    for (size_t i = 0; i < rule_count; i++) {
        if (strcmp(rules[i].api, api) == 0) {
            rules[i].calls++;
            if (rules[i].calls == rules[i].nth && code == 0) {
                code = rules[i].code;
                nth = rules[i].nth;
                source = plan_source;
                injected++;
            }
        }
    }
    pthread_mutex_unlock(&fault_lock);
    if (code != 0) {
        aclEmu_fail(code, api, "injected fault (call %llu of %s, planned by %s)",
                    (unsigned long long)nth, api, source);
    }
    return code;
}

void aclEmu_fault_lock_for_fork(void) { pthread_mutex_lock(&fault_lock); }
void aclEmu_fault_unlock_after_fork(void) { pthread_mutex_unlock(&fault_lock); }
