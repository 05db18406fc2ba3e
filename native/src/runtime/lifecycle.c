/*
 * aclInit and aclFinalize: bringing the emulated devices up (their memory capacity and default
 * streams) and down (dropping queued work, streams and device memory), and the leak report.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/emu_internal.h"
#include "runtime/device.h"
#include "runtime/memory.h"
#include "runtime/registry.h"
#include "runtime/settings.h"
#include "runtime/stream.h"

#define EMU_VERSION "acl-swiglu-emulator 0.1.0"

static int ever_finalized;   /* under the device lock */

EMU_EXPORT const char *aclEmuVersion(void) { return EMU_VERSION; }

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
    aclEmu_device_lock();
    if (aclEmu_devices_up_locked()) {
        aclEmu_device_unlock();
        return aclEmu_fail(ACL_ERROR_REPEAT_INITIALIZE, api,
                           "ACL is already initialised in this process (aclInit called twice)");
    }
    uint64_t devices = aclEmu_env_u64("ACL_EMU_DEVICES", 1);
    if (devices < 1 || devices > EMU_MAX_DEVICES) {
        fprintf(stderr, "acl-swiglu emulator: ignoring ACL_EMU_DEVICES=%llu (1..%d)\n",
                (unsigned long long)devices, EMU_MAX_DEVICES);
        devices = 1;
    }
    aclEmu_mem_set_capacity(aclEmu_env_u64("ACL_EMU_DEVICE_MEMORY", default_device_memory()));
    int rc = aclEmu_streams_init((uint32_t)devices);
    if (rc != 0) {
        aclEmu_device_unlock();
        return aclEmu_fail(rc, api, "out of host memory creating the default streams");
    }
    aclEmu_devices_start_locked((uint32_t)devices);
    aclEmu_device_unlock();
    return ACL_SUCCESS;
}

EMU_EXPORT aclError aclFinalize(void)
{
    static const char api[] = "aclFinalize";
    int fault = aclEmu_fault(api);
    if (fault) {
        return fault;
    }
    aclEmu_device_lock();
    if (!aclEmu_devices_up_locked()) {
        int code = ever_finalized ? ACL_ERROR_REPEAT_FINALIZE : ACL_ERROR_UNINITIALIZE;
        aclEmu_device_unlock();
        return aclEmu_fail(code, api,
                           code == ACL_ERROR_REPEAT_FINALIZE
                               ? "ACL was already finalised (aclFinalize called twice)"
                               : "aclInit has not been called");
    }
    const char *leak_check = getenv("ACL_EMU_LEAK_CHECK");
    if (leak_check != NULL && strcmp(leak_check, "1") == 0 &&
        aclEmu_report_live_handles(stderr) > 0) {
        aclEmu_mem_report(stderr);
    }
    /* Like the real runtime, finalising releases device-side resources: queued work is
     * dropped, streams and device memory are freed. Host-side handles stay the caller's. */
    aclEmu_streams_release_all();
    aclEmu_mem_release_all();
    aclEmu_devices_stop_locked();
    ever_finalized = 1;
    aclEmu_device_unlock();
    return ACL_SUCCESS;
}
