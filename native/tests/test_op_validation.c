/* Phase 1 of aclnnSwigluGroupQuantGrad: every rule of docs/emulator.md "The operator", steps
 * 1-4, with the exact status and a message naming the parameter, for ABI revisions 2 and 1;
 * plus empty tensors and the workspace size. Memory rules (step 5) are in test_strict.c. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "acl_emu/acl_emu.h"
#include "aclnnop/aclnn_swiglu_group_quant_grad.h"
#include "emu_operator_params.h"
#include "emu_session.h"
#include "emu_test.h"

#define PHASE1 "aclnnSwigluGroupQuantGradGetWorkspaceSize: "
#define MAX_MADE 512

/* ---- helpers ---- */

static aclTensor *made[MAX_MADE];
static size_t made_count;
static uint64_t last_workspace;

static aclTensor *mkf(aclDataType dt, aclFormat format, uint64_t n, const int64_t *dims)
{
    aclTensor *t = aclCreateTensor(dims, n, dt, NULL, 0, format, NULL, 0, NULL);
    CHECK(t != NULL);
    if (t != NULL && made_count < MAX_MADE) made[made_count++] = t;
    return t;
}

static aclTensor *mk(aclDataType dt, uint64_t n, const int64_t *dims)
{
    return mkf(dt, ACL_FORMAT_ND, n, dims);
}

#define DIMS(...) (sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), ((int64_t[]){__VA_ARGS__})

static void destroy_made(void)
{
    for (size_t i = 0; i < made_count; i++) CHECK_EQ_INT(aclDestroyTensor(made[i]), ACLNN_SUCCESS);
    made_count = 0;
}

/* A tensor handle that was destroyed: use it before creating anything else. */
static const aclTensor *dead_tensor(void)
{
    aclTensor *t = aclCreateTensor(NULL, 0, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    CHECK(t != NULL);
    CHECK_EQ_INT(aclDestroyTensor(t), ACLNN_SUCCESS);
    return t;
}

typedef struct {
    const aclTensor *gy, *x, *w, *yo, *gi, *gx, *gw;
    double clamp;
} op_args;

/* Runs phase 1; on success checks and frees the executor; on failure checks that no executor
 * was left behind. Returns the status (the thread's message is left for CHECK_FAILS). */
static int phase1(op_args a)
{
    uint64_t ws = 12345;
    aclOpExecutor *ex = NULL;
    int64_t before = aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR);
    int rc = aclnnSwigluGroupQuantGradGetWorkspaceSize(a.gy, a.x, a.w, a.yo, a.gi, a.clamp, a.gx,
                                                       a.gw, &ws, &ex);
    if (rc == ACLNN_SUCCESS) {
        CHECK(ex != NULL);
        CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), before + 1);
        CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
        last_workspace = ws;
    } else {
        CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), before);
    }
    return rc;
}

#define ACCEPTS(args)                                                                        \
    do {                                                                                     \
        int rc_ = phase1(args);                                                              \
        CHECK_EQ_INT(rc_, ACLNN_SUCCESS);                                                    \
        if (rc_ != ACLNN_SUCCESS) {                                                          \
            const char *m_ = aclGetRecentErrMsg();                                           \
            fprintf(stderr, "%s:%d:   %s\n", __FILE__, __LINE__, m_ ? m_ : "(no message)");  \
        }                                                                                    \
    } while (0)

/* The full valid set in revision 2: gradY [4,8], x/gradX [4,16], weight/gradWeight [4,1],
 * yOrigin [4,8], groupIndex [2]; dtype `io` for gradY/x/yOrigin/gradX. */
static op_args full_args(aclDataType io)
{
    op_args a;
    a.gy = mk(io, DIMS(4, 8));
    a.x = mk(io, DIMS(4, 16));
    a.w = mk(ACL_FLOAT, DIMS(4, 1));
    a.yo = mk(io, DIMS(4, 8));
    a.gi = mk(ACL_INT64, DIMS(2));
    a.gx = mk(io, DIMS(4, 16));
    a.gw = mk(ACL_FLOAT, DIMS(4, 1));
    a.clamp = -1.0;
    return a;
}

static const aclTensor **param(op_args *a, int i)
{
    const aclTensor **all[OP_PARAMS] = {&a->gy, &a->x, &a->w, &a->yo, &a->gi, &a->gx, &a->gw};
    return all[i];
}

static void use_abi(const char *value)
{
    if (value == NULL) unsetenv("ACL_SWIGLU_ABI");
    else setenv("ACL_SWIGLU_ABI", value, 1);
}

/* ---- step 1: 161001 ---- */

static void test_null_pointers(void)
{
    op_args good = full_args(ACL_FLOAT);
    ACCEPTS(good);
    CHECK_EQ_INT(last_workspace, 16384);
    op_args a = good;
    a.gy = NULL;
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_NULLPTR, PHASE1 "gradY is NULL");
    a = good;
    a.x = NULL;
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_NULLPTR, PHASE1 "x is NULL");
    a = good;
    a.gx = NULL;
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_NULLPTR, PHASE1 "gradXOut is NULL");
    /* The first missing one is named. */
    a.gy = NULL;
    a.x = NULL;
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_NULLPTR, PHASE1 "gradY is NULL");
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    CHECK_FAILS(aclnnSwigluGroupQuantGradGetWorkspaceSize(good.gy, good.x, good.w, good.yo,
                                                          good.gi, -1.0, good.gx, good.gw, NULL,
                                                          &ex),
                ACLNN_ERR_PARAM_NULLPTR, PHASE1 "workspaceSize is NULL");
    CHECK_FAILS(aclnnSwigluGroupQuantGradGetWorkspaceSize(good.gy, good.x, good.w, good.yo,
                                                          good.gi, -1.0, good.gx, good.gw, &ws,
                                                          NULL),
                ACLNN_ERR_PARAM_NULLPTR, PHASE1 "executor is NULL");
    /* Step 1 comes before step 2 (a dead gradY) and step 4 (a bad clampLimit). */
    a = good;
    a.gx = NULL;
    a.clamp = 0.0;
    a.gy = dead_tensor();
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_NULLPTR, PHASE1 "gradXOut is NULL");
    /* Optional parameters may be NULL. */
    a = good;
    a.w = a.yo = a.gi = a.gw = NULL;
    ACCEPTS(a);
    destroy_made();
}

/* ---- step 2: handles ---- */

static void test_dead_and_foreign_handles(void)
{
    op_args good = full_args(ACL_FLOAT);
    int64_t values[2] = {1, 2};
    aclIntArray *array = aclCreateIntArray(values, 2);
    struct {
        int64_t junk[64];
    } foreign = {{0}};
    char name_colon[64];
    for (int i = 0; i < OP_PARAMS; i++) {
        snprintf(name_colon, sizeof name_colon, PHASE1 "%s: ", op_param_name(i));
        op_args a = good;
        *param(&a, i) = dead_tensor();
        CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, name_colon, "already destroyed");
        a = good;
        *param(&a, i) = (const aclTensor *)array;
        CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, name_colon, "aclIntArray",
                    "not an aclTensor");
        a = good;
        *param(&a, i) = (const aclTensor *)&foreign;
        CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, name_colon,
                    "not an aclTensor made by this library");
    }
    /* Step 2 comes before step 3 (a bad dtype) and step 4 (bad shapes). */
    op_args a = good;
    a.gy = mk(ACL_INT32, DIMS(4, 8));
    a.gx = mk(ACL_FLOAT, DIMS(3, 3));
    a.w = (const aclTensor *)array;
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1 "weightOptional: ", "aclIntArray");
    CHECK_EQ_INT(aclDestroyIntArray(array), ACLNN_SUCCESS);
    destroy_made();
}

/* Revision 1: groupIndexOptional must be a live aclIntArray; revision 2: an aclTensor. */
static void test_group_index_kind_per_revision(void)
{
    int64_t values[2] = {2, 2};
    op_args a = full_args(ACL_FLOAT);
    aclIntArray *array = aclCreateIntArray(values, 2);
    CHECK(array != NULL);

    use_abi("2");
    ACCEPTS(a);
    op_args b = a;
    b.gi = (const aclTensor *)array;
    CHECK_FAILS(phase1(b), ACLNN_ERR_PARAM_INVALID, PHASE1 "groupIndexOptional: ", "aclIntArray",
                "not an aclTensor");

    use_abi("1");
    b.clamp = 0.0;
    ACCEPTS(b);
    CHECK_EQ_INT(last_workspace, 16384);
    b.gi = a.gi;   /* an INT64 tensor is not what revision 1 takes */
    CHECK_FAILS(phase1(b), ACLNN_ERR_PARAM_INVALID, PHASE1 "groupIndexOptional: ", "aclTensor",
                "not an aclIntArray");
    b.gi = (const aclTensor *)&values;
    CHECK_FAILS(phase1(b), ACLNN_ERR_PARAM_INVALID, PHASE1 "groupIndexOptional: ",
                "not an aclIntArray made by this library");
    b.gi = NULL;
    ACCEPTS(b);
    aclIntArray *empty = aclCreateIntArray(NULL, 0);
    b.gi = (const aclTensor *)empty;
    ACCEPTS(b);
    CHECK_EQ_INT(aclDestroyIntArray(empty), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyIntArray(array), ACLNN_SUCCESS);
    b.gi = (const aclTensor *)array;
    CHECK_FAILS(phase1(b), ACLNN_ERR_PARAM_INVALID, PHASE1 "groupIndexOptional: ",
                "already destroyed");
    /* Revision 1 does not look at a tensor's dtype in the groupIndex slot: it is no tensor. */
    use_abi(NULL);
    destroy_made();
}

static void test_abi_selection(void)
{
    op_args a = full_args(ACL_FLOAT);
    static const char *const bad[] = {"3", "0", "abc", "12", "2 2", "+2", "02", "\xc2\xa0" "2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        use_abi(bad[i]);
        CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1, "ACL_SWIGLU_ABI=\"", bad[i]);
    }
    /* ASCII whitespace around the value does not count; nothing left means unset (2). */
    static const char *const two[] = {"2 ", " 2", "\t2\n", "\v\f2\r", "", "  "};
    for (size_t i = 0; i < sizeof two / sizeof two[0]; i++) {
        use_abi(two[i]);
        ACCEPTS(a);
        CHECK_EQ_INT(aclEmuAbiRevision(), 2);
    }
    use_abi(" 1\n");
    CHECK_EQ_INT(aclEmuAbiRevision(), 1);
    use_abi("3");
    CHECK_EQ_INT(aclEmuAbiRevision(), 0);
    /* The environment is watched: fixing the variable fixes the next call. */
    use_abi("2");
    ACCEPTS(a);
    use_abi("");
    ACCEPTS(a);
    use_abi(NULL);
    ACCEPTS(a);
    destroy_made();
}

/* ---- step 3: formats and dtypes ---- */

static void test_formats(void)
{
    op_args good = full_args(ACL_FLOAT);
    static const int64_t dims[7][2] = {{4, 8}, {4, 16}, {4, 1}, {4, 8}, {2, 0}, {4, 16}, {4, 1}};
    static const aclDataType types[7] = {ACL_FLOAT, ACL_FLOAT, ACL_FLOAT, ACL_FLOAT,
                                         ACL_INT64, ACL_FLOAT, ACL_FLOAT};
    static const aclFormat formats[] = {ACL_FORMAT_NCHW, ACL_FORMAT_NHWC, ACL_FORMAT_NCL,
                                        ACL_FORMAT_UNDEFINED};
    static const char *const format_names[] = {"NCHW", "NHWC", "NCL", "UNDEFINED"};
    char expected[128];
    for (int i = 0; i < OP_PARAMS; i++) {
        for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
            op_args a = good;
            uint64_t n = i == OP_PARAM_GROUP_INDEX ? 1 : 2;
            *param(&a, i) = mkf(types[i], formats[f], n, dims[i]);
            snprintf(expected, sizeof expected, PHASE1 "%s has format %s", op_param_name(i),
                     format_names[f]);
            CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, expected, "ND");
        }
    }
    destroy_made();
}

static void test_dtypes(void)
{
    /* Each of FLOAT, FLOAT16, BF16 works when gradY/x/yOrigin/gradX agree. */
    static const aclDataType io_types[] = {ACL_FLOAT, ACL_FLOAT16, ACL_BF16};
    for (size_t i = 0; i < 3; i++) {
        op_args a = full_args(io_types[i]);
        ACCEPTS(a);
    }
    op_args good = full_args(ACL_FLOAT);
    /* gradY outside the supported set (the others following it, so gradY is the culprit). */
    static const aclDataType bad_io[] = {ACL_INT32, ACL_DOUBLE, ACL_INT8, ACL_INT64, ACL_BOOL,
                                         ACL_COMPLEX64, ACL_UINT16};
    for (size_t i = 0; i < sizeof bad_io / sizeof bad_io[0]; i++) {
        op_args a = good;
        a.gy = mk(bad_io[i], DIMS(4, 8));
        a.x = mk(bad_io[i], DIMS(4, 16));
        a.yo = mk(bad_io[i], DIMS(4, 8));
        a.gx = mk(bad_io[i], DIMS(4, 16));
        CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1 "gradY has dtype",
                    "FLOAT, FLOAT16 or BF16");
    }
    /* x, yOrigin, gradX must match gradY. */
    op_args a = good;
    a.x = mk(ACL_FLOAT16, DIMS(4, 16));
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1 "x has dtype FLOAT16", "gradY");
    a = good;
    a.yo = mk(ACL_BF16, DIMS(4, 8));
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1 "yOriginOptional has dtype BF16");
    a = good;
    a.gx = mk(ACL_FLOAT16, DIMS(4, 16));
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1 "gradXOut has dtype FLOAT16");
    a = full_args(ACL_FLOAT16);
    a.gx = mk(ACL_BF16, DIMS(4, 16));
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1 "gradXOut has dtype BF16");
    /* weight and gradWeight are FLOAT even when the rest is 16-bit. */
    a = full_args(ACL_FLOAT16);
    a.w = mk(ACL_FLOAT16, DIMS(4, 1));
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1 "weightOptional has dtype FLOAT16");
    a = good;
    a.w = mk(ACL_DOUBLE, DIMS(4, 1));
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1 "weightOptional has dtype DOUBLE");
    a = full_args(ACL_BF16);
    a.gw = mk(ACL_BF16, DIMS(4, 1));
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1 "gradWeightOutOptional has dtype BF16");
    /* groupIndex (revision 2) is INT64 only. */
    static const aclDataType bad_gi[] = {ACL_INT32, ACL_UINT64, ACL_FLOAT, ACL_DOUBLE};
    for (size_t i = 0; i < sizeof bad_gi / sizeof bad_gi[0]; i++) {
        a = good;
        a.gi = mk(bad_gi[i], DIMS(2));
        CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1 "groupIndexOptional has dtype",
                    "INT64");
    }
    /* Step 3 comes before step 4: a bad dtype wins over a bad shape and a bad clampLimit. */
    a = good;
    a.w = mk(ACL_INT32, DIMS(7));
    a.gx = mk(ACL_FLOAT, DIMS(3, 3));
    a.clamp = 0.0;
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1 "weightOptional has dtype INT32");
    destroy_made();
}

/* ---- step 4: shapes, ranks, clampLimit ---- */

/* A consistent problem of rank r: leading dims {2, 1, 3, 1, ...}, H = 4. */
static op_args rank_args(uint64_t r, int with_weight)
{
    int64_t gy[16], x[16];
    int64_t rows = 1;
    for (uint64_t i = 0; i + 1 < r; i++) {
        gy[i] = x[i] = i % 2 == 0 ? (int64_t)(2 + i % 3) : 1;
        rows *= gy[i];
    }
    gy[r - 1] = 4;
    x[r - 1] = 8;
    op_args a = {mk(ACL_FLOAT, r, gy), mk(ACL_FLOAT, r, x), NULL, NULL, NULL,
                 mk(ACL_FLOAT, r, x), NULL, -1.0};
    if (with_weight) {
        int64_t w[1] = {rows};
        a.w = mk(ACL_FLOAT, 1, w);
        a.gw = mk(ACL_FLOAT, 1, w);
        a.yo = mk(ACL_FLOAT, r, gy);
    }
    return a;
}

static void test_ranks_revision2(void)
{
    for (uint64_t r = 1; r <= 8; r++) {
        ACCEPTS(rank_args(r, 0));
        ACCEPTS(rank_args(r, 1));
    }
    op_args a = rank_args(9, 0);
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "gradY has rank 9", "1-8");
    a = rank_args(12, 0);
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "gradY has rank 12");
    /* Rank 0 (a scalar gradY). */
    a = rank_args(2, 0);
    a.gy = mk(ACL_FLOAT, 0, NULL);
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "gradY has rank 0");
    destroy_made();
}

static void test_ranks_revision1(void)
{
    use_abi("1");
    for (uint64_t r = 2; r <= 3; r++) {
        op_args a = rank_args(r, 0);
        a.clamp = 0.0;
        ACCEPTS(a);
    }
    static const uint64_t bad[] = {1, 4, 8};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        op_args a = rank_args(bad[i], 0);
        a.clamp = 0.0;
        CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "gradY has rank",
                    "ABI revision 1", "2-3");
    }
    use_abi(NULL);
    destroy_made();
}

static void test_shape_mismatches(void)
{
    op_args good = full_args(ACL_FLOAT);
    op_args a = good;
    a.x = mk(ACL_FLOAT, DIMS(4, 1, 16));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "x has rank 3", "gradY");
    a = good;
    a.x = mk(ACL_FLOAT, DIMS(5, 16));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "x [5, 16]", "dim 0");
    a = good;
    a.gy = mk(ACL_FLOAT, DIMS(2, 3, 8));
    a.x = mk(ACL_FLOAT, DIMS(2, 4, 16));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "x [2, 4, 16]", "dim 1");
    a = good;
    a.gy = mk(ACL_FLOAT, DIMS(4, 7));
    a.x = mk(ACL_FLOAT, DIMS(4, 15));
    a.gx = mk(ACL_FLOAT, DIMS(4, 15));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "x's last dim is 15", "even");
    a = good;
    a.x = mk(ACL_FLOAT, DIMS(4, 18));
    a.gx = mk(ACL_FLOAT, DIMS(4, 18));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "gradY's last dim is 8",
                "half");
    a = good;
    a.gx = mk(ACL_FLOAT, DIMS(2, 32));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "gradXOut has shape [2, 32]");
    a = good;
    a.gx = mk(ACL_FLOAT, DIMS(4, 1, 16));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "gradXOut has shape");
    a = good;
    a.yo = mk(ACL_FLOAT, DIMS(4, 7));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "yOriginOptional has shape [4, 7]");
    a = good;
    a.yo = mk(ACL_FLOAT, DIMS(32));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "yOriginOptional has shape");
    destroy_made();
}

static void test_optional_combinations(void)
{
    op_args good = full_args(ACL_FLOAT);
    op_args a = good;
    a.yo = NULL;
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR,
                PHASE1 "weightOptional is given without yOriginOptional");
    a = good;
    a.gw = NULL;
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR,
                PHASE1 "weightOptional is given without gradWeightOutOptional");
    a = good;
    a.w = NULL;
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR,
                PHASE1 "gradWeightOutOptional is given without weightOptional");
    /* Without weight, an empty fp32 gradWeight (as torch_npu passes; NULL data) is accepted. */
    static const int64_t empty_shapes[][2] = {{0, 0}, {0, 1}, {4, 0}};
    for (size_t i = 0; i < 3; i++) {
        a = good;
        a.w = NULL;
        a.gw = mk(ACL_FLOAT, 2, empty_shapes[i]);
        ACCEPTS(a);
    }
    a.gw = mk(ACL_FLOAT, DIMS(0));
    ACCEPTS(a);
    a.gw = mk(ACL_FLOAT16, DIMS(0));
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1 "gradWeightOutOptional has dtype");
    a.gw = mk(ACL_FLOAT, DIMS(1));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR,
                PHASE1 "gradWeightOutOptional is given without weightOptional", "[1]",
                "must be empty");
    /* yOrigin without weight is accepted (and unused). */
    a = good;
    a.w = NULL;
    a.gw = NULL;
    ACCEPTS(a);
    a.gi = NULL;
    ACCEPTS(a);
    destroy_made();
}

static void test_weight_shapes_revision2(void)
{
    op_args good = full_args(ACL_FLOAT);
    /* Any shape of rank 1-8 holding T = 4 elements, with gradWeight of the same shape. */
    const int64_t shapes[][4] = {{4}, {4, 1}, {2, 2}, {1, 4, 1, 1}, {1, 1, 1, 4}};
    const uint64_t ranks[] = {1, 2, 2, 4, 4};
    for (size_t i = 0; i < 5; i++) {
        op_args a = good;
        a.w = mk(ACL_FLOAT, ranks[i], shapes[i]);
        a.gw = mk(ACL_FLOAT, ranks[i], shapes[i]);
        ACCEPTS(a);
    }
    op_args a = good;
    a.w = mk(ACL_FLOAT, DIMS(3));
    a.gw = mk(ACL_FLOAT, DIMS(3));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "weightOptional has shape [3]",
                "T = 4");
    a = good;
    a.w = mk(ACL_FLOAT, DIMS(4, 2));
    a.gw = mk(ACL_FLOAT, DIMS(4, 2));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "weightOptional has shape [4, 2]");
    a = good;
    a.w = mk(ACL_FLOAT, 0, NULL);
    a.gw = mk(ACL_FLOAT, 0, NULL);
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "weightOptional has shape");
    a = good;
    a.gw = mk(ACL_FLOAT, DIMS(4));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR,
                PHASE1 "gradWeightOutOptional has shape [4]", "weightOptional has [4, 1]");
    a = good;
    a.gw = mk(ACL_FLOAT, DIMS(2, 2));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "gradWeightOutOptional has shape");
    destroy_made();
}

static void test_weight_shapes_revision1(void)
{
    use_abi("1");
    op_args a = full_args(ACL_FLOAT);
    a.gi = NULL;
    a.clamp = 0.0;
    ACCEPTS(a);   /* [4, 1] */
    op_args b = a;
    b.w = mk(ACL_FLOAT, DIMS(4));
    b.gw = mk(ACL_FLOAT, DIMS(4));
    CHECK_FAILS(phase1(b), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "weightOptional has shape [4]",
                "ABI revision 1");
    b = a;
    b.w = mk(ACL_FLOAT, DIMS(2, 2));
    b.gw = mk(ACL_FLOAT, DIMS(2, 2));
    CHECK_FAILS(phase1(b), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "weightOptional has shape [2, 2]");
    /* Rank 3: [B, S, 1]. */
    b.gy = mk(ACL_FLOAT, DIMS(2, 2, 8));
    b.yo = mk(ACL_FLOAT, DIMS(2, 2, 8));
    b.x = mk(ACL_FLOAT, DIMS(2, 2, 16));
    b.gx = mk(ACL_FLOAT, DIMS(2, 2, 16));
    b.w = mk(ACL_FLOAT, DIMS(2, 2, 1));
    b.gw = mk(ACL_FLOAT, DIMS(2, 2, 1));
    ACCEPTS(b);
    b.w = mk(ACL_FLOAT, DIMS(4, 1));
    b.gw = mk(ACL_FLOAT, DIMS(4, 1));
    CHECK_FAILS(phase1(b), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "weightOptional has shape [4, 1]");
    b.w = mk(ACL_FLOAT, DIMS(2, 2, 1));
    b.gw = mk(ACL_FLOAT, DIMS(4, 1));
    CHECK_FAILS(phase1(b), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "gradWeightOutOptional has shape");
    use_abi(NULL);
    destroy_made();
}

static void test_group_index_shape(void)
{
    op_args good = full_args(ACL_FLOAT);
    op_args a = good;
    a.gi = mk(ACL_INT64, DIMS(2, 1));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR,
                PHASE1 "groupIndexOptional has shape [2, 1]", "1-D");
    a.gi = mk(ACL_INT64, 0, NULL);
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "groupIndexOptional has shape []");
    a.gi = mk(ACL_INT64, DIMS(0));   /* G = 0 */
    ACCEPTS(a);
    a.gi = mk(ACL_INT64, DIMS(100));   /* any G */
    ACCEPTS(a);
    destroy_made();
}

static void test_clamp_limit_revision2(void)
{
    op_args a = full_args(ACL_FLOAT);
    static const double ok[] = {-1.0, 1.0, 0.5, 1e-30, 7.0, 1e30};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        a.clamp = ok[i];
        ACCEPTS(a);
    }
    /* Just outside the default release's (9.2.0) band |c + 1| <= 1e-6 of "off": refused. */
    static const double bad[] = {0.0, -0.0, -0.5, -2.0, -1.0 - 9 * 0x1p-23, -1.0 + 17 * 0x1p-24, -1e-30};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        a.clamp = bad[i];
        CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "clampLimit", "-1.0");
    }
    /* "Off" is compared in fp32: doubles that round to -1.0f are off, and on 9.2.0 so is every
     * fp32 within 1e-6 of -1, and NaN (it fails that release's test for "on"). */
    static const double off[] = {-1.00000001, -0.99999999, -1.0 - 0x1p-25, -1.0000001, -1.0 - 8 * 0x1p-23,
                                 -1.0 + 16 * 0x1p-24, NAN, -NAN};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
        a.clamp = off[i];
        ACCEPTS(a);
    }
    /* A limit that is on must be > 0 in fp32: positive doubles that round to 0 are refused. */
    static const double vanish[] = {1e-50, 0x1p-150, 4.9e-324};
    for (size_t i = 0; i < sizeof vanish / sizeof vanish[0]; i++) {
        a.clamp = vanish[i];
        CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "clampLimit", "in fp32");
    }
    a.clamp = 0x1p-149;   /* the smallest fp32 subnormal: on */
    ACCEPTS(a);
    /* clampLimit is checked after the shapes. */
    a.clamp = 0.0;
    a.gx = mk(ACL_FLOAT, DIMS(4, 8));
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "gradXOut has shape");
    destroy_made();
}

static void test_clamp_limit_revision1(void)
{
    use_abi("1");
    op_args a = full_args(ACL_FLOAT);
    a.gi = NULL;
    static const double ok[] = {0.0, 0.5, 1.0, 1e-30, 1e30};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        a.clamp = ok[i];
        ACCEPTS(a);
    }
    static const double bad[] = {-1.0, -0.5, -1e-30};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        a.clamp = bad[i];
        CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "clampLimit", ">= 0");
    }
    a.clamp = NAN;
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "clampLimit");
    /* The same fp32 rule for a limit that is on. */
    a.clamp = 1e-50;
    CHECK_FAILS(phase1(a), ACLNN_ERR_INNER_TILING_ERROR, PHASE1 "clampLimit", "in fp32");
    use_abi(NULL);
    destroy_made();
}

/* ACL_EMU_ABI sets the emulator's revision apart from the binding's ACL_SWIGLU_ABI, with the
 * same reading rule; unset (or blank) it follows ACL_SWIGLU_ABI. */
static void test_emulator_abi_variable(void)
{
    op_args a = full_args(ACL_FLOAT);
    use_abi("1");
    setenv("ACL_EMU_ABI", " 2\t", 1);
    CHECK_EQ_INT(aclEmuAbiRevision(), 2);
    ACCEPTS(a);   /* revision 2: a groupIndex tensor */
    setenv("ACL_EMU_ABI", "1", 1);
    use_abi("2");
    CHECK_EQ_INT(aclEmuAbiRevision(), 1);
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1 "groupIndexOptional: ",
                "ABI revision 1 takes an aclIntArray");
    setenv("ACL_EMU_ABI", "two", 1);
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1 "ACL_EMU_ABI=\"two\"");
    use_abi("junk");   /* the binding's variable does not matter while ACL_EMU_ABI decides */
    setenv("ACL_EMU_ABI", "2", 1);
    ACCEPTS(a);
    setenv("ACL_EMU_ABI", " \n", 1);   /* blank: unset, so ACL_SWIGLU_ABI decides again */
    CHECK_FAILS(phase1(a), ACLNN_ERR_PARAM_INVALID, PHASE1 "ACL_SWIGLU_ABI=\"junk\"");
    use_abi(NULL);
    ACCEPTS(a);
    unsetenv("ACL_EMU_ABI");
    CHECK_EQ_INT(aclEmuAbiRevision(), 2);
    destroy_made();
}

/* ---- empty tensors and the workspace size ---- */

static void run_empty(op_args a, aclrtStream stream)
{
    uint64_t ws = 777;
    aclOpExecutor *ex = NULL;
    CHECK_EQ_INT(aclnnSwigluGroupQuantGradGetWorkspaceSize(a.gy, a.x, a.w, a.yo, a.gi, a.clamp,
                                                           a.gx, a.gw, &ws, &ex),
                 ACLNN_SUCCESS);
    CHECK_EQ_INT(ws, 0);
    CHECK(ex != NULL);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(NULL, 0, ex, stream), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(stream), ACL_SUCCESS);
    /* The single-use executor was consumed. */
    CHECK_FAILS(aclnnSwigluGroupQuantGrad(NULL, 0, ex, stream), ACLNN_ERR_PARAM_INVALID,
                "aclnnSwigluGroupQuantGrad", "consumed");
}

static void test_empty_tensors(void)
{
    aclrtStream stream = NULL;
    CHECK_EQ_INT(aclrtCreateStream(&stream), ACL_SUCCESS);
    int64_t before = aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR);
    /* T = 0, NULL data everywhere, NULL workspace. */
    op_args a = {mk(ACL_FLOAT16, DIMS(0, 8)), mk(ACL_FLOAT16, DIMS(0, 16)), mk(ACL_FLOAT, DIMS(0)),
                 mk(ACL_FLOAT16, DIMS(0, 8)), NULL, mk(ACL_FLOAT16, DIMS(0, 16)),
                 mk(ACL_FLOAT, DIMS(0)), 1.0};
    run_empty(a, stream);
    run_empty(a, NULL);
    /* A zero leading dim in rank 3, clamp off. */
    op_args b = {mk(ACL_FLOAT, DIMS(2, 0, 8)), mk(ACL_FLOAT, DIMS(2, 0, 16)), NULL, NULL, NULL,
                 mk(ACL_FLOAT, DIMS(2, 0, 16)), NULL, -1.0};
    run_empty(b, stream);
    /* With a real groupIndex in device memory. */
    void *gi = NULL;
    int64_t values[2] = {5, 5};
    CHECK_EQ_INT(aclrtMalloc(&gi, sizeof values, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtMemcpy(gi, sizeof values, values, sizeof values, ACL_MEMCPY_HOST_TO_DEVICE),
                 ACL_SUCCESS);
    aclTensor *git = aclCreateTensor((int64_t[]){2}, 1, ACL_INT64, NULL, 0, ACL_FORMAT_ND, NULL, 0,
                                     gi);
    b.gi = git;
    run_empty(b, stream);
    /* When phase 1 asked for 0 bytes, any workspace argument is accepted. */
    uint64_t ws = 1;
    aclOpExecutor *ex = NULL;
    char host[64];
    CHECK_EQ_INT(aclnnSwigluGroupQuantGradGetWorkspaceSize(b.gy, b.x, NULL, NULL, b.gi, -1.0, b.gx,
                                                           NULL, &ws, &ex),
                 ACLNN_SUCCESS);
    CHECK_EQ_INT(ws, 0);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(host, 5, ex, stream), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(stream), ACL_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(git), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtFree(gi), ACL_SUCCESS);
    /* Non-empty T: 16384 whatever the size. */
    op_args c = rank_args(1, 0);
    ACCEPTS(c);
    CHECK_EQ_INT(last_workspace, 16384);
    op_args d = full_args(ACL_BF16);
    ACCEPTS(d);
    CHECK_EQ_INT(last_workspace, 16384);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), before);
    CHECK_EQ_INT(aclrtDestroyStream(stream), ACL_SUCCESS);
    destroy_made();
}

int main(void)
{
    emu_session session = emu_session_begin(EMU_SESSION_DEVICE);
    test_null_pointers();
    test_dead_and_foreign_handles();
    test_group_index_kind_per_revision();
    test_abi_selection();
    test_emulator_abi_variable();
    test_formats();
    test_dtypes();
    test_ranks_revision2();
    test_ranks_revision1();
    test_shape_mismatches();
    test_optional_combinations();
    test_weight_shapes_revision2();
    test_weight_shapes_revision1();
    test_group_index_shape();
    test_clamp_limit_revision2();
    test_clamp_limit_revision1();
    test_empty_tensors();
    emu_session_end(&session);
    return emu_test_finish("test_op_validation");
}
