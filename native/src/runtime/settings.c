/*
 * The emulator's settings: kernel variant and thread count (read at load, changeable through
 * the aclEmu* extras) and the operator ABI revision (read from the environment when it changed).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/emu_internal.h"
#include "runtime/settings.h"

extern char **environ;

static int thread_count;
static int kernel_variant;
static int online_cpus = 1;   /* read once: sysconf reads /sys on every call */

uint64_t aclEmu_env_u64(const char *name, uint64_t fallback)
{
    const char *text = getenv(name);
    if (text == NULL || *text == '\0') {
        return fallback;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-') {
        fprintf(stderr, "acl-swiglu emulator: ignoring %s=%s (not a whole number)\n", name, text);
        return fallback;
    }
    return (uint64_t)value;
}

__attribute__((constructor)) static void settings_from_environment(void)
{
    uint64_t threads = aclEmu_env_u64("ACL_EMU_THREADS", 0);
    if (threads > 256) {   /* the bound aclEmuSetThreads enforces; (int) would wrap it */
        fprintf(stderr, "acl-swiglu emulator: ignoring ACL_EMU_THREADS=%llu (0 for one per CPU, "
                "or 1..256)\n", (unsigned long long)threads);
        threads = 0;
    }
    thread_count = (int)threads;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    online_cpus = online > 0 ? (int)online : 1;
    const char *variant = getenv("ACL_EMU_KERNEL");
    if (variant != NULL && strcmp(variant, "scalar") == 0) {
        kernel_variant = 1;
    } else if (variant != NULL && *variant != '\0' && strcmp(variant, "vector") != 0) {
        fprintf(stderr, "acl-swiglu emulator: ignoring ACL_EMU_KERNEL=%s (use vector or scalar)\n",
                variant);
    }
}

int aclEmu_kernel_variant(void) { return __atomic_load_n(&kernel_variant, __ATOMIC_RELAXED); }

int aclEmu_thread_count(void)
{
    int wanted = __atomic_load_n(&thread_count, __ATOMIC_RELAXED);
    return wanted > 0 ? wanted : online_cpus;
}

EMU_EXPORT aclError aclEmuSetKernelVariant(int32_t variant)
{
    if (variant != 0 && variant != 1) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, "aclEmuSetKernelVariant",
                           "variant must be 0 (vectorised) or 1 (scalar reference), got %d", variant);
    }
    __atomic_store_n(&kernel_variant, variant, __ATOMIC_RELAXED);
    return ACL_SUCCESS;
}

EMU_EXPORT aclError aclEmuSetThreads(int32_t threads)
{
    if (threads < 0 || threads > 256) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, "aclEmuSetThreads",
                           "threads must be 0 (one per CPU) or 1..256, got %d", threads);
    }
    __atomic_store_n(&thread_count, threads, __ATOMIC_RELAXED);
    return ACL_SUCCESS;
}

/* ---- the ABI revision ---- */

/* A fingerprint of the process environment: the address of its array and of every entry, in
 * order. setenv, unsetenv, putenv and clearenv all change an entry address, the array or its
 * length, so an unchanged fingerprint means the values read last still hold; computing it reads
 * only the array, which is much cheaper than looking names up. */
static uint64_t environment_fingerprint(void)
{
    uint64_t h = (uint64_t)(uintptr_t)environ * 0x9E3779B97F4A7C15ULL;
    for (char **entry = environ; entry != NULL && *entry != NULL; entry++) {
        h = (h ^ (uint64_t)(uintptr_t)*entry) * 0x100000001B3ULL;
    }
    return h;
}

typedef enum { ABI_UNSET = 0, ABI_ONE = 1, ABI_TWO = 2, ABI_INVALID = 3 } abi_value;

/* The shared rule: ASCII whitespace around the value does not count, nothing left means unset,
 * anything but "1" or "2" is invalid. */
static abi_value parse_abi(const char *text)
{
    static const char space[] = " \t\n\r\v\f";
    if (text == NULL) {
        return ABI_UNSET;
    }
    while (*text != '\0' && strchr(space, *text) != NULL) text++;
    size_t len = strlen(text);
    while (len > 0 && strchr(space, text[len - 1]) != NULL) len--;
    if (len == 0) return ABI_UNSET;
    if (len == 1 && (text[0] == '1' || text[0] == '2')) return text[0] == '1' ? ABI_ONE : ABI_TWO;
    return ABI_INVALID;
}

/* The variable in charge and what it says. */
static abi_value read_abi(const char **variable)
{
    static const char *const names[] = {"ACL_EMU_ABI", "ACL_SWIGLU_ABI"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        abi_value v = parse_abi(getenv(names[i]));
        if (v != ABI_UNSET) {
            *variable = names[i];
            return v;
        }
    }
    *variable = NULL;
    return ABI_TWO;
}

/* Fingerprint with the revision in its two low bits (a valid revision is never 0 there). */
static uint64_t abi_cache;

int aclEmu_abi_revision(const char *api, int invalid_code, int *abi)
{
    uint64_t print = environment_fingerprint() & ~(uint64_t)3;
    uint64_t cached = __atomic_load_n(&abi_cache, __ATOMIC_ACQUIRE);
    if ((cached & 3) != 0 && (cached & ~(uint64_t)3) == print) {
        *abi = (int)(cached & 3);
        return 0;
    }
    const char *variable = NULL;
    abi_value v = read_abi(&variable);
    if (v == ABI_INVALID) {
        return aclEmu_fail(invalid_code, api,
                           "%s=\"%s\" is not a revision of this operator's ABI (1 or 2; empty "
                           "or unset means the default)",
                           variable, getenv(variable));
    }
    __atomic_store_n(&abi_cache, print | (uint64_t)v, __ATOMIC_RELEASE);
    *abi = (int)v;
    return 0;
}

EMU_EXPORT int32_t aclEmuAbiRevision(void)
{
    const char *variable = NULL;
    abi_value v = read_abi(&variable);
    return v == ABI_INVALID ? 0 : (int32_t)v;
}
