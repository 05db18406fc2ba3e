/* The emulated runtime (libascendcl.so): init/finalize, devices, device memory, copies,
 * streams, error text, fault injection, live counts and the leak report, as documented in
 * docs/emulator.md. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "acl/acl.h"
#include "acl_emu/acl_emu.h"
#include "aclnnop/aclnn_swiglu_group_quant_grad.h"
#include "emu_test.h"

/* ---- helpers ---- */

static void drain_message(void)
{
    while (aclGetRecentErrMsg() != NULL) {
    }
}

static void start(void)
{
    CHECK_EQ_INT(aclInit(NULL), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSetDevice(0), ACL_SUCCESS);
}

static void stop(void)
{
    CHECK_EQ_INT(aclrtResetDevice(0), ACL_SUCCESS);
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);
}

static void *dev_alloc(size_t size)
{
    void *p = NULL;
    CHECK_EQ_INT(aclrtMalloc(&p, size, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK(p != NULL);
    return p;
}

static void upload(void *dev, const void *host, size_t n)
{
    CHECK_EQ_INT(aclrtMemcpy(dev, n, host, n, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
}

static void download(void *host, const void *dev, size_t n)
{
    CHECK_EQ_INT(aclrtMemcpy(host, n, dev, n, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
}

static int all_bytes(const unsigned char *p, size_t n, unsigned char value)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != value) return 0;
    }
    return 1;
}

static void fill_pattern(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed * 31u + i * 7u + 1u);
}

/* ---- before aclInit ---- */

static void test_calls_before_init(void)
{
    void *p = NULL;
    uint32_t count = 0;
    aclrtStream s = NULL;
    char host[16] = {0}, other[16] = {0};
    CHECK_FAILS(aclFinalize(), ACL_ERROR_UNINITIALIZE, "aclFinalize", "aclInit");
    CHECK_FAILS(aclrtSetDevice(0), ACL_ERROR_UNINITIALIZE, "aclrtSetDevice");
    CHECK_FAILS(aclrtResetDevice(0), ACL_ERROR_UNINITIALIZE, "aclrtResetDevice");
    CHECK_FAILS(aclrtGetDeviceCount(&count), ACL_ERROR_UNINITIALIZE, "aclrtGetDeviceCount");
    CHECK_FAILS(aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_UNINITIALIZE,
                "aclrtMalloc", "aclInit");
    CHECK_FAILS(aclrtFree(host), ACL_ERROR_UNINITIALIZE, "aclrtFree");
    CHECK_FAILS(aclrtMemcpy(host, 16, other, 16, ACL_MEMCPY_HOST_TO_HOST), ACL_ERROR_UNINITIALIZE,
                "aclrtMemcpy");
    CHECK_FAILS(aclrtMemcpyAsync(host, 16, other, 16, ACL_MEMCPY_HOST_TO_HOST, NULL),
                ACL_ERROR_UNINITIALIZE, "aclrtMemcpyAsync");
    CHECK_FAILS(aclrtMemset(host, 16, 0, 16), ACL_ERROR_UNINITIALIZE, "aclrtMemset");
    CHECK_FAILS(aclrtCreateStream(&s), ACL_ERROR_UNINITIALIZE, "aclrtCreateStream");
    CHECK_FAILS(aclrtDestroyStream(host), ACL_ERROR_UNINITIALIZE, "aclrtDestroyStream");
    CHECK_FAILS(aclrtSynchronizeStream(NULL), ACL_ERROR_UNINITIALIZE, "aclrtSynchronizeStream");
    CHECK_FAILS(aclrtSynchronizeDevice(), ACL_ERROR_UNINITIALIZE, "aclrtSynchronizeDevice");
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    CHECK_FAILS(aclnnSwigluGroupQuantGradGetWorkspaceSize(NULL, NULL, NULL, NULL, NULL, -1.0, NULL,
                                                          NULL, &ws, &ex),
                ACL_ERROR_UNINITIALIZE, "aclnnSwigluGroupQuantGradGetWorkspaceSize");
    CHECK(p == NULL);
    CHECK_EQ_INT(count, 0);
}

/* ---- aclInit / aclFinalize ---- */

static void test_init_finalize(void)
{
    CHECK_EQ_INT(aclInit(NULL), ACL_SUCCESS);
    CHECK_FAILS(aclInit(NULL), ACL_ERROR_REPEAT_INITIALIZE, "aclInit");
    CHECK_FAILS(aclInit(""), ACL_ERROR_REPEAT_INITIALIZE, "aclInit");
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);
    CHECK_FAILS(aclFinalize(), ACL_ERROR_REPEAT_FINALIZE, "aclFinalize");
    CHECK_FAILS(aclFinalize(), ACL_ERROR_REPEAT_FINALIZE, "aclFinalize");
    /* After aclFinalize the runtime is uninitialised again. */
    void *p = NULL;
    CHECK_FAILS(aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_UNINITIALIZE,
                "aclrtMalloc");
    /* An empty configPath is like NULL; init works again after finalize. */
    CHECK_EQ_INT(aclInit(""), ACL_SUCCESS);
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);
}

static void test_init_config_path(void)
{
    CHECK_FAILS(aclInit("/nonexistent/acl-swiglu/acl.json"), ACL_ERROR_INVALID_PARAM, "aclInit",
                "configPath", "/nonexistent/acl-swiglu/acl.json");
    /* A failed aclInit leaves the runtime uninitialised. */
    uint32_t count = 0;
    CHECK_FAILS(aclrtGetDeviceCount(&count), ACL_ERROR_UNINITIALIZE, "aclrtGetDeviceCount");

    char path[] = "/tmp/acl_swiglu_cfg_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK_EQ_INT(write(fd, "{}\n", 3), 3);
    close(fd);
    CHECK_EQ_INT(aclInit(path), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtGetDeviceCount(&count), ACL_SUCCESS);
    CHECK_EQ_INT(count, 1);
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);
    unlink(path);
}

/* A device set before aclFinalize does not count after the next aclInit. */
static void test_device_does_not_survive_finalize(void)
{
    start();
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);
    CHECK_EQ_INT(aclInit(NULL), ACL_SUCCESS);
    void *p = NULL;
    CHECK_FAILS(aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_CONTEXT_NULL,
                "aclrtMalloc", "aclrtSetDevice");
    CHECK_EQ_INT(aclrtSetDevice(0), ACL_SUCCESS);
    p = dev_alloc(64);
    CHECK_EQ_INT(aclrtFree(p), ACL_SUCCESS);
    stop();
}

/* ---- devices ---- */

static void test_device_count_and_ids(void)
{
    unsetenv("ACL_EMU_DEVICES");
    CHECK_EQ_INT(aclInit(NULL), ACL_SUCCESS);
    uint32_t count = 99;
    CHECK_EQ_INT(aclrtGetDeviceCount(&count), ACL_SUCCESS);
    CHECK_EQ_INT(count, 1);
    CHECK_FAILS(aclrtGetDeviceCount(NULL), ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceCount", "count");
    CHECK_FAILS(aclrtSetDevice(1), ACL_ERROR_RT_INVALID_DEVICEID, "aclrtSetDevice", "1");
    CHECK_FAILS(aclrtSetDevice(-1), ACL_ERROR_RT_INVALID_DEVICEID, "aclrtSetDevice", "-1");
    CHECK_FAILS(aclrtResetDevice(7), ACL_ERROR_RT_INVALID_DEVICEID, "aclrtResetDevice", "7");
    CHECK_EQ_INT(aclrtSetDevice(0), ACL_SUCCESS);
    /* Reset clears the calling thread's device. */
    CHECK_EQ_INT(aclrtResetDevice(0), ACL_SUCCESS);
    void *p = NULL;
    CHECK_FAILS(aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_CONTEXT_NULL,
                "aclrtMalloc");
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);

    setenv("ACL_EMU_DEVICES", "3", 1);
    CHECK_EQ_INT(aclInit(NULL), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtGetDeviceCount(&count), ACL_SUCCESS);
    CHECK_EQ_INT(count, 3);
    CHECK_EQ_INT(aclrtSetDevice(2), ACL_SUCCESS);
    CHECK_FAILS(aclrtSetDevice(3), ACL_ERROR_RT_INVALID_DEVICEID, "aclrtSetDevice", "3");
    p = dev_alloc(32);
    CHECK_EQ_INT(aclrtFree(p), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtResetDevice(2), ACL_SUCCESS);
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);
    unsetenv("ACL_EMU_DEVICES");
}

typedef struct {
    void *dev;
    aclrtStream stream;
    int main_failed;     /* main thread left a message before starting the thread */
} thread_args;

static void *no_device_thread(void *arg)
{
    thread_args *a = arg;
    void *p = NULL;
    char host[64] = {0};
    aclrtStream s = NULL;
    /* The main thread's message is not visible here. */
    CHECK(aclGetRecentErrMsg() == NULL);
    uint32_t count = 0;
    CHECK_EQ_INT(aclrtGetDeviceCount(&count), ACL_SUCCESS);
    CHECK_EQ_INT(count, 1);
    CHECK_FAILS(aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_CONTEXT_NULL,
                "aclrtMalloc", "aclrtSetDevice");
    CHECK_FAILS(aclrtFree(a->dev), ACL_ERROR_RT_CONTEXT_NULL, "aclrtFree");
    CHECK_FAILS(aclrtMemcpy(a->dev, 64, host, 64, ACL_MEMCPY_HOST_TO_DEVICE),
                ACL_ERROR_RT_CONTEXT_NULL, "aclrtMemcpy");
    CHECK_FAILS(aclrtMemcpyAsync(a->dev, 64, host, 64, ACL_MEMCPY_HOST_TO_DEVICE, a->stream),
                ACL_ERROR_RT_CONTEXT_NULL, "aclrtMemcpyAsync");
    CHECK_FAILS(aclrtMemset(a->dev, 64, 0, 64), ACL_ERROR_RT_CONTEXT_NULL, "aclrtMemset");
    CHECK_FAILS(aclrtCreateStream(&s), ACL_ERROR_RT_CONTEXT_NULL, "aclrtCreateStream");
    CHECK_FAILS(aclrtDestroyStream(a->stream), ACL_ERROR_RT_CONTEXT_NULL, "aclrtDestroyStream");
    CHECK_FAILS(aclrtSynchronizeStream(a->stream), ACL_ERROR_RT_CONTEXT_NULL,
                "aclrtSynchronizeStream");
    CHECK_FAILS(aclrtSynchronizeDevice(), ACL_ERROR_RT_CONTEXT_NULL, "aclrtSynchronizeDevice");
    /* Setting a device on this thread makes it work here; resetting undoes it. */
    CHECK_EQ_INT(aclrtSetDevice(0), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(p), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtResetDevice(0), ACL_SUCCESS);
    CHECK_FAILS(aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_CONTEXT_NULL,
                "aclrtMalloc");
    return NULL;
}

static void test_device_is_per_thread(void)
{
    start();
    thread_args a = {dev_alloc(64), NULL, 1};
    CHECK_EQ_INT(aclrtCreateStream(&a.stream), ACL_SUCCESS);
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, no_device_thread, &a), 0);
    pthread_join(th, NULL);
    /* The thread's reset did not touch the main thread's device; the stream is still alive. */
    CHECK_EQ_INT(aclrtSynchronizeStream(a.stream), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtDestroyStream(a.stream), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(a.dev), ACL_SUCCESS);
    stop();
}

/* ---- device memory ---- */

static void test_malloc_errors(void)
{
    start();
    void *p = NULL;
    CHECK_FAILS(aclrtMalloc(NULL, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM,
                "aclrtMalloc", "devPtr");
    CHECK_FAILS(aclrtMalloc(&p, 0, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM,
                "aclrtMalloc", "size");
    CHECK_FAILS(aclrtMalloc(&p, 64, (aclrtMemMallocPolicy)3), ACL_ERROR_INVALID_PARAM,
                "aclrtMalloc", "policy");
    CHECK_FAILS(aclrtMalloc(&p, 64, (aclrtMemMallocPolicy)-1), ACL_ERROR_INVALID_PARAM,
                "aclrtMalloc", "policy");
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_ALLOCATION), 0);
    /* Every documented policy works. */
    for (int policy = 0; policy <= 2; policy++) {
        CHECK_EQ_INT(aclrtMalloc(&p, 100, (aclrtMemMallocPolicy)policy), ACL_SUCCESS);
        CHECK(p != NULL);
        CHECK_EQ_INT(aclrtFree(p), ACL_SUCCESS);
    }
    stop();
}

static void test_malloc_capacity(void)
{
    setenv("ACL_EMU_DEVICE_MEMORY", "4096", 1);
    start();
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_FAILS(aclrtMalloc(&a, 4097, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_MEMORY_ALLOCATION,
                "aclrtMalloc", "4097", "4096", "ACL_EMU_DEVICE_MEMORY");
    CHECK_EQ_INT(aclrtMalloc(&a, 4096, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_FAILS(aclrtMalloc(&b, 1, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_MEMORY_ALLOCATION,
                "aclrtMalloc", "ACL_EMU_DEVICE_MEMORY");
    CHECK_EQ_INT(aclrtFree(a), ACL_SUCCESS);
    /* Freed bytes can be allocated again; the requested size is what counts. */
    CHECK_EQ_INT(aclrtMalloc(&a, 2048, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtMalloc(&b, 2048, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveBytes(), 4096);
    CHECK_FAILS(aclrtMalloc(&c, 1, ACL_MEM_MALLOC_NORMAL_ONLY), ACL_ERROR_RT_MEMORY_ALLOCATION,
                "aclrtMalloc");
    CHECK_EQ_INT(aclrtFree(a), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(b), ACL_SUCCESS);
    stop();
    unsetenv("ACL_EMU_DEVICE_MEMORY");
    /* Read at aclInit: without the variable the small limit is gone. */
    start();
    a = dev_alloc(1 << 20);
    CHECK_EQ_INT(aclrtFree(a), ACL_SUCCESS);
    stop();
}

static void test_fresh_memory_and_alignment(void)
{
    start();
    static const size_t sizes[] = {1, 3, 31, 33, 64, 100, 4097};
    void *ptrs[sizeof sizes / sizeof sizes[0]];
    int64_t bytes = aclEmuLiveBytes();
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        ptrs[i] = dev_alloc(sizes[i]);
        CHECK_EQ_INT((uintptr_t)ptrs[i] % 64, 0);
        CHECK_EQ_INT((uintptr_t)ptrs[i] % 32, 0);
        bytes += (int64_t)sizes[i];
        CHECK_EQ_INT(aclEmuLiveBytes(), bytes);
        unsigned char host[4097];
        memset(host, 0, sizeof host);
        download(host, ptrs[i], sizes[i]);
        CHECK(all_bytes(host, sizes[i], 0xFF));
    }
    /* A fresh fp32 reads as NaN. */
    float f = 0.0f;
    download(&f, ptrs[6], sizeof f);
    CHECK(f != f);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        CHECK_EQ_INT(aclrtFree(ptrs[i]), ACL_SUCCESS);
    }
    CHECK_EQ_INT(aclEmuLiveBytes(), 0);
    stop();
}

/* Freed memory handed out again (large blocks are cached for reuse) never shows the previous
 * owner's bytes, nor zeros: it is filled afresh, whatever its size. */
static void test_reused_memory_is_filled_again(void)
{
    start();
    static const size_t sizes[] = {4096, (size_t)2 << 20, ((size_t)3 << 20) + 100, (size_t)9 << 20};
    const size_t largest = (size_t)9 << 20;
    unsigned char *host = malloc(largest);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (int round = 0; round < 3; round++) {
            void *d = dev_alloc(sizes[i]);
            CHECK_EQ_INT((uintptr_t)d % 64, 0);
            memset(host, 0, sizes[i]);
            download(host, d, sizes[i]);
            CHECK(all_bytes(host, sizes[i], 0xFF));
            /* Leave the caller's data (and zeros) behind for whoever gets the block next. */
            memset(host, round == 0 ? 0x00 : 0x3C, sizes[i]);
            upload(d, host, sizes[i]);
            CHECK_EQ_INT(aclrtFree(d), ACL_SUCCESS);
        }
    }
    /* A smaller request may be served by a larger cached block: only its own bytes count. */
    void *big = dev_alloc((size_t)8 << 20);
    CHECK_EQ_INT(aclrtFree(big), ACL_SUCCESS);
    void *d = dev_alloc(((size_t)7 << 20) + 1);
    download(host, d, ((size_t)7 << 20) + 1);
    CHECK(all_bytes(host, ((size_t)7 << 20) + 1, 0xFF));
    CHECK_FAILS(aclrtMemset(d, (size_t)8 << 20, 0, (size_t)8 << 20), ACL_ERROR_INVALID_PARAM,
                "aclrtMemset", "one device allocation");
    CHECK_EQ_INT(aclrtFree(d), ACL_SUCCESS);
    free(host);
    stop();
}

static void test_free_errors(void)
{
    start();
    char *p = dev_alloc(256);
    char host[64];
    CHECK_FAILS(aclrtFree(NULL), ACL_ERROR_INVALID_PARAM, "aclrtFree", "NULL");
    CHECK_FAILS(aclrtFree(p + 1), ACL_ERROR_INVALID_PARAM, "aclrtFree", "inside");
    CHECK_FAILS(aclrtFree(p + 128), ACL_ERROR_INVALID_PARAM, "aclrtFree", "inside");
    CHECK_FAILS(aclrtFree(host), ACL_ERROR_INVALID_PARAM, "aclrtFree", "not");
    /* Still live after the bad frees. */
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_ALLOCATION), 1);
    CHECK_EQ_INT(aclrtFree(p), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_ALLOCATION), 0);
    CHECK_FAILS(aclrtFree(p), ACL_ERROR_INVALID_PARAM, "aclrtFree", "already freed");
    stop();
}

/* ---- copies ---- */

static void test_memcpy_kinds(void)
{
    start();
    enum { N = 64 };
    unsigned char *d1 = dev_alloc(N), *d2 = dev_alloc(N);
    unsigned char h1[N], h2[N], back[N];
    fill_pattern(h1, N, 1);
    memset(h2, 0, N);

    /* HOST_TO_DEVICE: dst device, src host. */
    CHECK_EQ_INT(aclrtMemcpy(d1, N, h1, N, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
    CHECK_FAILS(aclrtMemcpy(h2, N, h1, N, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "ACL_MEMCPY_HOST_TO_DEVICE", "dst");
    CHECK_FAILS(aclrtMemcpy(d2, N, d1, N, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "ACL_MEMCPY_HOST_TO_DEVICE", "src");
    /* DEVICE_TO_HOST: dst host, src device. */
    CHECK_EQ_INT(aclrtMemcpy(back, N, d1, N, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
    CHECK(memcmp(back, h1, N) == 0);
    CHECK_FAILS(aclrtMemcpy(d2, N, d1, N, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "ACL_MEMCPY_DEVICE_TO_HOST", "dst");
    CHECK_FAILS(aclrtMemcpy(h2, N, h1, N, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "ACL_MEMCPY_DEVICE_TO_HOST", "src");
    /* DEVICE_TO_DEVICE: both device. */
    CHECK_EQ_INT(aclrtMemcpy(d2, N, d1, N, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS);
    memset(back, 0, N);
    download(back, d2, N);
    CHECK(memcmp(back, h1, N) == 0);
    CHECK_FAILS(aclrtMemcpy(h2, N, d1, N, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "ACL_MEMCPY_DEVICE_TO_DEVICE", "dst");
    CHECK_FAILS(aclrtMemcpy(d2, N, h1, N, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "ACL_MEMCPY_DEVICE_TO_DEVICE", "src");
    /* HOST_TO_HOST: both host. */
    CHECK_EQ_INT(aclrtMemcpy(h2, N, h1, N, ACL_MEMCPY_HOST_TO_HOST), ACL_SUCCESS);
    CHECK(memcmp(h2, h1, N) == 0);
    CHECK_FAILS(aclrtMemcpy(d1, N, h1, N, ACL_MEMCPY_HOST_TO_HOST), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "ACL_MEMCPY_HOST_TO_HOST", "dst");
    CHECK_FAILS(aclrtMemcpy(h2, N, d1, N, ACL_MEMCPY_HOST_TO_HOST), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "ACL_MEMCPY_HOST_TO_HOST", "src");
    /* Unknown kinds. */
    CHECK_FAILS(aclrtMemcpy(d1, N, h1, N, (aclrtMemcpyKind)5), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "kind");
    CHECK_FAILS(aclrtMemcpy(d1, N, h1, N, (aclrtMemcpyKind)-1), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "kind");
    CHECK_EQ_INT(aclrtFree(d1), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(d2), ACL_SUCCESS);
    stop();
}

static void test_memcpy_default_kind(void)
{
    start();
    enum { N = 48 };
    unsigned char *d1 = dev_alloc(N), *d2 = dev_alloc(N);
    unsigned char h1[N], h2[N];
    fill_pattern(h1, N, 2);
    CHECK_EQ_INT(aclrtMemcpy(d1, N, h1, N, ACL_MEMCPY_DEFAULT), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtMemcpy(d2, N, d1, N, ACL_MEMCPY_DEFAULT), ACL_SUCCESS);
    memset(h2, 0, N);
    CHECK_EQ_INT(aclrtMemcpy(h2, N, d2, N, ACL_MEMCPY_DEFAULT), ACL_SUCCESS);
    CHECK(memcmp(h2, h1, N) == 0);
    memset(h2, 0, N);
    CHECK_EQ_INT(aclrtMemcpy(h2, N, h1, N, ACL_MEMCPY_DEFAULT), ACL_SUCCESS);
    CHECK(memcmp(h2, h1, N) == 0);
    /* DEFAULT still refuses a straddling range. */
    CHECK_FAILS(aclrtMemcpy(h2, N, d1 + 8, N, ACL_MEMCPY_DEFAULT), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "src");
    CHECK_EQ_INT(aclrtFree(d1), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(d2), ACL_SUCCESS);
    stop();
}

static void test_memcpy_ranges(void)
{
    start();
    enum { N = 64 };
    unsigned char *d = dev_alloc(N);
    unsigned char big[2 * N], back[N];
    fill_pattern(big, sizeof big, 3);
    /* NULL pointers, count > destMax. */
    CHECK_FAILS(aclrtMemcpy(NULL, N, big, N, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "dst");
    CHECK_FAILS(aclrtMemcpy(d, N, NULL, N, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "src");
    CHECK_FAILS(aclrtMemcpy(d, N - 1, big, N, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "destMax");
    /* A range running past the allocation's end, as dst and as src. */
    CHECK_FAILS(aclrtMemcpy(d, 2 * N, big, N + 1, ACL_MEMCPY_HOST_TO_DEVICE),
                ACL_ERROR_INVALID_PARAM, "aclrtMemcpy", "dst", "runs past");
    CHECK_FAILS(aclrtMemcpy(d + 32, N, big, N, ACL_MEMCPY_HOST_TO_DEVICE),
                ACL_ERROR_INVALID_PARAM, "aclrtMemcpy", "dst");
    CHECK_FAILS(aclrtMemcpy(big, 2 * N, d + 1, N, ACL_MEMCPY_DEVICE_TO_HOST),
                ACL_ERROR_INVALID_PARAM, "aclrtMemcpy", "src");
    /* A range that starts before the allocation and ends inside it. */
    void *before = (void *)((uintptr_t)d - 16);
    CHECK_FAILS(aclrtMemcpy(big, 2 * N, before, 32, ACL_MEMCPY_DEVICE_TO_HOST),
                ACL_ERROR_INVALID_PARAM, "aclrtMemcpy", "src");
    /* Nothing was written by the refused copies. */
    download(back, d, N);
    CHECK(all_bytes(back, N, 0xFF));
    /* Exactly the allocation, and a part at an inner offset, are fine. */
    upload(d, big, N);
    CHECK_EQ_INT(aclrtMemcpy(d + 60, 4, big + 100, 4, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
    download(back, d, N);
    CHECK(memcmp(back, big, 60) == 0);
    CHECK(memcmp(back + 60, big + 100, 4) == 0);
    /* count 0 is a no-op that succeeds. */
    unsigned char keep[N];
    memcpy(keep, back, N);
    CHECK_EQ_INT(aclrtMemcpy(back, N, d, 0, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtMemcpy(d, 0, big, 0, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
    CHECK(memcmp(back, keep, N) == 0);
    download(back, d, N);
    CHECK(memcmp(back, keep, N) == 0);
    CHECK_EQ_INT(aclrtFree(d), ACL_SUCCESS);
    /* A freed allocation is not device memory any more. */
    CHECK_FAILS(aclrtMemcpy(back, N, d, N, ACL_MEMCPY_DEVICE_TO_HOST), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "src");
    stop();
}

static void test_memset(void)
{
    start();
    enum { N = 64 };
    unsigned char *d = dev_alloc(N);
    unsigned char host[N], back[N];
    CHECK_EQ_INT(aclrtMemset(d, N, 0x1AB, N), ACL_SUCCESS);
    download(back, d, N);
    CHECK(all_bytes(back, N, 0xAB));
    CHECK_EQ_INT(aclrtMemset(d + 8, 8, 0, 8), ACL_SUCCESS);
    download(back, d, N);
    CHECK(all_bytes(back, 8, 0xAB));
    CHECK(all_bytes(back + 8, 8, 0x00));
    CHECK(all_bytes(back + 16, N - 16, 0xAB));
    CHECK_FAILS(aclrtMemset(d, 16, 0, 17), ACL_ERROR_INVALID_PARAM, "aclrtMemset", "maxCount");
    CHECK_FAILS(aclrtMemset(NULL, 16, 0, 16), ACL_ERROR_INVALID_PARAM, "aclrtMemset", "devPtr");
    CHECK_FAILS(aclrtMemset(host, N, 0, N), ACL_ERROR_INVALID_PARAM, "aclrtMemset",
                "device allocation");
    CHECK_FAILS(aclrtMemset(d + 32, N, 0, N), ACL_ERROR_INVALID_PARAM, "aclrtMemset",
                "device allocation");
    CHECK_EQ_INT(aclrtMemset(d, N, 0x11, 0), ACL_SUCCESS);
    download(back, d, N);
    CHECK_EQ_INT(back[0], 0xAB);
    CHECK_EQ_INT(aclrtFree(d), ACL_SUCCESS);
    stop();
}

/* ---- streams ---- */

static void test_stream_lifecycle(void)
{
    start();
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_STREAM), 0);   /* default stream not counted */
    aclrtStream s1 = NULL, s2 = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&s1), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtCreateStream(&s2), ACL_SUCCESS);
    CHECK(s1 != NULL && s2 != NULL && s1 != s2);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_STREAM), 2);
    CHECK_FAILS(aclrtCreateStream(NULL), ACL_ERROR_INVALID_PARAM, "aclrtCreateStream");
    CHECK_EQ_INT(aclrtSynchronizeStream(s1), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(NULL), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeDevice(), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtDestroyStream(s1), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_STREAM), 1);
    CHECK_FAILS(aclrtDestroyStream(s1), ACL_ERROR_INVALID_RESOURCE_HANDLE, "aclrtDestroyStream",
                "already destroyed");
    CHECK_FAILS(aclrtSynchronizeStream(s1), ACL_ERROR_INVALID_RESOURCE_HANDLE,
                "aclrtSynchronizeStream", "stream");
    int foreign = 0;
    CHECK_FAILS(aclrtSynchronizeStream(&foreign), ACL_ERROR_INVALID_RESOURCE_HANDLE,
                "aclrtSynchronizeStream", "stream");
    CHECK_FAILS(aclrtDestroyStream(&foreign), ACL_ERROR_INVALID_RESOURCE_HANDLE,
                "aclrtDestroyStream", "stream");
    /* Another kind of handle is not a stream. */
    void *d = dev_alloc(64);
    CHECK_FAILS(aclrtSynchronizeStream(d), ACL_ERROR_INVALID_RESOURCE_HANDLE,
                "aclrtSynchronizeStream", "device allocation");
    unsigned char h[64] = {0};
    CHECK_FAILS(aclrtMemcpyAsync(d, 64, h, 64, ACL_MEMCPY_HOST_TO_DEVICE, s1),
                ACL_ERROR_INVALID_RESOURCE_HANDLE, "aclrtMemcpyAsync", "stream");
    CHECK_EQ_INT(aclrtFree(d), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtDestroyStream(s2), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_STREAM), 0);
    stop();
}

static void test_async_copy_runs_at_sync(void)
{
    start();
    enum { N = 256 };
    aclrtStream s = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&s), ACL_SUCCESS);
    unsigned char *d = dev_alloc(N);
    unsigned char a[N], b[N], back[N];
    fill_pattern(a, N, 4);
    fill_pattern(b, N, 5);
    upload(d, a, N);
    CHECK_EQ_INT(aclrtMemcpyAsync(d, N, b, N, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_SUCCESS);
    download(back, d, N);
    CHECK(memcmp(back, a, N) == 0);   /* not yet */
    CHECK_EQ_INT(aclrtSynchronizeStream(s), ACL_SUCCESS);
    download(back, d, N);
    CHECK(memcmp(back, b, N) == 0);

    /* Device to host on the default stream: the host buffer changes at synchronisation. */
    memset(back, 0, N);
    CHECK_EQ_INT(aclrtMemcpyAsync(back, N, d, N, ACL_MEMCPY_DEVICE_TO_HOST, NULL), ACL_SUCCESS);
    CHECK(all_bytes(back, N, 0));
    CHECK_EQ_INT(aclrtSynchronizeStream(NULL), ACL_SUCCESS);
    CHECK(memcmp(back, b, N) == 0);

    /* Queue order: the later copy wins. */
    CHECK_EQ_INT(aclrtMemcpyAsync(d, N, a, N, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtMemcpyAsync(d, N, b, 16, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(s), ACL_SUCCESS);
    download(back, d, N);
    CHECK(memcmp(back, b, 16) == 0);
    CHECK(memcmp(back + 16, a + 16, N - 16) == 0);

    /* The checks run at call time. */
    CHECK_FAILS(aclrtMemcpyAsync(back, N, a, N, ACL_MEMCPY_HOST_TO_DEVICE, s),
                ACL_ERROR_INVALID_PARAM, "aclrtMemcpyAsync", "dst");
    CHECK_FAILS(aclrtMemcpyAsync(d, N - 1, a, N, ACL_MEMCPY_HOST_TO_DEVICE, s),
                ACL_ERROR_INVALID_PARAM, "aclrtMemcpyAsync", "destMax");
    CHECK_FAILS(aclrtMemcpyAsync(d, N, a, N, (aclrtMemcpyKind)9, s), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpyAsync", "kind");
    CHECK_EQ_INT(aclrtMemcpyAsync(d, N, a, 0, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(s), ACL_SUCCESS);

    CHECK_EQ_INT(aclrtDestroyStream(s), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(d), ACL_SUCCESS);
    stop();
}

static void test_synchronize_device_and_destroy(void)
{
    start();
    enum { N = 128 };
    aclrtStream s1 = NULL, s2 = NULL, s3 = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&s1), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtCreateStream(&s2), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtCreateStream(&s3), ACL_SUCCESS);
    unsigned char *d1 = dev_alloc(N), *d2 = dev_alloc(N), *d3 = dev_alloc(N), *d4 = dev_alloc(N);
    unsigned char a[N], back[N];
    fill_pattern(a, N, 6);
    CHECK_EQ_INT(aclrtMemcpyAsync(d1, N, a, N, ACL_MEMCPY_HOST_TO_DEVICE, s1), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtMemcpyAsync(d2, N, a, N, ACL_MEMCPY_HOST_TO_DEVICE, s2), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtMemcpyAsync(d3, N, a, N, ACL_MEMCPY_HOST_TO_DEVICE, NULL), ACL_SUCCESS);
    download(back, d1, N);
    CHECK(all_bytes(back, N, 0xFF));
    CHECK_EQ_INT(aclrtSynchronizeDevice(), ACL_SUCCESS);
    unsigned char *all[3] = {d1, d2, d3};
    for (int i = 0; i < 3; i++) {
        download(back, all[i], N);
        CHECK(memcmp(back, a, N) == 0);
    }
    /* Destroying a stream completes what is queued on it. */
    CHECK_EQ_INT(aclrtMemcpyAsync(d4, N, d1, N, ACL_MEMCPY_DEVICE_TO_DEVICE, s3), ACL_SUCCESS);
    download(back, d4, N);
    CHECK(all_bytes(back, N, 0xFF));
    CHECK_EQ_INT(aclrtDestroyStream(s3), ACL_SUCCESS);
    download(back, d4, N);
    CHECK(memcmp(back, a, N) == 0);

    CHECK_EQ_INT(aclrtDestroyStream(s1), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtDestroyStream(s2), ACL_SUCCESS);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(aclrtFree(all[i]), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(d4), ACL_SUCCESS);
    stop();
}

/* An async copy whose memory is freed before it runs fails at synchronisation with 507000,
 * and the rest of that stream's queue is dropped. */
static void test_async_copy_on_freed_memory(void)
{
    start();
    enum { N = 64 };
    aclrtStream s = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&s), ACL_SUCCESS);
    unsigned char *gone = dev_alloc(N), *kept = dev_alloc(N);
    unsigned char a[N], back[N];
    fill_pattern(a, N, 7);
    CHECK_EQ_INT(aclrtMemcpyAsync(gone, N, a, N, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtMemcpyAsync(kept, N, a, N, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(gone), ACL_SUCCESS);
    CHECK_FAILS(aclrtSynchronizeStream(s), ACL_ERROR_RT_INTERNAL_ERROR, "aclrtMemcpyAsync",
                "freed");
    download(back, kept, N);
    CHECK(all_bytes(back, N, 0xFF));
    /* The stream works again afterwards. */
    CHECK_EQ_INT(aclrtMemcpyAsync(kept, N, a, N, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(s), ACL_SUCCESS);
    download(back, kept, N);
    CHECK(memcmp(back, a, N) == 0);
    CHECK_EQ_INT(aclrtDestroyStream(s), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(kept), ACL_SUCCESS);
    stop();
}

/* aclFinalize drops queued work and frees streams and device memory. */
static void test_finalize_releases_device_resources(void)
{
    start();
    aclrtStream s = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&s), ACL_SUCCESS);
    void *d = dev_alloc(1000);
    static unsigned char host[1000];
    CHECK_EQ_INT(aclrtMemcpyAsync(d, 1000, host, 1000, ACL_MEMCPY_HOST_TO_DEVICE, s), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_STREAM), 1);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_ALLOCATION), 1);
    CHECK_EQ_INT(aclEmuLiveBytes(), 1000);
    CHECK_EQ_INT(aclrtResetDevice(0), ACL_SUCCESS);
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_STREAM), 0);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_ALLOCATION), 0);
    CHECK_EQ_INT(aclEmuLiveBytes(), 0);
    start();
    CHECK_FAILS(aclrtFree(d), ACL_ERROR_INVALID_PARAM, "aclrtFree", "already freed");
    CHECK_FAILS(aclrtSynchronizeStream(s), ACL_ERROR_INVALID_RESOURCE_HANDLE,
                "aclrtSynchronizeStream", "stream");
    stop();
}

/* ---- error text ---- */

static void *message_thread(void *arg)
{
    (void)arg;
    CHECK(aclGetRecentErrMsg() == NULL);
    CHECK_FAILS(aclrtSetDevice(42), ACL_ERROR_RT_INVALID_DEVICEID, "aclrtSetDevice", "42");
    CHECK_FAILS(aclrtSetDevice(43), ACL_ERROR_RT_INVALID_DEVICEID, "aclrtSetDevice", "43");
    return NULL;
}

static void test_recent_error_message(void)
{
    start();
    drain_message();
    CHECK(aclGetRecentErrMsg() == NULL);
    CHECK_EQ_INT(aclrtMalloc(NULL, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM);
    const char *m = aclGetRecentErrMsg();
    CHECK(m != NULL);
    char saved[1024] = "";
    if (m != NULL) {
        CHECK(strncmp(m, "aclrtMalloc: ", 13) == 0);
        const char *tail = " [status 100000]";
        size_t len = strlen(m), tl = strlen(tail);
        CHECK(len > tl && strcmp(m + len - tl, tail) == 0);
        snprintf(saved, sizeof saved, "%s", m);
    }
    /* Reading cleared it. */
    CHECK(aclGetRecentErrMsg() == NULL);
    /* The text handed out stays valid (and unchanged) until the thread reads again. */
    void *p = NULL;
    CHECK_EQ_INT(aclrtMalloc(&p, 0, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM);
    if (m != NULL) CHECK(strcmp(m, saved) == 0);
    const char *m2 = aclGetRecentErrMsg();
    CHECK(m2 != NULL && strstr(m2, "size") != NULL && strstr(m2, "[status 100000]") != NULL);
    /* Unread failures pile up, newest first, one per line; one read takes them all. */
    CHECK_EQ_INT(aclrtSetDevice(9), ACL_ERROR_RT_INVALID_DEVICEID);
    CHECK_EQ_INT(aclrtFree(NULL), ACL_ERROR_INVALID_PARAM);
    const char *m3 = aclGetRecentErrMsg();
    CHECK(m3 != NULL && strncmp(m3, "aclrtFree: ", 11) == 0 &&
          strstr(m3, "[status 100000]\naclrtSetDevice: ") != NULL &&
          strstr(m3, "[status 107001]") != NULL && strchr(strchr(m3, '\n') + 1, '\n') == NULL);
    CHECK(aclGetRecentErrMsg() == NULL);
    /* Only the latest returned text stays valid: the next read reuses its storage. */
    CHECK_EQ_INT(aclrtSetDevice(8), ACL_ERROR_RT_INVALID_DEVICEID);
    const char *first = aclGetRecentErrMsg();
    CHECK(first != NULL && strstr(first, "deviceId 8") != NULL);
    CHECK_EQ_INT(aclrtSetDevice(7), ACL_ERROR_RT_INVALID_DEVICEID);
    const char *second = aclGetRecentErrMsg();
    CHECK(second != NULL && strstr(second, "deviceId 7") != NULL && strstr(second, "deviceId 8") == NULL);
    /* Many unread failures: the oldest whole lines give way, the newest is always first. */
    for (int i = 0; i < 200; i++) {
        CHECK_EQ_INT(aclrtSetDevice(1000 + i), ACL_ERROR_RT_INVALID_DEVICEID);
    }
    const char *many = aclGetRecentErrMsg();
    CHECK(many != NULL && strncmp(many, "aclrtSetDevice: deviceId 1199 ", 30) == 0);
    if (many != NULL) {
        size_t len = strlen(many);
        CHECK(len < 4096 && strstr(many, "deviceId 1000 ") == NULL);
        CHECK(strcmp(many + len - strlen("[status 107001]"), "[status 107001]") == 0);
    }
    CHECK(aclGetRecentErrMsg() == NULL);

    /* Per thread: this thread's message is invisible there, and theirs here. */
    CHECK_EQ_INT(aclrtGetDeviceCount(NULL), ACL_ERROR_INVALID_PARAM);
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, message_thread, NULL), 0);
    pthread_join(th, NULL);
    const char *mine = aclGetRecentErrMsg();
    CHECK(mine != NULL && strncmp(mine, "aclrtGetDeviceCount: ", 21) == 0);
    CHECK(aclGetRecentErrMsg() == NULL);
    stop();
}

/* ---- fault injection ---- */

static void test_fault_injection(void)
{
    start();
    void *p[4] = {NULL, NULL, NULL, NULL};
    CHECK_EQ_INT(aclEmuSetFaults("aclrtMalloc:2:207001"), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuFaultsInjected(), 0);
    CHECK_EQ_INT(aclrtMalloc(&p[0], 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_FAILS(aclrtMalloc(&p[1], 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_MEMORY_ALLOCATION,
                "aclrtMalloc: injected fault", "call 2 of aclrtMalloc", "planned by aclEmuSetFaults",
                "[status 207001]");
    CHECK_EQ_INT(aclrtMalloc(&p[2], 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuFaultsInjected(), 1);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_ALLOCATION), 2);   /* no other effect */

    /* Setting the plan restarts its counters. */
    CHECK_EQ_INT(aclEmuSetFaults("aclrtMalloc:2:207001"), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuFaultsInjected(), 0);
    CHECK_EQ_INT(aclrtMalloc(&p[1], 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_FAILS(aclrtMalloc(&p[3], 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_MEMORY_ALLOCATION,
                "injected fault");
    CHECK_EQ_INT(aclEmuFaultsInjected(), 1);

    /* Several rules, any API, any code; other APIs are not counted against a rule. */
    CHECK_EQ_INT(aclEmuSetFaults("aclrtMemcpy:1:100000,aclrtSynchronizeStream:2:507015"),
                 ACL_SUCCESS);
    unsigned char h[64] = {0};
    CHECK_FAILS(aclrtMemcpy(p[0], 64, h, 64, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM,
                "aclrtMemcpy", "injected fault", "call 1 of aclrtMemcpy");
    CHECK_EQ_INT(aclrtMemcpy(p[0], 64, h, 64, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(NULL), ACL_SUCCESS);
    CHECK_FAILS(aclrtSynchronizeStream(NULL), ACL_ERROR_RT_AICORE_EXCEPTION,
                "aclrtSynchronizeStream", "injected fault");
    CHECK_EQ_INT(aclrtSynchronizeStream(NULL), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuFaultsInjected(), 2);

    /* Constructors return NULL with the message set. */
    CHECK_EQ_INT(aclEmuSetFaults("aclCreateTensor:1:161002,aclCreateIntArray:1:161001"),
                 ACL_SUCCESS);
    int64_t dims[1] = {4}, values[2] = {1, 2};
    int64_t tensors = aclEmuLiveCount(ACL_EMU_KIND_TENSOR);
    int64_t arrays = aclEmuLiveCount(ACL_EMU_KIND_INT_ARRAY);
    aclTensor *t = aclCreateTensor(dims, 1, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, dims, 1, p[0]);
    CHECK(t == NULL);
    emu_check_message(__FILE__, __LINE__, "aclCreateTensor",
                      (const char *[]){"aclCreateTensor", "injected fault", "[status 161002]",
                                       NULL});
    aclIntArray *arr = aclCreateIntArray(values, 2);
    CHECK(arr == NULL);
    emu_check_message(__FILE__, __LINE__, "aclCreateIntArray",
                      (const char *[]){"aclCreateIntArray", "injected fault", "[status 161001]",
                                       NULL});
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_TENSOR), tensors);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_INT_ARRAY), arrays);
    t = aclCreateTensor(dims, 1, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, dims, 1, p[0]);
    arr = aclCreateIntArray(values, 2);
    CHECK(t != NULL && arr != NULL);

    /* An injected destroy failure leaves the handle alive. */
    CHECK_EQ_INT(aclEmuSetFaults("aclDestroyTensor:1:161002"), ACL_SUCCESS);
    CHECK_FAILS(aclDestroyTensor(t), ACLNN_ERR_PARAM_INVALID, "aclDestroyTensor", "injected fault");
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_TENSOR), tensors + 1);
    CHECK_EQ_INT(aclDestroyTensor(t), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyIntArray(arr), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_TENSOR), tensors);

    /* Bad plans: 100000, and the old plan (with its counters) is kept. */
    CHECK_EQ_INT(aclEmuSetFaults("aclrtMalloc:1:207001"), ACL_SUCCESS);
    static const char *const bad[] = {"aclrtMalloc", "aclrtMalloc:1", "aclrtMalloc:0:207001",
                                      "aclrtMalloc:x:207001", "aclrtMalloc:1:abc",
                                      ":1:207001", "aclrtMalloc:-1:207001", "aclrtMalloc:1:0",
                                      "aclrtMalloc:1:207001,oops"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_FAILS(aclEmuSetFaults(bad[i]), ACL_ERROR_INVALID_PARAM, "aclEmuSetFaults");
    }
    void *q = NULL;
    CHECK_FAILS(aclrtMalloc(&q, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_MEMORY_ALLOCATION,
                "injected fault");
    CHECK_EQ_INT(aclEmuFaultsInjected(), 1);

    /* NULL and "" clear the plan. */
    CHECK_EQ_INT(aclEmuSetFaults("aclrtFree:1:100000"), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuSetFaults(NULL), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuFaultsInjected(), 0);
    CHECK_EQ_INT(aclrtFree(p[0]), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuSetFaults("aclrtFree:1:100000"), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuSetFaults(""), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(p[1]), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(p[2]), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuFaultsInjected(), 0);
    stop();
}

/* ---- live counts ---- */

static void test_live_counts(void)
{
    start();
    CHECK_EQ_INT(aclEmuLiveCount((aclEmuHandleKind)5), -1);
    CHECK_EQ_INT(aclEmuLiveCount((aclEmuHandleKind)-1), -1);
    int64_t base[ACL_EMU_KIND_COUNT];
    for (int k = 0; k < ACL_EMU_KIND_COUNT; k++) {
        base[k] = aclEmuLiveCount((aclEmuHandleKind)k);
        CHECK(base[k] >= 0);
    }
    int64_t bytes = aclEmuLiveBytes();

    void *d = dev_alloc(300);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_ALLOCATION), base[ACL_EMU_KIND_ALLOCATION] + 1);
    CHECK_EQ_INT(aclEmuLiveBytes(), bytes + 300);

    aclrtStream s = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&s), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_STREAM), base[ACL_EMU_KIND_STREAM] + 1);

    int64_t gy_dims[2] = {0, 4}, x_dims[2] = {0, 8}, values[1] = {3};
    aclTensor *gy = aclCreateTensor(gy_dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    aclTensor *x = aclCreateTensor(x_dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    aclTensor *gx = aclCreateTensor(x_dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    CHECK(gy != NULL && x != NULL && gx != NULL);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_TENSOR), base[ACL_EMU_KIND_TENSOR] + 3);

    aclIntArray *arr = aclCreateIntArray(values, 1);
    CHECK(arr != NULL);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_INT_ARRAY), base[ACL_EMU_KIND_INT_ARRAY] + 1);

    uint64_t ws = 1;
    aclOpExecutor *ex = NULL;
    CHECK_EQ_INT(aclnnSwigluGroupQuantGradGetWorkspaceSize(gy, x, NULL, NULL, NULL, -1.0, gx, NULL,
                                                           &ws, &ex),
                 ACLNN_SUCCESS);
    CHECK(ex != NULL);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), base[ACL_EMU_KIND_EXECUTOR] + 1);

    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), base[ACL_EMU_KIND_EXECUTOR]);
    CHECK_EQ_INT(aclDestroyIntArray(arr), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_INT_ARRAY), base[ACL_EMU_KIND_INT_ARRAY]);
    CHECK_EQ_INT(aclDestroyTensor(gy), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(x), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(gx), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_TENSOR), base[ACL_EMU_KIND_TENSOR]);
    CHECK_EQ_INT(aclrtDestroyStream(s), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_STREAM), base[ACL_EMU_KIND_STREAM]);
    CHECK_EQ_INT(aclrtFree(d), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_ALLOCATION), base[ACL_EMU_KIND_ALLOCATION]);
    CHECK_EQ_INT(aclEmuLiveBytes(), bytes);
    stop();
}

/* ---- leak report at aclFinalize ---- */

/* Runs `body` in a child with ACL_EMU_LEAK_CHECK=1 and stderr captured; returns the text
 * (malloc'd) or NULL. */
static char *capture_child_stderr(void (*body)(void))
{
    int fds[2];
    if (pipe(fds) != 0) return NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return NULL;
    }
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        close(fds[1]);
        setenv("ACL_EMU_LEAK_CHECK", "1", 1);
        body();
        _exit(0);   /* the child leaks on purpose: skip every exit-time check */
    }
    close(fds[1]);
    size_t cap = 4096, len = 0;
    char *text = malloc(cap);
    for (;;) {
        if (len + 1 == cap) {
            char *grown = realloc(text, cap * 2);
            if (grown == NULL) break;
            text = grown;
            cap *= 2;
        }
        ssize_t n = read(fds[0], text + len, cap - 1 - len);
        if (n <= 0) break;
        len += (size_t)n;
    }
    text[len] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return text;
}

static void leaky_child(void)
{
    aclInit(NULL);
    aclrtSetDevice(0);
    aclrtStream s = NULL;
    aclrtCreateStream(&s);
    void *d = NULL;
    aclrtMalloc(&d, 1234, ACL_MEM_MALLOC_HUGE_FIRST);
    int64_t gy_dims[2] = {0, 4}, x_dims[2] = {0, 8}, values[1] = {1};
    aclTensor *gy = aclCreateTensor(gy_dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    aclTensor *x = aclCreateTensor(x_dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    aclTensor *gx = aclCreateTensor(x_dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    aclCreateIntArray(values, 1);
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    aclnnSwigluGroupQuantGradGetWorkspaceSize(gy, x, NULL, NULL, NULL, -1.0, gx, NULL, &ws, &ex);
    aclFinalize();
}

static void clean_child(void)
{
    aclInit(NULL);
    aclrtSetDevice(0);
    void *d = NULL;
    aclrtMalloc(&d, 64, ACL_MEM_MALLOC_HUGE_FIRST);
    aclrtFree(d);
    aclrtResetDevice(0);
    aclFinalize();
}

static void test_leak_check_report(void)
{
    char *text = capture_child_stderr(leaky_child);
    CHECK(text != NULL);
    if (text != NULL) {
        static const char *const wanted[] = {"leak check", "3 aclTensor", "1 aclIntArray",
                                             "1 aclOpExecutor", "1 aclrtStream",
                                             "1 device allocation", "1234"};
        for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++) {
            if (strstr(text, wanted[i]) == NULL) {
                fprintf(stderr, "leak report lacks \"%s\":\n%s\n", wanted[i], text);
            }
            CHECK(strstr(text, wanted[i]) != NULL);
        }
        CHECK(strstr(text, "no live handles") == NULL);
        free(text);
    }
    text = capture_child_stderr(clean_child);
    CHECK(text != NULL);
    if (text != NULL) {
        CHECK(strstr(text, "no live handles") != NULL);
        CHECK(strstr(text, "leaked") == NULL);
        free(text);
    }
}

/* ---- ACL_EMU_FAIL, read at load: the test re-executes itself with the variable set ---- */

#define FAIL_CHILD_FLAG "--fail-at-load-child"

/* Child mode: exits 0 when the plan from ACL_EMU_FAIL behaved as `expect_fault` says. */
static int fail_at_load_child(int expect_fault)
{
    int ok = aclInit(NULL) == ACL_SUCCESS && aclrtSetDevice(0) == ACL_SUCCESS;
    void *a = NULL, *b = NULL;
    int first = aclrtMalloc(&a, 64, ACL_MEM_MALLOC_HUGE_FIRST);
    int second = aclrtMalloc(&b, 64, ACL_MEM_MALLOC_HUGE_FIRST);
    const char *m = aclGetRecentErrMsg();
    if (expect_fault) {
        ok = ok && first == ACL_SUCCESS && second == ACL_ERROR_RT_DEVICE_OOM && m != NULL &&
             strstr(m, "injected fault (call 2 of aclrtMalloc") != NULL &&
             strstr(m, "planned by ACL_EMU_FAIL") != NULL && aclEmuFaultsInjected() == 1;
    } else {
        ok = ok && first == ACL_SUCCESS && second == ACL_SUCCESS && aclEmuFaultsInjected() == 0;
    }
    if (a != NULL) aclrtFree(a);
    if (b != NULL) aclrtFree(b);
    aclrtResetDevice(0);
    aclFinalize();
    if (!ok) fprintf(stderr, "fail-at-load child: first %d, second %d\n", first, second);
    return ok ? 0 : 1;
}

/* This program as ctest started it (argv[0]), set once in main before any thread. */
static const char *self_program;

/* Runs this program again in child mode. Under a user-mode emulator (a cross build run by
 * qemu-user) /proc/self/exe is the emulator and the kernel cannot run the program itself, so
 * the child goes through the same launcher, which CMake passes in ACL_EMU_TEST_LAUNCHER. */
static void exec_self_child(const char *mode)
{
    const char *launcher = getenv("ACL_EMU_TEST_LAUNCHER");
    if (launcher != NULL && launcher[0] != '\0') {
        execlp(launcher, launcher, self_program, FAIL_CHILD_FLAG, mode, (char *)NULL);
    } else {
        execl("/proc/self/exe", "test_runtime", FAIL_CHILD_FLAG, mode, (char *)NULL);
    }
    _exit(3);
}

static void exec_with_good_plan(void)
{
    setenv("ACL_EMU_FAIL", "aclrtMalloc:2:207018", 1);
    exec_self_child("fault");
}

static void exec_with_bad_plan(void)
{
    setenv("ACL_EMU_FAIL", "aclrtMalloc:two:207018", 1);
    exec_self_child("none");
}

static void test_fail_plan_from_environment(void)
{
    char *text = capture_child_stderr(exec_with_good_plan);
    CHECK(text != NULL);
    free(text);
    text = capture_child_stderr(exec_with_bad_plan);
    CHECK(text != NULL && strstr(text, "ignoring ACL_EMU_FAIL") != NULL);
    free(text);
}

/* ---- the other extras ---- */

static void test_emulator_extras(void)
{
    const char *version = aclEmuVersion();
    CHECK(version != NULL && strlen(version) > 0);
    CHECK_FAILS(aclEmuSetThreads(-1), ACL_ERROR_INVALID_PARAM, "aclEmuSetThreads", "-1");
    CHECK_FAILS(aclEmuSetThreads(257), ACL_ERROR_INVALID_PARAM, "aclEmuSetThreads", "257");
    CHECK_EQ_INT(aclEmuSetThreads(256), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuSetThreads(1), ACL_SUCCESS);
    CHECK_EQ_INT(aclEmuSetThreads(0), ACL_SUCCESS);
}

int main(int argc, char **argv)
{
    self_program = argv[0];
    if (argc == 3 && strcmp(argv[1], FAIL_CHILD_FLAG) == 0) {
        return fail_at_load_child(strcmp(argv[2], "fault") == 0);
    }
    test_calls_before_init();   /* must run first: nothing initialised yet */
    test_init_finalize();
    test_init_config_path();
    test_device_does_not_survive_finalize();
    test_device_count_and_ids();
    test_device_is_per_thread();
    test_malloc_errors();
    test_malloc_capacity();
    test_fresh_memory_and_alignment();
    test_reused_memory_is_filled_again();
    test_free_errors();
    test_memcpy_kinds();
    test_memcpy_default_kind();
    test_memcpy_ranges();
    test_memset();
    test_stream_lifecycle();
    test_async_copy_runs_at_sync();
    test_synchronize_device_and_destroy();
    test_async_copy_on_freed_memory();
    test_finalize_releases_device_resources();
    test_recent_error_message();
    test_fault_injection();
    test_live_counts();
    test_leak_check_report();
    test_fail_plan_from_environment();
    test_emulator_extras();
    return emu_test_finish("test_runtime");
}
