/* The emulator's strictness around the operator: device memory rules at phase 1 and 2
 * (docs/emulator.md "The operator" step 5 and "Phase 2"), executor life cycles, workspace
 * rules, stream ordering, memory freed under queued work, threads without a device, and when
 * each ABI revision reads groupIndex. Results are checked against the docs/operator.md math. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "acl_emu/acl_emu.h"
#include "emu_problem.h"
#include "emu_session.h"

static aclrtStream g_stream;

/* ---- a correct run, as the baseline every strict test departs from ---- */

static void test_correct_run(void)
{
    static const int64_t groups[2] = {3, 2};
    prob p;
    prob_init(&p, 7, 40, 1, 2, groups, 11, 1);
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    launch_sync(ex, g_stream);
    CHECK_EQ_INT(verify(&p, 5, 0, 0.0), 0);
    prob_free(&p);
    /* With clamp on, no weight, no groups, on the default stream. */
    prob_init(&p, 5, 33, 0, -1, NULL, 12, 1);
    ex = phase1_ok(&p, 1.5);
    launch_sync(ex, NULL);
    CHECK_EQ_INT(verify(&p, 5, 1, 1.5), 0);
    prob_free(&p);
}

/* ---- phase 1 memory rules (step 5) ---- */

static void test_host_pointers_rejected(void)
{
    static float host[2 * 4 * 16] __attribute__((aligned(64)));
    static int64_t host_groups[2] __attribute__((aligned(64))) = {1, 1};
    static const int64_t groups[2] = {1, 1};
    prob p;
    prob_init(&p, 4, 16, 1, 2, groups, 1, 1);
    uint64_t ws;
    aclOpExecutor *ex;
    for (size_t i = 0; i < OP_PARAMS; i++) {
        /* Swap in a host address through aclSetRawTensorAddr; restore it afterwards. */
        aclTensor *t = *prob_tensor_slot(&p, i);
        void *on_host = i == OP_PARAM_GROUP_INDEX ? (void *)host_groups : (void *)host;
        CHECK_EQ_INT(aclSetRawTensorAddr(t, on_host), ACLNN_SUCCESS);
        char what[96];
        snprintf(what, sizeof what, "%s data", op_param_name(i));
        CHECK_FAILS(phase1(&p, -1.0, &ws, &ex), ACLNN_ERR_PARAM_INVALID, PHASE1, what,
                    "not device memory");
        CHECK(ex == NULL);
        CHECK_EQ_INT(aclSetRawTensorAddr(t, *prob_buffer_slot(&p, i)), ACLNN_SUCCESS);
    }
    ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    prob_free(&p);
}

static void test_view_past_allocation(void)
{
    prob p;
    prob_init(&p, 4, 16, 0, -1, NULL, 2, 1);
    uint64_t ws;
    aclOpExecutor *ex;
    int64_t x_dims[2] = {4, 32};
    /* One element short. */
    void *short_gy = dev_alloc(4 * 16 * sizeof(float) - sizeof(float));
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgy, short_gy), ACLNN_SUCCESS);
    CHECK_FAILS(phase1(&p, -1.0, &ws, &ex), ACLNN_ERR_PARAM_INVALID, PHASE1, "gradY",
                "runs past the end");
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgy, p.dgy), ACLNN_SUCCESS);
    /* The right size, but an element offset pushes the view out. */
    int64_t storage[1] = {4 * 32 + 1};
    aclTensor *shifted = aclCreateTensor(x_dims, 2, ACL_FLOAT, NULL, 1, ACL_FORMAT_ND, storage, 1,
                                         p.dx);
    CHECK(shifted != NULL);
    CHECK_FAILS(aclnnSwigluGroupQuantGradGetWorkspaceSize(p.tgy, shifted, NULL, NULL, NULL, -1.0,
                                                          p.tgx, NULL, &ws, &ex),
                ACLNN_ERR_PARAM_INVALID, PHASE1, "x", "runs past the end");
    /* An output with a row pitch larger than its allocation allows. */
    int64_t strides[2] = {40, 1}, storage2[1] = {3 * 40 + 32};
    aclTensor *padded = aclCreateTensor(x_dims, 2, ACL_FLOAT, strides, 0, ACL_FORMAT_ND, storage2,
                                        1, p.dgx);
    CHECK(padded != NULL);
    CHECK_FAILS(aclnnSwigluGroupQuantGradGetWorkspaceSize(p.tgy, p.tx, NULL, NULL, NULL, -1.0,
                                                          padded, NULL, &ws, &ex),
                ACLNN_ERR_PARAM_INVALID, PHASE1, "gradXOut", "runs past the end");
    /* A view starting in the middle of an allocation and fitting is fine. */
    void *big = dev_alloc(4 * 16 * sizeof(float) + 64);
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgy, (char *)big + 64), ACLNN_SUCCESS);
    CHECK_EQ_INT(phase1(&p, -1.0, &ws, &ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgy, (char *)big + 96), ACLNN_SUCCESS);
    CHECK_FAILS(phase1(&p, -1.0, &ws, &ex), ACLNN_ERR_PARAM_INVALID, PHASE1, "gradY", "runs past");
    CHECK_EQ_INT(aclDestroyTensor(shifted), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(padded), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtFree(short_gy), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(big), ACL_SUCCESS);
    prob_free(&p);
}

static void test_alignment_and_offset(void)
{
    prob p;
    prob_init(&p, 3, 24, 0, -1, NULL, 3, 1);
    uint64_t ws;
    aclOpExecutor *ex;
    int64_t gy_dims[2] = {3, 24};
    size_t gy_bytes = 3 * 24 * sizeof(float);
    void *big = dev_alloc(gy_bytes + 64);
    upload((char *)big + 32, p.gy, gy_bytes);
    /* An unaligned base address (even if the view fits) is refused... */
    static const size_t shifts[] = {4, 8, 16};
    for (size_t i = 0; i < 3; i++) {
        CHECK_EQ_INT(aclSetRawTensorAddr(p.tgy, (char *)big + shifts[i]), ACLNN_SUCCESS);
        CHECK_FAILS(phase1(&p, -1.0, &ws, &ex), ACLNN_ERR_PARAM_INVALID, PHASE1, "gradY",
                    "32-byte aligned");
    }
    /* ...the same element put in the tensor's offset works and is honoured. */
    int64_t storage[1] = {3 * 24 + 8};
    aclTensor *offset = aclCreateTensor(gy_dims, 2, ACL_FLOAT, NULL, 8, ACL_FORMAT_ND, storage, 1,
                                        big);
    CHECK(offset != NULL);
    ex = NULL;
    CHECK_EQ_INT(aclnnSwigluGroupQuantGradGetWorkspaceSize(offset, p.tx, NULL, NULL, NULL, -1.0,
                                                           p.tgx, NULL, &ws, &ex),
                 ACLNN_SUCCESS);
    launch_sync(ex, g_stream);
    CHECK_EQ_INT(verify(&p, 3, 0, 0.0), 0);
    /* A 32-byte aligned (not 64) base is fine. */
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgy, (char *)big + 32), ACLNN_SUCCESS);
    ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    /* Unaligned outputs are refused too. */
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgx, (char *)p.dgx + 4), ACLNN_SUCCESS);
    CHECK_FAILS(phase1(&p, -1.0, &ws, &ex), ACLNN_ERR_PARAM_INVALID, PHASE1, "gradXOut",
                "aligned");
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgx, p.dgx), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(offset), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtFree(big), ACL_SUCCESS);
    prob_free(&p);
}

static void test_output_overlaps(void)
{
    prob p;
    prob_init(&p, 4, 16, 1, -1, NULL, 4, 1);
    uint64_t ws;
    aclOpExecutor *ex;
    int64_t x_dims[2] = {4, 32}, w_dims[2] = {4, 1};
    /* gradX in place of x. */
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgx, p.dx), ACLNN_SUCCESS);
    CHECK_FAILS(phase1(&p, -1.0, &ws, &ex), ACLNN_ERR_PARAM_INVALID, PHASE1,
                "gradXOut overlaps x", "in place");
    /* gradX's tail overlapping gradY's head in one allocation. */
    size_t gy_bytes = 4 * 16 * sizeof(float), gx_bytes = 2 * gy_bytes;
    char *shared = dev_alloc(gy_bytes + gx_bytes);
    upload(shared + gx_bytes - 64, p.gy, gy_bytes);
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgy, shared + gx_bytes - 64), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgx, shared), ACLNN_SUCCESS);
    CHECK_FAILS(phase1(&p, -1.0, &ws, &ex), ACLNN_ERR_PARAM_INVALID, PHASE1,
                "gradXOut overlaps gradY");
    /* Adjacent but not overlapping is fine. */
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgy, shared + gx_bytes), ACLNN_SUCCESS);
    upload(shared + gx_bytes, p.gy, gy_bytes);
    ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgy, p.dgy), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgx, p.dgx), ACLNN_SUCCESS);
    /* gradWeight on weight, on yOrigin, on gradX. */
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgw, p.dw), ACLNN_SUCCESS);
    CHECK_FAILS(phase1(&p, -1.0, &ws, &ex), ACLNN_ERR_PARAM_INVALID, PHASE1,
                "gradWeightOutOptional overlaps weightOptional");
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgw, p.dyo), ACLNN_SUCCESS);
    CHECK_FAILS(phase1(&p, -1.0, &ws, &ex), ACLNN_ERR_PARAM_INVALID, PHASE1,
                "gradWeightOutOptional overlaps yOriginOptional");
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgw, (char *)p.dgx + 128), ACLNN_SUCCESS);
    CHECK_FAILS(phase1(&p, -1.0, &ws, &ex), ACLNN_ERR_PARAM_INVALID, PHASE1,
                "gradXOut and gradWeightOutOptional overlap");
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tgw, p.dgw), ACLNN_SUCCESS);
    /* An output overlapping itself: stride 0 on rows, or a row pitch shorter than a row. */
    int64_t s0[2] = {0, 1}, storage0[1] = {32};
    aclTensor *bcast = aclCreateTensor(x_dims, 2, ACL_FLOAT, s0, 0, ACL_FORMAT_ND, storage0, 1,
                                       p.dgx);
    CHECK_FAILS(aclnnSwigluGroupQuantGradGetWorkspaceSize(p.tgy, p.tx, p.tw, p.tyo, NULL, -1.0,
                                                          bcast, p.tgw, &ws, &ex),
                ACLNN_ERR_PARAM_INVALID, PHASE1, "gradXOut", "overlap itself");
    int64_t s16[2] = {16, 1};
    aclTensor *tight = aclCreateTensor(x_dims, 2, ACL_FLOAT, s16, 0, ACL_FORMAT_ND, NULL, 0,
                                       p.dgx);
    CHECK_FAILS(aclnnSwigluGroupQuantGradGetWorkspaceSize(p.tgy, p.tx, p.tw, p.tyo, NULL, -1.0,
                                                          tight, p.tgw, &ws, &ex),
                ACLNN_ERR_PARAM_INVALID, PHASE1, "gradXOut", "overlap itself");
    int64_t w0[2] = {0, 1}, storage1[1] = {1};
    aclTensor *gw0 = aclCreateTensor(w_dims, 2, ACL_FLOAT, w0, 0, ACL_FORMAT_ND, storage1, 1,
                                     p.dgw);
    CHECK_FAILS(aclnnSwigluGroupQuantGradGetWorkspaceSize(p.tgy, p.tx, p.tw, p.tyo, NULL, -1.0,
                                                          p.tgx, gw0, &ws, &ex),
                ACLNN_ERR_PARAM_INVALID, PHASE1, "gradWeightOutOptional", "overlap itself");
    CHECK_EQ_INT(aclDestroyTensor(bcast), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(tight), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(gw0), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtFree(shared), ACL_SUCCESS);
    prob_free(&p);
}

/* Inputs may overlap each other and themselves (a broadcast gradY); strided views work. */
static void test_input_sharing_and_strides(void)
{
    prob p;
    prob_init(&p, 4, 16, 1, -1, NULL, 5, 1);
    /* yOrigin reads gradY's buffer, and both equal: the host copy follows. */
    memcpy(p.yo, p.gy, 4 * 16 * sizeof(float));
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tyo, p.dgy), ACLNN_SUCCESS);
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    launch_sync(ex, g_stream);
    CHECK_EQ_INT(verify(&p, 4, 0, 0.0), 0);
    CHECK_EQ_INT(aclSetRawTensorAddr(p.tyo, p.dyo), ACLNN_SUCCESS);
    prob_free(&p);

    /* gradY broadcast over rows (stride 0), x and gradX with a padded row pitch of 40. */
    prob_init(&p, 3, 16, 0, -1, NULL, 6, 0);
    for (int t = 1; t < 3; t++) memcpy(p.gy + t * 16, p.gy, 16 * sizeof(float));
    int64_t gy_dims[2] = {3, 16}, x_dims[2] = {3, 32}, s0[2] = {0, 1}, pitch[2] = {40, 1};
    int64_t gy_storage[1] = {16}, x_storage[1] = {2 * 40 + 32};
    size_t x_bytes = (size_t)x_storage[0] * sizeof(float);
    float padded[2 * 40 + 32];
    memset(padded, 0, sizeof padded);
    for (int t = 0; t < 3; t++) memcpy(padded + t * 40, p.x + t * 32, 32 * sizeof(float));
    void *dx = dev_upload(padded, x_bytes), *dgx = dev_alloc(x_bytes);
    p.tgy = aclCreateTensor(gy_dims, 2, ACL_FLOAT, s0, 0, ACL_FORMAT_ND, gy_storage, 1, p.dgy);
    p.tx = aclCreateTensor(x_dims, 2, ACL_FLOAT, pitch, 0, ACL_FORMAT_ND, x_storage, 1, dx);
    p.tgx = aclCreateTensor(x_dims, 2, ACL_FLOAT, pitch, 0, ACL_FORMAT_ND, x_storage, 1, dgx);
    CHECK(p.tgy && p.tx && p.tgx);
    ex = phase1_ok(&p, 2.0);
    launch_sync(ex, g_stream);
    /* Gather the padded output into the contiguous buffer verify reads. */
    float out[2 * 40 + 32], dense[3 * 32];
    download(out, dgx, x_bytes);
    for (int t = 0; t < 3; t++) memcpy(dense + t * 32, out + t * 40, 32 * sizeof(float));
    upload(p.dgx, dense, sizeof dense);
    CHECK_EQ_INT(verify(&p, 3, 1, 2.0), 0);
    /* The padding between rows was not written. */
    unsigned char gap[8 * sizeof(float)];
    for (int t = 0; t < 2; t++) {
        memcpy(gap, out + t * 40 + 32, sizeof gap);
        int untouched = 1;
        for (size_t i = 0; i < sizeof gap; i++) untouched &= gap[i] == 0xFF;
        CHECK(untouched);
    }
    CHECK_EQ_INT(aclrtFree(dx), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(dgx), ACL_SUCCESS);
    prob_free(&p);
}

/* ---- phase 2: executors ---- */

static void test_single_use_executor(void)
{
    prob p;
    prob_init(&p, 4, 16, 1, -1, NULL, 7, 1);
    void *ws = dev_alloc(WS_BYTES);
    int64_t live = aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR);
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), live + 1);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), live);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_ERR_PARAM_INVALID,
                PHASE2, "executor", "consumed");
    CHECK_FAILS(aclDestroyAclOpExecutor(ex), ACLNN_ERR_PARAM_INVALID, "aclDestroyAclOpExecutor",
                "consumed");
    CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
    CHECK_EQ_INT(verify(&p, 4, 0, 0.0), 0);
    /* A destroyed executor. */
    ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_ERR_PARAM_INVALID,
                PHASE2, "executor", "destroyed");
    /* NULL and foreign executors. */
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, NULL, g_stream), ACLNN_ERR_PARAM_NULLPTR,
                PHASE2, "executor is NULL");
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, (aclOpExecutor *)p.tgy, g_stream),
                ACLNN_ERR_PARAM_INVALID, PHASE2, "aclTensor");
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), live);
    CHECK_EQ_INT(aclrtFree(ws), ACL_SUCCESS);
    prob_free(&p);
}

/* A repeatable executor runs N times; each time every address is rebound to a new problem's
 * buffers (same shapes, new data and groups) and the new results appear there. */
static void test_repeatable_rebinding(void)
{
    enum { T = 6, H = 48, RUNS = 3 };
    static const int64_t groups0[2] = {2, 1};
    prob a;
    prob_init(&a, T, H, 1, 2, groups0, 100, 1);
    int64_t live = aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR);
    aclOpExecutor *ex = phase1_ok(&a, 0.75);
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(ex), ACLNN_SUCCESS);
    launch_sync(ex, g_stream);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), live + 1);   /* not consumed */
    CHECK_EQ_INT(verify(&a, 3, 1, 0.75), 0);
    /* The same buffers with new contents: relaunch without rebinding. */
    for (int i = 0; i < T * H; i++) a.gy[i] = -a.gy[i];
    upload(a.dgy, a.gy, sizeof(float) * T * H);
    launch_sync(ex, g_stream);
    CHECK_EQ_INT(verify(&a, 3, 1, 0.75), 0);

    for (int run = 1; run <= RUNS; run++) {
        int64_t groups[2] = {run, 2};
        prob b;
        prob_init(&b, T, H, 1, 2, groups, 100 + (unsigned)run, 0);
        prob_rebind(ex, &a, &b);
        launch_sync(ex, g_stream);
        CHECK_EQ_INT(verify(&b, run + 2, 1, 0.75), 0);
        /* a's outputs still hold a's results. */
        CHECK_EQ_INT(verify(&a, 3, 1, 0.75), 0);
        /* Rebind to a's buffers before b's are freed. */
        prob_rebind(ex, &a, &a);
        prob_free(&b);
    }
    /* Rebinding an output onto an input is caught at launch. */
    CHECK_EQ_INT(aclSetOutputTensorAddr(ex, 0, a.tgx, a.dx), ACLNN_SUCCESS);
    void *ws = dev_alloc(WS_BYTES);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_ERR_PARAM_INVALID,
                PHASE2, "gradXOut overlaps x");
    /* ...and a host address too; the repeatable executor survives failed launches. */
    static float host[T * 2 * H] __attribute__((aligned(64)));
    CHECK_EQ_INT(aclSetOutputTensorAddr(ex, 0, a.tgx, host), ACLNN_SUCCESS);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_ERR_PARAM_INVALID,
                PHASE2, "gradXOut", "not device memory");
    CHECK_EQ_INT(aclSetOutputTensorAddr(ex, 0, a.tgx, a.dgx), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
    CHECK_EQ_INT(verify(&a, 3, 1, 0.75), 0);
    CHECK_EQ_INT(aclrtFree(ws), ACL_SUCCESS);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), live);
    prob_free(&a);
}

static void test_workspace_rules(void)
{
    prob p;
    prob_init(&p, 4, 16, 0, -1, NULL, 8, 1);
    static unsigned char host_ws[WS_BYTES] __attribute__((aligned(64)));
    void *small = dev_alloc(WS_BYTES / 2), *ws = dev_alloc(WS_BYTES);
    struct {
        void *addr;
        uint64_t size;
        const char *fragment;
    } bad[] = {
        {NULL, WS_BYTES, "workspace is NULL"},
        {ws, WS_BYTES - 1, "workspaceSize 16383"},
        {ws, 0, "workspaceSize 0"},
        {host_ws, WS_BYTES, "device memory"},
        {small, WS_BYTES, "device memory"},
    };
    int64_t live = aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        aclOpExecutor *ex = phase1_ok(&p, -1.0);
        CHECK_FAILS(aclnnSwigluGroupQuantGrad(bad[i].addr, bad[i].size, ex, g_stream),
                    ACLNN_ERR_PARAM_INVALID, PHASE2, bad[i].fragment);
        /* Consumed anyway. */
        CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), live);
        CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_ERR_PARAM_INVALID,
                    PHASE2, "consumed");
    }
    CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
    CHECK(all_ff(p.dgx, 4 * 32 * sizeof(float)));   /* nothing ran */
    /* A larger workspace than asked is fine, from inside a bigger allocation too. */
    void *bigger = dev_alloc(2 * WS_BYTES);
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad((char *)bigger + 64, 2 * WS_BYTES - 64, ex, g_stream),
                 ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
    CHECK_EQ_INT(verify(&p, 4, 0, 0.0), 0);
    /* A repeatable executor is not consumed by a failed launch. */
    ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(ex), ACLNN_SUCCESS);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(NULL, 0, ex, g_stream), ACLNN_ERR_PARAM_INVALID, PHASE2,
                "workspace is NULL");
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtFree(small), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(ws), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(bigger), ACL_SUCCESS);
    prob_free(&p);
}

/* NULL addresses are allowed at phase 1 and set later on a repeatable executor; a non-empty
 * tensor still without an address fails at launch. */
static void test_null_addresses(void)
{
    prob p;
    prob_init(&p, 5, 16, 1, -1, NULL, 9, 0);
    prob_tensors(&p, 0);
    void *ws = dev_alloc(WS_BYTES);
    /* Single use, launched with NULL addresses. */
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_ERR_PARAM_INVALID,
                PHASE2, "gradY has no device address");
    /* Repeatable: set every address, then it runs. */
    ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetInputTensorAddr(ex, 0, p.tgy, p.dgy), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetInputTensorAddr(ex, 1, p.tx, p.dx), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetInputTensorAddr(ex, 2, p.tw, p.dw), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetInputTensorAddr(ex, 3, p.tyo, p.dyo), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetOutputTensorAddr(ex, 0, p.tgx, p.dgx), ACLNN_SUCCESS);
    /* gradWeight still NULL. */
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_ERR_PARAM_INVALID,
                PHASE2, "gradWeightOutOptional has no device address");
    CHECK_EQ_INT(aclSetOutputTensorAddr(ex, 1, p.tgw, p.dgw), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
    CHECK_EQ_INT(verify(&p, 5, 0, 0.0), 0);
    /* Setting an input back to NULL fails the next launch. */
    CHECK_EQ_INT(aclSetInputTensorAddr(ex, 1, p.tx, NULL), ACLNN_SUCCESS);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_ERR_PARAM_INVALID,
                PHASE2, "x has no device address");
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtFree(ws), ACL_SUCCESS);
    prob_free(&p);
}

/* ---- phase 2: streams and timing ---- */

static void test_results_only_after_sync(void)
{
    static const int64_t groups[1] = {4};
    prob p;
    prob_init(&p, 6, 64, 1, 1, groups, 10, 1);
    void *ws = dev_alloc(WS_BYTES);
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_SUCCESS);
    CHECK(all_ff(p.dgx, 6 * 128 * sizeof(float)));
    CHECK(all_ff(p.dgw, 6 * sizeof(float)));
    CHECK(all_ff(ws, WS_BYTES));
    CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
    CHECK_EQ_INT(verify(&p, 4, 0, 0.0), 0);
    /* The kernel filled the workspace with garbage first. */
    CHECK(!all_ff(ws, WS_BYTES));

    /* aclrtSynchronizeDevice drains the kernel too; so does destroying its stream. */
    prob q;
    prob_init(&q, 3, 32, 0, -1, NULL, 13, 1);
    ex = phase1_ok(&q, -1.0);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_SUCCESS);
    CHECK(all_ff(q.dgx, 3 * 64 * sizeof(float)));
    CHECK_EQ_INT(aclrtSynchronizeDevice(), ACL_SUCCESS);
    CHECK_EQ_INT(verify(&q, 3, 0, 0.0), 0);
    prob_free(&q);
    prob_init(&q, 3, 32, 0, -1, NULL, 14, 1);
    aclrtStream s = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&s), ACL_SUCCESS);
    ex = phase1_ok(&q, -1.0);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, s), ACLNN_SUCCESS);
    CHECK(all_ff(q.dgx, 3 * 64 * sizeof(float)));
    CHECK_EQ_INT(aclrtDestroyStream(s), ACL_SUCCESS);
    CHECK_EQ_INT(verify(&q, 3, 0, 0.0), 0);
    prob_free(&q);
    /* Work on another stream is not run by synchronising this one. */
    prob_init(&q, 2, 32, 0, -1, NULL, 15, 1);
    CHECK_EQ_INT(aclrtCreateStream(&s), ACL_SUCCESS);
    ex = phase1_ok(&q, -1.0);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, s), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
    CHECK(all_ff(q.dgx, 2 * 64 * sizeof(float)));
    CHECK_EQ_INT(aclrtSynchronizeStream(s), ACL_SUCCESS);
    CHECK_EQ_INT(verify(&q, 2, 0, 0.0), 0);
    CHECK_EQ_INT(aclrtDestroyStream(s), ACL_SUCCESS);
    prob_free(&q);
    CHECK_EQ_INT(aclrtFree(ws), ACL_SUCCESS);
    prob_free(&p);
}

/* Memory freed between launch and synchronisation: 507015 naming the argument; the queue
 * behind it is dropped; the stream is usable afterwards. */
static void test_free_before_sync(void)
{
    static const int64_t groups[2] = {2, 2};
    /* Each of the seven tensors' memory in turn, then the workspace. */
    for (size_t victim = 0; victim <= OP_PARAMS; victim++) {
        prob p, later;
        prob_init(&p, 4, 16, 1, 2, groups, 20 + (unsigned)victim, 1);
        prob_init(&later, 2, 16, 0, -1, NULL, 40 + (unsigned)victim, 1);
        void *ws = dev_alloc(WS_BYTES), *ws2 = dev_alloc(WS_BYTES);
        aclOpExecutor *ex = phase1_ok(&p, -1.0);
        CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_SUCCESS);
        aclOpExecutor *ex2 = phase1_ok(&later, -1.0);
        CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws2, WS_BYTES, ex2, g_stream), ACLNN_SUCCESS);
        int workspace = victim == OP_PARAMS;
        free_dev(workspace ? &ws : prob_buffer_slot(&p, victim));
        CHECK_FAILS(aclrtSynchronizeStream(g_stream), ACL_ERROR_RT_AICORE_EXCEPTION,
                    "aclrtSynchronizeStream", workspace ? "workspace" : op_param_name(victim),
                    "freed");
        if (victim != OP_PARAM_GRAD_X) CHECK(all_ff(p.dgx, 4 * 32 * sizeof(float)));
        /* The launch queued behind it was dropped. */
        CHECK(all_ff(later.dgx, 2 * 32 * sizeof(float)));
        CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
        /* The stream still works. */
        ex2 = phase1_ok(&later, -1.0);
        CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws2, WS_BYTES, ex2, g_stream), ACLNN_SUCCESS);
        CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
        CHECK_EQ_INT(verify(&later, 2, 0, 0.0), 0);
        free_dev(&ws);
        CHECK_EQ_INT(aclrtFree(ws2), ACL_SUCCESS);
        prob_free(&later);
        prob_free(&p);
    }
}

static void test_bad_streams(void)
{
    prob p;
    prob_init(&p, 2, 16, 0, -1, NULL, 30, 1);
    void *ws = dev_alloc(WS_BYTES);
    aclrtStream s = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&s), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtDestroyStream(s), ACL_SUCCESS);
    int64_t live = aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR);
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, s), ACLNN_ERR_PARAM_INVALID, PHASE2,
                "stream", "destroyed");
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), live);   /* consumed */
    int foreign = 0;
    ex = phase1_ok(&p, -1.0);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, &foreign), ACLNN_ERR_PARAM_INVALID,
                PHASE2, "stream");
    CHECK_EQ_INT(aclrtSynchronizeDevice(), ACL_SUCCESS);
    CHECK(all_ff(p.dgx, 2 * 32 * sizeof(float)));
    CHECK_EQ_INT(aclrtFree(ws), ACL_SUCCESS);
    prob_free(&p);
}

/* Fault injection in phase 2: the planned code, and the single-use executor is consumed. */
static void test_injected_launch_failure(void)
{
    prob p;
    prob_init(&p, 2, 16, 0, -1, NULL, 31, 1);
    void *ws = dev_alloc(WS_BYTES);
    int64_t live = aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR);
    CHECK_EQ_INT(aclEmuSetFaults("aclnnSwigluGroupQuantGrad:1:561000"), ACL_SUCCESS);
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_ERR_INNER, PHASE2,
                "injected fault");
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), live);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_ERR_PARAM_INVALID,
                PHASE2, "consumed");
    CHECK_EQ_INT(aclEmuFaultsInjected(), 1);
    /* Phase 1 injected: no executor. */
    CHECK_EQ_INT(aclEmuSetFaults(PHASE1 ":1:561002"), ACL_SUCCESS);
    uint64_t wsize = 0;
    CHECK_FAILS(phase1(&p, -1.0, &wsize, &ex), ACLNN_ERR_INNER_TILING_ERROR, PHASE1,
                "injected fault");
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), live);
    CHECK_EQ_INT(aclEmuSetFaults(NULL), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
    CHECK(all_ff(p.dgx, 2 * 32 * sizeof(float)));
    CHECK_EQ_INT(aclrtFree(ws), ACL_SUCCESS);
    prob_free(&p);
}

/* ---- threads ---- */

typedef struct {
    prob *p;
    aclOpExecutor *single;
    aclOpExecutor *repeatable;
    void *ws;
} thread_args;

static void *no_device_thread(void *arg)
{
    thread_args *a = arg;
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    CHECK_FAILS(phase1(a->p, -1.0, &ws, &ex), ACL_ERROR_RT_CONTEXT_NULL, PHASE1, "aclrtSetDevice");
    CHECK(ex == NULL);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(a->ws, WS_BYTES, a->single, NULL),
                ACL_ERROR_RT_CONTEXT_NULL, PHASE2, "aclrtSetDevice");
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(a->ws, WS_BYTES, a->repeatable, NULL),
                ACL_ERROR_RT_CONTEXT_NULL, PHASE2);
    /* With a device set, this thread can launch on the default stream. */
    CHECK_EQ_INT(aclrtSetDevice(0), ACL_SUCCESS);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(a->ws, WS_BYTES, a->repeatable, NULL), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(NULL), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtResetDevice(0), ACL_SUCCESS);
    return NULL;
}

static void test_thread_without_device(void)
{
    prob p;
    prob_init(&p, 3, 16, 0, -1, NULL, 32, 1);
    int64_t live = aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR);
    thread_args a = {&p, phase1_ok(&p, -1.0), phase1_ok(&p, -1.0), dev_alloc(WS_BYTES)};
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(a.repeatable), ACLNN_SUCCESS);
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, no_device_thread, &a), 0);
    pthread_join(th, NULL);
    /* The single-use one was consumed by the failed launch; the repeatable one lives. */
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), live + 1);
    CHECK_EQ_INT(verify(&p, 3, 0, 0.0), 0);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(a.repeatable), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtFree(a.ws), ACL_SUCCESS);
    prob_free(&p);
}

/* ---- when groupIndex is read ---- */

static void test_group_index_read_at_run_revision2(void)
{
    static const int64_t groups[2] = {2, 2};
    prob p;
    prob_init(&p, 8, 16, 1, 2, groups, 50, 1);
    void *ws = dev_alloc(WS_BYTES);
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, g_stream), ACLNN_SUCCESS);
    int64_t later[2] = {3, 3};
    upload(p.dgi, later, sizeof later);
    CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
    CHECK_EQ_INT(verify(&p, 6, 0, 0.0), 0);
    /* Again with other values, no new phase 1; then with counts summing past T. */
    int64_t fewer[2] = {1, 0};
    upload(p.dgi, fewer, sizeof fewer);
    launch_sync(ex, g_stream);
    CHECK_EQ_INT(verify(&p, 1, 0, 0.0), 0);
    int64_t many[2] = {5, 100};
    upload(p.dgi, many, sizeof many);
    launch_sync(ex, g_stream);
    CHECK_EQ_INT(verify(&p, expected_trunc(many, 2, 8), 0, 0.0), 0);
    /* Counts are summed as uint32: negatives and sums past 2^32 wrap. */
    int64_t wrapping[2][2] = {{-1, 4}, {INT64_C(4294967295), 6}};
    for (int i = 0; i < 2; i++) {
        upload(p.dgi, wrapping[i], sizeof wrapping[i]);
        launch_sync(ex, g_stream);
        CHECK_EQ_INT(expected_trunc(wrapping[i], 2, 8), 3 + 2 * i);
        CHECK_EQ_INT(verify(&p, 3 + 2 * i, 0, 0.0), 0);
    }
    /* An async copy queued before the launch on the same stream is seen by the kernel. */
    int64_t two[2] = {1, 1};
    CHECK_EQ_INT(aclrtMemcpyAsync(p.dgi, sizeof two, two, sizeof two, ACL_MEMCPY_HOST_TO_DEVICE,
                                  g_stream),
                 ACL_SUCCESS);
    launch_sync(ex, g_stream);
    CHECK_EQ_INT(verify(&p, 2, 0, 0.0), 0);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtFree(ws), ACL_SUCCESS);
    prob_free(&p);
}

static void test_group_index_read_at_phase1_revision1(void)
{
    setenv("ACL_SWIGLU_ABI", "1", 1);
    prob p;
    prob_init(&p, 8, 16, 1, -1, NULL, 60, 1);
    int64_t values[2] = {1, 1};
    aclIntArray *arr = aclCreateIntArray(values, 2);
    values[0] = 6;   /* copied at creation: no effect */
    uint64_t wsize = 0;
    aclOpExecutor *ex = NULL;
    CHECK_EQ_INT(aclnnSwigluGroupQuantGradGetWorkspaceSize(p.tgy, p.tx, p.tw, p.tyo,
                                                           (const aclTensor *)arr, 0.0, p.tgx,
                                                           p.tgw, &wsize, &ex),
                 ACLNN_SUCCESS);
    CHECK_EQ_INT(wsize, WS_BYTES);
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(ex), ACLNN_SUCCESS);
    /* Destroying the array after phase 1 changes nothing. */
    CHECK_EQ_INT(aclDestroyIntArray(arr), ACLNN_SUCCESS);
    launch_sync(ex, g_stream);
    CHECK_EQ_INT(verify(&p, 2, 0, 0.0), 0);
    /* A new array (with other values) does not reach an existing executor either. */
    int64_t other[1] = {7};
    aclIntArray *arr2 = aclCreateIntArray(other, 1);
    launch_sync(ex, g_stream);
    CHECK_EQ_INT(verify(&p, 2, 0, 0.0), 0);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    /* With the new array at phase 1, clamp on (> 0 in revision 1). */
    CHECK_EQ_INT(aclnnSwigluGroupQuantGradGetWorkspaceSize(p.tgy, p.tx, p.tw, p.tyo,
                                                           (const aclTensor *)arr2, 1.25, p.tgx,
                                                           p.tgw, &wsize, &ex),
                 ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyIntArray(arr2), ACLNN_SUCCESS);
    launch_sync(ex, g_stream);
    CHECK_EQ_INT(verify(&p, 7, 1, 1.25), 0);
    unsetenv("ACL_SWIGLU_ABI");
    prob_free(&p);
}

/* ---- after aclFinalize ---- */

static void test_launch_after_finalize(void)
{
    int64_t gy_dims[2] = {0, 4}, x_dims[2] = {0, 8};
    aclTensor *gy = tensor_at(ACL_FLOAT, 2, gy_dims, NULL);
    aclTensor *x = tensor_at(ACL_FLOAT, 2, x_dims, NULL);
    aclTensor *gx = tensor_at(ACL_FLOAT, 2, x_dims, NULL);
    uint64_t ws = 1;
    aclOpExecutor *ex = NULL;
    CHECK_EQ_INT(aclnnSwigluGroupQuantGradGetWorkspaceSize(gy, x, NULL, NULL, NULL, -1.0, gx, NULL,
                                                           &ws, &ex),
                 ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtResetDevice(0), ACL_SUCCESS);
    CHECK_EQ_INT(aclFinalize(), ACL_SUCCESS);
    /* Host objects survive aclFinalize; the launch reports the uninitialised runtime. */
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), 1);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(NULL, 0, ex, NULL), ACL_ERROR_UNINITIALIZE, PHASE2,
                "aclInit");
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), 0);
    CHECK_FAILS(aclnnSwigluGroupQuantGradGetWorkspaceSize(gy, x, NULL, NULL, NULL, -1.0, gx, NULL,
                                                          &ws, &ex),
                ACL_ERROR_UNINITIALIZE, PHASE1, "aclInit");
    CHECK_EQ_INT(aclDestroyTensor(gy), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(x), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(gx), ACLNN_SUCCESS);
}

int main(void)
{
    emu_session session = emu_session_begin(EMU_SESSION_DEVICE_STREAM);
    g_stream = session.stream;
    test_correct_run();
    test_host_pointers_rejected();
    test_view_past_allocation();
    test_alignment_and_offset();
    test_output_overlaps();
    test_input_sharing_and_strides();
    test_single_use_executor();
    test_repeatable_rebinding();
    test_workspace_rules();
    test_null_addresses();
    test_results_only_after_sync();
    test_free_before_sync();
    test_bad_streams();
    test_injected_launch_failure();
    test_thread_without_device();
    test_group_index_read_at_run_revision2();
    test_group_index_read_at_phase1_revision1();
    emu_session_release(&session);
    test_launch_after_finalize();
    return emu_test_finish("test_strict");
}
