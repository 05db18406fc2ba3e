/*
 * What the emulated install and device say about themselves: the CANN release
 * (aclsysGetCANNVersion, from ACL_EMU_CANN_VERSION) and the core counts (aclGetDeviceCapability,
 * aclrtGetDeviceInfo, from ACL_EMU_VECTOR_CORES). The same answers go to the operator library,
 * so that one variable decides both what a caller sees and what the kernel does.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/emu_internal.h"
#include "common/emu_release.h"
#include "runtime/device.h"
#include "runtime/settings.h"

/* The releases that ship the operator, oldest first; the last is the default. */
static const char *const known_releases[] = {"9.1.0", "9.1.1", "9.2.0-beta.1", "9.2.0-beta.2", "9.2.0"};
#define KNOWN_RELEASES (sizeof known_releases / sizeof known_releases[0])

#define DEFAULT_VECTOR_CORES 56
#define MAX_VECTOR_CORES 1024

static pthread_once_t release_once = PTHREAD_ONCE_INIT;
static size_t release_index = KNOWN_RELEASES - 1;   /* written once, under release_once */
static int64_t release_key[EMU_RELEASE_KEY_PARTS];

static pthread_once_t cores_once = PTHREAD_ONCE_INIT;
static int64_t vector_cores = DEFAULT_VECTOR_CORES;   /* written once, under cores_once */

static void choose_release(void)
{
    const char *text = getenv("ACL_EMU_CANN_VERSION");
    int64_t wanted[EMU_RELEASE_KEY_PARTS];
    int named = text != NULL && *text != '\0';
    int parsed = named && emu_release_key(text, wanted) == 0;
    for (size_t i = 0; parsed && i < KNOWN_RELEASES; i++) {
        int64_t key[EMU_RELEASE_KEY_PARTS];
        if (emu_release_key(known_releases[i], key) == 0 && !emu_release_before(key, wanted) &&
            !emu_release_before(wanted, key)) {
            release_index = i;
            named = 0;   /* found */
        }
    }
    if (named) {
        fprintf(stderr, "acl-swiglu emulator: ignoring ACL_EMU_CANN_VERSION=%s (it names no release of the "
                "operator; known: 9.1.0, 9.1.1, 9.2.0-beta.1, 9.2.0-beta.2, 9.2.0); emulating %s\n",
                text, known_releases[KNOWN_RELEASES - 1]);
    }
    (void)emu_release_key(known_releases[release_index], release_key);
}

const char *aclEmu_release(int64_t key[EMU_RELEASE_KEY_PARTS])
{
    pthread_once(&release_once, choose_release);
    if (key != NULL) {
        memcpy(key, release_key, sizeof release_key);
    }
    return known_releases[release_index];
}

static void choose_vector_cores(void)
{
    uint64_t wanted = aclEmu_env_u64("ACL_EMU_VECTOR_CORES", DEFAULT_VECTOR_CORES);
    if (wanted < 1 || wanted > MAX_VECTOR_CORES) {
        fprintf(stderr, "acl-swiglu emulator: ignoring ACL_EMU_VECTOR_CORES=%llu (1..%d); using %d\n",
                (unsigned long long)wanted, MAX_VECTOR_CORES, DEFAULT_VECTOR_CORES);
        wanted = DEFAULT_VECTOR_CORES;
    }
    vector_cores = (int64_t)wanted;
}

int64_t aclEmu_vector_cores(void)
{
    pthread_once(&cores_once, choose_vector_cores);
    return vector_cores;
}

int64_t aclEmu_ai_cores(void) { return (aclEmu_vector_cores() + 1) / 2; }

/* ---- aclsysGetCANNVersion ---- */

/* aclCANNPackageName: every package of the emulated install has the emulated release, but there
 * is no driver under an emulator. */
static const char *package_name(int name)
{
    static const char *const names[] = {"ACL_PKG_NAME_CANN", "ACL_PKG_NAME_RUNTIME", "ACL_PKG_NAME_COMPILER",
                                        "ACL_PKG_NAME_HCCL", "ACL_PKG_NAME_TOOLKIT", "ACL_PKG_NAME_OPP",
                                        "ACL_PKG_NAME_OPP_KERNEL", "ACL_PKG_NAME_DRIVER"};
    return name >= 0 && name < (int)(sizeof names / sizeof names[0]) ? names[name] : NULL;
}

/* Copies the text of [from, to) into a field of `size` bytes (the parts are short). */
static void set_part(char *field, size_t size, const char *from, const char *to)
{
    size_t length = (size_t)(to - from);
    if (length >= size) length = size - 1;
    memcpy(field, from, length);
    field[length] = '\0';
}

/* "9.2.0-beta.1": major "9", minor "2", release "0", patch "beta.1" (the pre-release label, or
 * empty for a release). */
static void fill_version(aclCANNPackageVersion *out, const char *release)
{
    memset(out, 0, sizeof *out);
    set_part(out->version, sizeof out->version, release, release + strlen(release));
    const char *first = strchr(release, '.');
    const char *second = first != NULL ? strchr(first + 1, '.') : NULL;
    const char *dash = strchr(release, '-');
    const char *end = release + strlen(release);
    if (first == NULL || second == NULL) {
        return;
    }
    set_part(out->majorVersion, sizeof out->majorVersion, release, first);
    set_part(out->minorVersion, sizeof out->minorVersion, first + 1, second);
    set_part(out->releaseVersion, sizeof out->releaseVersion, second + 1, dash != NULL ? dash : end);
    if (dash != NULL) {
        set_part(out->patchVersion, sizeof out->patchVersion, dash + 1, end);
    }
}

EMU_EXPORT aclError aclsysGetCANNVersion(aclCANNPackageName name, aclCANNPackageVersion *version)
{
    static const char api[] = "aclsysGetCANNVersion";
    int rc = aclEmu_fault(api);
    if (rc != 0) return rc;
    const char *package = package_name((int)name);
    if (package == NULL) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api,
                           "name %d is not an aclCANNPackageName (ACL_PKG_NAME_CANN 0 .. ACL_PKG_NAME_DRIVER 7)",
                           (int)name);
    }
    if (version == NULL) {
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api, "version is NULL");
    }
    if (name == ACL_PKG_NAME_DRIVER) {
        return aclEmu_fail(ACL_ERROR_INVALID_FILE, api,
                           "%s: the emulator has no driver package installed (it emulates CANN %s on the CPU)",
                           package, aclEmu_release(NULL));
    }
    fill_version(version, aclEmu_release(NULL));
    return ACL_SUCCESS;
}

/* ---- core counts ---- */

/* What both device queries check first: the fault plan, aclInit, where to put the answer, and
 * the device id. */
static int start_device_query(const char *api, uint32_t deviceId, const int64_t *value)
{
    int rc = aclEmu_fault(api);
    if (rc == 0) rc = aclEmu_require_init(api);
    if (rc == 0 && value == NULL) {
        rc = aclEmu_fail(ACL_ERROR_INVALID_PARAM, api, "value is NULL");
    }
    uint32_t count = aclEmu_device_count();
    if (rc == 0 && deviceId >= count) {
        rc = aclEmu_fail(ACL_ERROR_RT_INVALID_DEVICEID, api,
                         "deviceId %u is out of range (this host has %u device(s), ids 0..%u; "
                         "ACL_EMU_DEVICES sets the count)",
                         deviceId, count, count - 1);
    }
    return rc;
}

EMU_EXPORT aclError aclGetDeviceCapability(uint32_t deviceId, aclDeviceInfo deviceInfo, int64_t *value)
{
    static const char api[] = "aclGetDeviceCapability";
    int rc = start_device_query(api, deviceId, value);
    if (rc != 0) return rc;
    switch (deviceInfo) {
    case ACL_DEVICE_INFO_AI_CORE_NUM:
        *value = aclEmu_ai_cores();
        return ACL_SUCCESS;
    case ACL_DEVICE_INFO_VECTOR_CORE_NUM:
        *value = aclEmu_vector_cores();
        return ACL_SUCCESS;
    case ACL_DEVICE_INFO_L2_SIZE:
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api,
                           "ACL_DEVICE_INFO_L2_SIZE is not emulated (the emulator answers "
                           "ACL_DEVICE_INFO_AI_CORE_NUM 0 and ACL_DEVICE_INFO_VECTOR_CORE_NUM 1)");
    default:
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api,
                           "deviceInfo %d is not an aclDeviceInfo (AI_CORE_NUM 0, VECTOR_CORE_NUM 1, "
                           "L2_SIZE 2)",
                           (int)deviceInfo);
    }
}

EMU_EXPORT aclError aclrtGetDeviceInfo(uint32_t deviceId, aclrtDevAttr attr, int64_t *value)
{
    static const char api[] = "aclrtGetDeviceInfo";
    int rc = start_device_query(api, deviceId, value);
    if (rc != 0) return rc;
    switch (attr) {
    case ACL_DEV_ATTR_AICORE_CORE_NUM:
    case ACL_DEV_ATTR_CUBE_CORE_NUM:
        *value = aclEmu_ai_cores();
        return ACL_SUCCESS;
    case ACL_DEV_ATTR_VECTOR_CORE_NUM:
        *value = aclEmu_vector_cores();
        return ACL_SUCCESS;
    default:
        return aclEmu_fail(ACL_ERROR_INVALID_PARAM, api,
                           "attr %d is not an aclrtDevAttr the emulator answers (ACL_DEV_ATTR_AICORE_CORE_NUM "
                           "101, ACL_DEV_ATTR_CUBE_CORE_NUM 102, ACL_DEV_ATTR_VECTOR_CORE_NUM 201)",
                           (int)attr);
    }
}
