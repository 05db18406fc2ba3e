/* Adversarial uses of the emulator: handles reused at a freed address, streams destroyed with
 * work queued, workspaces of the wrong kind, clamp sentinels at fp32 rounding edges, the ABI
 * variables' whitespace rules and the error text's read-and-clear order. */
#define _GNU_SOURCE
#include <fenv.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "acl_emu/acl_emu.h"
#include "emu_problem.h"
#include "emu_session.h"

static aclrtStream g_stream;

/* A repeatable executor keeps the handles of phase 1. A tensor destroyed after phase 1 and a new
 * one that happens to get the same address is not the phase-1 handle: refreshing its address
 * must be refused, not silently accepted with the old view. */
static void test_reused_tensor_address_is_not_the_phase1_handle(void)
{
    prob p;
    prob_init(&p, 4, 8, 0, -1, NULL, 11, 1);
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(ex), ACLNN_SUCCESS);
    aclTensor *old = p.tgy;
    /* glibc's calloc reuses a freed block once the per-size cache is full: free some spares
     * first so that the next tensors come from the block `old` goes back to. */
    int64_t dims[2] = {2, 8};
    aclTensor *spare[64];
    size_t spares = 0;
    for (size_t i = 0; i < 16; i++) {
        spare[i] = aclCreateTensor(dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, p.dgy);
        CHECK(spare[i] != NULL);
    }
    for (size_t i = 0; i < 16; i++) CHECK_EQ_INT(aclDestroyTensor(spare[i]), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(old), ACLNN_SUCCESS);
    p.tgy = NULL;
    aclTensor *again = NULL;
    for (size_t i = 0; i < 64 && again == NULL; i++) {
        aclTensor *t = aclCreateTensor(dims, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, p.dgy);
        CHECK(t != NULL);
        if (t == old) again = t; else spare[spares++] = t;
    }
#ifdef __SANITIZE_ADDRESS__
    /* AddressSanitizer holds freed blocks in quarantine, so no address is handed out again in
     * that build; the dead handle itself is refused in test_hardening. */
#else
    CHECK(again != NULL);
#endif
    if (again != NULL) {
        CHECK_FAILS(aclSetInputTensorAddr(ex, 0, again, p.dgy), ACLNN_ERR_PARAM_INVALID,
                    "aclSetInputTensorAddr", "phase 1");
        CHECK_EQ_INT(aclDestroyTensor(again), ACLNN_SUCCESS);
    }
    for (size_t i = 0; i < spares; i++) CHECK_EQ_INT(aclDestroyTensor(spare[i]), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    prob_free(&p);
}

/* Destroying a stream with a launch queued on it: either the work runs first or the destroy is
 * refused; never a dangling job. */
static void test_destroy_stream_with_queued_work(void)
{
    prob p;
    prob_init(&p, 4, 8, 1, -1, NULL, 12, 1);
    aclrtStream s = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&s), ACL_SUCCESS);
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    void *ws = dev_alloc(WS_BYTES);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(ws, WS_BYTES, ex, s), ACLNN_SUCCESS);
    int rc = aclrtDestroyStream(s);
    (void)aclGetRecentErrMsg();
    if (rc != ACL_SUCCESS) {
        CHECK_EQ_INT(aclrtSynchronizeStream(s), ACL_SUCCESS);
        CHECK_EQ_INT(aclrtDestroyStream(s), ACL_SUCCESS);
    }
    CHECK_EQ_INT(verify(&p, 4, 0, 0.0), 0);
    CHECK_EQ_INT(aclrtFree(ws), ACL_SUCCESS);
    prob_free(&p);
}

/* A workspace in host memory, too small, or NULL while one is needed. */
static void test_bad_workspaces(void)
{
    prob p;
    prob_init(&p, 4, 8, 0, -1, NULL, 13, 1);
    static unsigned char host_ws[WS_BYTES + 64];
    void *aligned = (void *)(((uintptr_t)host_ws + 31) & ~(uintptr_t)31);
    /* Repeatable, so that each refusal can be tried on the same executor (a refused launch
     * still uses up a single-use one). */
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(ex), ACLNN_SUCCESS);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(aligned, WS_BYTES, ex, g_stream), ACLNN_ERR_PARAM_INVALID,
                "workspace must be", "device memory");
    void *small = dev_alloc(WS_BYTES / 2);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(small, WS_BYTES, ex, g_stream), ACLNN_ERR_PARAM_INVALID,
                "workspace must be", "device memory");
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(small, WS_BYTES / 2, ex, g_stream),
                ACLNN_ERR_PARAM_INVALID, "workspaceSize 8192 is smaller");
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(NULL, 0, ex, g_stream), ACLNN_ERR_PARAM_INVALID,
                "workspace is NULL");
    /* A size claiming more than the block holds, starting inside it. */
    void *big = dev_alloc(WS_BYTES);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad((char *)big + 32, WS_BYTES, ex, g_stream),
                ACLNN_ERR_PARAM_INVALID, "workspace must be");
    /* A freed block is not device memory any more. */
    void *gone = dev_alloc(WS_BYTES);
    CHECK_EQ_INT(aclrtFree(gone), ACL_SUCCESS);
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(gone, WS_BYTES, ex, g_stream), ACLNN_ERR_PARAM_INVALID,
                "workspace must be");
    /* Nothing ran: the outputs still hold the 0xFF they were allocated with. */
    CHECK(all_ff(p.dgx, (size_t)(p.T * 2 * p.H) * sizeof(float)));
    /* After all those refusals the executor is still usable once. */
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(big, WS_BYTES, ex, g_stream), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
    CHECK_EQ_INT(verify(&p, 4, 0, 0.0), 0);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtFree(small), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(big), ACL_SUCCESS);
    prob_free(&p);
}

/* Clamp sentinels in revision 2: doubles whose fp32 rounding is -1 are off; a positive double
 * that rounds to 0 (or is subnormal and flushes) is refused; +inf is on (nothing clamped). */
static void test_clamp_sentinels(void)
{
    prob p;
    prob_init(&p, 4, 8, 1, -1, NULL, 14, 1);
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    double near_minus_one = -1.0 - 1e-12;   /* rounds to -1.0f */
    CHECK_EQ_INT(phase1(&p, near_minus_one, &ws, &ex), ACLNN_SUCCESS);
    if (ex) launch_sync(ex, g_stream);
    CHECK_EQ_INT(verify(&p, 4, 0, 0.0), 0);
    double tiny = 1e-50;                    /* > 0 as a double, 0 as fp32 */
    CHECK_FAILS(phase1(&p, tiny, &ws, &ex), ACLNN_ERR_INNER_TILING_ERROR, "clamp");
    CHECK(ex == NULL);
    CHECK_FAILS(phase1(&p, 0.0, &ws, &ex), ACLNN_ERR_INNER_TILING_ERROR, "clamp");
    CHECK_FAILS(phase1(&p, -0.0, &ws, &ex), ACLNN_ERR_INNER_TILING_ERROR, "clamp");
    /* The default release (9.2.0) takes |c + 1| <= 1e-6 for off, a test NaN fails too: off. */
    CHECK_EQ_INT(phase1(&p, NAN, &ws, &ex), ACLNN_SUCCESS);
    if (ex) launch_sync(ex, g_stream);
    CHECK_EQ_INT(verify(&p, 4, 0, 0.0), 0);
    CHECK_FAILS(phase1(&p, -2.0, &ws, &ex), ACLNN_ERR_INNER_TILING_ERROR, "clamp");
    CHECK_FAILS(phase1(&p, -INFINITY, &ws, &ex), ACLNN_ERR_INNER_TILING_ERROR, "clamp");
    CHECK_FAILS(phase1(&p, -1.0 + 1e-6, &ws, &ex), ACLNN_ERR_INNER_TILING_ERROR, "clamp");
    prob_free(&p);
}

/* ACL_EMU_ABI and ACL_SWIGLU_ABI: ASCII whitespace stripped, empty means unset, only "1" or
 * "2"; ACL_EMU_ABI wins when set. */
static void test_abi_variable_rules(void)
{
    static const struct { const char *emu, *swiglu; int32_t expected; } cases[] = {
        {" 1 ", NULL, 1},   {"\t2\n", NULL, 2}, {"", "1", 1},       {"  ", "1", 1},
        {"\v\f\r", NULL, 2}, {"01", NULL, 0},   {"1.0", NULL, 0},   {"+1", NULL, 0},
        {"3", NULL, 0},      {"1 2", NULL, 0},  {"\xc2\xa0" "1", NULL, 0}, {NULL, " 1\t", 1},
        {NULL, "x", 0},      {"2", "junk", 2},  {NULL, "", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].emu) setenv("ACL_EMU_ABI", cases[i].emu, 1); else unsetenv("ACL_EMU_ABI");
        if (cases[i].swiglu) setenv("ACL_SWIGLU_ABI", cases[i].swiglu, 1);
        else unsetenv("ACL_SWIGLU_ABI");
        int32_t got = aclEmuAbiRevision();
        if (got != cases[i].expected) {
            fprintf(stderr, "case %zu: emu=%s swiglu=%s\n", i, cases[i].emu ? cases[i].emu : "-",
                    cases[i].swiglu ? cases[i].swiglu : "-");
        }
        CHECK_EQ_INT(got, cases[i].expected);
    }
    /* An invalid value fails phase 1 with the variable named, and the cache does not keep an
     * older good value. */
    prob p;
    prob_init(&p, 2, 4, 0, -1, NULL, 15, 1);
    uint64_t ws;
    aclOpExecutor *ex;
    unsetenv("ACL_SWIGLU_ABI");
    setenv("ACL_EMU_ABI", "2", 1);
    CHECK_EQ_INT(phase1(&p, -1.0, &ws, &ex), ACLNN_SUCCESS);
    if (ex) CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    setenv("ACL_EMU_ABI", "2x", 1);
    CHECK_FAILS(phase1(&p, -1.0, &ws, &ex), ACLNN_ERR_PARAM_INVALID, "ACL_EMU_ABI", "2x");
    setenv("ACL_EMU_ABI", "2", 1);
    CHECK_EQ_INT(phase1(&p, -1.0, &ws, &ex), ACLNN_SUCCESS);
    if (ex) CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    unsetenv("ACL_EMU_ABI");
    prob_free(&p);
}

/* aclGetRecentErrMsg: newest first, cleared by reading; a message far longer than the buffer
 * does not corrupt it. */
static void test_error_message_order(void)
{
    CHECK(aclGetRecentErrMsg() == NULL);
    int64_t one[1] = {1};
    CHECK(aclCreateTensor(one, 1, (aclDataType)99, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL) == NULL);
    CHECK(aclCreateTensor(one, 1, ACL_FLOAT, NULL, -1, ACL_FORMAT_ND, NULL, 0, NULL) == NULL);
    const char *m = aclGetRecentErrMsg();
    CHECK(m != NULL);
    if (m != NULL) {
        const char *newest = strstr(m, "offset -1 is negative");
        const char *oldest = strstr(m, "dataType 99");
        CHECK(newest != NULL && oldest != NULL && newest < oldest);
        CHECK(strchr(m, '\n') != NULL && strchr(m, '\n') < oldest);
    }
    CHECK(aclGetRecentErrMsg() == NULL);
    /* Far more text than the buffer holds: the newest line survives whole, first, and the
     * text stays one NUL-terminated string of whole lines. */
    for (int i = 0; i < 200; i++) {
        CHECK(aclCreateTensor(one, 1, ACL_FLOAT, NULL, -1000 - i, ACL_FORMAT_ND, NULL, 0, NULL) ==
              NULL);
    }
    m = aclGetRecentErrMsg();
    CHECK(m != NULL);
    if (m != NULL) {
        CHECK(strncmp(m, "aclCreateTensor: offset -1199 is negative", 41) == 0);
        CHECK(strlen(m) < 4096);
        CHECK(m[strlen(m) - 1] != '\n');
        const char *last_line = strrchr(m, '\n');
        CHECK(last_line != NULL && strncmp(last_line + 1, "aclCreateTensor: offset ", 24) == 0);
    }
    CHECK(aclGetRecentErrMsg() == NULL);
}

/* The caller's floating-point environment (directed rounding, and FTZ/DAZ on x86-64) changes
 * neither phase 1's reading of the clamp nor the bytes the kernel writes on several threads. */
static void set_hostile_fp_env(int on)
{
#if defined(__x86_64__)
    unsigned int csr = _mm_getcsr();
    _mm_setcsr(on ? csr | 0x8040u : csr & ~0x8040u);   /* FTZ and DAZ */
#endif
    fesetround(on ? FE_DOWNWARD : FE_TONEAREST);
}

static void run_into(prob *p, double clamp, void *gx_copy, void *gw_copy)
{
    aclOpExecutor *ex = phase1_ok(p, clamp);
    if (ex != NULL) launch_sync(ex, g_stream);
    download(gx_copy, p->dgx, (size_t)(p->T * 2 * p->H) * sizeof(float));
    download(gw_copy, p->dgw, (size_t)p->T * sizeof(float));
}

static void test_caller_fp_environment(void)
{
    enum { ROWS = 96, HID = 520 };
    prob p;
    prob_init(&p, ROWS, HID, 1, -1, NULL, 16, 1);
    /* Subnormal gradients, so that FTZ/DAZ would change them. */
    for (size_t i = 0; i < (size_t)ROWS * HID; i++) p.gy[i] *= 1e-38f;
    upload(p.dgy, p.gy, (size_t)ROWS * HID * sizeof(float));
    size_t gx_bytes = (size_t)ROWS * 2 * HID * sizeof(float);
    float *want_gx = malloc(gx_bytes), *got_gx = malloc(gx_bytes);
    float want_gw[ROWS], got_gw[ROWS];
    CHECK_EQ_INT(aclEmuSetThreads(3), ACL_SUCCESS);
    static const double clamps[] = {-1.0 - 1e-12, 1.5, 1.0000000001};
    for (size_t c = 0; c < sizeof clamps / sizeof clamps[0]; c++) {
        run_into(&p, clamps[c], want_gx, want_gw);
        set_hostile_fp_env(1);
        run_into(&p, clamps[c], got_gx, got_gw);
        set_hostile_fp_env(0);
        CHECK(memcmp(want_gx, got_gx, gx_bytes) == 0);
        CHECK(memcmp(want_gw, got_gw, sizeof want_gw) == 0);
    }
    CHECK_EQ_INT(verify(&p, ROWS, 1, 1.0000000001), 0);
    int subnormal = 0;
    for (size_t i = 0; i < (size_t)ROWS * 2 * HID; i++) {
        subnormal += want_gx[i] != 0.0f && fabsf(want_gx[i]) < 1.17549435e-38f;
    }
    CHECK(subnormal > 0);
    /* Phase 1 takes or refuses each limit alike in both environments and both revisions; a
     * limit that is subnormal in fp32 is a positive limit (DAZ must not make it 0). */
    static const struct { double limit; int rc[2]; } limits[] = {
        {1e-40, {ACLNN_SUCCESS, ACLNN_SUCCESS}},
        {1.5e-45, {ACLNN_SUCCESS, ACLNN_SUCCESS}},
        {1e-310, {ACLNN_ERR_INNER_TILING_ERROR, ACLNN_ERR_INNER_TILING_ERROR}},   /* 0 in fp32 */
        {-1e-40, {ACLNN_ERR_INNER_TILING_ERROR, ACLNN_ERR_INNER_TILING_ERROR}},
        {0.0, {ACLNN_SUCCESS, ACLNN_ERR_INNER_TILING_ERROR}},                     /* revision 1's off */
        {-1.0, {ACLNN_ERR_INNER_TILING_ERROR, ACLNN_SUCCESS}},                    /* revision 2's off */
    };
    for (int abi = 1; abi <= 2; abi++) {
        setenv("ACL_EMU_ABI", abi == 1 ? "1" : "2", 1);
        for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
            for (int hostile = 0; hostile <= 1; hostile++) {
                uint64_t ws = 0;
                aclOpExecutor *ex = NULL;
                set_hostile_fp_env(hostile);
                int rc = phase1(&p, limits[i].limit, &ws, &ex);
                set_hostile_fp_env(0);
                if (rc != limits[i].rc[abi - 1]) {
                    fprintf(stderr, "  revision %d, clampLimit %g, hostile environment %d\n", abi,
                            limits[i].limit, hostile);
                }
                CHECK_EQ_INT(rc, limits[i].rc[abi - 1]);
                if (rc == 0 && ex != NULL) CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
                (void)aclGetRecentErrMsg();
            }
        }
    }
    unsetenv("ACL_EMU_ABI");
    CHECK_EQ_INT(fegetround(), FE_TONEAREST);
    CHECK_EQ_INT(aclEmuSetThreads(0), ACL_SUCCESS);
    free(want_gx);
    free(got_gx);
    prob_free(&p);
}

/* Copies and sets whose range wraps past the top of the address space say so, instead of
 * naming an allocation that does not exist; a size that overflows is refused the same way. */
static void test_wrapping_copy_ranges(void)
{
    char *d = dev_alloc(64);
    static char host[64];
    CHECK_FAILS(aclrtMemcpy(d, SIZE_MAX, host, SIZE_MAX, ACL_MEMCPY_HOST_TO_DEVICE),
                ACL_ERROR_INVALID_PARAM, "aclrtMemcpy", "dst range", "wraps past the top");
    CHECK_FAILS(aclrtMemcpy((void *)(UINTPTR_MAX - 15), 64, d, 64, ACL_MEMCPY_DEVICE_TO_HOST),
                ACL_ERROR_INVALID_PARAM, "aclrtMemcpy", "dst range", "wraps past the top");
    CHECK_FAILS(aclrtMemcpy(host, 64, (void *)(UINTPTR_MAX - 15), 64, ACL_MEMCPY_HOST_TO_HOST),
                ACL_ERROR_INVALID_PARAM, "aclrtMemcpy", "src range", "wraps past the top");
    CHECK_FAILS(aclrtMemset((void *)(UINTPTR_MAX - 15), 64, 0, 64), ACL_ERROR_INVALID_PARAM,
                "aclrtMemset", "wraps past the top");
    /* A range that runs off a real allocation still names it. */
    CHECK_FAILS(aclrtMemcpy(d + 32, 64, host, 64, ACL_MEMCPY_HOST_TO_DEVICE),
                ACL_ERROR_INVALID_PARAM, "dst range", "runs past the end of device allocation");
    CHECK_EQ_INT(aclrtFree(d), ACL_SUCCESS);
}

int main(void)
{
    emu_session session = emu_session_begin(EMU_SESSION_DEVICE_STREAM);
    g_stream = session.stream;
    test_reused_tensor_address_is_not_the_phase1_handle();
    test_destroy_stream_with_queued_work();
    test_bad_workspaces();
    test_clamp_sentinels();
    test_abi_variable_rules();
    test_error_message_order();
    test_caller_fp_environment();
    test_wrapping_copy_ranges();
    emu_session_end(&session);
    return emu_test_finish("test_hostile");
}
