/* Devices have identity (ACL_EMU_DEVICES=N): memory, streams and executors belong to the device
 * that was current when they were made, and using them while another device is current fails
 * with the real code and a message naming both devices; aclrtGetDevice reports the thread's. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "acl_emu/acl_emu.h"
#include "emu_problem.h"
#include "emu_session.h"

static void test_get_device(void)
{
    int32_t device = 77;
    CHECK_FAILS(aclrtGetDevice(&device), ACL_ERROR_RT_CONTEXT_NULL, "aclrtGetDevice",
                "no device is set");
    CHECK_EQ_INT(device, 77);
    CHECK_FAILS(aclrtGetDevice(NULL), ACL_ERROR_INVALID_PARAM, "aclrtGetDevice", "deviceId");
    CHECK_EQ_INT(aclrtSetDevice(2), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtGetDevice(&device), ACL_SUCCESS);
    CHECK_EQ_INT(device, 2);
    CHECK_EQ_INT(aclrtSetDevice(1), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtGetDevice(&device), ACL_SUCCESS);
    CHECK_EQ_INT(device, 1);
    CHECK_FAILS(aclrtSetDevice(3), ACL_ERROR_RT_INVALID_DEVICEID, "aclrtSetDevice", "3",
                "3 device(s)");
    CHECK_EQ_INT(aclrtGetDevice(&device), ACL_SUCCESS);
    CHECK_EQ_INT(device, 1);
    uint32_t count = 0;
    CHECK_EQ_INT(aclrtGetDeviceCount(&count), ACL_SUCCESS);
    CHECK_EQ_INT(count, 3);
    CHECK_EQ_INT(aclrtResetDevice(1), ACL_SUCCESS);
    CHECK_FAILS(aclrtGetDevice(&device), ACL_ERROR_RT_CONTEXT_NULL, "aclrtGetDevice");
}

/* Runtime calls on another device's memory and streams. */
static void test_runtime_resources(void)
{
    CHECK_EQ_INT(aclrtSetDevice(0), ACL_SUCCESS);
    void *mem0 = dev_alloc(256);
    aclrtStream s0 = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&s0), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSetDevice(1), ACL_SUCCESS);
    void *mem1 = dev_alloc(256);
    char host[256] = {0};
    CHECK_FAILS(aclrtMemcpy(mem0, 256, host, 256, ACL_MEMCPY_HOST_TO_DEVICE),
                ACL_ERROR_RT_PARAM_INVALID, "aclrtMemcpy", "dst", "device 0", "device 1");
    CHECK_FAILS(aclrtMemcpy(host, 256, mem0, 256, ACL_MEMCPY_DEVICE_TO_HOST),
                ACL_ERROR_RT_PARAM_INVALID, "aclrtMemcpy", "src", "device 0", "device 1");
    CHECK_FAILS(aclrtMemcpy(mem1, 256, mem0, 256, ACL_MEMCPY_DEVICE_TO_DEVICE),
                ACL_ERROR_RT_PARAM_INVALID, "aclrtMemcpy", "device 0");
    CHECK_FAILS(aclrtMemcpy(mem0, 256, host, 256, ACL_MEMCPY_DEFAULT), ACL_ERROR_RT_PARAM_INVALID,
                "aclrtMemcpy", "device 0");
    CHECK_FAILS(aclrtMemset(mem0, 256, 0, 256), ACL_ERROR_RT_PARAM_INVALID, "aclrtMemset",
                "device 0", "device 1");
    CHECK_FAILS(aclrtFree(mem0), ACL_ERROR_RT_PARAM_INVALID, "aclrtFree", "device 0",
                "device 1");
    CHECK_FAILS(aclrtSynchronizeStream(s0), ACL_ERROR_RT_STREAM_CONTEXT, "aclrtSynchronizeStream",
                "stream belongs to device 0", "device 1");
    CHECK_FAILS(aclrtMemcpyAsync(mem1, 256, host, 256, ACL_MEMCPY_HOST_TO_DEVICE, s0),
                ACL_ERROR_RT_STREAM_CONTEXT, "aclrtMemcpyAsync", "device 0");
    CHECK_FAILS(aclrtDestroyStream(s0), ACL_ERROR_RT_STREAM_CONTEXT, "aclrtDestroyStream",
                "device 0");
    /* On its own device everything works; each device has its own default stream. */
    CHECK_EQ_INT(aclrtMemcpyAsync(mem1, 256, host, 256, ACL_MEMCPY_HOST_TO_DEVICE, NULL),
                 ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(NULL), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(mem1), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSetDevice(0), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtMemset(mem0, 256, 1, 256), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtDestroyStream(s0), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(mem0), ACL_SUCCESS);
}

/* aclrtSynchronizeDevice drains the current device's streams only. */
static void test_synchronize_device_is_per_device(void)
{
    CHECK_EQ_INT(aclrtSetDevice(0), ACL_SUCCESS);
    void *mem0 = dev_alloc(64);
    aclrtStream s0 = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&s0), ACL_SUCCESS);
    unsigned char ones[64];
    memset(ones, 1, sizeof ones);
    CHECK_EQ_INT(aclrtMemcpyAsync(mem0, 64, ones, 64, ACL_MEMCPY_HOST_TO_DEVICE, s0), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSetDevice(1), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeDevice(), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSetDevice(0), ACL_SUCCESS);
    CHECK(all_ff(mem0, 64));   /* device 1's synchronisation did not run device 0's queue */
    CHECK_EQ_INT(aclrtSynchronizeDevice(), ACL_SUCCESS);
    unsigned char back[64];
    download(back, mem0, 64);
    CHECK(memcmp(back, ones, 64) == 0);
    CHECK_EQ_INT(aclrtDestroyStream(s0), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(mem0), ACL_SUCCESS);
}

/* The operator: tensors in another device's memory, an executor of another device, a stream of
 * another device. */
static void test_operator_across_devices(void)
{
    CHECK_EQ_INT(aclrtSetDevice(0), ACL_SUCCESS);
    prob p;
    prob_init(&p, 3, 8, 1, -1, NULL, 21, 1);
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(ex), ACLNN_SUCCESS);
    void *ws0 = dev_alloc(WS_BYTES);
    aclrtStream s0 = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&s0), ACL_SUCCESS);

    CHECK_EQ_INT(aclrtSetDevice(1), ACL_SUCCESS);
    uint64_t ws = 0;
    aclOpExecutor *other = NULL;
    CHECK_FAILS(phase1(&p, -1.0, &ws, &other), ACLNN_ERR_PARAM_INVALID, PHASE1, "gradY",
                "device 0", "device 1");
    void *ws1 = dev_alloc(WS_BYTES);
    aclrtStream s1 = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&s1), ACL_SUCCESS);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws1, WS_BYTES, ex, s1), ACLNN_ERR_PARAM_INVALID, PHASE2,
                "executor belongs to device 0", "device 1");
    CHECK_FAILS(aclSetInputTensorAddr(ex, 0, p.tgy, p.dgy), ACLNN_ERR_PARAM_INVALID,
                "aclSetInputTensorAddr", "executor belongs to device 0");

    CHECK_EQ_INT(aclrtSetDevice(0), ACL_SUCCESS);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws1, WS_BYTES, ex, s0), ACLNN_ERR_PARAM_INVALID, PHASE2,
                "workspace belongs to device 1", "device 0");
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws0, WS_BYTES, ex, s1), ACL_ERROR_RT_STREAM_CONTEXT,
                PHASE2, "stream belongs to device 1", "device 0");
    /* Everything of device 0: it runs and computes right. */
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws0, WS_BYTES, ex, s0), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(s0), ACL_SUCCESS);
    CHECK_EQ_INT(verify(&p, 3, 0, 0.0), 0);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtDestroyStream(s0), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(ws0), ACL_SUCCESS);
    prob_free(&p);
    CHECK_EQ_INT(aclrtSetDevice(1), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtDestroyStream(s1), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(ws1), ACL_SUCCESS);
}

/* Another thread that set the same device uses the resources; one that set another does not. */
typedef struct {
    int32_t device;
    void *mem;
    int status;
} thread_use;

static void *use_from_thread(void *arg)
{
    thread_use *u = arg;
    aclrtSetDevice(u->device);
    u->status = aclrtMemset(u->mem, 64, 0, 64);
    aclGetRecentErrMsg();
    aclrtResetDevice(u->device);
    return NULL;
}

static void test_threads_share_a_device(void)
{
    CHECK_EQ_INT(aclrtSetDevice(2), ACL_SUCCESS);
    void *mem = dev_alloc(64);
    thread_use same = {2, mem, -1}, other = {0, mem, -1};
    pthread_t a, b;
    CHECK_EQ_INT(pthread_create(&a, NULL, use_from_thread, &same), 0);
    pthread_join(a, NULL);
    CHECK_EQ_INT(pthread_create(&b, NULL, use_from_thread, &other), 0);
    pthread_join(b, NULL);
    CHECK_EQ_INT(same.status, ACL_SUCCESS);
    CHECK_EQ_INT(other.status, ACL_ERROR_RT_PARAM_INVALID);
    CHECK_EQ_INT(aclrtFree(mem), ACL_SUCCESS);
}

int main(void)
{
    setenv("ACL_EMU_DEVICES", "3", 1);
    emu_session session = emu_session_begin(EMU_SESSION_RUNTIME);
    test_get_device();
    test_runtime_resources();
    test_synchronize_device_is_per_device();
    test_operator_across_devices();
    test_threads_share_a_device();
    emu_session_end(&session);
    /* Default: one device. */
    unsetenv("ACL_EMU_DEVICES");
    CHECK_EQ_INT(aclInit(NULL), ACL_SUCCESS);
    uint32_t count = 0;
    CHECK_EQ_INT(aclrtGetDeviceCount(&count), ACL_SUCCESS);
    CHECK_EQ_INT(count, 1);
    CHECK_FAILS(aclrtSetDevice(1), ACL_ERROR_RT_INVALID_DEVICEID, "aclrtSetDevice", "1");
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);
    return emu_test_finish("test_devices");
}
