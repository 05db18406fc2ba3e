/* Phase 1 of aclnnSwigluGroupQuant: every refusal with its status and a message that names the
 * parameter and the rule, as the release in ACL_EMU_CANN_VERSION checks (ctest runs this program
 * once per release: unset, 9.1.0, 9.1.1, 9.2.0-beta.1, 9.2.0-beta.2, 9.2.0 and a value that
 * names no release). Releases before 9.2.0 check no ranks, shapes or empty inputs; 9.1.0 and
 * 9.1.1 also sum the group counts past their end for some G, which the emulator refuses.
 * Tensors here have no device memory (phase 1 allows that); each accepted call's executor is
 * destroyed again. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "aclnnop/aclnn_swiglu_group_quant.h"
#include "emu_session.h"
#include "emu_test.h"

#define PHASE1 "aclnnSwigluGroupQuantGetWorkspaceSize"
#define OK 0
#define NULLPTR ACLNN_ERR_PARAM_NULLPTR
#define INVALID ACLNN_ERR_PARAM_INVALID
#define TILING ACLNN_ERR_INNER_TILING_ERROR

static int lighter;      /* the emulated release checks no shapes (before 9.2.0) */
static int sum_overreads;/* 9.1.0 / 9.1.1 */

static void classify_release(void)
{
    static const char *const older[] = {"9.1.0", "9.1.1", "9.2.0-beta.1", "9.2.0-beta.2"};
    const char *release = getenv("ACL_EMU_CANN_VERSION");
    for (size_t i = 0; release != NULL && i < sizeof older / sizeof older[0]; i++) {
        if (strcmp(release, older[i]) == 0) {
            lighter = 1;
            sum_overreads = i < 2;
        }
    }
    printf("test_forward_checks: ACL_EMU_CANN_VERSION=%s: %s checks%s\n", release ? release : "(unset)",
           lighter ? "the lighter" : "the full", sum_overreads ? ", the group-sum hazard refused" : "");
}

static aclTensor *tensor(aclDataType dtype, uint64_t ndim, const int64_t *dims)
{
    aclTensor *t = aclCreateTensor(dims, ndim, dtype, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    CHECK(t != NULL);
    return t;
}
#define TENSOR(dtype, ...) tensor(dtype, sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), (int64_t[]){__VA_ARGS__})

typedef struct {
    aclTensor *x, *weight, *group, *scale, *y, *y_scale, *y_origin;
    int64_t dst, mode, block;
    bool round, origin;
    double clamp, dst_max;
    int no_workspace_size, no_executor;
} call;

typedef enum { BLOCK_FP8, MX_FP8, MX_FP4 } config;

/* A call every release accepts: x fp16 [4, 512] (T = 4, H = 256), weight [4], two group counts. */
static call make_call(config k)
{
    call c;
    memset(&c, 0, sizeof c);
    c.x = TENSOR(ACL_FLOAT16, 4, 512);
    c.weight = TENSOR(ACL_FLOAT, 4);
    c.group = TENSOR(ACL_INT64, 2);
    c.dst = k == MX_FP4 ? ACL_FLOAT4_E2M1 : ACL_FLOAT8_E4M3FN;
    c.mode = k == BLOCK_FP8 ? 0 : 1;
    c.round = k != BLOCK_FP8;
    c.clamp = -1.0;
    c.dst_max = 15.0;
    c.y = tensor((aclDataType)c.dst, 2, (int64_t[]){4, 256});
    c.y_scale = k == BLOCK_FP8 ? TENSOR(ACL_FLOAT, 4, 2) : TENSOR(ACL_FLOAT8_E8M0, 4, 4, 2);
    c.y_origin = TENSOR(ACL_FLOAT16, 0);
    return c;
}

static void replace(aclTensor **slot, aclTensor *t)
{
    if (*slot != NULL) CHECK_EQ_INT(aclDestroyTensor(*slot), ACLNN_SUCCESS);
    *slot = t;
}

static void free_call(call *c)
{
    aclTensor **all[] = {&c->x, &c->weight, &c->group, &c->scale, &c->y, &c->y_scale, &c->y_origin};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) replace(all[i], NULL);
}

/* Phase 1; an accepted call asks for 32 bytes of workspace and its executor is destroyed. */
static int phase1(call *c)
{
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    int rc = aclnnSwigluGroupQuantGetWorkspaceSize(c->x, c->weight, c->group, c->scale, c->dst, c->mode, c->block,
                                                   c->round, c->clamp, c->dst_max, c->origin, c->y, c->y_scale,
                                                   c->y_origin, c->no_workspace_size ? NULL : &ws,
                                                   c->no_executor ? NULL : &ex);
    if (rc == 0) {
        CHECK_EQ_INT(ws, 32);
        CHECK(ex != NULL);
        if (ex != NULL) CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    } else {
        CHECK(ex == NULL);
    }
    return rc;
}

static void expect_ok(call *c, int line)
{
    int rc = phase1(c);
    EMU_TEST_COUNT(emu_test_checks);
    if (rc != 0) {
        EMU_TEST_COUNT(emu_test_failures);
        const char *m = aclGetRecentErrMsg();
        fprintf(stderr, "%s:%d: phase 1 returned %d: %s\n", __FILE__, line, rc, m ? m : "(no message)");
    }
}
#define EXPECT_OK(c) expect_ok(c, __LINE__)
/* The status the release gives (OK or a status; the message is checked only for refusals). */
#define EXPECT(c, status, ...)                                                                     \
    do {                                                                                           \
        if ((status) == OK) EXPECT_OK(c);                                                          \
        else CHECK_FAILS(phase1(c), status, PHASE1, __VA_ARGS__);                                  \
    } while (0)

/* ---- 161001 ---- */

static void test_null_pointers(void)
{
    static const char *const names[] = {"x", "yOut", "yScaleOut", "yOriginOut"};
    for (int i = 0; i < 4; i++) {
        call c = make_call(BLOCK_FP8);
        aclTensor **slot = i == 0 ? &c.x : i == 1 ? &c.y : i == 2 ? &c.y_scale : &c.y_origin;
        replace(slot, NULL);
        CHECK_FAILS(phase1(&c), NULLPTR, PHASE1, names[i], "NULL");
        free_call(&c);
    }
    call c = make_call(MX_FP8);
    c.no_workspace_size = 1;
    CHECK_FAILS(phase1(&c), NULLPTR, PHASE1, "workspaceSize");
    c.no_workspace_size = 0;
    c.no_executor = 1;
    CHECK_FAILS(phase1(&c), NULLPTR, PHASE1, "executor");
    free_call(&c);
}

/* ---- 161002: dtype combinations of the op definition, the same in every release ---- */

static void test_dtype_combinations(void)
{
    call c = make_call(BLOCK_FP8);
    replace(&c.x, TENSOR(ACL_INT64, 4, 512));
    CHECK_FAILS(phase1(&c), INVALID, PHASE1, "x has dtype INT64", "FLOAT16");
    replace(&c.x, TENSOR(ACL_FLOAT, 4, 512));   /* FLOAT x goes with HIFLOAT8 y only */
    CHECK_FAILS(phase1(&c), INVALID, PHASE1, "FLOAT", "FLOAT8_E4M3FN", "no dtype combination");
    replace(&c.x, TENSOR(ACL_FLOAT16, 4, 512));
    replace(&c.y, TENSOR(ACL_FLOAT16, 4, 256));
    CHECK_FAILS(phase1(&c), INVALID, PHASE1, "yOut has dtype FLOAT16");
    replace(&c.y, TENSOR(ACL_FLOAT8_E4M3FN, 4, 256));
    replace(&c.y_scale, TENSOR(ACL_FLOAT16, 4, 2));
    CHECK_FAILS(phase1(&c), INVALID, PHASE1, "yScaleOut FLOAT16", "no dtype combination");
    replace(&c.y_scale, TENSOR(ACL_FLOAT, 4, 2));
    replace(&c.y_origin, TENSOR(ACL_BF16, 0));
    CHECK_FAILS(phase1(&c), INVALID, PHASE1, "yOriginOut has dtype BF16", "x has FLOAT16");
    replace(&c.y_origin, TENSOR(ACL_FLOAT16, 0));
    replace(&c.weight, TENSOR(ACL_FLOAT16, 4));
    CHECK_FAILS(phase1(&c), INVALID, PHASE1, "weightOptional has dtype FLOAT16", "FLOAT");
    replace(&c.weight, TENSOR(ACL_FLOAT, 4));
    replace(&c.scale, TENSOR(ACL_BF16, 1));
    CHECK_FAILS(phase1(&c), INVALID, PHASE1, "scaleOptional has dtype BF16");
    replace(&c.scale, TENSOR(ACL_FLOAT, 7));    /* scale: FLOAT of any shape, never read here */
    EXPECT_OK(&c);
    replace(&c.group, TENSOR(ACL_INT32, 2));
    CHECK_FAILS(phase1(&c), INVALID, PHASE1, "groupIndexOptional has dtype INT32", "INT64");
    replace(&c.group, NULL);
    aclTensor *nchw = aclCreateTensor((int64_t[]){4, 512}, 2, ACL_FLOAT16, NULL, 0, ACL_FORMAT_NCHW, NULL, 0, NULL);
    replace(&c.x, nchw);
    CHECK_FAILS(phase1(&c), INVALID, PHASE1, "x has format NCHW", "ND");
    free_call(&c);
    /* FP4 y takes FLOAT8_E8M0 scales only */
    c = make_call(MX_FP4);
    replace(&c.y_scale, TENSOR(ACL_FLOAT, 4, 2));
    CHECK_FAILS(phase1(&c), INVALID, PHASE1, "FLOAT4_E2M1", "yScaleOut FLOAT", "no dtype combination");
    free_call(&c);
}

/* ---- 161002: what is not emulated ---- */

static void test_modes_not_emulated(void)
{
    for (int64_t mode = 2; mode <= 5; mode++) {
        if (mode == 4) continue;
        call c = make_call(BLOCK_FP8);
        c.mode = mode;
        if (mode != 5) {   /* as modes 2 and 3 are called: HIFLOAT8 y with FLOAT scales */
            c.dst = ACL_HIFLOAT8;
            replace(&c.y, TENSOR(ACL_HIFLOAT8, 4, 256));
        }
        char text[32];
        snprintf(text, sizeof text, "quantMode %lld", (long long)mode);
        CHECK_FAILS(phase1(&c), INVALID, PHASE1, text, "not emulated");
        free_call(&c);
    }
}

/* ---- 561002: the tiling's checks in every release ---- */

static void test_common_tiling_checks(void)
{
    call c = make_call(BLOCK_FP8);
    /* FLOAT x with HIFLOAT8 y passes the op definition; modes 0 and 1 refuse the x dtype. */
    replace(&c.x, TENSOR(ACL_FLOAT, 4, 512));
    replace(&c.y, TENSOR(ACL_HIFLOAT8, 4, 256));
    replace(&c.y_origin, TENSOR(ACL_FLOAT, 0));
    CHECK_FAILS(phase1(&c), TILING, PHASE1, "x has dtype FLOAT", "only supports FLOAT16 or BFLOAT16");
    free_call(&c);

    static const int64_t widths[] = {128, 384, 0, 2, 257};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) {
        c = make_call(BLOCK_FP8);
        replace(&c.x, TENSOR(ACL_FLOAT16, 4, widths[i]));
        replace(&c.y, TENSOR(ACL_FLOAT8_E4M3FN, 4, widths[i] / 2));
        CHECK_FAILS(phase1(&c), TILING, PHASE1, "x's last dim", "multiple of 256");
        free_call(&c);
    }
    c = make_call(BLOCK_FP8);
    replace(&c.weight, TENSOR(ACL_FLOAT, 3));
    CHECK_FAILS(phase1(&c), TILING, PHASE1, "weightOptional has 3 elements", "T = 4");
    replace(&c.weight, TENSOR(ACL_FLOAT, 2, 2, 1));   /* any shape of T elements */
    EXPECT_OK(&c);
    replace(&c.weight, NULL);
    replace(&c.group, NULL);
    EXPECT_OK(&c);
    free_call(&c);

    /* The attributes, in the tiling's order. */
    c = make_call(BLOCK_FP8);
    c.dst = ACL_HIFLOAT8;
    replace(&c.y, TENSOR(ACL_HIFLOAT8, 4, 256));
    CHECK_FAILS(phase1(&c), TILING, PHASE1, "dstType is 34", "attr dst_type only supports", "not emulated");
    c.dst = ACL_FLOAT16;
    CHECK_FAILS(phase1(&c), TILING, PHASE1, "dstType is 1", "attr dst_type only supports");
    free_call(&c);
    static const int64_t bad_modes[] = {4, -1, 6, 100};
    for (size_t i = 0; i < 4; i++) {
        c = make_call(BLOCK_FP8);
        c.mode = bad_modes[i];
        CHECK_FAILS(phase1(&c), TILING, PHASE1, "quantMode", "only supports 0 (block_quant) or 1 (mx_quant)");
        free_call(&c);
    }
    c = make_call(MX_FP4);
    c.mode = 0;
    CHECK_FAILS(phase1(&c), TILING, PHASE1, "FLOAT4_E2M1", "needs quantMode 1");
    free_call(&c);
    static const struct { config k; int64_t block; int ok; } blocks[] = {
        {BLOCK_FP8, 0, 1}, {BLOCK_FP8, 128, 1}, {BLOCK_FP8, 32, 0}, {BLOCK_FP8, 64, 0},
        {MX_FP8, 0, 1},    {MX_FP8, 32, 1},     {MX_FP8, 128, 0},   {MX_FP4, 16, 0},
    };
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
        c = make_call(blocks[i].k);
        c.block = blocks[i].block;
        if (blocks[i].ok) EXPECT_OK(&c);
        else CHECK_FAILS(phase1(&c), TILING, PHASE1, "blockSize", "takes 0 or");
        free_call(&c);
    }
    c = make_call(MX_FP8);
    c.round = false;
    CHECK_FAILS(phase1(&c), TILING, PHASE1, "roundScale is false", "requires roundScale true");
    free_call(&c);
    c = make_call(BLOCK_FP8);
    c.round = true;
    EXPECT_OK(&c);
    c.origin = true;
    CHECK_FAILS(phase1(&c), TILING, PHASE1, "outputOrigin", "output_origin must be false");
    free_call(&c);

    /* clamp: (float)c == -1.0f is off, anything else must be > 0 in fp32. */
    static const struct { double limit; int ok; } clamps[] = {
        {-1.0, 1}, {-1.00000001, 1}, {INFINITY, 1}, {1e-30, 1}, {0.5, 1}, {0.0, 0}, {-0.0, 0}, {-2.0, 0},
        {-1.0000002, 0}, {NAN, 0}, {1e-50, 0}, {-INFINITY, 0},
    };
    for (size_t i = 0; i < sizeof clamps / sizeof clamps[0]; i++) {
        c = make_call(i % 2 ? MX_FP8 : BLOCK_FP8);
        c.clamp = clamps[i].limit;
        if (clamps[i].ok) EXPECT_OK(&c);
        else CHECK_FAILS(phase1(&c), TILING, PHASE1, "clampLimit", "attr clamp_limit should be greater than 0.0");
        free_call(&c);
    }
    /* dstTypeMax is not read in modes 0 and 1 */
    c = make_call(MX_FP4);
    c.dst_max = NAN;
    EXPECT_OK(&c);
    c.dst_max = -5.0;
    EXPECT_OK(&c);
    free_call(&c);

    /* Output dtypes against the attributes. */
    c = make_call(BLOCK_FP8);
    replace(&c.y, TENSOR(ACL_FLOAT8_E5M2, 4, 256));
    CHECK_FAILS(phase1(&c), TILING, PHASE1, "yOut has dtype FLOAT8_E5M2", "dstType is 36");
    c.dst = ACL_FLOAT8_E5M2;
    EXPECT_OK(&c);
    replace(&c.y_scale, TENSOR(ACL_FLOAT8_E8M0, 4, 2));
    CHECK_FAILS(phase1(&c), TILING, PHASE1, "yScaleOut has dtype FLOAT8_E8M0", "quantMode 0 needs FLOAT");
    free_call(&c);
    c = make_call(MX_FP8);
    replace(&c.y_scale, TENSOR(ACL_FLOAT, 4, 4, 2));
    CHECK_FAILS(phase1(&c), TILING, PHASE1, "yScaleOut has dtype FLOAT", "quantMode 1 needs FLOAT8_E8M0");
    free_call(&c);
}

/* ---- 561002 from 9.2.0 on: ranks, empty inputs, shapes ---- */

static void test_release_dependent_checks(void)
{
    /* x of rank 1: T = 1. */
    call c = make_call(BLOCK_FP8);
    replace(&c.x, TENSOR(ACL_FLOAT16, 512));
    replace(&c.weight, TENSOR(ACL_FLOAT, 1));
    replace(&c.y, TENSOR(ACL_FLOAT8_E4M3FN, 256));
    replace(&c.y_scale, TENSOR(ACL_FLOAT, 2));
    EXPECT(&c, lighter ? OK : TILING, "x has rank 1", "rank 2-8");
    replace(&c.x, tensor(ACL_FLOAT16, 0, NULL));   /* rank 0: refused everywhere */
    CHECK_FAILS(phase1(&c), TILING, PHASE1, "x has rank 0", lighter ? "> 0" : "2-8");
    free_call(&c);

    /* x of rank 9, every dim 1 but the last. */
    c = make_call(BLOCK_FP8);
    replace(&c.x, TENSOR(ACL_FLOAT16, 1, 1, 1, 1, 1, 1, 1, 1, 512));
    replace(&c.weight, NULL);
    replace(&c.y, TENSOR(ACL_FLOAT8_E4M3FN, 1, 1, 1, 1, 1, 1, 1, 1, 256));
    replace(&c.y_scale, TENSOR(ACL_FLOAT, 1, 1, 1, 1, 1, 1, 1, 1, 2));
    EXPECT(&c, lighter ? OK : TILING, "x has rank 9", "rank 2-8");
    free_call(&c);

    /* Mode 1 with x of rank 8: yScale would need rank 9. */
    c = make_call(MX_FP8);
    replace(&c.x, TENSOR(ACL_FLOAT16, 1, 1, 1, 1, 1, 1, 4, 512));
    replace(&c.y, TENSOR(ACL_FLOAT8_E4M3FN, 1, 1, 1, 1, 1, 1, 4, 256));
    replace(&c.y_scale, TENSOR(ACL_FLOAT8_E8M0, 1, 1, 1, 1, 1, 1, 4, 4, 2));
    EXPECT(&c, lighter ? OK : TILING, "x has rank 8", "quantMode 1 takes ranks up to 7");
    free_call(&c);

    /* T = 0 */
    c = make_call(MX_FP4);
    replace(&c.x, TENSOR(ACL_FLOAT16, 0, 512));
    replace(&c.weight, TENSOR(ACL_FLOAT, 0));
    replace(&c.y, TENSOR(ACL_FLOAT4_E2M1, 0, 256));
    replace(&c.y_scale, TENSOR(ACL_FLOAT8_E8M0, 0, 4, 2));
    EXPECT(&c, lighter ? OK : TILING, "T = 0 rows", "empty tensor is not supported");
    free_call(&c);

    /* weight: rank 9 of T elements; groupIndex 2-D, or G = 0 */
    c = make_call(BLOCK_FP8);
    replace(&c.weight, TENSOR(ACL_FLOAT, 1, 1, 1, 1, 1, 1, 1, 1, 4));
    EXPECT(&c, lighter ? OK : TILING, "weightOptional has rank 9", "rank 1-8");
    replace(&c.weight, NULL);
    replace(&c.group, TENSOR(ACL_INT64, 1, 2));
    EXPECT(&c, lighter ? OK : TILING, "groupIndexOptional has shape [1, 2]", "1-D [G] with G > 0");
    replace(&c.group, TENSOR(ACL_INT64, 0));
    EXPECT(&c, lighter ? OK : TILING, "groupIndexOptional has shape [0]", "G > 0");
    free_call(&c);

    /* yOut: the same element count in another shape (the lighter checks accept it); too few
     * elements (the device would write past it: refused); FP4 in bytes rather than elements. */
    c = make_call(BLOCK_FP8);
    replace(&c.y, TENSOR(ACL_FLOAT8_E4M3FN, 1024));
    EXPECT(&c, lighter ? OK : TILING, "yOut has shape [1024]", "leading dims");
    replace(&c.y, TENSOR(ACL_FLOAT8_E4M3FN, 4, 255));
    if (lighter) CHECK_FAILS(phase1(&c), INVALID, PHASE1, "yOut", "1020 elements", "writes 1024", "write past");
    else CHECK_FAILS(phase1(&c), TILING, PHASE1, "yOut has shape [4, 255]", "H = 256");
    replace(&c.y, TENSOR(ACL_FLOAT8_E4M3FN, 4, 256));
    replace(&c.y_scale, TENSOR(ACL_FLOAT, 4, 1));
    if (lighter) CHECK_FAILS(phase1(&c), INVALID, PHASE1, "yScaleOut", "writes 8", "write past");
    else CHECK_FAILS(phase1(&c), TILING, PHASE1, "yScaleOut has shape [4, 1]", "ceil(H/128) = 2");
    replace(&c.y_scale, TENSOR(ACL_FLOAT, 2, 4));
    EXPECT(&c, lighter ? OK : TILING, "yScaleOut has shape [2, 4]", "leading dims");
    free_call(&c);
    c = make_call(MX_FP4);
    replace(&c.y, TENSOR(ACL_FLOAT4_E2M1, 4, 128));
    if (lighter) CHECK_FAILS(phase1(&c), INVALID, PHASE1, "yOut", "4-bit elements", "write past");
    else CHECK_FAILS(phase1(&c), TILING, PHASE1, "yOut has shape [4, 128]", "FP4 counted in 4-bit elements");
    replace(&c.y, TENSOR(ACL_FLOAT4_E2M1, 4, 256));
    replace(&c.y_scale, TENSOR(ACL_FLOAT8_E8M0, 4, 8));
    EXPECT(&c, lighter ? OK : TILING, "yScaleOut has shape [4, 8]", "[ceil(ceil(H/32)/2), 2] = [4, 2]");
    replace(&c.y_scale, TENSOR(ACL_FLOAT8_E8M0, 4, 4, 1));
    if (lighter) CHECK_FAILS(phase1(&c), INVALID, PHASE1, "yScaleOut", "writes 32", "write past");
    else CHECK_FAILS(phase1(&c), TILING, PHASE1, "yScaleOut has shape [4, 4, 1]");
    free_call(&c);
}

/* ---- 161002 on 9.1.0 and 9.1.1: the group sum that reads past its data ---- */

static void test_group_sum_hazard(void)
{
    static const int64_t counts[] = {96, 97, 100, 127, 128, 129, 225, 255, 256};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        call c = make_call(MX_FP8);
        replace(&c.group, TENSOR(ACL_INT64, counts[i]));
        int64_t rest = counts[i] % 128;
        if (sum_overreads && rest >= 97) {
            char text[48];
            snprintf(text, sizeof text, "G = %lld", (long long)counts[i]);
            CHECK_FAILS(phase1(&c), INVALID, PHASE1, "groupIndexOptional", text, "unpredictable");
        } else {
            EXPECT_OK(&c);
        }
        free_call(&c);
    }
}

int main(void)
{
    classify_release();
    emu_session s = emu_session_begin(EMU_SESSION_DEVICE);
    test_null_pointers();
    test_dtype_combinations();
    test_modes_not_emulated();
    test_common_tiling_checks();
    test_release_dependent_checks();
    test_group_sum_hazard();
    emu_session_end(&s);
    return emu_test_finish("test_forward_checks");
}
