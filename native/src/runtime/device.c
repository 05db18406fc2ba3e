/*
 * Whether ACL is initialised, the emulated devices and each thread's current device. Memory,
 * streams and executors remember the device that was current when they were made.
 */
#include <pthread.h>
#include <string.h>

#include "common/emu_internal.h"
#include "runtime/device.h"

static pthread_mutex_t device_lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static uint32_t device_count = 1;
static int64_t device_refs[EMU_MAX_DEVICES];
/* Bumped by aclFinalize so that a device set before it does not count afterwards. */
static uint64_t init_generation;

static __thread int32_t tls_device = -1;
static __thread uint64_t tls_device_generation;

void aclEmu_device_lock(void) { pthread_mutex_lock(&device_lock); }
void aclEmu_device_unlock(void) { pthread_mutex_unlock(&device_lock); }
int aclEmu_devices_up_locked(void) { return initialized; }

void aclEmu_devices_start_locked(uint32_t count)
{
    __atomic_store_n(&device_count, count, __ATOMIC_RELAXED);
    memset(device_refs, 0, sizeof device_refs);
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
}

void aclEmu_devices_stop_locked(void)
{
    memset(device_refs, 0, sizeof device_refs);
    __atomic_store_n(&initialized, 0, __ATOMIC_RELEASE);
    __atomic_add_fetch(&init_generation, 1, __ATOMIC_RELEASE);
}

uint32_t aclEmu_device_count(void) { return __atomic_load_n(&device_count, __ATOMIC_RELAXED); }

int aclEmu_require_init(const char *api)
{
    if (__atomic_load_n(&initialized, __ATOMIC_ACQUIRE)) {
        return 0;
    }
    return aclEmu_fail(ACL_ERROR_UNINITIALIZE, api, "aclInit has not been called");
}

int32_t aclEmu_current_device(void)
{
    if (tls_device < 0 ||
        tls_device_generation != __atomic_load_n(&init_generation, __ATOMIC_ACQUIRE)) {
        return -1;
    }
    return tls_device;
}

static int no_device(const char *api)
{
    return aclEmu_fail(ACL_ERROR_RT_CONTEXT_NULL, api,
                       "no device is set on this thread (call aclrtSetDevice first; the current "
                       "device is per thread)");
}

int aclEmu_require_device(const char *api)
{
    int rc = aclEmu_require_init(api);
    if (rc == 0 && aclEmu_current_device() < 0) {
        rc = no_device(api);
    }
    return rc;
}

int aclEmu_require_owner(const char *api, int code, const char *what, int32_t owner)
{
    int32_t current = aclEmu_current_device();
    if (owner == current) {
        return 0;
    }
    return aclEmu_fail(code, api,
                       "%s belongs to device %d, but device %d is current on this thread "
                       "(call aclrtSetDevice(%d) to use it)",
                       what, owner, current, owner);
}

static int check_device_id(const char *api, int32_t deviceId)
{
    if (deviceId < 0 || (uint32_t)deviceId >= device_count) {
        return aclEmu_fail(ACL_ERROR_RT_INVALID_DEVICEID, api,
                           "deviceId %d is out of range (this host has %u device(s), ids 0..%u; "
                           "ACL_EMU_DEVICES sets the count)",
                           deviceId, device_count, device_count - 1);
    }
    return 0;
}

/* With the lock held and the id checked: make it the calling thread's device. */
static void bind_device(int32_t deviceId)
{
    device_refs[deviceId]++;
    tls_device = deviceId;
    tls_device_generation = init_generation;
}

static void release_device(int32_t deviceId)
{
    if (device_refs[deviceId] > 0) {
        device_refs[deviceId]--;
    }
    if (tls_device == deviceId) {
        tls_device = -1;
    }
}

/* aclrtSetDevice and aclrtResetDevice: the checks, then `change` under the lock. */
static int change_device(const char *api, int32_t deviceId, void (*change)(int32_t))
{
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_init(api);
    if (rc != 0) return rc;
    pthread_mutex_lock(&device_lock);
    rc = check_device_id(api, deviceId);
    if (rc == 0) {
        change(deviceId);
    }
    pthread_mutex_unlock(&device_lock);
    return rc;
}

EMU_EXPORT aclError aclrtSetDevice(int32_t deviceId)
{
    return change_device("aclrtSetDevice", deviceId, bind_device);
}

EMU_EXPORT aclError aclrtResetDevice(int32_t deviceId)
{
    return change_device("aclrtResetDevice", deviceId, release_device);
}

/* What every getter checks first: the fault plan, aclInit, and where to put the answer. */
static int start_getter(const char *api, const void *out, const char *out_name)
{
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_init(api);
    if (rc == 0 && out == NULL) {
        rc = aclEmu_fail(ACL_ERROR_INVALID_PARAM, api, "%s is NULL", out_name);
    }
    return rc;
}

EMU_EXPORT aclError aclrtGetDevice(int32_t *deviceId)
{
    static const char api[] = "aclrtGetDevice";
    int rc = start_getter(api, deviceId, "deviceId");
    if (rc != 0) return rc;
    int32_t current = aclEmu_current_device();
    if (current < 0) {
        return no_device(api);
    }
    *deviceId = current;
    return ACL_SUCCESS;
}

EMU_EXPORT aclError aclrtGetDeviceCount(uint32_t *count)
{
    static const char api[] = "aclrtGetDeviceCount";
    int rc = start_getter(api, count, "count");
    if (rc != 0) return rc;
    *count = aclEmu_device_count();
    return ACL_SUCCESS;
}

void aclEmu_device_lock_for_fork(void) { pthread_mutex_lock(&device_lock); }
void aclEmu_device_unlock_after_fork(void) { pthread_mutex_unlock(&device_lock); }
