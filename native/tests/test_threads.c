/*
 * Determinism: the kernel's bits do not depend on how many threads compute the rows, nor on
 * other host threads running the operator at the same time on their own device and stream.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "aclnnop/aclnn_swiglu_group_quant_grad.h"
#include "acl_emu/acl_emu.h"
#include "emu_test.h"

/* 300 * 1600 elements: enough work for 7 kernel threads (the kernel gives each thread at
 * least 2^16 elements). */
#define T_ROWS 300
#define H_COLS 1600
#define GROUPS 3
static const int64_t group_values[GROUPS] = {100, 150, 20}; /* trunc = 270 */
#define TRUNC 270

static const aclDataType dtypes[3] = {ACL_FLOAT, ACL_FLOAT16, ACL_BF16};

static size_t esize(aclDataType dt) { return dt == ACL_FLOAT ? 4 : 2; }

/* Inputs are made as bf16-exact values (8 significant bits), so they are exact in every dtype:
 * no conversion subtleties here, only the order of the computation matters. */
static float pattern(uint64_t i, double lo, double hi)
{
    uint64_t z = (i + 0x9E3779B97F4A7C15ULL) * 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 31;
    z *= 0x94D049BB133111EBULL;
    z ^= z >> 29;
    float v = (float)(lo + (hi - lo) * (double)(z >> 11) / 9007199254740992.0);
    if (fabsf(v) < 0x1p-10f) v = 0.0f; /* keep fp16 values normal */
    return f_bits(bits_f(v) & 0xFFFF0000u);
}

static void encode(aclDataType dt, float v, void *dst, size_t i)
{
    if (dt == ACL_FLOAT) {
        memcpy((char *)dst + 4 * i, &v, 4);
        return;
    }
    uint32_t b = bits_f(v);
    uint16_t h;
    if (dt == ACL_BF16) {
        h = (uint16_t)(b >> 16); /* exact: the low half is zero */
    } else {
        /* exact fp16 of a value with 8 significant bits in the normal fp16 range or 0 */
        if (v == 0.0f) {
            h = (uint16_t)((b >> 16) & 0x8000u);
        } else {
            int e = (int)((b >> 23) & 0xFF) - 127;
            h = (uint16_t)(((b >> 16) & 0x8000u) | (uint32_t)((e + 15) << 10) | ((b >> 13) & 0x3FFu));
        }
    }
    memcpy((char *)dst + 2 * i, &h, 2);
}

static float decode(aclDataType dt, const void *src, size_t i)
{
    if (dt == ACL_FLOAT) {
        float v;
        memcpy(&v, (const char *)src + 4 * i, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, (const char *)src + 2 * i, 2);
    if (dt == ACL_BF16) return f_bits((uint32_t)h << 16);
    int e = (h >> 10) & 0x1F, m = h & 0x3FF;
    float v = e == 0x1F ? (m ? NAN : INFINITY) : e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m + 1024), e - 25);
    return (h & 0x8000u) ? -v : v;
}

typedef struct {
    aclDataType dt;
    void *gy, *x, *yo; /* host, in dtype */
    float w[T_ROWS];
} host_inputs;

static void make_inputs(host_inputs *in, aclDataType dt)
{
    in->dt = dt;
    size_t es = esize(dt);
    in->gy = malloc((size_t)T_ROWS * H_COLS * es);
    in->x = malloc((size_t)T_ROWS * 2 * H_COLS * es);
    in->yo = malloc((size_t)T_ROWS * H_COLS * es);
    for (size_t i = 0; i < (size_t)T_ROWS * H_COLS; i++) {
        encode(dt, pattern(3 * i, -2.0, 2.0), in->gy, i);
        encode(dt, pattern(3 * i + 1, -1.5, 1.5), in->yo, i);
    }
    for (size_t i = 0; i < (size_t)T_ROWS * 2 * H_COLS; i++) encode(dt, pattern(7 * i + 2, -7.0, 7.0), in->x, i);
    for (int t = 0; t < T_ROWS; t++) in->w[t] = pattern(100003 + (uint64_t)t, 0.25, 1.75);
}

static void free_inputs(host_inputs *in)
{
    free(in->gy);
    free(in->x);
    free(in->yo);
}

typedef struct {
    uint8_t *gx; /* T * 2H elements */
    float gw[T_ROWS];
} outputs;

/* Counts its own failures (it may run on any host thread: no CHECK here). */
static int run_once(const host_inputs *in, aclrtStream stream, int fill, outputs *out)
{
    int failures = 0;
#define EXPECT_OK(call)                                                                      \
    do {                                                                                     \
        int rc_ = (int)(call);                                                               \
        if (rc_ != 0) {                                                                      \
            failures++;                                                                      \
            const char *m_ = aclGetRecentErrMsg();                                           \
            fprintf(stderr, "%s:%d: %s returned %d (%s)\n", __FILE__, __LINE__, #call, rc_,  \
                    m_ ? m_ : "no message");                                                 \
        }                                                                                    \
    } while (0)
    size_t es = esize(in->dt);
    size_t n_gy = (size_t)T_ROWS * H_COLS, n_x = 2 * n_gy;
    void *dgy = NULL, *dx = NULL, *dyo = NULL, *dw = NULL, *dgi = NULL, *dgx = NULL, *dgw = NULL, *dws = NULL;
    EXPECT_OK(aclrtMalloc(&dgy, n_gy * es, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT_OK(aclrtMalloc(&dx, n_x * es, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT_OK(aclrtMalloc(&dyo, n_gy * es, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT_OK(aclrtMalloc(&dw, sizeof in->w, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT_OK(aclrtMalloc(&dgi, sizeof group_values, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT_OK(aclrtMalloc(&dgx, n_x * es, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT_OK(aclrtMalloc(&dgw, sizeof out->gw, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT_OK(aclrtMemcpy(dgy, n_gy * es, in->gy, n_gy * es, ACL_MEMCPY_HOST_TO_DEVICE));
    EXPECT_OK(aclrtMemcpy(dx, n_x * es, in->x, n_x * es, ACL_MEMCPY_HOST_TO_DEVICE));
    EXPECT_OK(aclrtMemcpy(dyo, n_gy * es, in->yo, n_gy * es, ACL_MEMCPY_HOST_TO_DEVICE));
    EXPECT_OK(aclrtMemcpy(dw, sizeof in->w, in->w, sizeof in->w, ACL_MEMCPY_HOST_TO_DEVICE));
    EXPECT_OK(aclrtMemcpy(dgi, sizeof group_values, group_values, sizeof group_values, ACL_MEMCPY_HOST_TO_DEVICE));
    /* outputs start as a different pattern each run: stale bytes cannot pass for results */
    EXPECT_OK(aclrtMemset(dgx, n_x * es, fill, n_x * es));
    EXPECT_OK(aclrtMemset(dgw, sizeof out->gw, fill, sizeof out->gw));

    int64_t gy_shape[2] = {T_ROWS, H_COLS}, x_shape[2] = {T_ROWS, 2 * H_COLS}, w_shape[2] = {T_ROWS, 1};
    int64_t g_shape[1] = {GROUPS};
    aclTensor *tgy = aclCreateTensor(gy_shape, 2, in->dt, NULL, 0, ACL_FORMAT_ND, gy_shape, 2, dgy);
    aclTensor *tx = aclCreateTensor(x_shape, 2, in->dt, NULL, 0, ACL_FORMAT_ND, x_shape, 2, dx);
    aclTensor *tyo = aclCreateTensor(gy_shape, 2, in->dt, NULL, 0, ACL_FORMAT_ND, gy_shape, 2, dyo);
    aclTensor *tw = aclCreateTensor(w_shape, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, w_shape, 2, dw);
    aclTensor *tgi = aclCreateTensor(g_shape, 1, ACL_INT64, NULL, 0, ACL_FORMAT_ND, g_shape, 1, dgi);
    aclTensor *tgx = aclCreateTensor(x_shape, 2, in->dt, NULL, 0, ACL_FORMAT_ND, x_shape, 2, dgx);
    aclTensor *tgw = aclCreateTensor(w_shape, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, w_shape, 2, dgw);
    if (!tgy || !tx || !tyo || !tw || !tgi || !tgx || !tgw) failures++;

    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    EXPECT_OK(aclnnSwigluGroupQuantGradGetWorkspaceSize(tgy, tx, tw, tyo, tgi, 2.5, tgx, tgw, &ws, &ex));
    if (ws > 0) EXPECT_OK(aclrtMalloc(&dws, ws, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT_OK(aclnnSwigluGroupQuantGrad(dws, ws, ex, stream));
    EXPECT_OK(aclrtSynchronizeStream(stream));
    EXPECT_OK(aclrtMemcpy(out->gx, n_x * es, dgx, n_x * es, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT_OK(aclrtMemcpy(out->gw, sizeof out->gw, dgw, sizeof out->gw, ACL_MEMCPY_DEVICE_TO_HOST));

    aclTensor *all[] = {tgy, tx, tyo, tw, tgi, tgx, tgw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) EXPECT_OK(aclDestroyTensor(all[i]));
    void *mem[] = {dgy, dx, dyo, dw, dgi, dgx, dgw, dws};
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++) {
        if (mem[i]) EXPECT_OK(aclrtFree(mem[i]));
    }
#undef EXPECT_OK
    return failures;
}

static void alloc_outputs(outputs *o, aclDataType dt)
{
    o->gx = malloc((size_t)T_ROWS * 2 * H_COLS * esize(dt));
}

static int same_outputs(const outputs *a, const outputs *b, aclDataType dt)
{
    return memcmp(a->gx, b->gx, (size_t)T_ROWS * 2 * H_COLS * esize(dt)) == 0 &&
           memcmp(a->gw, b->gw, sizeof a->gw) == 0;
}

/* The baseline is a real result: rows past trunc are +0.0, and rows before agree with the
 * math in double (so identical bytes below cannot come from an idle kernel). */
static void check_baseline(const host_inputs *in, const outputs *o)
{
    aclDataType dt = in->dt;
    const double c = 2.5, rtol = dt == ACL_FLOAT ? 1e-5 : dt == ACL_FLOAT16 ? 2e-3 : 1.6e-2;
    int64_t zero_bad = 0, value_bad = 0, nonzero = 0;
    for (int t = 0; t < T_ROWS; t++) {
        if (t >= TRUNC) {
            for (size_t h = 0; h < 2 * H_COLS; h++) {
                if (decode(dt, o->gx, (size_t)t * 2 * H_COLS + h) != 0.0f ||
                    bits_f(decode(dt, o->gx, (size_t)t * 2 * H_COLS + h)) != 0) {
                    zero_bad++;
                }
            }
            if (bits_f(o->gw[t]) != 0) zero_bad++;
            continue;
        }
        double gw = 0, gw_abs = 0;
        for (size_t h = 0; h < H_COLS; h++) {
            double gy = decode(dt, in->gy, (size_t)t * H_COLS + h);
            double yo = decode(dt, in->yo, (size_t)t * H_COLS + h);
            double x0 = decode(dt, in->x, (size_t)t * 2 * H_COLS + h);
            double x1 = decode(dt, in->x, (size_t)t * 2 * H_COLS + H_COLS + h);
            gw += gy * yo;
            gw_abs += fabs(gy * yo);
            gy *= in->w[t];
            double a = fmin(x0, c), b = fmin(fmax(x1, -c), c);
            double s = 1.0 / (1.0 + exp(-a));
            double g0 = gy * b * s * (1.0 + a * (1.0 - s)) * (x0 < c ? 1.0 : 0.0);
            double g1 = gy * a * s * ((-c < x1 && x1 < c) ? 1.0 : 0.0);
            double a0 = decode(dt, o->gx, (size_t)t * 2 * H_COLS + h);
            double a1 = decode(dt, o->gx, (size_t)t * 2 * H_COLS + H_COLS + h);
            double scale0 = fabs(gy * b) * (1.0 + fabs(a)), scale1 = fabs(gy * a);
            if (!(fabs(a0 - g0) <= rtol * (fabs(g0) + scale0))) value_bad++;
            if (!(fabs(a1 - g1) <= rtol * (fabs(g1) + scale1))) value_bad++;
            if (a0 != 0.0) nonzero++;
        }
        if (!(fabs(o->gw[t] - gw) <= 1e-6 * gw_abs)) value_bad++;
    }
    if (zero_bad || value_bad) {
        fprintf(stderr, "%d baseline: %lld non-zero past trunc, %lld values off\n", (int)dt,
                (long long)zero_bad, (long long)value_bad);
    }
    CHECK_EQ_INT(zero_bad, 0);
    CHECK_EQ_INT(value_bad, 0);
    CHECK(nonzero > (int64_t)TRUNC * H_COLS / 2);
}

static host_inputs inputs_by_dtype[3];
static outputs baseline[3];

static void test_thread_counts(aclrtStream stream)
{
    static const int counts[] = {2, 3, 7, 0};
    for (int d = 0; d < 3; d++) {
        CHECK_EQ_INT(aclEmuSetThreads(1), 0);
        alloc_outputs(&baseline[d], dtypes[d]);
        CHECK_EQ_INT(run_once(&inputs_by_dtype[d], stream, 0x11, &baseline[d]), 0);
        check_baseline(&inputs_by_dtype[d], &baseline[d]);
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            CHECK_EQ_INT(aclEmuSetThreads(counts[k]), 0);
            outputs o;
            alloc_outputs(&o, dtypes[d]);
            CHECK_EQ_INT(run_once(&inputs_by_dtype[d], stream, 0x22 + (int)k, &o), 0);
            int same = same_outputs(&o, &baseline[d], dtypes[d]);
            if (!same) fprintf(stderr, "dtype %d: %d threads differ from 1 thread\n", (int)dtypes[d], counts[k]);
            CHECK(same);
            free(o.gx);
        }
    }
}

typedef struct {
    int device;
    int rounds;
    int failures;   /* API failures */
    int mismatches; /* results that differ from the baseline */
    int runs;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    aclrtStream stream = NULL;
    if (aclrtSetDevice(w->device) != 0) {
        w->failures++;
        return NULL;
    }
    if (aclrtCreateStream(&stream) != 0) w->failures++;
    for (int r = 0; r < w->rounds; r++) {
        for (int d = 0; d < 3; d++) {
            outputs o;
            alloc_outputs(&o, dtypes[d]);
            w->failures += run_once(&inputs_by_dtype[d], stream, 0x40 + w->device * 8 + r, &o);
            if (!same_outputs(&o, &baseline[d], dtypes[d])) w->mismatches++;
            w->runs++;
            free(o.gx);
        }
    }
    if (stream && aclrtDestroyStream(stream) != 0) w->failures++;
    if (aclrtResetDevice(w->device) != 0) w->failures++;
    return NULL;
}

/* Two host threads, each with its own device binding and stream, run the operator at the same
 * time (with several kernel threads each) and get the single-threaded bytes. */
static void test_concurrent_host_threads(int device_a, int device_b)
{
    CHECK_EQ_INT(aclEmuSetThreads(3), 0);
    worker w[2] = {{device_a, 3, 0, 0, 0}, {device_b, 3, 0, 0, 0}};
    pthread_t ids[2];
    int started[2];
    for (int i = 0; i < 2; i++) started[i] = pthread_create(&ids[i], NULL, worker_main, &w[i]) == 0;
    for (int i = 0; i < 2; i++) {
        CHECK(started[i]);
        if (started[i]) pthread_join(ids[i], NULL);
        CHECK_EQ_INT(w[i].failures, 0);
        CHECK_EQ_INT(w[i].mismatches, 0);
        CHECK_EQ_INT(w[i].runs, 9);
    }
}

int main(void)
{
    setenv("ACL_EMU_DEVICES", "2", 1);
    CHECK_EQ_INT(aclInit(NULL), 0);
    uint32_t devices = 0;
    CHECK_EQ_INT(aclrtGetDeviceCount(&devices), 0);
    CHECK_EQ_INT(devices, 2);
    CHECK_EQ_INT(aclrtSetDevice(0), 0);
    aclrtStream stream = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&stream), 0);
    for (int d = 0; d < 3; d++) make_inputs(&inputs_by_dtype[d], dtypes[d]);

    test_thread_counts(stream);
    test_concurrent_host_threads(0, 1);
    test_concurrent_host_threads(0, 0);

    for (int d = 0; d < 3; d++) {
        free_inputs(&inputs_by_dtype[d]);
        free(baseline[d].gx);
    }
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_TENSOR), 0);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), 0);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_ALLOCATION), 0);
    CHECK_EQ_INT(aclrtDestroyStream(stream), 0);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_STREAM), 0);
    CHECK_EQ_INT(aclrtResetDevice(0), 0);
    CHECK_EQ_INT(aclFinalize(), 0);
    return emu_test_finish("test_threads");
}
