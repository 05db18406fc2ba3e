/*
 * Golden digests of the forward (aclnnSwigluGroupQuant, modes 0 and 1): the kernel gives the
 * same bytes on every machine (x86-64 and aarch64). Each case runs the operator through the
 * public ACL path on fixed pseudo-random inputs (integer-only generation, so the inputs are the
 * same bits everywhere; a special value in every 97th element of x) with outputs that start as
 * 0xA5 bytes, and compares a 64-bit FNV-1a digest of yOut's and of yScaleOut's bytes with the
 * table below.
 *
 * The table is not this program's output: it is computed by the NumPy model of the kernel,
 * tests/forward_model.py, from the same generator (python tests/forward_model.py prints it;
 * tests/test_forward_emulator.py checks that it still agrees). Every mode, dst type,
 * round_scale and x dtype has a plain case and one with weight, clamp and groups (4 of 5 rows
 * computed, the fifth left as it was) on rows that cross the kernel's 2048-column chunk.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "aclnnop/aclnn_swiglu_group_quant.h"
#include "emu_test.h"
#include "golden_digest.h"

/* FORWARD_GOLDEN: from tests/forward_model.py; per case the digest of yOut, then of yScaleOut. */
static const golden_digest FORWARD_GOLDEN[] = {
    {"fp16 mode0 e4m3fn exact T=7 H=384", 0x75aa2c3c0aa2c266ull, 0x3a18782f727e048eull},
    {"fp16 mode0 e4m3fn exact T=5 H=2304 weight clamp groups", 0x71a6649dbd562f12ull, 0x4c5185d5e13759e0ull},
    {"fp16 mode0 e4m3fn round T=7 H=384", 0xb56c91ab05b12be0ull, 0xd6223af80638d037ull},
    {"fp16 mode0 e4m3fn round T=5 H=2304 weight clamp groups", 0x9ebf26e31333eb29ull, 0x9f2028ba4dcaad98ull},
    {"fp16 mode0 e5m2 exact T=7 H=384", 0x3010279994ea3cdfull, 0xbdba1f23b0bc6ef8ull},
    {"fp16 mode0 e5m2 exact T=5 H=2304 weight clamp groups", 0x486cf0e3dfa10b17ull, 0x6fe55947089d606cull},
    {"fp16 mode0 e5m2 round T=7 H=384", 0x54316406b8689fb2ull, 0x3014697143d3257bull},
    {"fp16 mode0 e5m2 round T=5 H=2304 weight clamp groups", 0xbaa61e067fa10705ull, 0xd5359c62bf2ecc87ull},
    {"fp16 mode1 e4m3fn T=7 H=384", 0x9850963031153b55ull, 0xbadd9fcfa5aecf9aull},
    {"fp16 mode1 e4m3fn T=5 H=2304 weight clamp groups", 0x666cfbbfdc91f349ull, 0x699cefe965c9f830ull},
    {"fp16 mode1 e5m2 T=7 H=384", 0xfa6d6d6c0f0f35cfull, 0xfcd3a65a7b26ab26ull},
    {"fp16 mode1 e5m2 T=5 H=2304 weight clamp groups", 0xbeefa7a77b186c75ull, 0x1edf26de9122cb44ull},
    {"fp16 mode1 e2m1 T=7 H=384", 0x1339a8d73be6c761ull, 0xc03ca83c47571c3aull},
    {"fp16 mode1 e2m1 T=5 H=2304 weight clamp groups", 0x20e2bb30a5694b33ull, 0x564660c716d5309eull},
    {"fp16 mode1 e1m2 T=7 H=384", 0x69478fe2575c8b0dull, 0xf3ba7b9f9206649aull},
    {"fp16 mode1 e1m2 T=5 H=2304 weight clamp groups", 0xdf9255235178ea44ull, 0x8f56fc2be0b67436ull},
    {"bf16 mode0 e4m3fn exact T=7 H=384", 0xa81474a3a05abdd2ull, 0x1104649f2fa42049ull},
    {"bf16 mode0 e4m3fn exact T=5 H=2304 weight clamp groups", 0x425cab00af26fc63ull, 0xc1168b554d3ecb79ull},
    {"bf16 mode0 e4m3fn round T=7 H=384", 0x25a73e80f32a7146ull, 0x337fb6f9364090f5ull},
    {"bf16 mode0 e4m3fn round T=5 H=2304 weight clamp groups", 0x9504137a316ee9c6ull, 0x975fac953f4a98bdull},
    {"bf16 mode0 e5m2 exact T=7 H=384", 0x964db249f2ee10deull, 0x4e2636df374bf3c2ull},
    {"bf16 mode0 e5m2 exact T=5 H=2304 weight clamp groups", 0x52f009fe6e1dfa08ull, 0xf4990bb7d8ecd3d5ull},
    {"bf16 mode0 e5m2 round T=7 H=384", 0x9d8435876eda7384ull, 0x636bb2eb99bfd811ull},
    {"bf16 mode0 e5m2 round T=5 H=2304 weight clamp groups", 0x3d24b75129459e14ull, 0x9939a26f90c3b79dull},
    {"bf16 mode1 e4m3fn T=7 H=384", 0xa9e69a68155531f8ull, 0x036e9a0950e70804ull},
    {"bf16 mode1 e4m3fn T=5 H=2304 weight clamp groups", 0x51a281d81f8c14c2ull, 0xfbfa3b20bccc1c06ull},
    {"bf16 mode1 e5m2 T=7 H=384", 0xe774f24b8b76aa12ull, 0xa0b4cdd9643ea7c9ull},
    {"bf16 mode1 e5m2 T=5 H=2304 weight clamp groups", 0xfffb2761b62e3474ull, 0x8adafba92ab8268aull},
    {"bf16 mode1 e2m1 T=7 H=384", 0x72a757da865b4572ull, 0x05ac19878682ef37ull},
    {"bf16 mode1 e2m1 T=5 H=2304 weight clamp groups", 0xdd90b0b8000a15a8ull, 0xbc2bed714c06a066ull},
    {"bf16 mode1 e1m2 T=7 H=384", 0x13d9ecd0733de5c2ull, 0x66c58b43ebd64788ull},
    {"bf16 mode1 e1m2 T=5 H=2304 weight clamp groups", 0x7b7505c6111b7e5bull, 0x40e04ff0abde8b34ull},
};

typedef struct {
    int fp16;
    aclDataType dst;
    int mode, round_scale, full;
} golden_case;

static const struct { aclDataType dst; int mode, round_scale; const char *name; } COMBINATIONS[] = {
    {ACL_FLOAT8_E4M3FN, 0, 0, "e4m3fn"}, {ACL_FLOAT8_E4M3FN, 0, 1, "e4m3fn"}, {ACL_FLOAT8_E5M2, 0, 0, "e5m2"},
    {ACL_FLOAT8_E5M2, 0, 1, "e5m2"},     {ACL_FLOAT8_E4M3FN, 1, 1, "e4m3fn"}, {ACL_FLOAT8_E5M2, 1, 1, "e5m2"},
    {ACL_FLOAT4_E2M1, 1, 1, "e2m1"},     {ACL_FLOAT4_E1M2, 1, 1, "e1m2"},
};
#define N_COMBINATIONS (sizeof COMBINATIONS / sizeof COMBINATIONS[0])
#define MAX_CASES (2 * N_COMBINATIONS * 2)

static const uint16_t SPECIAL_FP16[] = {0x4300, 0xC300, 0x5640, 0xD640, 0x7E00, 0x7C00, 0xFC00, 0x8000, 0x0001};
static const uint16_t SPECIAL_BF16[] = {0x4060, 0xC060, 0x42C8, 0xC2C8, 0x7FC0, 0x7F80, 0xFF80, 0x8000, 0x0001};
#define N_SPECIAL 9
#define SPECIAL_EVERY 97
#define CLAMP_LIMIT 3.5
static const int64_t GROUPS[] = {2, 1, 1};
#define SENTINEL 0xA5

static int is_fp4(aclDataType dst) { return dst == ACL_FLOAT4_E2M1 || dst == ACL_FLOAT4_E1M2; }
static int64_t case_rows(const golden_case *c) { return c->full ? 5 : 7; }
static int64_t case_hidden(const golden_case *c) { return c->full ? 2304 : 384; }

static uint64_t case_seed(const golden_case *c)
{
    return ((uint64_t)c->fp16 << 40) ^ ((uint64_t)c->dst << 32) ^ ((uint64_t)c->mode << 24) ^
           ((uint64_t)c->round_scale << 16) ^ ((uint64_t)case_hidden(c) << 1) ^ (uint64_t)c->full;
}

/* ---- inputs: splitmix64, turned into values without any floating-point rounding ---- */

static uint16_t *make_x(int fp16, size_t count, uint64_t seed)
{
    uint16_t *x = malloc(count * sizeof *x);
    if (x == NULL) return NULL;
    for (size_t i = 0; i < count; i++) {
        uint64_t r = golden_next_random(&seed);
        if (i % SPECIAL_EVERY == SPECIAL_EVERY - 1) {
            x[i] = (fp16 ? SPECIAL_FP16 : SPECIAL_BF16)[r % N_SPECIAL];
        } else if (fp16) {
            /* random sign and mantissa, exponent field 0..17: magnitudes below 8, subnormals too */
            x[i] = (uint16_t)(((r >> 20) & 0x8000u) | (((r >> 32) % 18) << 10) | (r & 0x3FFu));
        } else {
            /* a 24-bit integer times 2^-20, minus 8 (exact), truncated to bf16 (exact) */
            x[i] = (uint16_t)(bits_f((float)(r >> 40) * 0x1p-20f - 8.0f) >> 16);
        }
    }
    return x;
}

/* Weights in [-1, 1): a 23-bit integer times 2^-22, minus 1 (exact). */
static float *make_weight(size_t count, uint64_t seed)
{
    float *w = malloc(count * sizeof *w);
    if (w == NULL) return NULL;
    for (size_t i = 0; i < count; i++) w[i] = (float)(golden_next_random(&seed) >> 41) * 0x1p-22f - 1.0f;
    return w;
}

/* ---- one operator call through the public path ---- */

static int run_case(const golden_case *c, aclrtStream stream, uint64_t *y_digest, uint64_t *scale_digest)
{
    const int64_t T = case_rows(c), H = case_hidden(c);
    const uint64_t seed = case_seed(c);
    const size_t y_bytes = (size_t)(T * H) / (is_fp4(c->dst) ? 2 : 1);
    const size_t scale_bytes = c->mode == 0 ? (size_t)(T * H / 128) * 4 : (size_t)(T * H / 32);
    uint16_t *x = make_x(c->fp16, (size_t)(T * 2 * H), seed + 1);
    float *weight = make_weight((size_t)T, seed + 2);
    unsigned char *y = malloc(y_bytes), *scales = malloc(scale_bytes);
    int64_t x_dims[2] = {T, 2 * H}, y_dims[2] = {T, H}, w_dims[1] = {T}, g_dims[1] = {3};
    int64_t s_dims[3] = {T, c->mode == 0 ? H / 128 : H / 64, 2}, empty[1] = {0};
    golden_tensor dx = {0}, dw = {0}, dg = {0}, dy = {0}, ds = {0};
    aclTensor *origin = aclCreateTensor(empty, 1, c->fp16 ? ACL_FLOAT16 : ACL_BF16, NULL, 0, ACL_FORMAT_ND, empty, 1,
                                        NULL);
    aclOpExecutor *executor = NULL;
    uint64_t workspace_size = 0;
    void *workspace = NULL;
    int ok = x && weight && y && scales && origin &&
             golden_upload(&dx, x, (size_t)(T * 2 * H) * 2, 0, c->fp16 ? ACL_FLOAT16 : ACL_BF16, x_dims, 2) == 0 &&
             golden_upload(&dy, NULL, y_bytes, SENTINEL, c->dst, y_dims, 2) == 0 &&
             golden_upload(&ds, NULL, scale_bytes, SENTINEL, c->mode == 0 ? ACL_FLOAT : ACL_FLOAT8_E8M0, s_dims,
                    c->mode == 0 ? 2 : 3) == 0;
    if (ok && c->full) {
        ok = golden_upload(&dw, weight, (size_t)T * 4, 0, ACL_FLOAT, w_dims, 1) == 0 &&
             golden_upload(&dg, GROUPS, sizeof GROUPS, 0, ACL_INT64, g_dims, 1) == 0;
    }
    ok = ok && aclnnSwigluGroupQuantGetWorkspaceSize(dx.tensor, dw.tensor, dg.tensor, NULL, c->dst, c->mode, 0,
                                                     c->round_scale, c->full ? CLAMP_LIMIT : -1.0, 15.0, false,
                                                     dy.tensor, ds.tensor, origin, &workspace_size,
                                                     &executor) == ACLNN_SUCCESS;
    if (ok && workspace_size > 0) ok = aclrtMalloc(&workspace, workspace_size, ACL_MEM_MALLOC_HUGE_FIRST) == ACL_SUCCESS;
    ok = ok && aclnnSwigluGroupQuant(workspace, workspace_size, executor, stream) == ACLNN_SUCCESS &&
         aclrtSynchronizeStream(stream) == ACL_SUCCESS &&
         aclrtMemcpy(y, y_bytes, dy.device, y_bytes, ACL_MEMCPY_DEVICE_TO_HOST) == ACL_SUCCESS &&
         aclrtMemcpy(scales, scale_bytes, ds.device, scale_bytes, ACL_MEMCPY_DEVICE_TO_HOST) == ACL_SUCCESS;
    if (ok) {
        *y_digest = golden_fnv1a64(y, y_bytes);
        *scale_digest = golden_fnv1a64(scales, scale_bytes);
    } else {
        golden_report_failure("test_forward_golden");
    }
    if (workspace != NULL) aclrtFree(workspace);
    if (origin != NULL) aclDestroyTensor(origin);
    golden_release(&dx), golden_release(&dw), golden_release(&dg), golden_release(&dy), golden_release(&ds);
    free(x), free(weight), free(y), free(scales);
    return ok ? 0 : -1;
}

static size_t list_cases(golden_case *cases)
{
    size_t n = 0;
    for (int fp16 = 1; fp16 >= 0; fp16--) {
        for (size_t k = 0; k < N_COMBINATIONS; k++) {
            for (int full = 0; full < 2; full++) {
                cases[n++] = (golden_case){fp16, COMBINATIONS[k].dst, COMBINATIONS[k].mode,
                                           COMBINATIONS[k].round_scale, full};
            }
        }
    }
    return n;
}

static void case_name(const golden_case *c, char *out, size_t size)
{
    size_t k = 0;
    while (COMBINATIONS[k].dst != c->dst) k++;
    snprintf(out, size, "%s mode%d %s%s T=%lld H=%lld%s", c->fp16 ? "fp16" : "bf16", c->mode, COMBINATIONS[k].name,
             c->mode == 0 ? (c->round_scale ? " round" : " exact") : "", (long long)case_rows(c),
             (long long)case_hidden(c), c->full ? " weight clamp groups" : "");
}

int main(void)
{
    aclrtStream stream;
    if (golden_open("test_forward_golden", &stream) != 0) return 1;
    const golden_table table = {"test_forward_golden", FORWARD_GOLDEN, sizeof FORWARD_GOLDEN / sizeof FORWARD_GOLDEN[0],
                                "FORWARD_GOLDEN", "y", "y_scale", "model"};
    golden_case cases[MAX_CASES];
    size_t n = list_cases(cases);
    for (size_t i = 0; i < n; i++) {
        char name[96];
        uint64_t y = 0, scale = 0;
        case_name(&cases[i], name, sizeof name);
        int status = run_case(&cases[i], stream, &y, &scale);
        CHECK(status == 0);
        if (status != 0) continue;
        golden_check(&table, name, y, scale);
    }
    CHECK_EQ_INT(table.count, n);   /* no digest left over from removed cases */
    golden_close(stream);
    return emu_test_finish("test_forward_golden");
}
