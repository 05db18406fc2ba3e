/*
 * The C side of benchmarks/host_overhead.py: the same ACL call sequences the Python paths make,
 * timed in C against the same libraries, so the ratio shows what the binding adds.
 *
 *   host_overhead T H REPEATS [BATCH]  ->  one JSON object of median/min microseconds per call
 *
 * Each sample times BATCH calls in a row (default 1) and records their mean, so that the cost of
 * reading the clock is spread over the calls; benchmarks/host_overhead.py does the same.
 *
 * Scenarios (each ends with aclrtSynchronizeStream, as the Python side does):
 *   device_call:   phase 1 + phase 2 on existing device buffers and tensors
 *   plan_call:     phase 2 on a repeatable executor (addresses unchanged)
 *   plan_rebind:   aclSetInputTensorAddr x2 + aclSetOutputTensorAddr x1 + phase 2 (two buffer sets)
 *   one_shot:      one malloc (arrays and workspace) + copies in, tensors, phase 1, phase 2, copies
 *                  out, destroy, free
 * Inputs: bf16 gradY/x/yOrigin, fp32 weight, INT64 groupIndex, clamp 1.0 (ABI revision 2).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "acl/acl.h"
#include "bench_clock.h"
#include "aclnnop/aclnn_swiglu_group_quant_grad.h"

#define CHECK(call)                                                                    \
    do {                                                                               \
        int status_ = (call);                                                          \
        if (status_ != 0) {                                                            \
            const char *msg_ = aclGetRecentErrMsg();                                   \
            fprintf(stderr, "%s failed: %d %s\n", #call, status_, msg_ ? msg_ : "");   \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

enum { GY, X, W, YO, GI, GX, GW, COUNT };

typedef struct {
    int64_t dims[COUNT][2];
    int64_t ndims[COUNT];
    aclDataType dtypes[COUNT];
    size_t bytes[COUNT];
    void *host[COUNT];
} problem;

static void report(const char *name, double *samples, int n, int last)
{
    double median = sorted_median(samples, (size_t)n);
    printf("  \"%s\": {\"median_us\": %.3f, \"min_us\": %.3f}%s\n", name, median, samples[0],
           last ? "" : ",");
}

static void setup(problem *p, int64_t T, int64_t H)
{
    int64_t shapes[COUNT][2] = {{T, H}, {T, 2 * H}, {T, 1}, {T, H}, {2, 0}, {T, 2 * H}, {T, 1}};
    int64_t ndims[COUNT] = {2, 2, 2, 2, 1, 2, 2};
    aclDataType dtypes[COUNT] = {ACL_BF16, ACL_BF16, ACL_FLOAT, ACL_BF16, ACL_INT64, ACL_BF16, ACL_FLOAT};
    size_t sizes[COUNT] = {2, 2, 4, 2, 8, 2, 4};
    for (int k = 0; k < COUNT; k++) {
        memcpy(p->dims[k], shapes[k], sizeof shapes[k]);
        p->ndims[k] = ndims[k];
        p->dtypes[k] = dtypes[k];
        int64_t n = ndims[k] == 1 ? shapes[k][0] : shapes[k][0] * shapes[k][1];
        p->bytes[k] = (size_t)n * sizes[k];
        p->host[k] = calloc(1, p->bytes[k]);
    }
    uint16_t *gy = p->host[GY], *x = p->host[X], *yo = p->host[YO];
    for (int64_t i = 0; i < T * H; i++) { gy[i] = 0x3F80; yo[i] = 0x3F00; }
    for (int64_t i = 0; i < 2 * T * H; i++) x[i] = (uint16_t)(i % 3 ? 0x3F80 : 0xBF80);
    float *w = p->host[W];
    for (int64_t t = 0; t < T; t++) w[t] = 0.5f;
    int64_t *gi = p->host[GI];
    gi[0] = T / 2;
    gi[1] = T - T / 2;
}

static aclTensor *tensor(const problem *p, int k, void *data)
{
    int64_t storage = p->ndims[k] == 1 ? p->dims[k][0] : p->dims[k][0] * p->dims[k][1];
    return aclCreateTensor(p->dims[k], (uint64_t)p->ndims[k], p->dtypes[k], NULL, 0, ACL_FORMAT_ND, &storage, 1, data);
}

static void device_buffers(const problem *p, void *dev[COUNT])
{
    for (int k = 0; k < COUNT; k++) {
        CHECK(aclrtMalloc(&dev[k], p->bytes[k], ACL_MEM_MALLOC_HUGE_FIRST));
        if (k < GX) {
            CHECK(aclrtMemcpy(dev[k], p->bytes[k], p->host[k], p->bytes[k], ACL_MEMCPY_HOST_TO_DEVICE));
        }
    }
}

static aclnnStatus phase1(aclTensor *t[COUNT], uint64_t *ws, aclOpExecutor **ex)
{
    return aclnnSwigluGroupQuantGradGetWorkspaceSize(t[GY], t[X], t[W], t[YO], t[GI], 1.0, t[GX], t[GW], ws, ex);
}

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: host_overhead T H REPEATS [BATCH]\n");
        return 2;
    }
    int64_t T = atoll(argv[1]), H = atoll(argv[2]);
    int repeats = atoi(argv[3]);
    int batch = argc == 5 ? atoi(argv[4]) : 1;
    if (batch < 1) batch = 1;
    problem p;
    setup(&p, T, H);
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtStream stream;
    CHECK(aclrtCreateStream(&stream));
    void *dev[COUNT], *dev2[COUNT];
    device_buffers(&p, dev);
    device_buffers(&p, dev2);
    aclTensor *t[COUNT];
    for (int k = 0; k < COUNT; k++) t[k] = tensor(&p, k, dev[k]);
    void *workspace = NULL;
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    CHECK(phase1(t, &ws, &ex));
    CHECK(aclrtMalloc(&workspace, ws, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclDestroyAclOpExecutor(ex));
    double *samples = malloc((size_t)repeats * sizeof *samples);
    printf("{\n");

    /* device_call: both phases on existing buffers and tensors */
    for (int i = 0; i < repeats; i++) {
        double t0 = now_us();
        for (int b = 0; b < batch; b++) {
            CHECK(phase1(t, &ws, &ex));
            CHECK(aclnnSwigluGroupQuantGrad(workspace, ws, ex, stream));
            CHECK(aclrtSynchronizeStream(stream));
        }
        samples[i] = (now_us() - t0) / batch;
    }
    report("device_call", samples, repeats, 0);

    /* plan_call and plan_rebind: a repeatable executor on its own tensors */
    aclTensor *pt[COUNT];
    for (int k = 0; k < COUNT; k++) pt[k] = tensor(&p, k, dev[k]);
    CHECK(phase1(pt, &ws, &ex));
    CHECK(aclSetAclOpExecutorRepeatable(ex));
    for (int i = 0; i < repeats; i++) {
        double t0 = now_us();
        for (int b = 0; b < batch; b++) {
            CHECK(aclnnSwigluGroupQuantGrad(workspace, ws, ex, stream));
            CHECK(aclrtSynchronizeStream(stream));
        }
        samples[i] = (now_us() - t0) / batch;
    }
    report("plan_call", samples, repeats, 0);
    for (int i = 0; i < repeats; i++) {
        double t0 = now_us();
        for (int b = 0; b < batch; b++) {
            void **set = (i * batch + b) % 2 ? dev : dev2;
            CHECK(aclSetInputTensorAddr(ex, 0, pt[GY], set[GY]));
            CHECK(aclSetInputTensorAddr(ex, 1, pt[X], set[X]));
            CHECK(aclSetOutputTensorAddr(ex, 0, pt[GX], set[GX]));
            CHECK(aclnnSwigluGroupQuantGrad(workspace, ws, ex, stream));
            CHECK(aclrtSynchronizeStream(stream));
        }
        samples[i] = (now_us() - t0) / batch;
    }
    report("plan_rebind", samples, repeats, 0);
    CHECK(aclDestroyAclOpExecutor(ex));
    for (int k = 0; k < COUNT; k++) CHECK(aclDestroyTensor(pt[k]));

    /* one_shot: everything from host data to host results, all device memory in one
     * allocation at 64-byte aligned offsets with the workspace after the arrays, as the Python
     * one-shot call does */
    void *out_gx = malloc(p.bytes[GX]), *out_gw = malloc(p.bytes[GW]);
    size_t offsets[COUNT], arena = 0;
    for (int k = 0; k < COUNT; k++) {
        offsets[k] = arena;
        arena += (p.bytes[k] + 63) / 64 * 64;
    }
    size_t arrays_bytes = arena;
    arena += ws;
    for (int i = 0; i < repeats * batch; i++) {
        double t0 = now_us();
        void *base = NULL;
        aclTensor *ot[COUNT];
        CHECK(aclrtMalloc(&base, arena, ACL_MEM_MALLOC_HUGE_FIRST));
        for (int k = 0; k < COUNT; k++) {
            void *d = (char *)base + offsets[k];
            if (k < GX) {
                CHECK(aclrtMemcpy(d, p.bytes[k], p.host[k], p.bytes[k], ACL_MEMCPY_HOST_TO_DEVICE));
            }
            ot[k] = tensor(&p, k, d);
        }
        CHECK(phase1(ot, &ws, &ex));
        CHECK(aclnnSwigluGroupQuantGrad(ws ? (char *)base + arrays_bytes : NULL, ws, ex, stream));
        CHECK(aclrtSynchronizeStream(stream));
        CHECK(aclrtMemcpy(out_gx, p.bytes[GX], (char *)base + offsets[GX], p.bytes[GX], ACL_MEMCPY_DEVICE_TO_HOST));
        CHECK(aclrtMemcpy(out_gw, p.bytes[GW], (char *)base + offsets[GW], p.bytes[GW], ACL_MEMCPY_DEVICE_TO_HOST));
        for (int k = COUNT - 1; k >= 0; k--) CHECK(aclDestroyTensor(ot[k]));
        CHECK(aclrtFree(base));
        double elapsed = now_us() - t0;
        samples[i / batch] = (i % batch ? samples[i / batch] : 0.0) + elapsed / batch;
    }
    report("one_shot", samples, repeats, 1);
    printf("}\n");

    free(out_gx);
    free(out_gw);
    free(samples);
    for (int k = 0; k < COUNT; k++) {
        CHECK(aclDestroyTensor(t[k]));
        CHECK(aclrtFree(dev[k]));
        CHECK(aclrtFree(dev2[k]));
        free(p.host[k]);
    }
    CHECK(aclrtFree(workspace));
    CHECK(aclrtDestroyStream(stream));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    return 0;
}
