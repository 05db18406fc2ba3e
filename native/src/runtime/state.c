/*
 * Process state: aclInit/aclFinalize, the emulated devices and each thread's current device,
 * the emulator's settings from the environment, and the aclEmu* extras.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/emu_internal.h"
#include "runtime/runtime_internal.h"

#define EMU_VERSION "acl-swiglu-emulator 0.1.0"
#define MAX_EMULATED_DEVICES 64

static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static int ever_finalized;
static uint32_t device_count = 1;
static int64_t device_refs[MAX_EMULATED_DEVICES];
static int thread_count;
static int kernel_variant;
static int online_cpus = 1;   /* read once: sysconf reads /sys on every call */
/* Bumped by aclFinalize so that a device set before it does not count afterwards. */
static uint64_t init_generation;

static __thread int32_t tls_device = -1;
static __thread uint64_t tls_device_generation;

uint64_t aclEmu_env_u64(const char *name, uint64_t fallback)
{
    const char *text = getenv(name);
    if (text == NULL || *text == '\0') {
        return fallback;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0') {
        fprintf(stderr, "acl-swiglu emulator: ignoring %s=%s (not a whole number)\n", name, text);
        return fallback;
    }
    return (uint64_t)value;
}

static void fork_prepare(void)
{
    pthread_mutex_lock(&state_lock);
    aclEmu_fault_lock_for_fork();
    aclEmu_streams_lock_for_fork();
    aclEmu_mem_lock_for_fork();
    aclEmu_registry_lock_for_fork();
}

static void fork_release(void)
{
    aclEmu_registry_unlock_after_fork();
    aclEmu_mem_unlock_after_fork();
    aclEmu_streams_unlock_after_fork();
    aclEmu_fault_unlock_after_fork();
    pthread_mutex_unlock(&state_lock);
}

__attribute__((constructor)) static void emulator_load(void)
{
    /* A fork while another thread holds an emulator lock must not leave the child stuck. */
    pthread_atfork(fork_prepare, fork_release, fork_release);
    const char *faults = getenv("ACL_EMU_FAIL");
    if (faults != NULL && *faults != '\0' && aclEmu_fault_set(faults) != 0) {
        fprintf(stderr, "acl-swiglu emulator: ignoring ACL_EMU_FAIL=%s (%s)\n", faults,
                "expected name:N:code[,name:N:code...]");
    }
    thread_count = (int)aclEmu_env_u64("ACL_EMU_THREADS", 0);
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

static uint64_t default_device_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES);
    long page_size = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page_size <= 0) {
        return (uint64_t)8 << 30;
    }
    /* Half the host: every allocation is really touched (filled with garbage). */
    return (uint64_t)pages * (uint64_t)page_size / 2;
}

EMU_EXPORT aclError aclInit(const char *configPath)
{
    static const char api[] = "aclInit";
    int fault = aclEmu_fault(api);
    if (fault) {
        return fault;
    }
    if (configPath != NULL && *configPath != '\0' && access(configPath, R_OK) != 0) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api, "configPath \"%s\" cannot be read: %s",
                           configPath, strerror(errno));
    }
    pthread_mutex_lock(&state_lock);
    if (initialized) {
        pthread_mutex_unlock(&state_lock);
        return aclEmu_fail(ACL_ERROR_REPEAT_INITIALIZE, api,
                           "ACL is already initialised in this process (aclInit called twice)");
    }
    uint64_t devices = aclEmu_env_u64("ACL_EMU_DEVICES", 1);
    if (devices < 1 || devices > MAX_EMULATED_DEVICES) {
        devices = 1;
    }
    device_count = (uint32_t)devices;
    memset(device_refs, 0, sizeof device_refs);
    aclEmu_mem_set_capacity(aclEmu_env_u64("ACL_EMU_DEVICE_MEMORY", default_device_memory()));
    int rc = aclEmu_streams_init();
    if (rc != 0) {
        pthread_mutex_unlock(&state_lock);
        return aclEmu_fail(rc, api, "out of host memory creating the default stream");
    }
    initialized = 1;
    pthread_mutex_unlock(&state_lock);
    return ACL_SUCCESS;
}

static void report_leaks(void)
{
    static const aclEmuHandleKind kinds[] = {ACL_EMU_KIND_TENSOR, ACL_EMU_KIND_INT_ARRAY,
                                             ACL_EMU_KIND_EXECUTOR, ACL_EMU_KIND_STREAM,
                                             ACL_EMU_KIND_ALLOCATION};
    int64_t total = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        total += aclEmu_live_count(kinds[i]);
    }
    if (total == 0) {
        fprintf(stderr, "acl-swiglu emulator: leak check at aclFinalize: no live handles\n");
        return;
    }
    fprintf(stderr,
            "acl-swiglu emulator: leak check at aclFinalize: %lld live handle(s): "
            "%lld aclTensor, %lld aclIntArray, %lld aclOpExecutor, %lld aclrtStream, "
            "%lld device allocation(s) holding %lld bytes\n",
            (long long)total, (long long)aclEmu_live_count(ACL_EMU_KIND_TENSOR),
            (long long)aclEmu_live_count(ACL_EMU_KIND_INT_ARRAY),
            (long long)aclEmu_live_count(ACL_EMU_KIND_EXECUTOR),
            (long long)aclEmu_live_count(ACL_EMU_KIND_STREAM),
            (long long)aclEmu_live_count(ACL_EMU_KIND_ALLOCATION),
            (long long)aclEmu_mem_live_bytes());
    aclEmu_report_live_handles(stderr);
    aclEmu_mem_report(stderr);
}

EMU_EXPORT aclError aclFinalize(void)
{
    static const char api[] = "aclFinalize";
    int fault = aclEmu_fault(api);
    if (fault) {
        return fault;
    }
    pthread_mutex_lock(&state_lock);
    if (!initialized) {
        int code = ever_finalized ? ACL_ERROR_REPEAT_FINALIZE : ACL_ERROR_UNINITIALIZE;
        pthread_mutex_unlock(&state_lock);
        return aclEmu_fail(code, api,
                           code == ACL_ERROR_REPEAT_FINALIZE
                               ? "ACL was already finalised (aclFinalize called twice)"
                               : "aclInit has not been called");
    }
    const char *leak_check = getenv("ACL_EMU_LEAK_CHECK");
    if (leak_check != NULL && strcmp(leak_check, "1") == 0) {
        report_leaks();
    }
    /* Like the real runtime, finalising releases device-side resources: queued work is
     * dropped, streams and device memory are freed. Host-side handles stay the caller's. */
    aclEmu_streams_release_all();
    aclEmu_mem_release_all();
    memset(device_refs, 0, sizeof device_refs);
    initialized = 0;
    ever_finalized = 1;
    init_generation++;
    pthread_mutex_unlock(&state_lock);
    return ACL_SUCCESS;
}

int aclEmu_require_init(const char *api)
{
    if (__atomic_load_n(&initialized, __ATOMIC_ACQUIRE)) {
        return 0;
    }
    return aclEmu_fail(ACL_ERROR_UNINITIALIZE, api, "aclInit has not been called");
}

int aclEmu_require_device(const char *api)
{
    int rc = aclEmu_require_init(api);
    if (rc != 0) {
        return rc;
    }
    if (tls_device < 0 || tls_device_generation != __atomic_load_n(&init_generation,
                                                                    __ATOMIC_ACQUIRE)) {
        return aclEmu_fail(ACL_ERROR_RT_CONTEXT_NULL, api,
                           "no device is set on this thread (call aclrtSetDevice first; "
                           "the current device is per thread)");
    }
    return 0;
}

static int check_device_id(const char *api, int32_t deviceId)
{
    if (deviceId < 0 || (uint32_t)deviceId >= device_count) {
        return aclEmu_fail(ACL_ERROR_RT_INVALID_DEVICEID, api,
                           "deviceId %d is out of range (this host has %u device(s), ids 0..%u)",
                           deviceId, device_count, device_count - 1);
    }
    return 0;
}

EMU_EXPORT aclError aclrtSetDevice(int32_t deviceId)
{
    static const char api[] = "aclrtSetDevice";
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_init(api);
    if (rc != 0) return rc;
    pthread_mutex_lock(&state_lock);
    rc = check_device_id(api, deviceId);
    if (rc == 0) {
        device_refs[deviceId]++;
        tls_device = deviceId;
        tls_device_generation = init_generation;
    }
    pthread_mutex_unlock(&state_lock);
    return rc;
}

EMU_EXPORT aclError aclrtResetDevice(int32_t deviceId)
{
    static const char api[] = "aclrtResetDevice";
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_init(api);
    if (rc != 0) return rc;
    pthread_mutex_lock(&state_lock);
    rc = check_device_id(api, deviceId);
    if (rc == 0) {
        if (device_refs[deviceId] > 0) {
            device_refs[deviceId]--;
        }
        if (tls_device == deviceId) {
            tls_device = -1;
        }
    }
    pthread_mutex_unlock(&state_lock);
    return rc;
}

EMU_EXPORT aclError aclrtGetDeviceCount(uint32_t *count)
{
    static const char api[] = "aclrtGetDeviceCount";
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_init(api);
    if (rc != 0) return rc;
    if (count == NULL) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api, "count is NULL");
    }
    *count = device_count;
    return ACL_SUCCESS;
}

/* ---- aclEmu* extras ---- */

EMU_EXPORT const char *aclEmuVersion(void) { return EMU_VERSION; }

EMU_EXPORT int64_t aclEmuLiveCount(aclEmuHandleKind kind)
{
    if ((int)kind < 0 || kind >= ACL_EMU_KIND_COUNT) {
        return -1;
    }
    return aclEmu_live_count(kind);
}

EMU_EXPORT int64_t aclEmuLiveBytes(void) { return aclEmu_mem_live_bytes(); }

EMU_EXPORT aclError aclEmuSetFaults(const char *spec)
{
    int rc = aclEmu_fault_set(spec);
    if (rc != 0) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, "aclEmuSetFaults",
                           "cannot parse \"%s\": expected name:N:code[,name:N:code...] with N >= 1",
                           spec);
    }
    return ACL_SUCCESS;
}

EMU_EXPORT int64_t aclEmuFaultsInjected(void) { return aclEmu_fault_injected(); }

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
