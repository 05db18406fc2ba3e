/* What the emulated install and device say about themselves: aclsysGetCANNVersion reports the
 * release ACL_EMU_CANN_VERSION names (the newest, 9.2.0, when unset or naming no release), and
 * aclGetDeviceCapability / aclrtGetDeviceInfo the cores ACL_EMU_VECTOR_CORES sets (56 vector,
 * half as many AI cores), with the emulator's usual strictness. Both variables are read once per
 * process, so each setting runs in a child: this program started again with a mode argument. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "acl/acl.h"
#include "acl_emu/acl_emu.h"
#include "emu_test.h"

#define CHILD_FLAG "--device-info-child"

static void check_version(aclCANNPackageName name, const char *version, const char *major, const char *minor,
                          const char *release, const char *patch)
{
    aclCANNPackageVersion v;
    memset(&v, 0x5A, sizeof v);   /* every field must be written, terminator included */
    CHECK_EQ_INT(aclsysGetCANNVersion(name, &v), ACL_SUCCESS);
    CHECK(strcmp(v.version, version) == 0);
    CHECK(strcmp(v.majorVersion, major) == 0);
    CHECK(strcmp(v.minorVersion, minor) == 0);
    CHECK(strcmp(v.releaseVersion, release) == 0);
    CHECK(strcmp(v.patchVersion, patch) == 0);
    CHECK(v.reserved[0] == '\0');
    if (strcmp(v.version, version) != 0) fprintf(stderr, "reported version \"%s\", expected \"%s\"\n", v.version, version);
}

static void check_cores(uint32_t device, int64_t vector, int64_t ai)
{
    int64_t value = -1;
    CHECK_EQ_INT(aclGetDeviceCapability(device, ACL_DEVICE_INFO_VECTOR_CORE_NUM, &value), ACL_SUCCESS);
    CHECK_EQ_INT(value, vector);
    value = -1;
    CHECK_EQ_INT(aclGetDeviceCapability(device, ACL_DEVICE_INFO_AI_CORE_NUM, &value), ACL_SUCCESS);
    CHECK_EQ_INT(value, ai);
    value = -1;
    CHECK_EQ_INT(aclrtGetDeviceInfo(device, ACL_DEV_ATTR_VECTOR_CORE_NUM, &value), ACL_SUCCESS);
    CHECK_EQ_INT(value, vector);
    value = -1;
    CHECK_EQ_INT(aclrtGetDeviceInfo(device, ACL_DEV_ATTR_AICORE_CORE_NUM, &value), ACL_SUCCESS);
    CHECK_EQ_INT(value, ai);
    value = -1;
    CHECK_EQ_INT(aclrtGetDeviceInfo(device, ACL_DEV_ATTR_CUBE_CORE_NUM, &value), ACL_SUCCESS);
    CHECK_EQ_INT(value, ai);
}

/* The default install: CANN 9.2.0, 56 vector cores; every refusal with its code and text. */
static int child_default(void)
{
    /* The version is a question to the install, not to a device: it needs no aclInit. */
    check_version(ACL_PKG_NAME_CANN, "9.2.0", "9", "2", "0", "");
    check_version(ACL_PKG_NAME_OPP_KERNEL, "9.2.0", "9", "2", "0", "");
    aclCANNPackageVersion v;
    CHECK_FAILS(aclsysGetCANNVersion(ACL_PKG_NAME_DRIVER, &v), ACL_ERROR_INVALID_FILE, "aclsysGetCANNVersion",
                "ACL_PKG_NAME_DRIVER", "no driver");
    CHECK_FAILS(aclsysGetCANNVersion((aclCANNPackageName)8, &v), ACL_ERROR_INVALID_PARAM, "aclsysGetCANNVersion",
                "name 8");
    CHECK_FAILS(aclsysGetCANNVersion((aclCANNPackageName)-1, &v), ACL_ERROR_INVALID_PARAM,
                "aclsysGetCANNVersion", "name -1");
    CHECK_FAILS(aclsysGetCANNVersion(ACL_PKG_NAME_CANN, NULL), ACL_ERROR_INVALID_PARAM, "aclsysGetCANNVersion",
                "version is NULL");

    int64_t value = 77;
    CHECK_FAILS(aclGetDeviceCapability(0, ACL_DEVICE_INFO_VECTOR_CORE_NUM, &value), ACL_ERROR_UNINITIALIZE,
                "aclGetDeviceCapability", "aclInit");
    CHECK_FAILS(aclrtGetDeviceInfo(0, ACL_DEV_ATTR_VECTOR_CORE_NUM, &value), ACL_ERROR_UNINITIALIZE,
                "aclrtGetDeviceInfo", "aclInit");
    CHECK_EQ_INT(value, 77);
    CHECK_EQ_INT(aclInit(NULL), ACL_SUCCESS);
    /* No device needs to be set on the thread: the id says which. */
    check_cores(0, 56, 28);
    CHECK_FAILS(aclGetDeviceCapability(1, ACL_DEVICE_INFO_VECTOR_CORE_NUM, &value), ACL_ERROR_RT_INVALID_DEVICEID,
                "aclGetDeviceCapability", "deviceId 1", "1 device(s)");
    CHECK_FAILS(aclrtGetDeviceInfo(UINT32_MAX, ACL_DEV_ATTR_VECTOR_CORE_NUM, &value),
                ACL_ERROR_RT_INVALID_DEVICEID, "aclrtGetDeviceInfo", "deviceId 4294967295");
    CHECK_FAILS(aclGetDeviceCapability(0, ACL_DEVICE_INFO_VECTOR_CORE_NUM, NULL), ACL_ERROR_INVALID_PARAM,
                "aclGetDeviceCapability", "value is NULL");
    CHECK_FAILS(aclrtGetDeviceInfo(0, ACL_DEV_ATTR_VECTOR_CORE_NUM, NULL), ACL_ERROR_INVALID_PARAM,
                "aclrtGetDeviceInfo", "value is NULL");
    CHECK_FAILS(aclGetDeviceCapability(0, ACL_DEVICE_INFO_L2_SIZE, &value), ACL_ERROR_INVALID_PARAM,
                "aclGetDeviceCapability", "L2_SIZE is not emulated");
    CHECK_FAILS(aclGetDeviceCapability(0, (aclDeviceInfo)3, &value), ACL_ERROR_INVALID_PARAM,
                "aclGetDeviceCapability", "deviceInfo 3");
    CHECK_FAILS(aclGetDeviceCapability(0, ACL_DEVICE_INFO_UNDEFINED, &value), ACL_ERROR_INVALID_PARAM,
                "aclGetDeviceCapability", "deviceInfo -1");
    CHECK_FAILS(aclrtGetDeviceInfo(0, ACL_DEV_ATTR_AICPU_CORE_NUM, &value), ACL_ERROR_INVALID_PARAM,
                "aclrtGetDeviceInfo", "attr 1");
    CHECK_FAILS(aclrtGetDeviceInfo(0, (aclrtDevAttr)202, &value), ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceInfo",
                "attr 202");
    CHECK_EQ_INT(value, 77);   /* no failure wrote an answer */

    /* Like every API, the queries take part in fault injection. */
    CHECK_EQ_INT(aclEmuSetFaults("aclGetDeviceCapability:2:507000,aclsysGetCANNVersion:1:100003"), ACL_SUCCESS);
    CHECK_EQ_INT(aclGetDeviceCapability(0, ACL_DEVICE_INFO_VECTOR_CORE_NUM, &value), ACL_SUCCESS);
    CHECK_FAILS(aclGetDeviceCapability(0, ACL_DEVICE_INFO_VECTOR_CORE_NUM, &value), ACL_ERROR_RT_INTERNAL_ERROR,
                "aclGetDeviceCapability", "injected fault");
    CHECK_FAILS(aclsysGetCANNVersion(ACL_PKG_NAME_CANN, &v), ACL_ERROR_INVALID_FILE, "aclsysGetCANNVersion",
                "injected fault");
    CHECK_EQ_INT(aclEmuSetFaults(NULL), ACL_SUCCESS);
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);
    return emu_test_finish("test_device_info (default)");
}

/* A pre-release, a small part and two devices: the same answer for each device. */
static int child_small_part(void)
{
    check_version(ACL_PKG_NAME_CANN, "9.2.0-beta.1", "9", "2", "0", "beta.1");
    CHECK_EQ_INT(aclInit(NULL), ACL_SUCCESS);
    check_cores(0, 8, 4);
    check_cores(1, 8, 4);
    int64_t value = 0;
    CHECK_FAILS(aclrtGetDeviceInfo(2, ACL_DEV_ATTR_VECTOR_CORE_NUM, &value), ACL_ERROR_RT_INVALID_DEVICEID,
                "aclrtGetDeviceInfo", "2 device(s)");
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);
    return emu_test_finish("test_device_info (9.2.0-beta.1, 8 cores)");
}

/* Another spelling of a release ("v" in front) names it; an odd core count halves upwards. */
static int child_spelling(void)
{
    check_version(ACL_PKG_NAME_RUNTIME, "9.1.1", "9", "1", "1", "");
    CHECK_EQ_INT(aclInit(NULL), ACL_SUCCESS);
    check_cores(0, 9, 5);
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);
    return emu_test_finish("test_device_info (v9.1.1, 9 cores)");
}

/* Values that name no release or no core count: the defaults, with a report on stderr. */
static int child_defaults_after_bad_values(void)
{
    check_version(ACL_PKG_NAME_CANN, "9.2.0", "9", "2", "0", "");
    CHECK_EQ_INT(aclInit(NULL), ACL_SUCCESS);
    check_cores(0, 56, 28);
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);
    return emu_test_finish("test_device_info (bad values)");
}

typedef struct {
    const char *mode;
    const char *release;   /* ACL_EMU_CANN_VERSION, NULL for unset */
    const char *cores;     /* ACL_EMU_VECTOR_CORES, NULL for unset */
    const char *devices;   /* ACL_EMU_DEVICES, NULL for unset */
    int (*run)(void);
    const char *stderr_has[3];   /* fragments the child's stderr must hold */
} scenario;

static const scenario scenarios[] = {
    {"default", NULL, NULL, NULL, child_default, {NULL}},
    {"empty", "", "", NULL, child_default, {NULL}},
    {"small", "9.2.0-beta.1", "8", "2", child_small_part, {NULL}},
    {"spelling", "v9.1.1", "9", NULL, child_spelling, {NULL}},
    {"unknown-release", "9.3.0", "0", NULL, child_defaults_after_bad_values,
     {"ignoring ACL_EMU_CANN_VERSION=9.3.0", "emulating 9.2.0", "ignoring ACL_EMU_VECTOR_CORES=0"}},
    {"garbage", "8.0.RC1", "many", NULL, child_defaults_after_bad_values,
     {"ignoring ACL_EMU_CANN_VERSION=8.0.RC1", "ignoring ACL_EMU_VECTOR_CORES=many", NULL}},
    {"too-many-cores", "9.2.0-rc.1", "1025", NULL, child_defaults_after_bad_values,
     {"ignoring ACL_EMU_CANN_VERSION=9.2.0-rc.1", "ignoring ACL_EMU_VECTOR_CORES=1025", NULL}},
};
#define SCENARIOS (sizeof scenarios / sizeof scenarios[0])

static void set_or_unset(const char *name, const char *value)
{
    if (value != NULL) {
        setenv(name, value, 1);
    } else {
        unsetenv(name);
    }
}

/* Runs one scenario in a child of this program; returns its exit status, its stderr in `err`. */
static int run_child(const char *self, const scenario *s, char *err, size_t size)
{
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipe_fds[1], 2);
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        set_or_unset("ACL_EMU_CANN_VERSION", s->release);
        set_or_unset("ACL_EMU_VECTOR_CORES", s->cores);
        set_or_unset("ACL_EMU_DEVICES", s->devices);
        unsetenv("ACL_EMU_FAIL");
        const char *launcher = getenv("ACL_EMU_TEST_LAUNCHER");
        if (launcher != NULL && launcher[0] != '\0') {
            execlp(launcher, launcher, self, CHILD_FLAG, s->mode, (char *)NULL);
        } else {
            execl("/proc/self/exe", "test_device_info", CHILD_FLAG, s->mode, (char *)NULL);
        }
        _exit(3);
    }
    close(pipe_fds[1]);
    size_t used = 0;
    ssize_t got;
    while (used + 1 < size && (got = read(pipe_fds[0], err + used, size - 1 - used)) > 0) used += (size_t)got;
    err[used] = '\0';
    close(pipe_fds[0]);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], CHILD_FLAG) == 0) {
        for (size_t i = 0; i < SCENARIOS; i++) {
            if (strcmp(argv[2], scenarios[i].mode) == 0) return scenarios[i].run();
        }
        return 4;
    }
    static char err[16384];
    for (size_t i = 0; i < SCENARIOS; i++) {
        int status = run_child(argv[0], &scenarios[i], err, sizeof err);
        if (status != 0) fprintf(stderr, "scenario %s exited with %d; its stderr:\n%s\n", scenarios[i].mode, status, err);
        CHECK_EQ_INT(status, 0);
        for (int f = 0; f < 3 && scenarios[i].stderr_has[f] != NULL; f++) {
            if (strstr(err, scenarios[i].stderr_has[f]) == NULL) {
                fprintf(stderr, "scenario %s: stderr lacks \"%s\":\n%s\n", scenarios[i].mode, scenarios[i].stderr_has[f],
                        err);
                CHECK(0);
            }
        }
        if (scenarios[i].stderr_has[0] == NULL && strstr(err, "ignoring") != NULL) {
            fprintf(stderr, "scenario %s reported a value it should accept:\n%s\n", scenarios[i].mode, err);
            CHECK(0);
        }
    }
    return emu_test_finish("test_device_info");
}
