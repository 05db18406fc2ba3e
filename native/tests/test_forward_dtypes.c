/* The number formats of the forward in the meta API: aclCreateTensor takes HIFLOAT8 (34),
 * FLOAT8_E5M2 (35), FLOAT8_E4M3FN (36), FLOAT8_E8M0 (37), FLOAT4_E2M1 (40) and FLOAT4_E1M2 (41),
 * sizes FLOAT4 as 4-bit elements in its extent checks (the bytes of device views are checked in
 * test_forward_launch.c), names them in messages; and aclnnSwigluGroupQuantGrad still refuses every one of them with its own
 * 161002 messages. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "aclnnop/aclnn_swiglu_group_quant_grad.h"
#include "emu_session.h"
#include "emu_test.h"

static const struct { aclDataType dtype; const char *name; } NEW_DTYPES[] = {
    {ACL_HIFLOAT8, "HIFLOAT8"},         {ACL_FLOAT8_E5M2, "FLOAT8_E5M2"}, {ACL_FLOAT8_E4M3FN, "FLOAT8_E4M3FN"},
    {ACL_FLOAT8_E8M0, "FLOAT8_E8M0"},   {ACL_FLOAT4_E2M1, "FLOAT4_E2M1"}, {ACL_FLOAT4_E1M2, "FLOAT4_E1M2"},
};
#define N_NEW (sizeof NEW_DTYPES / sizeof NEW_DTYPES[0])

static void test_values_match_cann(void)
{
    CHECK_EQ_INT(ACL_HIFLOAT8, 34);
    CHECK_EQ_INT(ACL_FLOAT8_E5M2, 35);
    CHECK_EQ_INT(ACL_FLOAT8_E4M3FN, 36);
    CHECK_EQ_INT(ACL_FLOAT8_E8M0, 37);
    CHECK_EQ_INT(ACL_FLOAT4_E2M1, 40);
    CHECK_EQ_INT(ACL_FLOAT4_E1M2, 41);
}

static void test_tensors_of_the_new_dtypes(void)
{
    for (size_t i = 0; i < N_NEW; i++) {
        aclTensor *t = aclCreateTensor((int64_t[]){3, 5}, 2, NEW_DTYPES[i].dtype, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
        CHECK(t != NULL);
        if (t != NULL) CHECK_EQ_INT(aclDestroyTensor(t), ACLNN_SUCCESS);
    }
    /* Codes between and around them are no data types. */
    static const int unknown[] = {33, 38, 39, 42};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        aclTensor *t = aclCreateTensor((int64_t[]){2}, 1, (aclDataType)unknown[i], NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
        CHECK(t == NULL);
        char text[32];
        snprintf(text, sizeof text, "dataType %d", unknown[i]);
        emu_check_message(__FILE__, __LINE__, "aclCreateTensor", (const char *[]){text, NULL});
    }
}

static void test_extent_limits(void)
{
    /* One-byte types: (last + 1) bytes must fit int64; FLOAT4: the last element index must, and
     * its byte is then half that. */
    for (size_t i = 0; i < N_NEW; i++) {
        const aclDataType dt = NEW_DTYPES[i].dtype;
        const int64_t limit = INT64_MAX - 1;   /* the largest offset of a 1-element view */
        aclTensor *ok = aclCreateTensor((int64_t[]){1}, 1, dt, NULL, limit, ACL_FORMAT_ND, NULL, 0, NULL);
        CHECK(ok != NULL);
        if (ok != NULL) CHECK_EQ_INT(aclDestroyTensor(ok), ACLNN_SUCCESS);
        aclTensor *bad = aclCreateTensor((int64_t[]){2}, 1, dt, NULL, limit, ACL_FORMAT_ND, NULL, 0, NULL);
        CHECK(bad == NULL);
        emu_check_message(__FILE__, __LINE__, "aclCreateTensor", (const char *[]){"overflow", NULL});
    }
    /* Storage dims of 2^62 FP4 elements are 2^61 bytes; of an 8-bit type, 2^62 bytes. Both fit. */
    const int64_t huge[1] = {(int64_t)1 << 62};
    for (size_t i = 0; i < N_NEW; i++) {
        aclTensor *t = aclCreateTensor((int64_t[]){4}, 1, NEW_DTYPES[i].dtype, NULL, 0, ACL_FORMAT_ND, huge, 1, NULL);
        CHECK(t != NULL);
        if (t != NULL) CHECK_EQ_INT(aclDestroyTensor(t), ACLNN_SUCCESS);
    }
}

/* ---- the backward refuses them all ---- */

static int backward_phase1(const aclTensor *gy, const aclTensor *x, const aclTensor *w, const aclTensor *yo,
                           const aclTensor *gi, const aclTensor *gx, const aclTensor *gw)
{
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    int rc = aclnnSwigluGroupQuantGradGetWorkspaceSize(gy, x, w, yo, gi, -1.0, gx, gw, &ws, &ex);
    if (ex != NULL) CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    return rc;
}

static aclTensor *make(aclDataType dtype, int64_t d0, int64_t d1)
{
    aclTensor *t = aclCreateTensor((int64_t[]){d0, d1}, 2, dtype, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    CHECK(t != NULL);
    return t;
}

static void test_backward_refuses_the_new_dtypes(void)
{
    for (size_t i = 0; i < N_NEW; i++) {
        const aclDataType dt = NEW_DTYPES[i].dtype;
        const char *name = NEW_DTYPES[i].name;
        aclTensor *gy = make(ACL_FLOAT16, 2, 4), *x = make(ACL_FLOAT16, 2, 8), *gx = make(ACL_FLOAT16, 2, 8);
        aclTensor *yo = make(ACL_FLOAT16, 2, 4), *w = make(ACL_FLOAT, 2, 1), *gw = make(ACL_FLOAT, 2, 1);
        aclTensor *odd_gy = make(dt, 2, 4), *odd_x = make(dt, 2, 8), *odd_w = make(dt, 2, 1);
        aclTensor *odd_group = aclCreateTensor((int64_t[]){2}, 1, dt, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
        char text[96];
        CHECK_EQ_INT(backward_phase1(gy, x, w, yo, NULL, gx, gw), ACLNN_SUCCESS);   /* the baseline */
        snprintf(text, sizeof text, "gradY has dtype %s", name);
        CHECK_FAILS(backward_phase1(odd_gy, x, NULL, NULL, NULL, gx, NULL), ACLNN_ERR_PARAM_INVALID, text,
                    "FLOAT, FLOAT16 or BF16");
        snprintf(text, sizeof text, "x has dtype %s", name);
        CHECK_FAILS(backward_phase1(gy, odd_x, NULL, NULL, NULL, gx, NULL), ACLNN_ERR_PARAM_INVALID, text, "must match");
        snprintf(text, sizeof text, "gradXOut has dtype %s", name);
        CHECK_FAILS(backward_phase1(gy, x, NULL, NULL, NULL, odd_x, NULL), ACLNN_ERR_PARAM_INVALID, text);
        snprintf(text, sizeof text, "yOriginOptional has dtype %s", name);
        CHECK_FAILS(backward_phase1(gy, x, w, odd_gy, NULL, gx, gw), ACLNN_ERR_PARAM_INVALID, text);
        snprintf(text, sizeof text, "weightOptional has dtype %s", name);
        CHECK_FAILS(backward_phase1(gy, x, odd_w, yo, NULL, gx, gw), ACLNN_ERR_PARAM_INVALID, text, "must be FLOAT");
        snprintf(text, sizeof text, "gradWeightOutOptional has dtype %s", name);
        CHECK_FAILS(backward_phase1(gy, x, w, yo, NULL, gx, odd_w), ACLNN_ERR_PARAM_INVALID, text);
        snprintf(text, sizeof text, "groupIndexOptional has dtype %s", name);
        CHECK_FAILS(backward_phase1(gy, x, NULL, NULL, odd_group, gx, NULL), ACLNN_ERR_PARAM_INVALID, text,
                    "INT64");
        aclTensor *all[] = {gy, x, gx, yo, w, gw, odd_gy, odd_x, odd_w, odd_group};
        for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) CHECK_EQ_INT(aclDestroyTensor(all[k]), ACLNN_SUCCESS);
    }
}

int main(void)
{
    emu_session s = emu_session_begin(EMU_SESSION_DEVICE);
    test_values_match_cann();
    test_tensors_of_the_new_dtypes();
    test_extent_limits();
    test_backward_refuses_the_new_dtypes();
    emu_session_end(&s);
    return emu_test_finish("test_forward_dtypes");
}
