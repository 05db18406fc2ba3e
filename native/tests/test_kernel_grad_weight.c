/* gradWeight bit for bit in the device's order (docs/operator.md): the tiling of each release, the
 * ReduceSum of every element-count case, rows split across tiles, signed zeros meeting the +0.0
 * padding lanes; in the scalar kernel and every vector build this CPU runs, with 1 and 3 threads.
 * Expected values come from spec_grad_weight.h (written from the text of docs/operator.md) and from sums worked
 * out by hand. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_test.h"
#include "kernel_args.h"
#include "opapi/swiglu_kernel.h"
#include "spec_grad_weight.h"

static const swiglu_kernel_variant all_variants[] = {SWIGLU_KERNEL_SCALAR, SWIGLU_KERNEL_VECTOR,
                                                     SWIGLU_KERNEL_VECTOR_BASELINE, SWIGLU_KERNEL_VECTOR_AVX2,
                                                     SWIGLU_KERNEL_VECTOR_AVX512, SWIGLU_KERNEL_VECTOR_AVX512_BF16};
#define VARIANT_COUNT (sizeof all_variants / sizeof all_variants[0])

static const float u = 0x1p-24f;   /* 1 + u rounds (half to even) back to 1 */

static uint64_t rng_state = 0x2545F4914F6CDD1DULL;

/* Values over 24 binades with random signs, so that the order of additions shows in the bits. */
static float wide_value(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    float m = (float)(rng_state >> 40) / (float)(1u << 24);
    return ldexpf(m - 0.5f, (int)((rng_state >> 8) % 24) - 12);
}

/* The order the emulator used before it followed the device: 64-chunk trees of the whole row,
 * then the tree of the chunk sums, an odd element carried up as is. */
static float chunk_tree_of_row(const float *p, size_t n)
{
    float sums[1024];
    size_t chunks = 0;
    for (size_t c0 = 0; c0 < n; c0 += 64) sums[chunks++] = spec_tree64(p + c0, n - c0 < 64 ? n - c0 : 64);
    size_t count = chunks;
    while (count > 1) {
        size_t half = count / 2;
        for (size_t i = 0; i < half; i++) sums[i] = sums[2 * i] + sums[2 * i + 1];
        if (count & 1) sums[half] = sums[count - 1];
        count = half + (count & 1);
    }
    return count ? sums[0] : 0.0f;
}

/* ---- tiling ---- */

static void test_tiling(void)
{
    /* avail = 253952 - 32 - 8192 = 245728; a row is one tile while f*H*4 + 64 <= avail. */
    static const struct {
        aclDataType dtype;
        int clamp;
        int64_t hidden;
        swiglu_tiling tiling;
        int64_t tile;
    } cases[] = {
        /* current, bf16/fp16 + weight + clamp: f = 14 + 2 + 8 + 4 + 2 = 30, 245664 / 120 = 2047 -> 2032 */
        {ACL_BF16, 1, 2032, SWIGLU_TILING_CURRENT, 2032},
        {ACL_BF16, 1, 2047, SWIGLU_TILING_CURRENT, 2047},   /* 30 * 2047 * 4 + 64 = 245704 fits */
        {ACL_BF16, 1, 2048, SWIGLU_TILING_CURRENT, 2032},   /* 2032 + 16 */
        {ACL_BF16, 1, 2560, SWIGLU_TILING_CURRENT, 2032},   /* 2032 + 528 */
        {ACL_BF16, 1, 4096, SWIGLU_TILING_CURRENT, 2032},   /* 2032 + 2032 + 32 */
        {ACL_FLOAT16, 1, 4096, SWIGLU_TILING_CURRENT, 2032},
        /* bf16 + weight, no clamp: f = 22, 245664 / 88 = 2791 -> 2784 */
        {ACL_BF16, 0, 4096, SWIGLU_TILING_CURRENT, 2784},
        {ACL_BF16, 0, 2048, SWIGLU_TILING_CURRENT, 2048},
        /* fp32 + weight: f = 18, 245664 / 72 = 3412 -> 3408 (4096 = 3408 + 688) */
        {ACL_FLOAT, 0, 3412, SWIGLU_TILING_CURRENT, 3412},
        {ACL_FLOAT, 0, 3413, SWIGLU_TILING_CURRENT, 3408},
        {ACL_FLOAT, 0, 4096, SWIGLU_TILING_CURRENT, 3408},
        /* fp32 + weight + clamp: f = 26, 245664 / 104 = 2362 -> 2352 */
        {ACL_FLOAT, 1, 4096, SWIGLU_TILING_CURRENT, 2352},
        /* 9.1.0: weight + clamp f = 24, 245664 / 96 = 2559 -> 2544, whatever the dtype */
        {ACL_BF16, 1, 2048, SWIGLU_TILING_9_1, 2048},
        {ACL_BF16, 1, 2560, SWIGLU_TILING_9_1, 2544},       /* 2544 + 16 */
        {ACL_FLOAT, 1, 4096, SWIGLU_TILING_9_1, 2544},
        /* 9.1.0, weight: f = 16, 245664 / 64 = 3838 -> 3824 (4096 = 3824 + 272) */
        {ACL_FLOAT, 0, 3838, SWIGLU_TILING_9_1, 3838},
        {ACL_FLOAT, 0, 4096, SWIGLU_TILING_9_1, 3824},
        {ACL_BF16, 0, 4096, SWIGLU_TILING_9_1, 3824},
        /* rows of any length: the tile stays as long as the first */
        {ACL_BF16, 1, (int64_t)1 << 40, SWIGLU_TILING_CURRENT, 2032},
        {ACL_FLOAT, 0, INT64_MAX, SWIGLU_TILING_9_1, 3824},
        {ACL_BF16, 1, 0, SWIGLU_TILING_CURRENT, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t got = swiglu_tile_length(cases[i].dtype, 1, cases[i].clamp, cases[i].hidden, cases[i].tiling);
        if (got != cases[i].tile) {
            fprintf(stderr, "tiling case %zu: H %lld gives a first tile of %lld, expected %lld\n", i,
                    (long long)cases[i].hidden, (long long)got, (long long)cases[i].tile);
        }
        CHECK_EQ_INT(got, cases[i].tile);
        if (cases[i].hidden <= 8192) {
            CHECK_EQ_INT(spec_first_tile(cases[i].dtype != ACL_FLOAT, 1, cases[i].clamp, cases[i].hidden,
                                         cases[i].tiling == SWIGLU_TILING_9_1),
                         cases[i].tile);
        }
    }
    CHECK_EQ_INT(swiglu_tile_length(ACL_BF16, 1, 1, 4096, (swiglu_tiling)7), 0);
    CHECK_EQ_INT(swiglu_tile_length(ACL_BF16, 1, 1, -1, SWIGLU_TILING_CURRENT), 0);
}

static void test_release_names(void)
{
    static const struct {
        const char *text;
        int tiling;
    } cases[] = {
        {"9.1.0", SWIGLU_TILING_9_1},
        {"v9.1.0", SWIGLU_TILING_9_1},
        {"9.1.1", SWIGLU_TILING_9_1},
        {"9.2.0-alpha.3", SWIGLU_TILING_9_1},
        {"9.2.0-beta.1", SWIGLU_TILING_9_1},
        {"9.2.0-beta.2", SWIGLU_TILING_CURRENT},
        {"9.2.0-rc.1", SWIGLU_TILING_CURRENT},
        {"9.2.0", SWIGLU_TILING_CURRENT},
        {"v9.2.0", SWIGLU_TILING_CURRENT},
        {"9.10.0", SWIGLU_TILING_CURRENT},
        {"10.0.0", SWIGLU_TILING_CURRENT},
        {"9.1.0-rc.1", -1},   /* before 9.1.0: no such operator */
        {"9.0.0", -1},
        {"8.5.0", -1},
        {"", -1},
        {"9.2", -1},
        {"9.2.0-beta", -1},
        {"9.2.0-beta.", -1},
        {"9.2.0-gamma.1", -1},
        {"9.2.0beta1", -1},
        {"9.2.0 ", -1},
        {"latest", -1},
        {NULL, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got = swiglu_tiling_of_release(cases[i].text);
        if (got != cases[i].tiling) {
            fprintf(stderr, "release \"%s\" gives tiling %d, expected %d\n", cases[i].text ? cases[i].text : "(null)",
                    got, cases[i].tiling);
        }
        CHECK_EQ_INT(got, cases[i].tiling);
    }
    /* This test runs without ACL_EMU_CANN_VERSION: the current kernel. */
    CHECK_EQ_INT(swiglu_environment_tiling(), SWIGLU_TILING_CURRENT);
}

/* ---- ReduceSum ---- */

/* Every variant's ReduceSum of in[0..n) has the bits `want`. */
static void check_reduce(const float *in, size_t n, uint32_t want, const char *what)
{
    for (size_t v = 0; v < VARIANT_COUNT; v++) {
        if (!swiglu_kernel_variant_available(all_variants[v])) continue;
        float got = -1.0f;
        CHECK_EQ_INT(swiglu_kernel_reduce_sum(all_variants[v], in, n, &got), 0);
        if (bits_f(got) != want) {
            fprintf(stderr, "%s, n = %zu, variant %d: 0x%08x, expected 0x%08x\n", what, n, (int)all_variants[v],
                    bits_f(got), want);
        }
        CHECK_EQ_INT(bits_f(got), want);
    }
}

static const size_t reduce_shapes[] = {1, 2, 3, 63, 64, 65, 100, 127, 128, 129, 150, 191, 192, 193, 200, 255,
                                       256, 257, 300, 320, 1000, 2032, 2047, 3408, 3838, 4095, 4096};
#define REDUCE_SHAPE_COUNT (sizeof reduce_shapes / sizeof reduce_shapes[0])

/* Random data of every shape against the docs/operator.md ReduceSum; for the lane-folding shapes the
 * data also tells that order from the old chunk order. */
static void test_reduce_random(void)
{
    static float in[SWIGLU_REDUCE_MAX];
    for (size_t k = 0; k < REDUCE_SHAPE_COUNT; k++) {
        size_t n = reduce_shapes[k];
        int differs = 0;
        for (int trial = 0; trial < 30; trial++) {
            for (size_t i = 0; i < n; i++) in[i] = wide_value();
            float want = spec_reduce_sum(in, n);
            check_reduce(in, n, bits_f(want), "random data");
            differs += bits_f(want) != bits_f(chunk_tree_of_row(in, n));
        }
        if (n > 64 && n <= 256) CHECK(differs > 5);
    }
    float got;
    CHECK_EQ_INT(swiglu_kernel_reduce_sum(SWIGLU_KERNEL_SCALAR, in, SWIGLU_REDUCE_MAX + 1, &got), -1);
}

/* Sums worked out by hand, one per ReduceSum case, each telling the device order apart. */
static void test_reduce_by_hand(void)
{
    static float in[SWIGLU_REDUCE_MAX];
    const uint32_t one = 0x3F800000u, one_2u = 0x3F800001u, one_4u = 0x3F800002u;   /* 1, 1 + 2u, 1 + 4u */
    /* n = 1: the single element, plus +0.0 lanes */
    memset(in, 0, sizeof in);
    in[0] = 1.5f;
    check_reduce(in, 1, bits_f(1.5f), "n = 1");
    /* n = 64: ((1 + u) + (u + u)) + 0... = 1 + 2u (a left-to-right sum gives 1) */
    memset(in, 0, sizeof in);
    in[0] = 1.0f;
    in[1] = in[2] = in[3] = u;
    check_reduce(in, 64, one_2u, "n = 64");
    /* n = 65: lanes 1 + u = 1, u, u, u: (1 + u) + (u + u) = 1 + 2u. The chunk order gives
     * (1 + 2u) + u = 1 + 3u, a tie that rounds to 1 + 4u. */
    in[64] = u;
    check_reduce(in, 65, one_2u, "n = 65");
    CHECK_EQ_INT(bits_f(chunk_tree_of_row(in, 65)), one_4u);
    /* n = 128: {1 at 0, u at 1, -1 at 64}: lane 0 = 1 + -1 = 0, lane 1 = u: u. The chunk order
     * loses u: chunk 0 is 1 + u = 1, chunk 1 is -1, and 1 + -1 = 0. */
    memset(in, 0, sizeof in);
    in[0] = 1.0f;
    in[1] = u;
    in[64] = -1.0f;
    check_reduce(in, 128, bits_f(u), "n = 128");
    CHECK_EQ_INT(bits_f(chunk_tree_of_row(in, 128)), 0);
    /* n = 129 and 192: {1 at 0, u at 1, -1 at 128}: lane 0 = (1 + 0) + -1 = 0, lane 1 = u + 0: u.
     * Chunks 1, 0, -1: (1 + 0) + -1 = 0. */
    memset(in, 0, sizeof in);
    in[0] = 1.0f;
    in[1] = u;
    in[128] = -1.0f;
    check_reduce(in, 129, bits_f(u), "n = 129");
    CHECK_EQ_INT(bits_f(chunk_tree_of_row(in, 129)), 0);
    check_reduce(in, 192, bits_f(u), "n = 192");
    CHECK_EQ_INT(bits_f(chunk_tree_of_row(in, 192)), 0);
    /* n = 193: lane 0 = (1 + 0) + (-1 + 0) = 0, lane 1 = (u + 0) + 0 = u. Chunks 1, 0, -1, 0: 0. */
    check_reduce(in, 193, bits_f(u), "n = 193");
    CHECK_EQ_INT(bits_f(chunk_tree_of_row(in, 193)), 0);
    /* The grouping of the four rows of lanes: {1 at 0, u at 64, 128 and 192}.
     * 193..256: (1 + u) + (u + u) = 1 + 2u; 129..192 has no fourth row: (1 + u) + u = 1. */
    memset(in, 0, sizeof in);
    in[0] = 1.0f;
    in[64] = in[128] = in[192] = u;
    check_reduce(in, 256, one_2u, "n = 256");
    check_reduce(in, 193, one_2u, "n = 193, four rows");
    check_reduce(in, 192, one, "n = 192, three rows");
    /* n = 257: chunk sums {1, u, u, u, 0 (a chunk of one +0.0)}: (1 + u) + (u + u) = 1 + 2u */
    check_reduce(in, 257, one_2u, "n = 257");
    /* n = 4096: 64 chunks, sums {1, u, u, u, 0, ...}: 1 + 2u */
    check_reduce(in, 4096, one_2u, "n = 4096");
    /* u at 4032 and 4033: chunk 63's sum is 2u, which meets chunk 0's 1 at the top: 1 + 2u */
    memset(in, 0, sizeof in);
    in[0] = 1.0f;
    in[4032] = in[4033] = u;
    check_reduce(in, 4096, one_2u, "n = 4096, last chunk");
}

/* All products -0.0: the result's sign as the device's tree gives it. A -0.0 lane meeting a
 * +0.0 padding lane gives +0.0 (round to nearest); lanes all -0.0 stay -0.0. */
static void test_reduce_signed_zeros(void)
{
    static float in[SWIGLU_REDUCE_MAX];
    static const struct {
        size_t n;
        uint32_t bits;
    } cases[] = {
        {1, 0x00000000u},     /* 63 padding lanes */
        {63, 0x00000000u},    /* one padding lane */
        {64, 0x80000000u},    /* 64 lanes of -0.0 */
        {65, 0x80000000u},    /* 65..256: every one of the 64 lanes holds data */
        {128, 0x80000000u},
        {129, 0x80000000u},
        {192, 0x80000000u},
        {193, 0x80000000u},
        {256, 0x80000000u},
        {257, 0x00000000u},   /* the last chunk has padding lanes: its sum is +0.0 */
        {320, 0x00000000u},   /* five full chunks, but 59 padding chunk sums */
        {4032, 0x00000000u},  /* 63 full chunks and one padding chunk sum */
        {4096, 0x80000000u},  /* 64 full chunks */
    };
    for (size_t i = 0; i < SWIGLU_REDUCE_MAX; i++) in[i] = -0.0f;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        check_reduce(in, cases[k].n, cases[k].bits, "all -0.0");
        CHECK_EQ_INT(bits_f(spec_reduce_sum(in, cases[k].n)), cases[k].bits);
    }
    /* +0.0 and -0.0 mixed: one +0.0 anywhere turns the sum +0.0 */
    in[4095] = 0.0f;
    check_reduce(in, 4096, 0x00000000u, "all -0.0 but the last");
    in[4095] = -0.0f;
    in[70] = 0.0f;
    check_reduce(in, 100, 0x00000000u, "all -0.0 but one");
}

/* ---- rows through the kernel ---- */

/* Element i of a gradY or yOrigin buffer as the kernel reads it, from f made exact in the dtype
 * (bf16 truncated, fp16 rounded to nearest). */
static void store_element(aclDataType dtype, char *buf, size_t i, float f)
{
    if (dtype == ACL_FLOAT) {
        memcpy(buf + 4 * i, &f, sizeof f);
        return;
    }
    uint16_t h;
    if (dtype == ACL_BF16) {
        h = (uint16_t)(bits_f(f) >> 16);
    } else {
        _Float16 half = (_Float16)f;
        memcpy(&h, &half, sizeof h);
    }
    memcpy(buf + 2 * i, &h, sizeof h);
}

/* The value of element i of such a buffer. */
static float load_element(aclDataType dtype, const char *buf, size_t i)
{
    if (dtype == ACL_FLOAT) {
        float f;
        memcpy(&f, buf + 4 * i, sizeof f);
        return f;
    }
    uint16_t h;
    memcpy(&h, buf + 2 * i, sizeof h);
    if (dtype == ACL_BF16) return f_bits((uint32_t)h << 16);
    _Float16 half;
    memcpy(&half, &h, sizeof half);
    return (float)half;
}

/* One launch of `rows` rows of `hidden` columns with weight; gradY and yOrigin from the callbacks'
 * values (made exact in the dtype); gradWeight of every variant and thread count must equal
 * spec_grad_weight with the release's first tile. Returns how many rows the device order told
 * apart from the chunk order of the whole row. */
static int check_rows(aclDataType dtype, int clamp_on, int64_t rows, int64_t hidden, swiglu_tiling tiling,
                      const float *gy_values, const float *yo_values, const char *what)
{
    size_t es = dtype == ACL_FLOAT ? 4 : 2, count = (size_t)(rows * hidden);
    char *gy = malloc(count * es), *yo = malloc(count * es), *x = calloc(2 * count, es), *gx = malloc(2 * count * es);
    float *w = malloc((size_t)rows * sizeof *w), *gw = malloc((size_t)rows * sizeof *gw);
    float *want = malloc((size_t)rows * sizeof *want), *p = malloc((size_t)hidden * sizeof *p);
    for (size_t i = 0; i < count; i++) {
        store_element(dtype, gy, i, gy_values[i]);
        store_element(dtype, yo, i, yo_values[i]);
    }
    int64_t tile = spec_first_tile(dtype != ACL_FLOAT, 1, clamp_on, hidden, tiling == SWIGLU_TILING_9_1);
    int split_differs = 0;
    for (int64_t t = 0; t < rows; t++) {
        w[t] = 0.75f;
        /* The products come from the bytes the kernel reads, not from the values before they
         * were narrowed, so the expectation rests on exactly the kernel's inputs. Truncating
         * the floats themselves to bf16 here, f_bits(bits_f(f) & 0xFFFF0000u) under the dtype
         * branch, was miscompiled by GCC 12 on x86-64 at -O1, -O2 and -Os: its back end turns
         * that AND into a clear of the low 16 bits of a copy and multiplies the unmasked
         * floats. ctest builds and runs this test at several -O levels for such faults. */
        for (int64_t h = 0; h < hidden; h++) {
            size_t i = (size_t)(t * hidden + h);
            p[h] = load_element(dtype, gy, i) * load_element(dtype, yo, i);
        }
        want[t] = spec_grad_weight(p, hidden, tile);
        split_differs += bits_f(want[t]) != bits_f(chunk_tree_of_row(p, (size_t)hidden));
    }
    swiglu_kernel_args a;
    contiguous_args(&a, dtype, rows, hidden, gy, x, yo, w, gx, gw);
    a.clamp_on = clamp_on;
    a.clamp = 3.0f;
    a.tiling = tiling;
    for (size_t v = 0; v < VARIANT_COUNT; v++) {
        if (!swiglu_kernel_variant_available(all_variants[v])) continue;
        for (int threads = 1; threads <= 3; threads += 2) {
            memset(gw, 0xAB, (size_t)rows * sizeof *gw);
            CHECK_EQ_INT(swiglu_kernel_run(&a, threads, all_variants[v]), 0);
            for (int64_t t = 0; t < rows; t++) {
                if (bits_f(gw[t]) != bits_f(want[t])) {
                    fprintf(stderr, "%s: dtype %d H %lld tiling %d variant %d threads %d row %lld: 0x%08x, "
                            "expected 0x%08x\n", what, (int)dtype, (long long)hidden, (int)tiling,
                            (int)all_variants[v], threads, (long long)t, bits_f(gw[t]), bits_f(want[t]));
                }
                CHECK_EQ_INT(bits_f(gw[t]), bits_f(want[t]));
            }
        }
    }
    free(gy); free(yo); free(x); free(gx); free(w); free(gw); free(want); free(p);
    return split_differs;
}

/* Random wide-range rows of every split case: the kernel matches the docs/operator.md order, and the
 * data tells it from the chunk order of the whole row. */
static void test_split_rows_random(void)
{
    static const struct {
        aclDataType dtype;
        int clamp;
        int64_t hidden;
        swiglu_tiling tiling;
    } cases[] = {
        {ACL_BF16, 1, 2048, SWIGLU_TILING_CURRENT},      /* 2032 + 16 */
        {ACL_BF16, 1, 2560, SWIGLU_TILING_CURRENT},      /* 2032 + 528 */
        {ACL_BF16, 1, 4096, SWIGLU_TILING_CURRENT},      /* 2032 + 2032 + 32 */
        {ACL_FLOAT16, 1, 2048, SWIGLU_TILING_CURRENT},
        {ACL_FLOAT16, 1, 2560, SWIGLU_TILING_CURRENT},
        {ACL_FLOAT16, 1, 4096, SWIGLU_TILING_CURRENT},
        {ACL_FLOAT, 0, 4096, SWIGLU_TILING_CURRENT},     /* 3408 + 688 */
        {ACL_BF16, 1, 2560, SWIGLU_TILING_9_1},          /* 2544 + 16 */
        {ACL_FLOAT, 0, 4096, SWIGLU_TILING_9_1},         /* 3824 + 272 */
        {ACL_BF16, 1, 5000, SWIGLU_TILING_CURRENT},      /* 2032 + 2032 + 936 */
    };
    enum { ROWS = 8 };
    float *gy = malloc((size_t)ROWS * 5000 * sizeof *gy), *yo = malloc((size_t)ROWS * 5000 * sizeof *yo);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t n = ROWS * cases[k].hidden;
        for (int64_t i = 0; i < n; i++) {
            gy[i] = wide_value();
            yo[i] = wide_value();
        }
        int differs = check_rows(cases[k].dtype, cases[k].clamp, ROWS, cases[k].hidden, cases[k].tiling, gy, yo,
                                 "random split rows");
        CHECK(differs >= 3);
    }
    /* One tile under 9.1.0, split under the current kernel: bf16 + weight + clamp, H = 2048. */
    for (int64_t i = 0; i < ROWS * 2048; i++) {
        gy[i] = wide_value();
        yo[i] = wide_value();
    }
    check_rows(ACL_BF16, 1, ROWS, 2048, SWIGLU_TILING_9_1, gy, yo, "9.1.0 one tile");
    free(gy);
    free(yo);
}

/* A row worked out by hand: bf16 + weight + clamp, H = 2048 (tiles 2032 + 16). Products 1 at 0,
 * u at 2, 3, 2032 and 2033. Split: acc = {1 + u = 1, u, u, u}, ReduceSum (1 + u) + (u + u) =
 * 1 + 2u. One tile: chunk 0 gives 1 + 2u, chunk 31 (columns 1984..2047) gives 2u, and
 * (1 + 2u) + 2u = 1 + 4u. */
static void test_split_row_by_hand(void)
{
    enum { H = 2048 };
    static float gy[H], yo[H];
    for (int h = 0; h < H; h++) yo[h] = 1.0f;
    gy[0] = 1.0f;
    gy[2] = gy[3] = gy[2032] = gy[2033] = u;
    static const aclDataType dtypes[] = {ACL_BF16, ACL_FLOAT16};
    for (int d = 0; d < 2; d++) {
        CHECK_EQ_INT(check_rows(dtypes[d], 1, 1, H, SWIGLU_TILING_CURRENT, gy, yo, "hand row"), 1);
        float p[H];
        for (int h = 0; h < H; h++) p[h] = gy[h] * yo[h];
        CHECK_EQ_INT(bits_f(spec_grad_weight(p, H, 2032)), 0x3F800001u);
        CHECK_EQ_INT(bits_f(spec_grad_weight(p, H, H)), 0x3F800002u);
    }
    /* Signed zeros through a split row: all products -0.0 (gy = -1, yo = +0); H = 2048 bf16:
     * acc = -0 + -0 = -0 in every place, n = 2032 = 31 chunks + 48: the last chunk meets padding,
     * so the sum is +0.0. */
    for (int h = 0; h < H; h++) {
        gy[h] = -1.0f;
        yo[h] = 0.0f;
    }
    check_rows(ACL_BF16, 1, 1, H, SWIGLU_TILING_CURRENT, gy, yo, "-0.0 products");
    float p[H];
    for (int h = 0; h < H; h++) p[h] = gy[h] * yo[h];
    CHECK_EQ_INT(bits_f(spec_grad_weight(p, H, 2032)), 0u);
    /* 64 columns of -0.0 products, one tile: all 64 lanes -0.0, so -0.0 */
    CHECK_EQ_INT(bits_f(spec_grad_weight(p, 64, 64)), 0x80000000u);
    check_rows(ACL_FLOAT, 0, 1, 64, SWIGLU_TILING_CURRENT, gy, yo, "-0.0 products, 64 columns");
}

int main(void)
{
    test_tiling();
    test_release_names();
    test_reduce_random();
    test_reduce_by_hand();
    test_reduce_signed_zeros();
    test_split_rows_random();
    test_split_row_by_hand();
    return emu_test_finish("test_kernel_grad_weight");
}
