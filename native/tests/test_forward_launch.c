/* aclnnSwigluGroupQuant through the public ACL path: the operator's ST cases and their expected
 * bytes, rows past trunc and yOriginOut left untouched in device memory, the 32-byte workspace
 * and a launch without it, a repeatable executor moved to new output addresses, FLOAT4 tensors
 * sized in 4-bit elements (a view one nibble past its allocation is refused, one at an odd
 * element offset is written nibble by nibble), strided x, and outputs that overlap. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "aclnnop/aclnn_swiglu_group_quant.h"
#include "emu_session.h"
#include "emu_test.h"

#define PHASE1 "aclnnSwigluGroupQuantGetWorkspaceSize"
#define PHASE2 "aclnnSwigluGroupQuant"
#define SENTINEL 0xA5

static aclrtStream g_stream;

typedef struct {
    void *device;
    size_t bytes;
    aclTensor *tensor;
} buffer;

/* `bytes` of device memory holding `host` (or SENTINEL bytes) and a tensor on it. */
static buffer make_buffer(size_t bytes, const void *host, aclDataType dtype, uint64_t ndim, const int64_t *dims,
                          const int64_t *strides, int64_t offset)
{
    buffer b = {NULL, bytes, NULL};
    CHECK_EQ_INT(aclrtMalloc(&b.device, bytes, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    if (host != NULL) CHECK_EQ_INT(aclrtMemcpy(b.device, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
    else CHECK_EQ_INT(aclrtMemset(b.device, bytes, SENTINEL, bytes), ACL_SUCCESS);
    b.tensor = aclCreateTensor(dims, ndim, dtype, strides, offset, ACL_FORMAT_ND, NULL, 0, b.device);
    CHECK(b.tensor != NULL);
    return b;
}

static void read_back(const buffer *b, void *host)
{
    CHECK_EQ_INT(aclrtMemcpy(host, b->bytes, b->device, b->bytes, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
}

static void free_buffer(buffer *b)
{
    if (b->tensor != NULL) CHECK_EQ_INT(aclDestroyTensor(b->tensor), ACLNN_SUCCESS);
    if (b->device != NULL) CHECK_EQ_INT(aclrtFree(b->device), ACL_SUCCESS);
    b->tensor = NULL;
    b->device = NULL;
}

static aclTensor *empty_origin(aclDataType dtype)
{
    aclTensor *t = aclCreateTensor((int64_t[]){0}, 1, dtype, NULL, 0, ACL_FORMAT_ND, NULL, 0, NULL);
    CHECK(t != NULL);
    return t;
}

static int phase1(const aclTensor *x, const aclTensor *weight, const aclTensor *groups, int64_t dst, int64_t mode,
                  bool round, const aclTensor *y, const aclTensor *scale, const aclTensor *origin, uint64_t *ws,
                  aclOpExecutor **ex)
{
    return aclnnSwigluGroupQuantGetWorkspaceSize(x, weight, groups, NULL, dst, mode, 0, round, -1.0, 15.0, false, y,
                                                 scale, origin, ws, ex);
}

/* Phase 2 with a 32-byte workspace, synchronised. */
static void launch(aclOpExecutor *ex)
{
    void *ws = NULL;
    CHECK_EQ_INT(aclrtMalloc(&ws, 32, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_EQ_INT(aclnnSwigluGroupQuant(ws, 32, ex, g_stream), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
    CHECK_EQ_INT(aclrtFree(ws), ACL_SUCCESS);
}

/* x0 = 1 and x1 = +1, -1, +1, ... in every row: y = +-silu(1). */
static uint16_t *st_input(int64_t rows, int64_t hidden)
{
    uint16_t *x = malloc((size_t)(rows * 2 * hidden) * sizeof *x);
    CHECK(x != NULL);
    for (int64_t t = 0; x != NULL && t < rows; t++) {
        for (int64_t h = 0; h < hidden; h++) {
            x[t * 2 * hidden + h] = 0x3C00;                              /* fp16 1.0 */
            x[t * 2 * hidden + hidden + h] = h % 2 ? 0xBC00 : 0x3C00;     /* -1.0 / +1.0 */
        }
    }
    return x;
}

/* ---- the operator's ST cases ---- */

static void test_st_fp4_cases(void)
{
    /* E2M1 [4, 512], E1M2 [2, 512] and [1, 3, 768], fp16. silu(1) = 0.7311 has exponent -1: the
     * E2M1 scale is 2^(-1 - 2) (byte 124) and 0.7311 * 8 = 5.85 rounds to 6 (code 7); the E1M2
     * scale is 2^-1 (byte 126) and 0.7311 * 2 = 1.46 rounds to 1.5 (code 6). The even element is
     * positive (low nibble), the odd one negative (high nibble, sign bit 8). */
    static const struct { aclDataType dst; uint64_t ndim; int64_t dims[3]; uint8_t byte, scale; } cases[] = {
        {ACL_FLOAT4_E2M1, 2, {4, 512}, 0xF7, 124},
        {ACL_FLOAT4_E1M2, 2, {2, 512}, 0xE6, 126},
        {ACL_FLOAT4_E1M2, 3, {1, 3, 768}, 0xE6, 126},
    };
    for (size_t i = 0; i < 3; i++) {
        const uint64_t nd = cases[i].ndim;
        int64_t rows = 1, hidden = cases[i].dims[nd - 1] / 2;
        for (uint64_t d = 0; d + 1 < nd; d++) rows *= cases[i].dims[d];
        int64_t y_dims[3], s_dims[4];
        memcpy(y_dims, cases[i].dims, sizeof y_dims);
        memcpy(s_dims, cases[i].dims, sizeof y_dims);
        y_dims[nd - 1] = hidden;
        s_dims[nd - 1] = hidden / 64;
        s_dims[nd] = 2;
        uint16_t *host = st_input(rows, hidden);
        size_t y_bytes = (size_t)(rows * hidden / 2), s_bytes = (size_t)(rows * hidden / 32);
        buffer x = make_buffer((size_t)(rows * 2 * hidden) * 2, host, ACL_FLOAT16, nd, cases[i].dims, NULL, 0);
        /* The outputs get exactly ceil(numel / 2) bytes and numel bytes: FP4 is 4-bit. */
        buffer y = make_buffer(y_bytes, NULL, cases[i].dst, nd, y_dims, NULL, 0);
        buffer s = make_buffer(s_bytes, NULL, ACL_FLOAT8_E8M0, nd + 1, s_dims, NULL, 0);
        aclTensor *origin = empty_origin(ACL_FLOAT16);
        uint64_t ws = 0;
        aclOpExecutor *ex = NULL;
        CHECK_EQ_INT(phase1(x.tensor, NULL, NULL, cases[i].dst, 1, true, y.tensor, s.tensor, origin, &ws, &ex), 0);
        CHECK_EQ_INT(ws, 32);
        if (ex != NULL) launch(ex);
        uint8_t *codes = malloc(y_bytes), *scales = malloc(s_bytes);
        read_back(&y, codes);
        read_back(&s, scales);
        int bytes_ok = 1, scales_ok = 1;
        for (size_t k = 0; k < y_bytes; k++) bytes_ok &= codes[k] == cases[i].byte;
        for (size_t k = 0; k < s_bytes; k++) scales_ok &= scales[k] == cases[i].scale;
        CHECK(bytes_ok);
        CHECK(scales_ok);
        if (!bytes_ok || !scales_ok) {
            fprintf(stderr, "ST case %zu: first byte 0x%02x (expected 0x%02x), first scale %u (expected %u)\n", i,
                    codes[0], cases[i].byte, scales[0], cases[i].scale);
        }
        free(codes), free(scales), free(host);
        CHECK_EQ_INT(aclDestroyTensor(origin), ACLNN_SUCCESS);
        free_buffer(&x), free_buffer(&y), free_buffer(&s);
    }
}

/* ---- what is not written ---- */

static void test_untouched_rows_and_origin(void)
{
    /* T = 4, groups {1, 1}: rows 2 and 3 of y and yScale keep their bytes; yOriginOut (a real
     * buffer this time) is never written; a group sum of 0 writes nothing at all. */
    const int64_t T = 4, H = 256;
    uint16_t *host = st_input(T, H);
    static const int64_t counts[2][2] = {{1, 1}, {0, 0}};
    for (int k = 0; k < 2; k++) {
        buffer x = make_buffer((size_t)(T * 2 * H) * 2, host, ACL_FLOAT16, 2, (int64_t[]){T, 2 * H}, NULL, 0);
        buffer g = make_buffer(sizeof counts[k], counts[k], ACL_INT64, 1, (int64_t[]){2}, NULL, 0);
        buffer y = make_buffer((size_t)(T * H), NULL, ACL_FLOAT8_E5M2, 2, (int64_t[]){T, H}, NULL, 0);
        buffer s = make_buffer((size_t)(T * 2) * 4, NULL, ACL_FLOAT, 2, (int64_t[]){T, 2}, NULL, 0);
        buffer o = make_buffer((size_t)(T * H) * 2, NULL, ACL_FLOAT16, 2, (int64_t[]){T, H}, NULL, 0);
        uint64_t ws = 0;
        aclOpExecutor *ex = NULL;
        CHECK_EQ_INT(phase1(x.tensor, NULL, g.tensor, ACL_FLOAT8_E5M2, 0, false, y.tensor, s.tensor, o.tensor, &ws,
                            &ex), 0);
        if (ex != NULL) launch(ex);
        uint8_t codes[4 * 256], scales[4 * 2 * 4], origin[4 * 256 * 2];
        read_back(&y, codes);
        read_back(&s, scales);
        read_back(&o, origin);
        int64_t trunc = k == 0 ? 2 : 0;
        for (int64_t t = 0; t < T; t++) {
            int untouched = 1;
            for (int64_t h = 0; h < H; h++) untouched &= codes[t * H + h] == SENTINEL;
            for (int64_t b = 0; b < 8; b++) untouched &= scales[t * 8 + b] == SENTINEL;
            CHECK_EQ_INT(untouched, t >= trunc);
        }
        int origin_untouched = 1;
        for (size_t i = 0; i < sizeof origin; i++) origin_untouched &= origin[i] == SENTINEL;
        CHECK(origin_untouched);
        free_buffer(&x), free_buffer(&g), free_buffer(&y), free_buffer(&s), free_buffer(&o);
    }
    free(host);
}

/* ---- the workspace and a repeatable executor ---- */

static void test_workspace_and_repeatable_executor(void)
{
    const int64_t T = 4, H = 256;
    uint16_t *host = st_input(T, H);
    buffer x = make_buffer((size_t)(T * 2 * H) * 2, host, ACL_FLOAT16, 2, (int64_t[]){T, 2 * H}, NULL, 0);
    buffer y = make_buffer((size_t)(T * H / 2), NULL, ACL_FLOAT4_E2M1, 2, (int64_t[]){T, H}, NULL, 0);
    buffer s = make_buffer((size_t)(T * H / 32), NULL, ACL_FLOAT8_E8M0, 3, (int64_t[]){T, H / 64, 2}, NULL, 0);
    aclTensor *origin = empty_origin(ACL_FLOAT16);
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    CHECK_EQ_INT(phase1(x.tensor, NULL, NULL, ACL_FLOAT4_E2M1, 1, true, y.tensor, s.tensor, origin, &ws, &ex), 0);
    CHECK_EQ_INT(ws, 32);
    /* Without the workspace it asked for, phase 2 fails (and consumes the executor). */
    CHECK_FAILS(aclnnSwigluGroupQuant(NULL, 0, ex, g_stream), ACLNN_ERR_PARAM_INVALID, PHASE2, "workspace is NULL",
                "32 bytes");
    CHECK_EQ_INT(phase1(x.tensor, NULL, NULL, ACL_FLOAT4_E2M1, 1, true, y.tensor, s.tensor, origin, &ws, &ex), 0);
    void *small = NULL;
    CHECK_EQ_INT(aclrtMalloc(&small, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    CHECK_FAILS(aclnnSwigluGroupQuant(small, 16, ex, g_stream), ACLNN_ERR_PARAM_INVALID, PHASE2, "workspaceSize 16");
    CHECK_EQ_INT(aclrtFree(small), ACL_SUCCESS);

    /* Repeatable: launched twice, the second time into other output buffers. */
    CHECK_EQ_INT(phase1(x.tensor, NULL, NULL, ACL_FLOAT4_E2M1, 1, true, y.tensor, s.tensor, origin, &ws, &ex), 0);
    CHECK_EQ_INT(aclSetAclOpExecutorRepeatable(ex), ACLNN_SUCCESS);
    launch(ex);
    buffer y2 = make_buffer((size_t)(T * H / 2), NULL, ACL_FLOAT4_E2M1, 2, (int64_t[]){T, H}, NULL, 0);
    buffer s2 = make_buffer((size_t)(T * H / 32), NULL, ACL_FLOAT8_E8M0, 3, (int64_t[]){T, H / 64, 2}, NULL, 0);
    CHECK_EQ_INT(aclSetOutputTensorAddr(ex, 0, y.tensor, y2.device), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclSetOutputTensorAddr(ex, 1, s.tensor, s2.device), ACLNN_SUCCESS);
    launch(ex);
    CHECK_EQ_INT(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
    uint8_t codes[2][512], scales[2][32];
    read_back(&y, codes[0]);
    read_back(&y2, codes[1]);
    read_back(&s, scales[0]);
    read_back(&s2, scales[1]);
    for (int k = 0; k < 2; k++) {
        int ok = 1;
        for (int i = 0; i < 512; i++) ok &= codes[k][i] == 0xF7;
        for (int i = 0; i < 32; i++) ok &= scales[k][i] == 124;
        CHECK(ok);
    }
    CHECK_EQ_INT(aclDestroyTensor(origin), ACLNN_SUCCESS);
    free(host);
    free_buffer(&x), free_buffer(&y), free_buffer(&s), free_buffer(&y2), free_buffer(&s2);
}

/* ---- FLOAT4 sizing and layouts ---- */

static void test_fp4_views(void)
{
    const int64_t T = 2, H = 256;
    uint16_t *host = st_input(T, H);
    buffer x = make_buffer((size_t)(T * 2 * H) * 2, host, ACL_FLOAT16, 2, (int64_t[]){T, 2 * H}, NULL, 0);
    buffer s = make_buffer((size_t)(T * H / 32), NULL, ACL_FLOAT8_E8M0, 3, (int64_t[]){T, H / 64, 2}, NULL, 0);
    aclTensor *origin = empty_origin(ACL_FLOAT16);
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    /* T * H = 512 elements in 256 bytes: at element offset 1 the view reaches byte 256. */
    buffer tight = make_buffer(256, NULL, ACL_FLOAT4_E2M1, 2, (int64_t[]){T, H}, NULL, 1);
    CHECK_FAILS(phase1(x.tensor, NULL, NULL, ACL_FLOAT4_E2M1, 1, true, tight.tensor, s.tensor, origin, &ws, &ex),
                ACLNN_ERR_PARAM_INVALID, PHASE1, "yOut", "257 bytes", "runs past the end");
    free_buffer(&tight);
    /* With one byte more it fits; the codes start in the high nibble of byte 0. */
    buffer odd = make_buffer(257, NULL, ACL_FLOAT4_E2M1, 2, (int64_t[]){T, H}, NULL, 1);
    CHECK_EQ_INT(phase1(x.tensor, NULL, NULL, ACL_FLOAT4_E2M1, 1, true, odd.tensor, s.tensor, origin, &ws, &ex), 0);
    if (ex != NULL) launch(ex);
    uint8_t bytes[257];
    read_back(&odd, bytes);
    CHECK_EQ_INT(bytes[0], 0x75);      /* low nibble: the sentinel's 5; high: element 0, +6 */
    int middle = 1;
    for (int i = 1; i < 256; i++) middle &= bytes[i] == 0x7F;   /* element 2i - 1 low (-6), 2i high (+6) */
    CHECK(middle);
    CHECK_EQ_INT(bytes[256], 0xAF);    /* the last element low, the sentinel's A high */
    free_buffer(&odd);
    /* Rows with a pitch: FP4 strides count elements too. */
    buffer pitched = make_buffer((size_t)(T * (H + 64) / 2), NULL, ACL_FLOAT4_E2M1, 2, (int64_t[]){T, H},
                                 (int64_t[]){H + 64, 1}, 0);
    CHECK_EQ_INT(phase1(x.tensor, NULL, NULL, ACL_FLOAT4_E2M1, 1, true, pitched.tensor, s.tensor, origin, &ws, &ex), 0);
    if (ex != NULL) launch(ex);
    uint8_t rows[2 * 160];
    read_back(&pitched, rows);
    int ok = 1;
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < 160; i++) ok &= rows[t * 160 + i] == (i < 128 ? 0xF7 : SENTINEL);
    }
    CHECK(ok);
    free_buffer(&pitched);
    CHECK_EQ_INT(aclDestroyTensor(origin), ACLNN_SUCCESS);
    free_buffer(&x), free_buffer(&s);
    free(host);
}

static void test_strided_x_and_overlapping_outputs(void)
{
    /* x as every other row of a [4, 512] buffer: the same codes as the ST rows. */
    const int64_t H = 256;
    uint16_t *host = st_input(4, H);
    buffer x = make_buffer(4 * 2 * H * 2, host, ACL_FLOAT16, 2, (int64_t[]){2, 2 * H}, (int64_t[]){4 * H, 1}, 0);
    buffer y = make_buffer(2 * H, NULL, ACL_FLOAT8_E4M3FN, 2, (int64_t[]){2, H}, NULL, 0);
    buffer s = make_buffer(2 * 8, NULL, ACL_FLOAT8_E8M0, 3, (int64_t[]){2, 4, 2}, NULL, 0);
    aclTensor *origin = empty_origin(ACL_FLOAT16);
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    CHECK_EQ_INT(phase1(x.tensor, NULL, NULL, ACL_FLOAT8_E4M3FN, 1, true, y.tensor, s.tensor, origin, &ws, &ex), 0);
    if (ex != NULL) launch(ex);
    uint8_t codes[512], scales[16];
    read_back(&y, codes);
    read_back(&s, scales);
    /* silu(1) = 0.7311: scale 2^ceil(log2(0.7311 / 448)) = 2^-9 (byte 118); 0.7311 * 512 = 374.3
     * is 1.4622 * 2^8, E4M3FN's nearest 1.5 * 2^8 (0x7C, negative 0xFC). */
    int ok = 1;
    for (int i = 0; i < 512; i++) ok &= codes[i] == (i % 2 ? 0xFC : 0x7C);
    for (int i = 0; i < 16; i++) ok &= scales[i] == 118;
    CHECK(ok);
    /* yScaleOut inside yOut's memory: outputs must not overlap. */
    aclTensor *inside = aclCreateTensor((int64_t[]){2, 4, 2}, 3, ACL_FLOAT8_E8M0, NULL, 0, ACL_FORMAT_ND, NULL, 0,
                                        y.device);
    CHECK_FAILS(phase1(x.tensor, NULL, NULL, ACL_FLOAT8_E4M3FN, 1, true, y.tensor, inside, origin, &ws, &ex),
                ACLNN_ERR_PARAM_INVALID, PHASE1, "yScaleOut", "yOut");
    CHECK_EQ_INT(aclDestroyTensor(inside), ACLNN_SUCCESS);
    CHECK_EQ_INT(aclDestroyTensor(origin), ACLNN_SUCCESS);
    free_buffer(&x), free_buffer(&y), free_buffer(&s);
    free(host);
}

int main(void)
{
    emu_session s = emu_session_begin(EMU_SESSION_DEVICE_STREAM);
    g_stream = s.stream;
    test_st_fp4_cases();
    test_untouched_rows_and_origin();
    test_workspace_and_repeatable_executor();
    test_fp4_views();
    test_strided_x_and_overlapping_outputs();
    emu_session_end(&s);
    return emu_test_finish("test_forward_launch");
}
