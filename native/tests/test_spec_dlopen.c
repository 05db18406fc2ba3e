/*
 * The operator's documented C++ example, done correctly, written ONLY from docs/c_abi.md (and the
 * math of docs/operator.md): no project header is included. Every type, enum value, status code and
 * prototype below is declared here from the text of those pages; the three libraries are opened with
 * dlopen from the directory given as argv[1] and every function is looked up with dlsym.
 *
 * gradY [512,512], x [512,1024], yOrigin [512,512] and gradX are FLOAT16 with real fp16 data;
 * weight [512,1] and gradWeight [512,1] are FLOAT; groupIndex {256, 256} is an INT64 device
 * tensor (ABI revision 2); clampLimit 1.0. Every output element is compared with the math in
 * double (docs/operator.md (judging a result) tolerances), and a repeatable executor must reproduce the bits.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the C ABI, from docs/c_abi.md ---- */

typedef int aclError;
typedef int32_t aclnnStatus;
typedef void *aclrtStream;
typedef struct aclTensor aclTensor;
typedef struct aclIntArray aclIntArray;
typedef struct aclOpExecutor aclOpExecutor;

typedef int aclDataType;   /* passed as a C enum, i.e. an int */
enum { ACL_FLOAT = 0, ACL_FLOAT16 = 1, ACL_INT64 = 9 };
typedef int aclFormat;
enum { ACL_FORMAT_ND = 2 };
typedef int aclrtMemcpyKind;
enum {
    ACL_MEMCPY_HOST_TO_HOST = 0,
    ACL_MEMCPY_HOST_TO_DEVICE = 1,
    ACL_MEMCPY_DEVICE_TO_HOST = 2,
    ACL_MEMCPY_DEVICE_TO_DEVICE = 3
};
typedef int aclrtMemMallocPolicy;
enum { ACL_MEM_MALLOC_HUGE_FIRST = 0 };

enum { ACL_SUCCESS = 0, ACLNN_SUCCESS = 0 };
enum { ACLNN_ERR_PARAM_NULLPTR = 161001, ACL_ERROR_REPEAT_INITIALIZE = 100002 };

/* Runtime (libascendcl.so). */
typedef aclError (*aclInit_fn)(const char *configPath);
typedef aclError (*aclFinalize_fn)(void);
typedef aclError (*aclrtSetDevice_fn)(int32_t deviceId);
typedef aclError (*aclrtResetDevice_fn)(int32_t deviceId);
typedef aclError (*aclrtGetDeviceCount_fn)(uint32_t *count);
typedef aclError (*aclrtCreateStream_fn)(aclrtStream *stream);
typedef aclError (*aclrtDestroyStream_fn)(aclrtStream stream);
typedef aclError (*aclrtSynchronizeStream_fn)(aclrtStream stream);
typedef aclError (*aclrtSynchronizeDevice_fn)(void);
typedef aclError (*aclrtMalloc_fn)(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
typedef aclError (*aclrtFree_fn)(void *devPtr);
typedef aclError (*aclrtMemcpy_fn)(void *dst, size_t destMax, const void *src, size_t count,
                                   aclrtMemcpyKind kind);
typedef aclError (*aclrtMemcpyAsync_fn)(void *dst, size_t destMax, const void *src, size_t count,
                                        aclrtMemcpyKind kind, aclrtStream stream);
typedef aclError (*aclrtMemset_fn)(void *devPtr, size_t maxCount, int32_t value, size_t count);
typedef const char *(*aclGetRecentErrMsg_fn)(void);

/* Meta API (libnnopbase.so). */
typedef aclTensor *(*aclCreateTensor_fn)(const int64_t *viewDims, uint64_t viewDimsNum,
                                         aclDataType dataType, const int64_t *stride,
                                         int64_t offset, aclFormat format,
                                         const int64_t *storageDims, uint64_t storageDimsNum,
                                         void *tensorData);
typedef aclnnStatus (*aclDestroyTensor_fn)(const aclTensor *tensor);
typedef aclIntArray *(*aclCreateIntArray_fn)(const int64_t *value, uint64_t size);
typedef aclnnStatus (*aclDestroyIntArray_fn)(const aclIntArray *array);
typedef aclnnStatus (*aclSetAclOpExecutorRepeatable_fn)(aclOpExecutor *executor);
typedef aclnnStatus (*aclDestroyAclOpExecutor_fn)(aclOpExecutor *executor);
typedef aclnnStatus (*aclSetTensorAddr_fn)(aclOpExecutor *executor, size_t index,
                                           aclTensor *tensor, void *addr);
typedef aclnnStatus (*aclSetRawTensorAddr_fn)(aclTensor *tensor, void *addr);

/* The operator (libopapi.so), revision 2. */
typedef aclnnStatus (*GetWorkspaceSize_fn)(const aclTensor *gradY, const aclTensor *x,
                                           const aclTensor *weightOptional,
                                           const aclTensor *yOriginOptional,
                                           const aclTensor *groupIndexOptional, double clampLimit,
                                           const aclTensor *gradXOut,
                                           const aclTensor *gradWeightOutOptional,
                                           uint64_t *workspaceSize, aclOpExecutor **executor);
typedef aclnnStatus (*Launch_fn)(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                 aclrtStream stream);

static struct {
    aclInit_fn aclInit;
    aclFinalize_fn aclFinalize;
    aclrtSetDevice_fn aclrtSetDevice;
    aclrtResetDevice_fn aclrtResetDevice;
    aclrtGetDeviceCount_fn aclrtGetDeviceCount;
    aclrtCreateStream_fn aclrtCreateStream;
    aclrtDestroyStream_fn aclrtDestroyStream;
    aclrtSynchronizeStream_fn aclrtSynchronizeStream;
    aclrtSynchronizeDevice_fn aclrtSynchronizeDevice;
    aclrtMalloc_fn aclrtMalloc;
    aclrtFree_fn aclrtFree;
    aclrtMemcpy_fn aclrtMemcpy;
    aclrtMemcpyAsync_fn aclrtMemcpyAsync;
    aclrtMemset_fn aclrtMemset;
    aclGetRecentErrMsg_fn aclGetRecentErrMsg;
    aclCreateTensor_fn aclCreateTensor;
    aclDestroyTensor_fn aclDestroyTensor;
    aclCreateIntArray_fn aclCreateIntArray;
    aclDestroyIntArray_fn aclDestroyIntArray;
    aclSetAclOpExecutorRepeatable_fn aclSetAclOpExecutorRepeatable;
    aclDestroyAclOpExecutor_fn aclDestroyAclOpExecutor;
    aclSetTensorAddr_fn aclSetInputTensorAddr;
    aclSetTensorAddr_fn aclSetOutputTensorAddr;
    aclSetRawTensorAddr_fn aclSetRawTensorAddr;
    GetWorkspaceSize_fn aclnnSwigluGroupQuantGradGetWorkspaceSize;
    Launch_fn aclnnSwigluGroupQuantGrad;
} api;

/* ---- tiny checks of our own ---- */

static int failures, checks;

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        checks++;                                                                            \
        if (!(cond)) {                                                                       \
            failures++;                                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);         \
        }                                                                                    \
    } while (0)

#define CHECK_OK(call)                                                                       \
    do {                                                                                     \
        long long rc_ = (long long)(call);                                                   \
        checks++;                                                                            \
        if (rc_ != 0) {                                                                      \
            const char *m_ = api.aclGetRecentErrMsg ? api.aclGetRecentErrMsg() : NULL;       \
            failures++;                                                                      \
            fprintf(stderr, "%s:%d: %s returned %lld (%s)\n", __FILE__, __LINE__, #call, rc_, \
                    m_ ? m_ : "no message");                                                 \
        }                                                                                    \
    } while (0)

/* ---- fp16, round half to even ---- */

static uint16_t float_to_half(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t exponent = (u >> 23) & 0xFFu;
    uint32_t mantissa = u & 0x7FFFFFu;
    if (exponent == 0xFFu) {   /* inf stays inf, NaN stays a (quiet) NaN */
        return (uint16_t)(sign | 0x7C00u | (mantissa ? 0x200u | (mantissa >> 13) : 0u));
    }
    int32_t e = (int32_t)exponent - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7C00u);
    if (e <= 0) {
        /* A half subnormal: q * 2^-24, q = M >> shift, rounded half to even. */
        if (e < -10) return (uint16_t)sign;
        uint32_t m = mantissa | 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = ((uint32_t)e << 10) | (mantissa >> 13);
    uint32_t rem = mantissa & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;   /* a carry may reach inf */
    return (uint16_t)(sign | h);
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
    if (exponent == 0) {
        float v = ldexpf((float)mantissa, -24);
        return sign ? -v : v;
    }
    uint32_t u = exponent == 31 ? sign | 0x7F800000u | (mantissa << 13)
                                : sign | ((exponent + 112u) << 23) | (mantissa << 13);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void check_half_conversions(void)
{
    CHECK(float_to_half(0.0f) == 0x0000);
    CHECK(float_to_half(-0.0f) == 0x8000);
    CHECK(float_to_half(1.0f) == 0x3C00);
    CHECK(float_to_half(-2.0f) == 0xC000);
    CHECK(float_to_half(0.1f) == 0x2E66);
    CHECK(float_to_half(65504.0f) == 0x7BFF);
    CHECK(float_to_half(65519.0f) == 0x7BFF);
    CHECK(float_to_half(65520.0f) == 0x7C00);            /* ties to even: rounds up to inf */
    CHECK(float_to_half(1.0f + 1.0f / 2048) == 0x3C00);  /* tie, even stays */
    CHECK(float_to_half(1.0f + 3.0f / 2048) == 0x3C02);  /* tie, odd rounds up */
    CHECK(float_to_half(ldexpf(1.0f, -24)) == 0x0001);   /* smallest subnormal */
    CHECK(float_to_half(ldexpf(1.0f, -25)) == 0x0000);   /* tie to even: 0 */
    CHECK(float_to_half(ldexpf(1.5f, -25)) == 0x0001);
    CHECK(float_to_half(ldexpf(1.0f, -14)) == 0x0400);   /* smallest normal */
    CHECK(float_to_half(INFINITY) == 0x7C00);
    CHECK((float_to_half(NAN) & 0x7FFF) > 0x7C00);
    for (uint32_t h = 0; h < 0x7C00; h++) {   /* every finite half survives a round trip */
        if (float_to_half(half_to_float((uint16_t)h)) != h) {
            CHECK(0 && "half round trip");
            break;
        }
    }
    CHECK(half_to_float(0x3555) == 0.333251953125f);
    CHECK(half_to_float(0x0001) == ldexpf(1.0f, -24));
    CHECK(half_to_float(0xFBFF) == -65504.0f);
    CHECK(isinf(half_to_float(0x7C00)) && isnan(half_to_float(0x7E00)));
}

/* ---- loading ---- */

static void *libs[3];

static int load(const char *dir)
{
    static const char *const names[3] = {"libascendcl.so", "libnnopbase.so", "libopapi.so"};
    char path[4096];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        libs[i] = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
        if (libs[i] == NULL) {
            fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
            return -1;
        }
    }
    struct {
        int lib;
        const char *name;
        void *slot;
    } symbols[] = {
        {0, "aclInit", &api.aclInit},
        {0, "aclFinalize", &api.aclFinalize},
        {0, "aclrtSetDevice", &api.aclrtSetDevice},
        {0, "aclrtResetDevice", &api.aclrtResetDevice},
        {0, "aclrtGetDeviceCount", &api.aclrtGetDeviceCount},
        {0, "aclrtCreateStream", &api.aclrtCreateStream},
        {0, "aclrtDestroyStream", &api.aclrtDestroyStream},
        {0, "aclrtSynchronizeStream", &api.aclrtSynchronizeStream},
        {0, "aclrtSynchronizeDevice", &api.aclrtSynchronizeDevice},
        {0, "aclrtMalloc", &api.aclrtMalloc},
        {0, "aclrtFree", &api.aclrtFree},
        {0, "aclrtMemcpy", &api.aclrtMemcpy},
        {0, "aclrtMemcpyAsync", &api.aclrtMemcpyAsync},
        {0, "aclrtMemset", &api.aclrtMemset},
        {0, "aclGetRecentErrMsg", &api.aclGetRecentErrMsg},
        {1, "aclCreateTensor", &api.aclCreateTensor},
        {1, "aclDestroyTensor", &api.aclDestroyTensor},
        {1, "aclCreateIntArray", &api.aclCreateIntArray},
        {1, "aclDestroyIntArray", &api.aclDestroyIntArray},
        {1, "aclSetAclOpExecutorRepeatable", &api.aclSetAclOpExecutorRepeatable},
        {1, "aclDestroyAclOpExecutor", &api.aclDestroyAclOpExecutor},
        {1, "aclSetInputTensorAddr", &api.aclSetInputTensorAddr},
        {1, "aclSetOutputTensorAddr", &api.aclSetOutputTensorAddr},
        {1, "aclSetRawTensorAddr", &api.aclSetRawTensorAddr},
        {2, "aclnnSwigluGroupQuantGradGetWorkspaceSize",
         &api.aclnnSwigluGroupQuantGradGetWorkspaceSize},
        {2, "aclnnSwigluGroupQuantGrad", &api.aclnnSwigluGroupQuantGrad},
    };
    int missing = 0;
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
        dlerror();
        void *sym = dlsym(libs[symbols[i].lib], symbols[i].name);
        CHECK(sym != NULL);
        if (sym == NULL) {
            fprintf(stderr, "dlsym %s in %s: %s\n", symbols[i].name, names[symbols[i].lib],
                    dlerror());
            missing++;
            continue;
        }
        memcpy(symbols[i].slot, &sym, sizeof sym);   /* a function pointer, as POSIX allows */
    }
    return missing ? -1 : 0;
}

static void unload(void)
{
    for (int i = 2; i >= 0; i--) {
        if (libs[i] != NULL) CHECK(dlclose(libs[i]) == 0);
    }
}

/* ---- the example ---- */

enum { T = 512, H = 512 };

typedef struct {
    void *addr;
    aclTensor *tensor;
} dev_tensor;

static int64_t numel(const int64_t *shape, int n)
{
    int64_t k = 1;
    for (int i = 0; i < n; i++) k *= shape[i];
    return k;
}

/* aclrtMalloc + aclrtMemcpy + aclCreateTensor with explicit contiguous strides, as the documented
 * example's CreateAclTensor does (host == NULL: zero the memory with aclrtMemset instead). */
static dev_tensor make_tensor(const void *host, size_t element_size, const int64_t *shape, int n,
                              aclDataType dtype)
{
    dev_tensor d = {NULL, NULL};
    size_t bytes = (size_t)numel(shape, n) * element_size;
    CHECK_OK(api.aclrtMalloc(&d.addr, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    if (host != NULL) {
        CHECK_OK(api.aclrtMemcpy(d.addr, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    } else {
        CHECK_OK(api.aclrtMemset(d.addr, bytes, 0, bytes));
    }
    int64_t strides[8];
    strides[n - 1] = 1;
    for (int i = n - 2; i >= 0; i--) strides[i] = shape[i + 1] * strides[i + 1];
    d.tensor = api.aclCreateTensor(shape, (uint64_t)n, dtype, strides, 0, ACL_FORMAT_ND, shape,
                                   (uint64_t)n, d.addr);
    CHECK(d.tensor != NULL);
    return d;
}

static void free_tensor(dev_tensor *d)
{
    CHECK_OK(api.aclDestroyTensor(d->tensor));
    CHECK_OK(api.aclrtFree(d->addr));
}

/* docs/operator.md in double, from the values the device sees (fp16 inputs widened exactly). */
static void reference(const uint16_t *gy16, const uint16_t *x16, const float *w,
                      const uint16_t *yo16, int64_t trunc, double clamp, double *gx, double *gw)
{
    double c = (double)(float)clamp;
    for (int64_t t = 0; t < T; t++) {
        double sum = 0.0;
        for (int64_t h = 0; h < H; h++) {
            double *g0 = &gx[t * 2 * H + h], *g1 = &gx[t * 2 * H + H + h];
            if (t >= trunc) {
                *g0 = *g1 = 0.0;
                continue;
            }
            double gy = half_to_float(gy16[t * H + h]);
            sum += gy * half_to_float(yo16[t * H + h]);
            gy *= w[t];
            double x0o = half_to_float(x16[t * 2 * H + h]);
            double x1o = half_to_float(x16[t * 2 * H + H + h]);
            double x0 = fmin(x0o, c), x1 = fmin(fmax(x1o, -c), c);
            double s = 1.0 / (1.0 + exp(-x0));
            double silu = x0 * s, dsilu = s * (1.0 + x0 * (1.0 - s));
            *g0 = gy * x1 * dsilu * (x0o < c ? 1.0 : 0.0);
            *g1 = gy * silu * ((-c < x1o && x1o < c) ? 1.0 : 0.0);
        }
        gw[t] = t < trunc ? sum : 0.0;
    }
}

static int64_t compare(const uint16_t *gx16, const float *gw, const double *rgx, const double *rgw)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < (int64_t)T * 2 * H; i++) {
        double a = half_to_float(gx16[i]), g = rgx[i];
        if (!(fabs(a - g) <= 1e-3 + 1e-3 * fabs(g))) {
            if (bad++ < 5) {
                fprintf(stderr, "gradX[%lld] = %.7g, expected %.7g\n", (long long)i, a, g);
            }
        }
    }
    for (int64_t t = 0; t < T; t++) {
        if (!(fabs(gw[t] - rgw[t]) <= 1e-4 * fabs(rgw[t]) + 1e-6)) {
            if (bad++ < 10) {
                fprintf(stderr, "gradWeight[%lld] = %.9g, expected %.9g\n", (long long)t, gw[t],
                        rgw[t]);
            }
        }
    }
    return bad;
}

static void run_example(void)
{
    const double clamp_limit = 1.0;
    int64_t gy_shape[2] = {T, H}, x_shape[2] = {T, 2 * H}, w_shape[2] = {T, 1};
    int64_t gi_shape[1] = {2}, group_values[2] = {256, 256};
    size_t n_gy = (size_t)T * H, n_x = 2 * n_gy;
    uint16_t *gy16 = malloc(n_gy * 2), *x16 = malloc(n_x * 2), *yo16 = malloc(n_gy * 2);
    uint16_t *gx16 = malloc(n_x * 2), *gx16_again = malloc(n_x * 2);
    float *w = malloc(T * sizeof(float)), *gw = malloc(T * sizeof(float));
    float *gw_again = malloc(T * sizeof(float));
    double *rgx = malloc(n_x * sizeof(double)), *rgw = malloc(T * sizeof(double));
    for (size_t i = 0; i < n_gy; i++) gy16[i] = float_to_half((float)(i % 10) * 0.1f);
    for (size_t i = 0; i < n_x; i++) x16[i] = float_to_half((float)((int)(i % 20) - 10) * 0.5f);
    for (size_t i = 0; i < T; i++) w[i] = (float)((i % 5) + 1) * 0.2f;
    for (size_t i = 0; i < n_gy; i++) yo16[i] = float_to_half((float)((i % 8) + 1) * 0.3f);

    aclrtStream stream = NULL;
    CHECK_OK(api.aclrtCreateStream(&stream));
    dev_tensor gy = make_tensor(gy16, 2, gy_shape, 2, ACL_FLOAT16);
    dev_tensor x = make_tensor(x16, 2, x_shape, 2, ACL_FLOAT16);
    dev_tensor wt = make_tensor(w, sizeof(float), w_shape, 2, ACL_FLOAT);
    dev_tensor yo = make_tensor(yo16, 2, gy_shape, 2, ACL_FLOAT16);
    dev_tensor gi = make_tensor(group_values, sizeof(int64_t), gi_shape, 1, ACL_INT64);
    dev_tensor gx = make_tensor(NULL, 2, x_shape, 2, ACL_FLOAT16);
    dev_tensor gwt = make_tensor(NULL, sizeof(float), w_shape, 2, ACL_FLOAT);

    /* A failing call sets the thread's message (docs/operator.md). */
    uint64_t workspace_size = 0;
    aclOpExecutor *executor = NULL;
    CHECK(api.aclnnSwigluGroupQuantGradGetWorkspaceSize(NULL, x.tensor, wt.tensor, yo.tensor,
                                                        gi.tensor, clamp_limit, gx.tensor,
                                                        gwt.tensor, &workspace_size, &executor) ==
          ACLNN_ERR_PARAM_NULLPTR);
    const char *message = api.aclGetRecentErrMsg();
    CHECK(message != NULL && strstr(message, "gradY") != NULL);
    CHECK(api.aclGetRecentErrMsg() == NULL);

    /* Phase 1, workspace, phase 2, synchronise. */
    CHECK_OK(api.aclnnSwigluGroupQuantGradGetWorkspaceSize(gy.tensor, x.tensor, wt.tensor,
                                                           yo.tensor, gi.tensor, clamp_limit,
                                                           gx.tensor, gwt.tensor, &workspace_size,
                                                           &executor));
    void *workspace = NULL;
    if (workspace_size > 0) {
        CHECK_OK(api.aclrtMalloc(&workspace, workspace_size, ACL_MEM_MALLOC_HUGE_FIRST));
    }
    CHECK_OK(api.aclnnSwigluGroupQuantGrad(workspace, workspace_size, executor, stream));
    CHECK_OK(api.aclrtSynchronizeStream(stream));
    CHECK_OK(api.aclrtMemcpy(gx16, n_x * 2, gx.addr, n_x * 2, ACL_MEMCPY_DEVICE_TO_HOST));
    CHECK_OK(api.aclrtMemcpy(gw, T * sizeof(float), gwt.addr, T * sizeof(float),
                             ACL_MEMCPY_DEVICE_TO_HOST));
    printf("gradX output (first 10 elements):\n");
    for (int i = 0; i < 10; i++) printf("gradX[%d] = %f\n", i, half_to_float(gx16[i]));
    printf("gradWeight output (first 10 elements):\n");
    for (int i = 0; i < 10; i++) printf("gradWeight[%d] = %f\n", i, gw[i]);

    int64_t trunc = group_values[0] + group_values[1] < T ? group_values[0] + group_values[1] : T;
    reference(gy16, x16, w, yo16, trunc, clamp_limit, rgx, rgw);
    int64_t bad = compare(gx16, gw, rgx, rgw);
    CHECK(bad == 0);
    /* The example's values are not trivially zero. */
    int nonzero = 0;
    for (size_t i = 0; i < n_x; i++) nonzero += half_to_float(gx16[i]) != 0.0f;
    CHECK(nonzero > (int)(n_x / 4));
    CHECK(gw[1] > 0.0f);
    printf("compared %zu gradX and %d gradWeight elements with the math: %lld outside tolerance\n",
           n_x, T, (long long)bad);

    /* A repeatable executor, outputs rebound to new buffers, launched twice: same bits. */
    void *gx2 = NULL, *gw2 = NULL;
    CHECK_OK(api.aclrtMalloc(&gx2, n_x * 2, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_OK(api.aclrtMalloc(&gw2, T * sizeof(float), ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_OK(api.aclnnSwigluGroupQuantGradGetWorkspaceSize(gy.tensor, x.tensor, wt.tensor,
                                                           yo.tensor, gi.tensor, clamp_limit,
                                                           gx.tensor, gwt.tensor, &workspace_size,
                                                           &executor));
    CHECK_OK(api.aclSetAclOpExecutorRepeatable(executor));
    CHECK_OK(api.aclSetInputTensorAddr(executor, 0, gy.tensor, gy.addr));
    CHECK_OK(api.aclSetOutputTensorAddr(executor, 0, gx.tensor, gx2));
    CHECK_OK(api.aclSetOutputTensorAddr(executor, 1, gwt.tensor, gw2));
    for (int run = 0; run < 2; run++) {
        CHECK_OK(api.aclrtMemset(gx2, n_x * 2, 0x7F, n_x * 2));
        CHECK_OK(api.aclnnSwigluGroupQuantGrad(workspace, workspace_size, executor, stream));
        CHECK_OK(api.aclrtSynchronizeDevice());
        memset(gx16_again, 0, n_x * 2);
        CHECK_OK(api.aclrtMemcpyAsync(gx16_again, n_x * 2, gx2, n_x * 2,
                                      ACL_MEMCPY_DEVICE_TO_HOST, stream));
        CHECK_OK(api.aclrtSynchronizeStream(stream));
        CHECK_OK(api.aclrtMemcpy(gw_again, T * sizeof(float), gw2, T * sizeof(float),
                                 ACL_MEMCPY_DEVICE_TO_HOST));
        CHECK(memcmp(gx16_again, gx16, n_x * 2) == 0);
        CHECK(memcmp(gw_again, gw, T * sizeof(float)) == 0);
    }
    CHECK_OK(api.aclDestroyAclOpExecutor(executor));
    /* The handle now points at gx2; point it back before freeing gx2. */
    CHECK_OK(api.aclSetRawTensorAddr(gx.tensor, gx.addr));
    CHECK_OK(api.aclSetRawTensorAddr(gwt.tensor, gwt.addr));

    /* Revision 1's groupIndex type exists too (not used by this revision-2 call). */
    aclIntArray *array = api.aclCreateIntArray(group_values, 2);
    CHECK(array != NULL);
    CHECK_OK(api.aclDestroyIntArray(array));

    if (workspace != NULL) CHECK_OK(api.aclrtFree(workspace));
    CHECK_OK(api.aclrtFree(gx2));
    CHECK_OK(api.aclrtFree(gw2));
    dev_tensor *all[] = {&gy, &x, &wt, &yo, &gi, &gx, &gwt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free_tensor(all[i]);
    CHECK_OK(api.aclrtDestroyStream(stream));
    free(gy16);
    free(x16);
    free(yo16);
    free(gx16);
    free(gx16_again);
    free(w);
    free(gw);
    free(gw_again);
    free(rgx);
    free(rgw);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <directory holding libascendcl.so, libnnopbase.so, "
                        "libopapi.so>\n", argv[0]);
        return 2;
    }
    check_half_conversions();
    if (load(argv[1]) != 0) {
        unload();
        fprintf(stderr, "test_spec_dlopen: cannot load the libraries from %s\n", argv[1]);
        return 1;
    }
    CHECK_OK(api.aclInit(NULL));
    CHECK(api.aclInit(NULL) == ACL_ERROR_REPEAT_INITIALIZE);
    CHECK(api.aclGetRecentErrMsg() != NULL);
    uint32_t count = 0;
    CHECK_OK(api.aclrtGetDeviceCount(&count));
    CHECK(count >= 1);
    CHECK_OK(api.aclrtSetDevice(0));
    run_example();
    CHECK_OK(api.aclrtResetDevice(0));
    CHECK_OK(api.aclFinalize());
    unload();
    if (failures) {
        fprintf(stderr, "test_spec_dlopen: %d of %d checks failed\n", failures, checks);
        return 1;
    }
    printf("test_spec_dlopen: all %d checks passed\n", checks);
    return 0;
}
