/* The meta API (libnnopbase.so): aclTensor, aclIntArray and aclOpExecutor handles, as
 * documented in docs/emulator.md "Meta API". */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "acl_emu/acl_emu.h"
#include "aclnnop/aclnn_swiglu_group_quant_grad.h"
#include "emu_session.h"
#include "emu_test.h"

#define PHASE1 "aclnnSwigluGroupQuantGradGetWorkspaceSize"

/* ---- helpers ---- */

static void drain_message(void)
{
    while (aclGetRecentErrMsg() != NULL) {
    }
}

/* aclCreateTensor must refuse: NULL back and a message naming aclCreateTensor and `fragment`. */
#define CHECK_TENSOR_REJECTED(fragment, ...)                                                  \
    do {                                                                                      \
        int64_t before_ = aclEmuLiveCount(ACL_EMU_KIND_TENSOR);                               \
        aclTensor *t_ = aclCreateTensor(__VA_ARGS__);                                         \
        CHECK(t_ == NULL);                                                                    \
        if (t_ != NULL) aclDestroyTensor(t_);                                                 \
        emu_check_message(__FILE__, __LINE__, "aclCreateTensor(" #__VA_ARGS__ ")",            \
                          (const char *[]){"aclCreateTensor: ", fragment, "[status 161002]",  \
                                           NULL});                                            \
        CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_TENSOR), before_);                          \
    } while (0)

/* aclCreateTensor must accept; the tensor is destroyed at once. */
#define CHECK_TENSOR_ACCEPTED(...)                                                            \
    do {                                                                                      \
        aclTensor *t_ = aclCreateTensor(__VA_ARGS__);                                         \
        CHECK(t_ != NULL);                                                                    \
        if (t_ != NULL) CHECK_EQ_INT(aclDestroyTensor(t_), ACLNN_SUCCESS);                    \
        else {                                                                                \
            const char *m_ = aclGetRecentErrMsg();                                            \
            fprintf(stderr, "%s:%d: rejected: %s\n", __FILE__, __LINE__, m_ ? m_ : "?");      \
        }                                                                                     \
    } while (0)

static aclTensor *contiguous(const int64_t *dims, uint64_t n, aclDataType dt, void *data)
{
    aclTensor *t = aclCreateTensor(dims, n, dt, NULL, 0, ACL_FORMAT_ND, dims, n, data);
    CHECK(t != NULL);
    return t;
}

static void *dev_alloc(size_t size)
{
    void *p = NULL;
    CHECK_EQ_INT(aclrtMalloc(&p, size, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    return p;
}

/* A small valid problem for the executor tests: gradY [2,4], x/gradX [2,8] fp32, NULL data. */
typedef struct {
    aclTensor *gy, *x, *gx;
    aclOpExecutor *ex;
} problem;

static problem make_problem_clamp(double clamp)
{
    int64_t gy_dims[2] = {2, 4}, x_dims[2] = {2, 8};
    problem p = {contiguous(gy_dims, 2, ACL_FLOAT, NULL), contiguous(x_dims, 2, ACL_FLOAT, NULL),
                 contiguous(x_dims, 2, ACL_FLOAT, NULL), NULL};
    uint64_t ws = 0;
    CHECK_EQ_INT(aclnnSwigluGroupQuantGradGetWorkspaceSize(p.gy, p.x, NULL, NULL, NULL, clamp, p.gx,
                                                           NULL, &ws, &p.ex),
                 ACLNN_SUCCESS);
    CHECK(p.ex != NULL);
    CHECK_EQ_INT(ws, 16384);
    return p;
}

/* Clamp off in revision 2. */
static problem make_problem(void) { return make_problem_clamp(-1.0); }

static void free_problem(problem *p)
{
    if (p->ex != NULL) CHECK_EQ_INT(aclDestroyAclOpExecutor(p->ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(p->gy), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(p->x), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(p->gx), ACLNN_SUCCESS);
}

/* ---- aclCreateTensor ---- */

static void test_create_tensor_rejections(void)
{
    int64_t dims[17], strides[17], storage[17];
    for (int i = 0; i < 17; i++) {
        dims[i] = 1;
        strides[i] = 1;
        storage[i] = 1;
    }
    int64_t d23[2] = {2, 3}, s6[1] = {6};
    char host[64];
    /* More than 16 dims. */
    CHECK_TENSOR_REJECTED("17", dims, 17, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    /* NULL viewDims with dims. */
    CHECK_TENSOR_REJECTED("viewDims", NULL, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, s6, 1, NULL);
    /* Data types without a fixed size. */
    CHECK_TENSOR_REJECTED("STRING", d23, 2, ACL_STRING, NULL, 0, ACL_FORMAT_ND, s6, 1, NULL);
    CHECK_TENSOR_REJECTED("dataType", d23, 2, ACL_DT_UNDEFINED, NULL, 0, ACL_FORMAT_ND, s6, 1,
                          NULL);
    CHECK_TENSOR_REJECTED("dataType 99", d23, 2, (aclDataType)99, NULL, 0, ACL_FORMAT_ND, s6, 1,
                          NULL);
    CHECK_TENSOR_REJECTED("dataType 5", d23, 2, (aclDataType)5, NULL, 0, ACL_FORMAT_ND, s6, 1,
                          NULL);
    /* Unknown formats. */
    CHECK_TENSOR_REJECTED("format 3", d23, 2, ACL_FLOAT, NULL, 0, (aclFormat)3, s6, 1, NULL);
    CHECK_TENSOR_REJECTED("format", d23, 2, ACL_FLOAT, NULL, 0, (aclFormat)-2, s6, 1, NULL);
    /* Negative dims, strides, offset, storage dims. */
    int64_t neg_dim[2] = {2, -3};
    CHECK_TENSOR_REJECTED("viewDims[1]", neg_dim, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, s6, 1,
                          NULL);
    int64_t neg_stride[2] = {-3, 1};
    CHECK_TENSOR_REJECTED("stride[0]", d23, 2, ACL_FLOAT, neg_stride, 0, ACL_FORMAT_ND, s6, 1,
                          NULL);
    CHECK_TENSOR_REJECTED("offset", d23, 2, ACL_FLOAT, NULL, -1, ACL_FORMAT_ND, s6, 1, NULL);
    int64_t neg_storage[2] = {2, -3};
    CHECK_TENSOR_REJECTED("storageDims[1]", d23, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND,
                          neg_storage, 2, NULL);
    /* Overflowing storage dims and view dims. */
    int64_t huge[3] = {INT64_C(1) << 31, INT64_C(1) << 31, INT64_C(1) << 31};
    CHECK_TENSOR_REJECTED("overflow", d23, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, huge, 3, NULL);
    CHECK_TENSOR_REJECTED("overflow", huge, 3, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    /* Too many or NULL storage dims. */
    CHECK_TENSOR_REJECTED("storageDims", d23, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, storage, 17,
                          NULL);
    CHECK_TENSOR_REJECTED("storageDims", d23, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 1, NULL);
    /* A view reaching beyond its storage: contiguous, strided, with an offset. */
    int64_t s5[1] = {5};
    CHECK_TENSOR_REJECTED("storage", d23, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, s5, 1, host);
    int64_t st41[2] = {4, 1};
    CHECK_TENSOR_REJECTED("storage", d23, 2, ACL_FLOAT, st41, 0, ACL_FORMAT_ND, s6, 1, NULL);
    CHECK_TENSOR_REJECTED("offset 1", d23, 2, ACL_FLOAT, NULL, 1, ACL_FORMAT_ND, s6, 1, NULL);
    CHECK_TENSOR_REJECTED("storage", d23, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, d23, 1, NULL);
    /* A 0-d tensor holds one element: zero-size storage cannot hold it. */
    int64_t zero[1] = {0};
    CHECK_TENSOR_REJECTED("storage", NULL, 0, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, zero, 1, NULL);
    (void)strides;
}

static void test_create_tensor_accepted(void)
{
    int64_t d23[2] = {2, 3}, s6[1] = {6}, s7[1] = {7}, s8[1] = {8}, s5[1] = {5};
    char host[64];
    /* Both storageDims conventions, and none. */
    CHECK_TENSOR_ACCEPTED(d23, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, d23, 2, NULL);
    CHECK_TENSOR_ACCEPTED(d23, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, s6, 1, NULL);
    CHECK_TENSOR_ACCEPTED(d23, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    /* NULL stride = contiguous [3, 1]: the same storage bounds as explicit strides. */
    int64_t st31[2] = {3, 1};
    CHECK_TENSOR_ACCEPTED(d23, 2, ACL_FLOAT, st31, 0, ACL_FORMAT_ND, s6, 1, NULL);
    CHECK_TENSOR_REJECTED("storage", d23, 2, ACL_FLOAT, st31, 0, ACL_FORMAT_ND, s5, 1, NULL);
    /* Non-contiguous strides: [2,3] with strides [1,2] reaches element 5; [4,1] reaches 6. */
    int64_t st12[2] = {1, 2}, st41[2] = {4, 1};
    CHECK_TENSOR_ACCEPTED(d23, 2, ACL_FLOAT, st12, 0, ACL_FORMAT_ND, s6, 1, NULL);
    CHECK_TENSOR_REJECTED("storage", d23, 2, ACL_FLOAT, st12, 0, ACL_FORMAT_ND, s5, 1, NULL);
    CHECK_TENSOR_ACCEPTED(d23, 2, ACL_FLOAT, st41, 0, ACL_FORMAT_ND, s7, 1, NULL);
    /* Broadcast (stride 0) views are legal tensors. */
    int64_t st01[2] = {0, 1}, s3[1] = {3};
    CHECK_TENSOR_ACCEPTED(d23, 2, ACL_FLOAT, st01, 0, ACL_FORMAT_ND, s3, 1, NULL);
    /* An offset counts elements: 2 + 5 = 7 needs 8 elements. */
    CHECK_TENSOR_ACCEPTED(d23, 2, ACL_FLOAT, NULL, 2, ACL_FORMAT_ND, s8, 1, NULL);
    CHECK_TENSOR_REJECTED("storage", d23, 2, ACL_FLOAT, NULL, 2, ACL_FORMAT_ND, s7, 1, NULL);
    CHECK_TENSOR_ACCEPTED(d23, 2, ACL_FLOAT, NULL, 2, ACL_FORMAT_ND, NULL, 0, NULL);
    /* 0-d tensors. */
    int64_t one[1] = {1};
    CHECK_TENSOR_ACCEPTED(NULL, 0, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    CHECK_TENSOR_ACCEPTED(NULL, 0, ACL_INT64, NULL, 0, ACL_FORMAT_ND, one, 1, NULL);
    CHECK_TENSOR_ACCEPTED(d23, 0, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    /* Empty tensors: any storage, even none. */
    int64_t empty[2] = {0, 5}, zero[1] = {0};
    CHECK_TENSOR_ACCEPTED(empty, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, zero, 1, NULL);
    CHECK_TENSOR_ACCEPTED(empty, 2, ACL_FLOAT16, NULL, 0, ACL_FORMAT_ND, empty, 2, NULL);
    CHECK_TENSOR_ACCEPTED(empty, 2, ACL_BF16, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    /* 16 dims is the limit; every fixed-size dtype and known format; the data pointer is not
     * checked here (host memory or NULL). */
    int64_t dims16[16];
    for (int i = 0; i < 16; i++) dims16[i] = 1;
    CHECK_TENSOR_ACCEPTED(dims16, 16, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, dims16, 16, host);
    static const aclDataType types[] = {ACL_FLOAT, ACL_FLOAT16, ACL_INT8, ACL_INT32, ACL_UINT8,
                                        ACL_INT16, ACL_UINT16, ACL_UINT32, ACL_INT64, ACL_UINT64,
                                        ACL_DOUBLE, ACL_BOOL, ACL_COMPLEX64, ACL_COMPLEX128,
                                        ACL_BF16};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        CHECK_TENSOR_ACCEPTED(d23, 2, types[i], NULL, 0, ACL_FORMAT_ND, s6, 1, host);
    }
    static const aclFormat formats[] = {ACL_FORMAT_UNDEFINED, ACL_FORMAT_NCHW, ACL_FORMAT_NHWC,
                                        ACL_FORMAT_ND, ACL_FORMAT_NCL};
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        CHECK_TENSOR_ACCEPTED(d23, 2, ACL_FLOAT, NULL, 0, formats[i], s6, 1, NULL);
    }
}

/* Dims are copied: changing the caller's array afterwards changes nothing. */
static void test_tensor_dims_are_copied(void)
{
    int64_t gy_dims[2] = {2, 4}, x_dims[2] = {2, 8};
    aclTensor *gy = aclCreateTensor(gy_dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    aclTensor *x = aclCreateTensor(x_dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    aclTensor *gx = aclCreateTensor(x_dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    CHECK(gy && x && gx);
    gy_dims[0] = 3;
    gy_dims[1] = 7;
    x_dims[1] = 5;
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    CHECK_EQ_INT(aclnnSwigluGroupQuantGradGetWorkspaceSize(gy, x, NULL, NULL, NULL, -1.0, gx, NULL,
                                                           &ws, &ex),
                 ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    aclDestroyTensor(gy);
    aclDestroyTensor(x);
    aclDestroyTensor(gx);
}

/* ---- destroying handles ---- */

static void test_destroy_rules(void)
{
    int64_t dims[1] = {4}, values[2] = {1, 2};
    int foreign = 0;
    CHECK_EQ_INT(aclDestroyTensor(NULL), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyIntArray(NULL), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(NULL), ACLNN_SUCCESS);

    aclTensor *t = contiguous(dims, 1, ACL_FLOAT, NULL);
    aclIntArray *a = aclCreateIntArray(values, 2);
    CHECK(a != NULL);
    /* The wrong destroy for a live handle says what it is; the handle survives. */
    CHECK_FAILS(aclDestroyTensor((const aclTensor *)a), ACLNN_ERR_PARAM_INVALID,
                "aclDestroyTensor", "aclIntArray", "not an aclTensor");
    CHECK_FAILS(aclDestroyIntArray((const aclIntArray *)t), ACLNN_ERR_PARAM_INVALID,
                "aclDestroyIntArray", "aclTensor", "not an aclIntArray");
    CHECK_FAILS(aclDestroyAclOpExecutor((aclOpExecutor *)t), ACLNN_ERR_PARAM_INVALID,
                "aclDestroyAclOpExecutor", "aclTensor");
    /* Foreign pointers. */
    CHECK_FAILS(aclDestroyTensor((const aclTensor *)&foreign), ACLNN_ERR_PARAM_INVALID,
                "aclDestroyTensor", "not an aclTensor made by this library");
    CHECK_FAILS(aclDestroyIntArray((const aclIntArray *)&foreign), ACLNN_ERR_PARAM_INVALID,
                "aclDestroyIntArray", "not an aclIntArray");
    CHECK_FAILS(aclDestroyAclOpExecutor((aclOpExecutor *)&foreign), ACLNN_ERR_PARAM_INVALID,
                "aclDestroyAclOpExecutor", "not an aclOpExecutor");
    /* Twice. */
    CHECK_EQ_INT(aclDestroyTensor(t), ACLNN_SUCCESS);
    CHECK_FAILS(aclDestroyTensor(t), ACLNN_ERR_PARAM_INVALID, "aclDestroyTensor",
                "already destroyed");
    CHECK_EQ_INT(aclDestroyIntArray(a), ACLNN_SUCCESS);
    CHECK_FAILS(aclDestroyIntArray(a), ACLNN_ERR_PARAM_INVALID, "aclDestroyIntArray",
                "already destroyed");
    problem p = make_problem();
    CHECK_EQ_INT(aclDestroyAclOpExecutor(p.ex), ACLNN_SUCCESS);
    CHECK_FAILS(aclDestroyAclOpExecutor(p.ex), ACLNN_ERR_PARAM_INVALID, "aclDestroyAclOpExecutor",
                "already destroyed");
    p.ex = NULL;
    free_problem(&p);
}

/* ---- aclIntArray ---- */

static void test_int_arrays(void)
{
    int64_t values[3] = {5, -1, 7};
    int64_t before = aclEmuLiveCount(ACL_EMU_KIND_INT_ARRAY);
    drain_message();
    aclIntArray *bad = aclCreateIntArray(NULL, 3);
    CHECK(bad == NULL);
    emu_check_message(__FILE__, __LINE__, "aclCreateIntArray(NULL, 3)",
                      (const char *[]){"aclCreateIntArray", "NULL", NULL});
    aclIntArray *empty = aclCreateIntArray(NULL, 0);
    aclIntArray *full = aclCreateIntArray(values, 3);
    CHECK(empty != NULL && full != NULL && empty != full);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_INT_ARRAY), before + 2);
    CHECK_EQ_INT(aclDestroyIntArray(empty), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyIntArray(full), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_INT_ARRAY), before);
}

/* ---- aclSetRawTensorAddr ---- */

static void test_set_raw_tensor_addr(void)
{
    int64_t gy_dims[2] = {2, 4}, x_dims[2] = {2, 8};
    char host[64] __attribute__((aligned(64)));
    void *dgy = dev_alloc(2 * 4 * sizeof(float));
    aclTensor *gy = contiguous(gy_dims, 2, ACL_FLOAT, NULL);
    aclTensor *x = contiguous(x_dims, 2, ACL_FLOAT, NULL);
    aclTensor *gx = contiguous(x_dims, 2, ACL_FLOAT, NULL);
    CHECK_FAILS(aclSetRawTensorAddr(NULL, dgy), ACLNN_ERR_PARAM_NULLPTR, "aclSetRawTensorAddr",
                "tensor");
    CHECK_FAILS(aclSetRawTensorAddr((aclTensor *)&host, dgy), ACLNN_ERR_PARAM_INVALID,
                "aclSetRawTensorAddr", "not an aclTensor");
    /* The address set is the one phase 1 checks. */
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    CHECK_EQ_INT(aclSetRawTensorAddr(gy, host), ACLNN_SUCCESS);
    CHECK_FAILS(aclnnSwigluGroupQuantGradGetWorkspaceSize(gy, x, NULL, NULL, NULL, -1.0, gx, NULL,
                                                          &ws, &ex),
                ACLNN_ERR_PARAM_INVALID, PHASE1, "gradY", "not device memory");
    CHECK_EQ_INT(aclSetRawTensorAddr(gy, dgy), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGradGetWorkspaceSize(gy, x, NULL, NULL, NULL, -1.0, gx, NULL,
                                                           &ws, &ex),
                 ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetRawTensorAddr(gy, NULL), ACLNN_SUCCESS);
    aclDestroyTensor(gy);
    CHECK_FAILS(aclSetRawTensorAddr(gy, dgy), ACLNN_ERR_PARAM_INVALID, "aclSetRawTensorAddr",
                "already destroyed");
    aclDestroyTensor(x);
    aclDestroyTensor(gx);
    CHECK_EQ_INT(aclrtFree(dgy), ACL_SUCCESS);
}

/* ---- executors ---- */

static void test_set_repeatable(void)
{
    CHECK_FAILS(aclSetAclOpExecutorRepeatable(NULL), ACLNN_ERR_PARAM_NULLPTR,
                "aclSetAclOpExecutorRepeatable", "executor");
    problem p = make_problem();
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(p.ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(p.ex), ACLNN_SUCCESS);   /* idempotent */
    CHECK_FAILS(aclSetAclOpExecutorRepeatable((aclOpExecutor *)p.gy), ACLNN_ERR_PARAM_INVALID,
                "aclSetAclOpExecutorRepeatable", "aclTensor");
    CHECK_EQ_INT(aclDestroyAclOpExecutor(p.ex), ACLNN_SUCCESS);
    CHECK_FAILS(aclSetAclOpExecutorRepeatable(p.ex), ACLNN_ERR_PARAM_INVALID,
                "aclSetAclOpExecutorRepeatable", "already destroyed");
    p.ex = NULL;
    free_problem(&p);
}

static void test_set_tensor_addr_rules(void)
{
    void *d = dev_alloc(256);
    char *unaligned = (char *)d + 16;
    problem p = make_problem();
    /* NULL executor or tensor: 561103. */
    CHECK_FAILS(aclSetInputTensorAddr(NULL, 0, p.gy, d), ACLNN_ERR_INNER_NULLPTR,
                "aclSetInputTensorAddr", "executor");
    CHECK_FAILS(aclSetInputTensorAddr(p.ex, 0, NULL, d), ACLNN_ERR_INNER_NULLPTR,
                "aclSetInputTensorAddr", "tensor");
    CHECK_FAILS(aclSetOutputTensorAddr(NULL, 0, p.gx, d), ACLNN_ERR_INNER_NULLPTR,
                "aclSetOutputTensorAddr", "executor");
    CHECK_FAILS(aclSetOutputTensorAddr(p.ex, 0, NULL, d), ACLNN_ERR_INNER_NULLPTR,
                "aclSetOutputTensorAddr", "tensor");
    /* Not 32-byte aligned. */
    CHECK_FAILS(aclSetInputTensorAddr(p.ex, 0, p.gy, unaligned), ACLNN_ERR_PARAM_INVALID,
                "aclSetInputTensorAddr", "aligned");
    /* Not repeatable. */
    CHECK_FAILS(aclSetInputTensorAddr(p.ex, 0, p.gy, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetInputTensorAddr", "not repeatable");
    CHECK_FAILS(aclSetOutputTensorAddr(p.ex, 0, p.gx, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetOutputTensorAddr", "not repeatable");
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(p.ex), ACLNN_SUCCESS);
    /* Index out of range: 5 inputs (revision 2), 2 outputs. */
    CHECK_FAILS(aclSetInputTensorAddr(p.ex, 5, p.gy, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetInputTensorAddr", "index 5", "out of range");
    CHECK_FAILS(aclSetInputTensorAddr(p.ex, (size_t)-1, p.gy, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetInputTensorAddr", "out of range");
    CHECK_FAILS(aclSetOutputTensorAddr(p.ex, 2, p.gx, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetOutputTensorAddr", "index 2", "out of range");
    /* Slots that were NULL at phase 1: weight 2, yOrigin 3, groupIndex 4, gradWeight out 1. */
    for (size_t i = 2; i <= 4; i++) {
        CHECK_FAILS(aclSetInputTensorAddr(p.ex, i, p.gy, d), ACLNN_ERR_PARAM_INVALID,
                    "aclSetInputTensorAddr", "NULL at phase 1");
    }
    CHECK_FAILS(aclSetOutputTensorAddr(p.ex, 1, p.gx, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetOutputTensorAddr", "NULL at phase 1");
    /* The wrong handle for the slot (even one describing the same shape). */
    CHECK_FAILS(aclSetInputTensorAddr(p.ex, 0, p.x, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetInputTensorAddr", "not the handle", "input 0");
    CHECK_FAILS(aclSetInputTensorAddr(p.ex, 1, p.gx, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetInputTensorAddr", "not the handle");
    CHECK_FAILS(aclSetOutputTensorAddr(p.ex, 0, p.x, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetOutputTensorAddr", "not the handle", "output 0");
    /* The right handles. NULL is an aligned address too. */
    CHECK_EQ_INT(aclSetInputTensorAddr(p.ex, 0, p.gy, d), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetInputTensorAddr(p.ex, 1, p.x, NULL), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetOutputTensorAddr(p.ex, 0, p.gx, (char *)d + 128), ACLNN_SUCCESS);
    /* A dead executor. */
    CHECK_EQ_INT(aclDestroyAclOpExecutor(p.ex), ACLNN_SUCCESS);
    CHECK_FAILS(aclSetInputTensorAddr(p.ex, 0, p.gy, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetInputTensorAddr", "already destroyed");
    CHECK_FAILS(aclSetOutputTensorAddr(p.ex, 0, p.gx, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetOutputTensorAddr", "already destroyed");
    /* Another kind of handle as the executor. */
    CHECK_FAILS(aclSetInputTensorAddr((aclOpExecutor *)p.gy, 0, p.gy, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetInputTensorAddr", "aclTensor");
    p.ex = NULL;
    free_problem(&p);
    CHECK_EQ_INT(aclrtFree(d), ACL_SUCCESS);
}

/* Revision 1 has four input slots: index 4 is out of range there. */
static void test_set_tensor_addr_revision1(void)
{
    setenv("ACL_SWIGLU_ABI", "1", 1);
    void *d = dev_alloc(256);
    problem p = make_problem_clamp(0.0);   /* clamp off in revision 1 */
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(p.ex), ACLNN_SUCCESS);
    CHECK_FAILS(aclSetInputTensorAddr(p.ex, 4, p.gy, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetInputTensorAddr", "index 4", "out of range");
    CHECK_FAILS(aclSetInputTensorAddr(p.ex, 3, p.gy, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetInputTensorAddr", "NULL at phase 1");
    CHECK_EQ_INT(aclSetInputTensorAddr(p.ex, 0, p.gy, d), ACLNN_SUCCESS);
    free_problem(&p);
    CHECK_EQ_INT(aclrtFree(d), ACL_SUCCESS);
    unsetenv("ACL_SWIGLU_ABI");
}

/* The new address is stored in the tensor handle too: the next phase 1 sees it. */
static void test_set_tensor_addr_updates_handle(void)
{
    char host[64] __attribute__((aligned(64)));
    void *d = dev_alloc(2 * 8 * sizeof(float));
    problem p = make_problem();
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(p.ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetInputTensorAddr(p.ex, 1, p.x, host), ACLNN_SUCCESS);
    uint64_t ws = 0;
    aclOpExecutor *ex2 = NULL;
    CHECK_FAILS(aclnnSwigluGroupQuantGradGetWorkspaceSize(p.gy, p.x, NULL, NULL, NULL, -1.0, p.gx,
                                                          NULL, &ws, &ex2),
                ACLNN_ERR_PARAM_INVALID, PHASE1, "x", "not device memory");
    CHECK_EQ_INT(aclSetOutputTensorAddr(p.ex, 0, p.gx, host), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetInputTensorAddr(p.ex, 1, p.x, d), ACLNN_SUCCESS);
    CHECK_FAILS(aclnnSwigluGroupQuantGradGetWorkspaceSize(p.gy, p.x, NULL, NULL, NULL, -1.0, p.gx,
                                                          NULL, &ws, &ex2),
                ACLNN_ERR_PARAM_INVALID, PHASE1, "gradXOut", "not device memory");
    CHECK_EQ_INT(aclSetOutputTensorAddr(p.ex, 0, p.gx, NULL), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGradGetWorkspaceSize(p.gy, p.x, NULL, NULL, NULL, -1.0, p.gx,
                                                           NULL, &ws, &ex2),
                 ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex2), ACLNN_SUCCESS);
    /* A dead handle is refused everywhere: once the tensor is destroyed its slot cannot be
     * refreshed, in either direction. */
    aclTensor *gy = p.gy, *gx = p.gx;
    CHECK_EQ_INT(aclDestroyTensor(gy), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(gx), ACLNN_SUCCESS);
    CHECK_FAILS(aclSetInputTensorAddr(p.ex, 0, gy, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetInputTensorAddr", "tensor", "already destroyed");
    CHECK_FAILS(aclSetOutputTensorAddr(p.ex, 0, gx, d), ACLNN_ERR_PARAM_INVALID,
                "aclSetOutputTensorAddr", "tensor", "already destroyed");
    CHECK_FAILS(aclSetRawTensorAddr(gy, d), ACLNN_ERR_PARAM_INVALID, "aclSetRawTensorAddr",
                "already destroyed");
    p.gy = contiguous((int64_t[]){1}, 1, ACL_FLOAT, NULL);
    p.gx = contiguous((int64_t[]){1}, 1, ACL_FLOAT, NULL);
    free_problem(&p);
    CHECK_EQ_INT(aclrtFree(d), ACL_SUCCESS);
}

int main(void)
{
    emu_session session = emu_session_begin(EMU_SESSION_DEVICE);
    test_create_tensor_rejections();
    test_create_tensor_accepted();
    test_tensor_dims_are_copied();
    test_destroy_rules();
    test_int_arrays();
    test_set_raw_tensor_addr();
    test_set_repeatable();
    test_set_tensor_addr_rules();
    test_set_tensor_addr_revision1();
    test_set_tensor_addr_updates_handle();
    emu_session_end(&session);
    return emu_test_finish("test_meta");
}
