/* Hardening of the emulator: size, stride and offset arithmetic that would overflow is refused
 * (for inputs and outputs, at aclCreateTensor or phase 1, never a crash at synchronize); dead
 * handles are refused everywhere; an empty gradWeight without weight is accepted and untouched. */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>

#include "acl_emu/acl_emu.h"
#include "emu_problem.h"
#include "emu_session.h"

static aclrtStream g_stream;

/* ---- extents that overflow ---- */

static void test_extent_overflow_at_create(void)
{
    const int64_t big = (int64_t)1 << 61;
    int64_t dims[2] = {2, 2}, strides[2] = {big, big};
    /* Element extent 2^62 fits int64; in bytes (x4) it does not. */
    aclTensor *t = aclCreateTensor(dims, 2, ACL_FLOAT, strides, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    CHECK(t == NULL);
    const char *m = aclGetRecentErrMsg();
    CHECK(m != NULL && strstr(m, "aclCreateTensor") != NULL && strstr(m, "overflows") != NULL);
    /* The same through the offset, and for every element size. */
    static const aclDataType types[] = {ACL_FLOAT16, ACL_BF16, ACL_FLOAT, ACL_INT64};
    static const int64_t limits[] = {(int64_t)1 << 62, (int64_t)1 << 62, (int64_t)1 << 61,
                                     (int64_t)1 << 60};
    for (size_t i = 0; i < 4; i++) {
        int64_t one[1] = {1};
        aclTensor *ok = aclCreateTensor(one, 1, types[i], NULL, limits[i] - 2, ACL_FORMAT_ND, NULL,
                                        0, NULL);
        CHECK(ok != NULL);   /* (offset + 1) * size = 2^63 - size: fits */
        if (ok != NULL) CHECK_EQ_INT(aclDestroyTensor(ok), ACLNN_SUCCESS);
        aclTensor *bad = aclCreateTensor(one, 1, types[i], NULL, limits[i], ACL_FORMAT_ND, NULL, 0,
                                         NULL);
        CHECK(bad == NULL);
        const char *mb = aclGetRecentErrMsg();
        CHECK(mb != NULL && strstr(mb, "overflows") != NULL);
    }
    /* Empty views reach no element: nothing to overflow. */
    int64_t empty[2] = {0, 2};
    aclTensor *e = aclCreateTensor(empty, 2, ACL_FLOAT, strides, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    CHECK(e != NULL);
    if (e != NULL) CHECK_EQ_INT(aclDestroyTensor(e), ACLNN_SUCCESS);
}

/* A view whose byte range wraps past the top of the address space: refused at phase 1 for
 * every input and output slot, and at phase 2 after an address update. */
static void test_wrapping_addresses(void)
{
    prob p;
    prob_init(&p, 2, 4, 1, 1, (const int64_t[]){2}, 5, 1);
    void *top = (void *)(uintptr_t)(UINTPTR_MAX - 31);   /* 32-byte aligned, 32 bytes below */
    for (size_t i = 0; i < OP_PARAMS; i++) {
        aclTensor **slot = prob_tensor_slot(&p, i);
        aclTensor *saved = *slot;
        /* Same shape as the real one, 64 elements past the top of the address space. */
        int64_t dims[2];
        uint64_t n = prob_slot_dims(&p, i, dims);
        *slot = aclCreateTensor(dims, n, prob_slot_dtype(i), NULL, 64, ACL_FORMAT_ND, NULL, 0, top);
        CHECK(*slot != NULL);
        uint64_t ws = 0;
        aclOpExecutor *ex = NULL;
        CHECK_FAILS(phase1(&p, -1.0, &ws, &ex), ACLNN_ERR_PARAM_INVALID, PHASE1,
                    op_param_name(i), "address space");
        CHECK(ex == NULL);
        CHECK_EQ_INT(aclDestroyTensor(*slot), ACLNN_SUCCESS);
        *slot = saved;
    }
    /* Phase 2: a repeatable executor whose output address is moved to the top. */
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetOutputTensorAddr(ex, 0, p.tgx, top), ACLNN_SUCCESS);
    void *ws = dev_alloc(WS_BYTES);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_ERR_PARAM_INVALID,
                PHASE2, "gradXOut", "address space");
    CHECK_EQ_INT(aclSetOutputTensorAddr(ex, 0, p.tgx, p.dgx), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetInputTensorAddr(ex, 1, p.tx, top), ACLNN_SUCCESS);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_ERR_PARAM_INVALID,
                PHASE2, "x", "address space");
    CHECK_EQ_INT(aclSetInputTensorAddr(ex, 1, p.tx, p.dx), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
    CHECK_EQ_INT(verify(&p, 2, 0, 0.0), 0);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtFree(ws), ACL_SUCCESS);
    prob_free(&p);
}

/* Huge strides on an output must not be mistaken for distinct elements by wrapping. */
static void test_self_overlap_with_huge_strides(void)
{
    prob p;
    prob_init(&p, 2, 4, 0, -1, NULL, 6, 1);
    int64_t dims[2] = {2, 8}, strides[2] = {(int64_t)1 << 59, 1};
    aclTensor *wide = aclCreateTensor(dims, 2, ACL_FLOAT, strides, 0, ACL_FORMAT_ND, NULL, 0,
                                      p.dgx);
    CHECK(wide != NULL);   /* 2^59 * 4 bytes fits int64 */
    aclTensor *saved = p.tgx;
    p.tgx = wide;
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    CHECK_FAILS(phase1(&p, -1.0, &ws, &ex), ACLNN_ERR_PARAM_INVALID, PHASE1, "gradXOut");
    p.tgx = saved;
    CHECK_EQ_INT(aclDestroyTensor(wide), ACLNN_SUCCESS);
    prob_free(&p);
}

/* ---- dead handles ---- */

static void test_dead_handles_everywhere(void)
{
    prob p;
    prob_init(&p, 2, 4, 1, -1, NULL, 7, 1);
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(p.tx), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(p.tgw), ACLNN_SUCCESS);
    aclTensor *dead_x = p.tx, *dead_gw = p.tgw;
    p.tx = NULL;
    p.tgw = NULL;
    CHECK_FAILS(aclSetInputTensorAddr(ex, 1, dead_x, p.dx), ACLNN_ERR_PARAM_INVALID,
                "aclSetInputTensorAddr", "tensor", "already destroyed");
    CHECK_FAILS(aclSetOutputTensorAddr(ex, 1, dead_gw, p.dgw), ACLNN_ERR_PARAM_INVALID,
                "aclSetOutputTensorAddr", "tensor", "already destroyed");
    CHECK_FAILS(aclSetRawTensorAddr(dead_x, p.dx), ACLNN_ERR_PARAM_INVALID, "aclSetRawTensorAddr",
                "already destroyed");
    CHECK_FAILS(aclDestroyTensor(dead_x), ACLNN_ERR_PARAM_INVALID, "aclDestroyTensor",
                "already destroyed");
    /* The executor's own copies are unaffected: it still launches. */
    void *ws = dev_alloc(WS_BYTES);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
    CHECK_EQ_INT(verify(&p, 2, 0, 0.0), 0);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    CHECK_FAILS(aclSetInputTensorAddr(ex, 0, p.tgy, p.dgy), ACLNN_ERR_PARAM_INVALID,
                "aclSetInputTensorAddr", "executor", "already destroyed");
    CHECK_EQ_INT(aclrtFree(ws), ACL_SUCCESS);
    prob_free(&p);
}

/* ---- gradWeight without weight ---- */

static void test_empty_grad_weight_without_weight(void)
{
    prob p;
    prob_init(&p, 3, 8, 0, -1, NULL, 8, 1);
    void *sentinel = dev_alloc(64);
    CHECK_EQ_INT(aclrtMemset(sentinel, 64, 0xAB, 64), ACL_SUCCESS);
    int64_t zero[1] = {0};
    /* NULL data, and an address in device memory: neither is touched. */
    void *addresses[2] = {NULL, sentinel};
    for (int k = 0; k < 2; k++) {
        aclTensor *gw = aclCreateTensor(zero, 1, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0,
                                        addresses[k]);
        CHECK(gw != NULL);
        CHECK_EQ_INT(aclrtMemset(p.dgx, 3 * 16 * 4, 0x5A, 3 * 16 * 4), ACL_SUCCESS);
        uint64_t ws = 0;
        aclOpExecutor *ex = NULL;
        CHECK_EQ_INT(aclnnSwigluGroupQuantGradGetWorkspaceSize(p.tgy, p.tx, NULL, NULL, NULL, -1.0,
                                                               p.tgx, gw, &ws, &ex),
                     ACLNN_SUCCESS);
        CHECK_EQ_INT(ws, WS_BYTES);
        launch_sync(ex, g_stream);
        CHECK_EQ_INT(verify(&p, 3, 0, 0.0), 0);
        unsigned char host[64];
        download(host, sentinel, 64);
        int untouched = 1;
        for (int i = 0; i < 64; i++) untouched &= host[i] == 0xAB;
        CHECK(untouched);
        CHECK_EQ_INT(aclDestroyTensor(gw), ACLNN_SUCCESS);
    }
    CHECK_EQ_INT(aclrtFree(sentinel), ACL_SUCCESS);
    prob_free(&p);
}

int main(void)
{
    emu_session session = emu_session_begin(EMU_SESSION_DEVICE_STREAM);
    g_stream = session.stream;
    test_extent_overflow_at_create();
    test_wrapping_addresses();
    test_self_overlap_with_huge_strides();
    test_dead_handles_everywhere();
    test_empty_grad_weight_without_weight();
    emu_session_end(&session);
    return emu_test_finish("test_hardening");
}
