/* The forward kernel (aclnnSwigluGroupQuant, modes 0 and 1) on hand-made inputs whose results
 * follow from docs/forward.md by hand: special blocks and groups (all zero, inf, NaN, amax = +inf
 * and NaN in mode 1), round-half-even ties of FP8 and FP4, saturation, the FP4 sticky bit, the
 * packing order, the +0 step, the flushing division, clamp, weight, truncation (rows past it
 * untouched); each checked on every build of the kernel this CPU runs. Then every build on
 * random data full of special values, in several layouts, thread counts and floating-point
 * environments, against the scalar reference, byte for byte. */
#define _GNU_SOURCE 1   /* feenableexcept */
#include <fenv.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_test.h"
#include "forward_case.h"
#include "opapi/swiglu_quant_impl.h"

static const swiglu_kernel_variant VARIANTS[] = {SWIGLU_KERNEL_SCALAR, SWIGLU_KERNEL_VECTOR_BASELINE,
                                                 SWIGLU_KERNEL_VECTOR_AVX2, SWIGLU_KERNEL_VECTOR_AVX512,
                                                 SWIGLU_KERNEL_VECTOR};
#define N_VARIANTS (sizeof VARIANTS / sizeof VARIANTS[0])
static const aclDataType X_DTYPES[] = {ACL_FLOAT16, ACL_BF16};

#define E4M3 ACL_FLOAT8_E4M3FN
#define E5M2 ACL_FLOAT8_E5M2
#define E2M1 ACL_FLOAT4_E2M1
#define E1M2 ACL_FLOAT4_E1M2

static int run(forward_case *c, swiglu_kernel_variant v)
{
    int rc = forward_case_run(c, v);
    CHECK_EQ_INT(rc, 0);
    return rc;
}

/* ---- mode 0 ---- */

static void test_zero_block(swiglu_kernel_variant v, aclDataType xd)
{
    /* y = -0 everywhere: the +0 step makes every code +0; amax is the 1e-4 floor. */
    static const struct { aclDataType dst; int round; uint32_t scale; } cases[] = {
        {E4M3, 0, 0x346FACADu}, {E4M3, 1, 0x34800000u},   /* 1e-4f * fp32(1/448); 2^-22 */
        {E5M2, 0, 0x30EFACADu}, {E5M2, 1, 0x31000000u},   /* 1e-4f * fp32(1/57344); 2^-29 */
    };
    for (size_t i = 0; i < 4; i++) {
        forward_case c;
        forward_case_init(&c, xd, cases[i].dst, 0, cases[i].round, 1, 256);
        for (int h = 0; h < 256; h++) forward_set_y(&c, 0, h, -0.0f);
        if (run(&c, v) == 0) {
            CHECK_EQ_INT(forward_scale(&c, 0, 0), cases[i].scale);
            CHECK_EQ_INT(forward_scale(&c, 0, 1), cases[i].scale);
            for (int h = 0; h < 256; h++) CHECK_EQ_INT(forward_code(&c, 0, h), 0x00);
        }
        forward_case_free(&c);
    }
}

static void test_block_with_inf_and_nan(swiglu_kernel_variant v, aclDataType xd)
{
    /* Non-finite elements count as 0 for amax (2 here) and pass through the scaling. */
    static const float values[] = {INFINITY, -INFINITY, NAN, 2.0f, 1.0f, -2.0f, 0.0f};
    static const struct { aclDataType dst; int round; uint32_t scale; uint8_t codes[7]; } cases[] = {
        /* 2^-7; inv 128: 2 -> 256, 1 -> 128 */
        {E4M3, 1, 0x3C000000u, {0x7F, 0x7F, 0x7F, 0x78, 0x70, 0xF8, 0x00}},
        /* 2 * fp32(1/448) exactly; inv 448 / 2 = 224: 2 -> 448, 1 -> 224 */
        {E4M3, 0, 0x3B924925u, {0x7F, 0x7F, 0x7F, 0x7E, 0x76, 0xFE, 0x00}},
        /* 2^-14; inv 2^14: 2 -> 2^15, 1 -> 2^14 */
        {E5M2, 1, 0x38800000u, {0x7C, 0xFC, 0x7E, 0x78, 0x74, 0xF8, 0x00}},
    };
    for (size_t i = 0; i < 3; i++) {
        forward_case c;
        forward_case_init(&c, xd, cases[i].dst, 0, cases[i].round, 1, 128);
        for (int h = 0; h < 7; h++) forward_set_y(&c, 0, h, values[h]);
        if (run(&c, v) == 0) {
            CHECK_EQ_INT(forward_scale(&c, 0, 0), cases[i].scale);
            for (int h = 0; h < 7; h++) CHECK_EQ_INT(forward_code(&c, 0, h), cases[i].codes[h]);
        }
        forward_case_free(&c);
    }
    /* A block of nothing but inf and NaN: the floor's scale, the elements as they are. */
    forward_case c;
    forward_case_init(&c, xd, E5M2, 0, 0, 1, 128);
    for (int h = 0; h < 128; h++) forward_set_y(&c, 0, h, values[h % 3]);
    if (run(&c, v) == 0) {
        CHECK_EQ_INT(forward_scale(&c, 0, 0), 0x30EFACADu);
        for (int h = 0; h < 128; h++) CHECK_EQ_INT(forward_code(&c, 0, h), ((const uint8_t[]){0x7C, 0xFC, 0x7E})[h % 3]);
    }
    forward_case_free(&c);
}

/* Mode 0 with round_scale on one row of 128 whose first `count` elements are `values` (the
 * first of them dst's largest finite value, so that the scale is 1): each element's code must be
 * the one in `codes`. */
static void check_unit_scale_codes(swiglu_kernel_variant v, aclDataType xd, aclDataType dst, const float *values,
                                   const uint8_t *codes, size_t count)
{
    forward_case c;
    forward_case_init(&c, xd, dst, 0, 1, 1, 128);
    for (size_t k = 0; k < count; k++) forward_set_y(&c, 0, (int64_t)k, values[k]);
    if (run(&c, v) == 0) {
        CHECK_EQ_INT(forward_scale(&c, 0, 0), 0x3F800000u);
        for (size_t k = 0; k < count; k++) {
            uint8_t got = forward_code(&c, 0, (int64_t)k);
            EMU_TEST_COUNT(emu_test_checks);
            if (got != codes[k]) {
                EMU_TEST_COUNT(emu_test_failures);
                fprintf(stderr, "%s:%d: dst %d element %zu (%a) has code 0x%02x, expected 0x%02x\n", __FILE__,
                        __LINE__, (int)dst, k, (double)values[k], got, codes[k]);
            }
        }
    }
    forward_case_free(&c);
}

static void test_fp8_rounding(swiglu_kernel_variant v, aclDataType xd)
{
    /* E4M3FN: 448 sets the scale to 1. 1.0625 is the tie of 1 and 1.125 (even: 1), 1.1875 of
     * 1.125 and 1.25 (even: 1.25), 232 of 224 and 240 (even: 224); subnormals step by 2^-9:
     * 1.5 steps -> 2, 2.5 steps -> 2, 0.5 steps -> 0, 7.5 steps -> 8 (the smallest normal). */
    static const float e4m3_values[] = {448.0f, 1.0625f, 1.1875f, -1.0625f, 232.0f, 0x1.8p-9f, 0x1.4p-8f,
                                        0x1p-10f, 0x1.ep-7f, 1.0703125f};
    static const uint8_t e4m3_codes[] = {0x7E, 0x38, 0x3A, 0xB8, 0x76, 0x02, 0x02, 0x00, 0x08, 0x39};
    /* E5M2: 57344 sets the scale to 1. 1.125: tie of 1 and 1.25 -> 1; 1.375: of 1.25 and 1.5 ->
     * 1.5; subnormals step by 2^-16: 2.5 steps -> 2, 3.5 steps -> 4 (the smallest normal). */
    static const float e5m2_values[] = {57344.0f, 1.125f, 1.375f, -1.375f, 0x1.4p-15f, 0x1.cp-15f, 0x1p-17f};
    static const uint8_t e5m2_codes[] = {0x7B, 0x3C, 0x3E, 0xBE, 0x02, 0x04, 0x00};
    _Static_assert(sizeof e4m3_values / sizeof e4m3_values[0] == sizeof e4m3_codes, "a code per E4M3FN value");
    _Static_assert(sizeof e5m2_values / sizeof e5m2_values[0] == sizeof e5m2_codes, "a code per E5M2 value");
    check_unit_scale_codes(v, xd, E4M3, e4m3_values, e4m3_codes, sizeof e4m3_codes);
    check_unit_scale_codes(v, xd, E5M2, e5m2_values, e5m2_codes, sizeof e5m2_codes);
}

/* ---- mode 1, FP8 ---- */

static void test_mx_fp8_groups(swiglu_kernel_variant v, aclDataType xd)
{
    /* Group 0 holds +inf: E = 128, byte 0xFF, multiplier -inf (finite y change sign and become
     * infinite, 0 becomes NaN). Group 1 holds NaN: E = 129, byte 0x00, multiplier -2^127 (finite
     * non-zero y overflow, 0 becomes -0). Group 2's max is the type's max: scale 1 (byte 127).
     * Group 3's max 450 is just above 448: scale 2 (byte 128), 450 -> 225 -> 224. */
    static const float g0[] = {INFINITY, 1.0f, -2.0f, 0.0f}, g1[] = {NAN, 1.0f, -1.0f, 0.0f};
    static const struct { aclDataType dst; float max; uint8_t c0[4], c1[4], c2_max, c2_one; uint8_t c3_max; } cases[] = {
        {E5M2, 57344.0f, {0xFC, 0xFC, 0x7C, 0x7E}, {0x7E, 0xFC, 0x7C, 0x80}, 0x7B, 0x3C, 0},
        {E4M3, 448.0f, {0x7F, 0x7F, 0x7F, 0x7F}, {0x7F, 0x7F, 0x7F, 0x80}, 0x7E, 0x38, 0x76},
    };
    for (size_t i = 0; i < 2; i++) {
        forward_case c;
        forward_case_init(&c, xd, cases[i].dst, 1, 1, 1, 128);
        for (int k = 0; k < 4; k++) {
            forward_set_y(&c, 0, k, g0[k]);
            forward_set_y(&c, 0, 32 + k, g1[k]);
        }
        forward_set_y(&c, 0, 64, cases[i].max);
        forward_set_y(&c, 0, 65, 1.0f);
        if (cases[i].dst == E4M3) forward_set_y(&c, 0, 96, 450.0f);
        if (run(&c, v) == 0) {
            CHECK_EQ_INT(forward_scale(&c, 0, 0), 0xFF);
            CHECK_EQ_INT(forward_scale(&c, 0, 1), 0x00);
            CHECK_EQ_INT(forward_scale(&c, 0, 2), 127);
            for (int k = 0; k < 4; k++) {
                CHECK_EQ_INT(forward_code(&c, 0, k), cases[i].c0[k]);
                CHECK_EQ_INT(forward_code(&c, 0, 32 + k), cases[i].c1[k]);
            }
            /* The rest of group 0 is +0 * -inf = NaN; of group 1, +0 * -2^127 = -0. */
            CHECK_EQ_INT(forward_code(&c, 0, 20), cases[i].dst == E5M2 ? 0x7E : 0x7F);
            CHECK_EQ_INT(forward_code(&c, 0, 50), 0x80);
            CHECK_EQ_INT(forward_code(&c, 0, 64), cases[i].c2_max);
            CHECK_EQ_INT(forward_code(&c, 0, 65), cases[i].c2_one);
            if (cases[i].dst == E4M3) {
                CHECK_EQ_INT(forward_scale(&c, 0, 3), 128);
                CHECK_EQ_INT(forward_code(&c, 0, 96), cases[i].c3_max);
            } else {
                CHECK_EQ_INT(forward_scale(&c, 0, 3), 98);   /* an all-zero group: 2^-29 */
            }
        }
        forward_case_free(&c);
    }
}

/* ---- mode 1, FP4 ---- */

static void set_group(forward_case *c, int64_t first, const float *values, size_t n)
{
    for (size_t k = 0; k < n; k++) forward_set_y(c, 0, first + (int64_t)k, values[k]);
}

static void check_group_codes(const forward_case *c, int64_t first, const float *values, const uint8_t *codes,
                              size_t n, int line)
{
    for (size_t k = 0; k < n; k++) {
        uint8_t got = forward_code(c, 0, first + (int64_t)k);
        EMU_TEST_COUNT(emu_test_checks);
        if (got != codes[k]) {
            EMU_TEST_COUNT(emu_test_failures);
            fprintf(stderr, "%s:%d: %s element %zu (%a) has code 0x%x, expected 0x%x\n", __FILE__, line,
                    c->x_dtype == ACL_FLOAT16 ? "fp16" : "bf16", k, (double)values[k], got, codes[k]);
        }
    }
}

static void test_fp4_rounding(swiglu_kernel_variant v, aclDataType xd)
{
    /* E2M1 (0, 0.5, 1, 1.5, 2, 3, 4, 6): a group max in [4, 8) gives scale 2^0 (byte 127, the
     * exponent of the max minus 2) and multiplier 1. Ties go to the even code; 7.5 saturates. */
    static const float e2m1[] = {7.5f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -1.25f, 0.5f, -0.0f, 0.1875f};
    static const uint8_t e2m1_codes[] = {0x7, 0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0xA, 0x1, 0x8, 0x0};
    /* E1M2 (steps of 0.25 up to 1.75): a max in [1, 2) gives scale 2^0 (byte 127). */
    static const float e1m2[] = {1.875f, 0.125f, 0.375f, 0.625f, 0.875f, 1.125f, 1.375f, 1.625f, -0.375f, 1.75f};
    static const uint8_t e1m2_codes[] = {0x7, 0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0xA, 0x7};
    forward_case c;
    forward_case_init(&c, xd, E2M1, 1, 1, 1, 128);
    set_group(&c, 0, e2m1, sizeof e2m1 / sizeof e2m1[0]);
    set_group(&c, 32, e1m2, sizeof e1m2 / sizeof e1m2[0]);   /* max 1.875: exponent 0 is below 6's: byte 127 - 2 */
    if (run(&c, v) == 0) {
        CHECK_EQ_INT(forward_scale(&c, 0, 0), 127);
        check_group_codes(&c, 0, e2m1, e2m1_codes, sizeof e2m1_codes, __LINE__);
        CHECK_EQ_INT(forward_scale(&c, 0, 1), 125);   /* 2^-2: the multiplier 4 */
        CHECK_EQ_INT(forward_code(&c, 0, 32), 0x7);    /* 1.875 * 4 = 7.5 -> 6 */
        CHECK_EQ_INT(forward_code(&c, 0, 33), 0x1);    /* 0.125 * 4 = 0.5 */
        CHECK_EQ_INT(forward_scale(&c, 0, 2), 0);      /* an all-zero group */
        CHECK_EQ_INT(forward_code(&c, 0, 64), 0x0);
    }
    forward_case_free(&c);
    forward_case_init(&c, xd, E1M2, 1, 1, 1, 128);
    set_group(&c, 0, e1m2, sizeof e1m2 / sizeof e1m2[0]);
    if (run(&c, v) == 0) {
        CHECK_EQ_INT(forward_scale(&c, 0, 0), 127);
        check_group_codes(&c, 0, e1m2, e1m2_codes, sizeof e1m2_codes, __LINE__);
    }
    forward_case_free(&c);
}

static void test_fp4_sticky_bit(swiglu_kernel_variant v)
{
    /* fp16 values just above a tie whose extra bits lie in bits 0-2, which truncation to bf16
     * drops: bit 3 keeps them, so they round up. Exact ties stay ties (even code). */
    const aclDataType xd = ACL_FLOAT16;
    forward_case c;
    forward_case_init(&c, xd, E2M1, 1, 1, 1, 128);
    /* 6 sets multiplier 1; 0x3D01 = 1.25 + 2^-10, 0x3D00 = 1.25, 0x3D08 = 1.25 + 2^-7 (already
     * kept by bf16), 0x3E01 = 1.5 + 2^-10 (not a tie at all). */
    static const uint16_t e2m1_bits[] = {0x4600, 0x3D01, 0x3D00, 0x3D08, 0x3E01, 0xBD01};
    static const uint8_t e2m1_codes[] = {0x7, 0x3, 0x2, 0x3, 0x3, 0xB};
    float values[6];
    for (int k = 0; k < 6; k++) values[k] = forward_float16(xd, e2m1_bits[k]);
    set_group(&c, 0, values, 6);
    if (run(&c, v) == 0) check_group_codes(&c, 0, values, e2m1_codes, 6, __LINE__);
    forward_case_free(&c);
    /* E1M2: 1.75 sets multiplier 1; 0x3C81 = 1.125 + 2^-10 rounds up to 1.25, 0x3C80 = 1.125 is
     * the tie of 1 and 1.25 (even: 1). */
    forward_case_init(&c, xd, E1M2, 1, 1, 1, 128);
    static const uint16_t e1m2_bits[] = {0x3F00, 0x3C81, 0x3C80, 0xBC81};
    static const uint8_t e1m2_codes[] = {0x7, 0x5, 0x4, 0xD};
    for (int k = 0; k < 4; k++) values[k] = forward_float16(xd, e1m2_bits[k]);
    set_group(&c, 0, values, 4);
    if (run(&c, v) == 0) check_group_codes(&c, 0, values, e1m2_codes, 4, __LINE__);
    forward_case_free(&c);
}

static void test_fp4_special_groups(swiglu_kernel_variant v, aclDataType xd)
{
    /* inf or NaN in a group: byte 0xFF and every code 0 (NaN becomes +0). The +0 step is not
     * done: -0 stays -0 (0x8) in a normal group. Packing: element 2i low nibble, 2i+1 high. */
    forward_case c;
    forward_case_init(&c, xd, E2M1, 1, 1, 1, 128);
    forward_set_y(&c, 0, 0, INFINITY);
    forward_set_y(&c, 0, 1, 4.0f);
    forward_set_y(&c, 0, 33, NAN);
    forward_set_y(&c, 0, 34, -1.0f);
    forward_set_y(&c, 0, 64, 0.5f);   /* group 2: max 1.0 -> byte 127 - 2 = 125, multiplier 4 */
    forward_set_y(&c, 0, 65, 1.0f);
    forward_set_y(&c, 0, 66, -0.0f);
    if (run(&c, v) == 0) {
        CHECK_EQ_INT(forward_scale(&c, 0, 0), 0xFF);
        CHECK_EQ_INT(forward_scale(&c, 0, 1), 0xFF);
        CHECK_EQ_INT(forward_scale(&c, 0, 2), 125);
        CHECK_EQ_INT(forward_scale(&c, 0, 3), 0);
        for (int k = 0; k < 32; k++) CHECK_EQ_INT(c.y[k], 0x00);     /* groups 0 and 1 */
        CHECK_EQ_INT(c.y[32], 0x64);                                 /* 2 (code 4) low, 4 (code 6) high */
        CHECK_EQ_INT(c.y[33], 0x08);                                 /* -0 low, +0 high */
    }
    forward_case_free(&c);
    if (xd == ACL_BF16) {
        /* A bf16-subnormal group max has exponent key 0: byte 0, multiplier 0. */
        forward_case_init(&c, xd, E1M2, 1, 1, 1, 128);
        float weight = 0x1p-3f;
        c.weight = &weight;
        for (int k = 0; k < 32; k++) forward_set_x(&c, 0, k, forward_bits16(xd, 128.0f), k % 2 ? 0x8001 : 0x0001);
        if (run(&c, v) == 0) {   /* y = +-128 * 2^-133 * 2^-3 = +-2^-129 */
            CHECK_EQ_INT(forward_scale(&c, 0, 0), 0);
            for (int k = 0; k < 16; k++) CHECK_EQ_INT(c.y[k], 0x80);   /* +0 low, -0 high */
        }
        forward_case_free(&c);
    }
}

/* ---- the core ---- */

static void test_flushing_division(swiglu_kernel_variant v)
{
    /* A bf16-subnormal gate is read as +0 by the division: y = +0 * -2^120 = -0, then +0 by the
     * +0 step. Without the flush, y would be -2^-14 and code 0xE8 at this block's scale 2^-20. */
    forward_case c;
    forward_case_init(&c, ACL_BF16, E4M3, 0, 1, 1, 128);
    forward_set_x(&c, 0, 0, 0x0001, 0xFB80);
    forward_set_y(&c, 0, 1, 0x1p-12f);
    if (run(&c, v) == 0) {
        CHECK_EQ_INT(forward_scale(&c, 0, 0), 107u << 23);   /* 2^-20 */
        CHECK_EQ_INT(forward_code(&c, 0, 0), 0x00);
        CHECK_EQ_INT(forward_code(&c, 0, 1), 0x78);          /* 2^-12 * 2^20 = 256 */
    }
    forward_case_free(&c);
}

static void test_clamp_and_weight(swiglu_kernel_variant v, aclDataType xd)
{
    /* c = 96: x0 = 128 becomes 96 (exp(-96) flushes: the swish is 96); x1 is clipped to
     * [-96, 96]; a gate far below is not clamped (e = inf, swish -0). Weight -0.5 scales the row. */
    forward_case c;
    forward_case_init(&c, xd, E5M2, 0, 1, 1, 128);
    c.clamp_on = 1;
    c.clamp = 96.0f;
    float weight = -0.5f;
    c.weight = &weight;
    const uint16_t x0 = forward_bits16(xd, 128.0f);
    forward_set_x(&c, 0, 0, x0, forward_bits16(xd, 200.0f));   /* 96 * 96 * -0.5 = -4608 */
    forward_set_x(&c, 0, 1, x0, forward_bits16(xd, -200.0f));  /* +4608 */
    forward_set_x(&c, 0, 2, x0, forward_bits16(xd, 50.0f));    /* -2400 */
    forward_set_x(&c, 0, 3, forward_bits16(xd, -200.0f), forward_bits16(xd, 5.0f));   /* -0 * ... = +0 */
    forward_set_x(&c, 0, 4, forward_bits16(xd, NAN), forward_bits16(xd, 1.0f));       /* NaN */
    if (run(&c, v) == 0) {
        /* amax 4608: 4608 / 57344 in (2^-4, 2^-3]: scale 2^-3, multiplier 8. 4608 * 8 = 1.125 * 2^15
         * (tie: 2^15); 2400 * 8 = 1.171875 * 2^14 (nearest: 1.25 * 2^14). */
        CHECK_EQ_INT(forward_scale(&c, 0, 0), 124u << 23);
        CHECK_EQ_INT(forward_code(&c, 0, 0), 0xF8);
        CHECK_EQ_INT(forward_code(&c, 0, 1), 0x78);
        CHECK_EQ_INT(forward_code(&c, 0, 2), 0xF5);
        CHECK_EQ_INT(forward_code(&c, 0, 3), 0x00);
        CHECK_EQ_INT(forward_code(&c, 0, 4), 0x7E);
    }
    forward_case_free(&c);
    /* A NaN weight makes the whole row NaN: mode 1 gives every group byte 0 and NaN codes. */
    forward_case_init(&c, xd, E4M3, 1, 1, 1, 128);
    weight = NAN;
    c.weight = &weight;
    if (run(&c, v) == 0) {
        for (int k = 0; k < 4; k++) CHECK_EQ_INT(forward_scale(&c, 0, k), 0);
        for (int h = 0; h < 128; h++) CHECK_EQ_INT(forward_code(&c, 0, h), 0x7F);
    }
    forward_case_free(&c);
}

/* ---- truncation ---- */

static int row_untouched(const forward_case *c, int64_t t)
{
    size_t y_row = c->y_bytes / (size_t)c->rows, s_row = c->scale_bytes / (size_t)c->rows;
    for (size_t i = 0; i < y_row; i++) {
        if (c->y[(size_t)t * y_row + i] != FORWARD_SENTINEL) return 0;
    }
    for (size_t i = 0; i < s_row; i++) {
        if (c->scales[(size_t)t * s_row + i] != FORWARD_SENTINEL) return 0;
    }
    return 1;
}

static void test_truncation(swiglu_kernel_variant v)
{
    static const struct { int64_t count; int64_t groups[3]; int64_t trunc; } cases[] = {
        {2, {2, 1}, 3},                         /* rows past the sum are left as they were */
        {2, {4, -10}, 0},                       /* a negative sum: nothing written */
        {2, {INT64_MAX, 2}, 0},                 /* wraps to a negative sum */
        {3, {INT64_MAX, INT64_MAX, 3}, 1},      /* wraps to 1 */
        {1, {100}, 6},                          /* more than T: all rows */
        {1, {0}, 0},
        {0, {0}, 0},                            /* no counts at all */
    };
    static const aclDataType dsts[] = {E4M3, E2M1};
    for (size_t d = 0; d < 2; d++) {
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            forward_case c;
            forward_case_init(&c, ACL_FLOAT16, dsts[d], d == 0 ? 0 : 1, 1, 6, 128);
            c.group_count = cases[i].count;
            memcpy(c.groups, cases[i].groups, sizeof cases[i].groups);
            for (int64_t t = 0; t < 6; t++) forward_set_y(&c, t, 0, 1.0f);
            swiglu_quant_args a;
            forward_args(&c, &a);
            CHECK_EQ_INT(swiglu_quant_trunc(&a) < 0 ? 0 : swiglu_quant_trunc(&a), cases[i].trunc);
            if (run(&c, v) == 0) {
                for (int64_t t = 0; t < 6; t++) CHECK_EQ_INT(row_untouched(&c, t), t >= cases[i].trunc);
            }
            forward_case_free(&c);
        }
    }
}

/* ---- every build against the scalar one ---- */

static uint64_t rng = 0x243F6A8885A308D3ull;

static uint64_t next_random(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static uint16_t random_bits(aclDataType xd)
{
    static const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, 100.0f, -100.0f, 88.5f, -88.75f, -87.5f,
                                     0.0f, -0.0f, 3.5f, -3.5f, 65504.0f, 1e-7f, -1e-7f};
    uint64_t r = next_random();
    if (r % 29 == 0) {
        uint16_t b = forward_bits16(xd, specials[(r >> 8) % (sizeof specials / sizeof specials[0])]);
        return (r >> 40) % 5 == 0 ? (uint16_t)((r >> 20) & 0x8007) : b;   /* and subnormals */
    }
    if (xd == ACL_BF16) return (uint16_t)(bits_f((float)((int64_t)(r >> 20) % 200001 - 100000) * 6e-5f) >> 16);
    return (uint16_t)(((r >> 20) & 0x8000) | (((r >> 32) % 20) << 10) | (r & 0x3FF));
}

typedef struct {
    aclDataType xd, dst;
    int mode, round;
} combination;

static const combination COMBINATIONS[] = {
    {0, E4M3, 0, 0}, {0, E4M3, 0, 1}, {0, E5M2, 0, 0}, {0, E5M2, 0, 1},
    {0, E4M3, 1, 1}, {0, E5M2, 1, 1}, {0, E2M1, 1, 1}, {0, E1M2, 1, 1},
};

#define CMP_ROWS 9
#define CMP_HIDDEN 2304   /* crosses the kernel's 2048-column chunk */

/* Runs a random problem in a layout: x with a column step, y with a row pitch (and, for FP4, an
 * odd element offset), y_scale with a row pitch; returns the codes and scales as a contiguous
 * problem would hold them. */
static void run_layout(const combination *k, const uint16_t *x_dense, const float *w, const int64_t *groups,
                       int clamp_on, swiglu_kernel_variant v, int threads, int strided, uint8_t *codes,
                       uint8_t *scales)
{
    const int64_t T = CMP_ROWS, H = CMP_HIDDEN, step = strided ? 3 : 1;
    const int fp4 = forward_is_fp4(k->dst);
    const int64_t per_scale = k->mode == 0 ? 128 : 32, S = H / per_scale, scale_size = k->mode == 0 ? 4 : 1;
    const int64_t y_pitch = strided ? H + 6 : H, y_offset = strided && fp4 ? 3 : 0, s_pitch = strided ? S + 5 : S;
    uint16_t *x = calloc((size_t)(T * 2 * H * step), sizeof *x);
    size_t y_bytes = (size_t)((T * y_pitch + y_offset) / (fp4 ? 2 : 1) + 1);
    uint8_t *y = malloc(y_bytes), *s = malloc((size_t)(T * s_pitch * scale_size));
    CHECK(x != NULL && y != NULL && s != NULL);
    if (x == NULL || y == NULL || s == NULL) return;
    /* Both nibbles alike: rows past trunc read the same in every layout. */
    memset(y, 0xAA, y_bytes);
    memset(s, 0xAA, (size_t)(T * s_pitch * scale_size));
    for (int64_t i = 0; i < T * 2 * H; i++) x[i * step] = x_dense[i];
    swiglu_quant_args a;
    memset(&a, 0, sizeof a);
    a.x_dtype = k->xd;
    a.dst = k->dst;
    a.mode = k->mode == 0 ? SWIGLU_QUANT_MODE_BLOCK : SWIGLU_QUANT_MODE_MX;
    a.round_scale = k->round;
    a.rows = T;
    a.hidden = H;
    a.x = (swiglu_quant_view){(char *)x, 0, 2, {T, 2 * H}, {2 * H * step, step}};
    if (w != NULL) {
        a.has_weight = 1;
        a.weight = (swiglu_quant_view){(char *)w, 0, 1, {T}, {1}};
    }
    if (groups != NULL) {
        a.has_groups = 1;
        a.group_index = (swiglu_quant_view){(char *)groups, 0, 1, {2}, {1}};
    }
    a.clamp_on = clamp_on;
    a.clamp = 3.5f;
    a.y = (swiglu_quant_view){(char *)y, y_offset, 2, {T, H}, {y_pitch, 1}};
    if (k->mode == 0) {
        a.y_scale = (swiglu_quant_view){(char *)s, 0, 2, {T, S}, {s_pitch, 1}};
    } else {
        a.y_scale = (swiglu_quant_view){(char *)s, 0, 3, {T, S / 2, 2}, {s_pitch, 2, 1}};
    }
    CHECK_EQ_INT(swiglu_quant_run(&a, threads, v), 0);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = 0; h < H; h++) {
            int64_t e = y_offset + t * y_pitch + h;
            uint8_t code = fp4 ? (uint8_t)(e % 2 ? y[e / 2] >> 4 : y[e / 2] & 0xF) : y[e];
            if (fp4) {
                uint8_t *out = &codes[(t * H + h) / 2];
                *out = h % 2 ? (uint8_t)((*out & 0x0F) | code << 4) : (uint8_t)((*out & 0xF0) | code);
            } else {
                codes[t * H + h] = code;
            }
        }
        memcpy(scales + t * S * scale_size, s + t * s_pitch * scale_size, (size_t)(S * scale_size));
    }
    free(x);
    free(y);
    free(s);
}

static void set_caller_environment(int hostile)
{
    if (hostile) {
        fesetround(FE_UPWARD);
#if defined(__x86_64__)
        unsigned int csr = 0x1F80u | 0x8040u;   /* flush-to-zero and denormals-are-zero on */
        __asm__ __volatile__("ldmxcsr %0" : : "m"(csr));
#endif
        feenableexcept(FE_INVALID | FE_DIVBYZERO | FE_OVERFLOW);
    } else {
        fedisableexcept(FE_ALL_EXCEPT);
        fesetround(FE_TONEAREST);
#if defined(__x86_64__)
        unsigned int csr = 0x1F80u;
        __asm__ __volatile__("ldmxcsr %0" : : "m"(csr));
#endif
    }
}

static void test_builds_agree(void)
{
    const int64_t T = CMP_ROWS, H = CMP_HIDDEN;
    size_t n = (size_t)(T * 2 * H);
    uint16_t *x = malloc(n * sizeof *x);
    uint8_t *reference = malloc((size_t)(T * H)), *codes = malloc((size_t)(T * H));
    uint8_t *ref_scales = malloc((size_t)(T * H / 32 * 4)), *scales = malloc((size_t)(T * H / 32 * 4));
    float w[CMP_ROWS];
    static const int64_t groups[2] = {5, 2};   /* trunc 7 of 9 */
    CHECK(x && reference && codes && ref_scales && scales);
    if (!(x && reference && codes && ref_scales && scales)) return;
    for (size_t xi = 0; xi < 2; xi++) {
        for (size_t ki = 0; ki < sizeof COMBINATIONS / sizeof COMBINATIONS[0]; ki++) {
            combination k = COMBINATIONS[ki];
            k.xd = X_DTYPES[xi];
            for (int options = 0; options < 4; options++) {
                for (size_t i = 0; i < n; i++) x[i] = random_bits(k.xd);
                for (int t = 0; t < T; t++) w[t] = (float)((int64_t)(next_random() >> 40) - (1 << 23)) * 0x1p-22f;
                const float *weight = options & 1 ? w : NULL;
                const int64_t *g = options & 2 ? groups : NULL;
                int clamp_on = options & 1;
                size_t scale_bytes = (size_t)(T * H / (k.mode == 0 ? 128 : 32) * (k.mode == 0 ? 4 : 1));
                size_t code_bytes = (size_t)(T * H) / (forward_is_fp4(k.dst) ? 2 : 1);
                memset(reference, 0, (size_t)(T * H));
                memset(codes, 0, (size_t)(T * H));
                run_layout(&k, x, weight, g, clamp_on, SWIGLU_KERNEL_SCALAR, 1, 0, reference, ref_scales);
                for (size_t vi = 1; vi < N_VARIANTS; vi++) {
                    if (!swiglu_kernel_variant_available(VARIANTS[vi])) continue;
                    for (int layout = 0; layout < 4; layout++) {
                        memset(codes, 0, (size_t)(T * H));
                        set_caller_environment(layout == 3);
                        run_layout(&k, x, weight, g, clamp_on, VARIANTS[vi], layout == 2 ? 4 : 1, layout >= 1,
                                   codes, scales);
                        set_caller_environment(0);
                        int same = memcmp(codes, reference, code_bytes) == 0 &&
                                   memcmp(scales, ref_scales, scale_bytes) == 0;
                        CHECK(same);
                        if (!same) {
                            fprintf(stderr, "build %d layout %d differs from the scalar kernel: x %s, dst %d, mode "
                                    "%d, round %d, options %d\n", (int)VARIANTS[vi], layout,
                                    k.xd == ACL_FLOAT16 ? "fp16" : "bf16", (int)k.dst, k.mode, k.round, options);
                        }
                    }
                }
            }
        }
    }
    free(x);
    free(reference);
    free(codes);
    free(ref_scales);
    free(scales);
}

static void test_refused_arguments(void)
{
    forward_case c;
    forward_case_init(&c, ACL_FLOAT16, E2M1, 0, 1, 1, 128);   /* FP4 in mode 0 */
    CHECK_EQ_INT(forward_case_run(&c, SWIGLU_KERNEL_SCALAR), -3);
    CHECK_EQ_INT(forward_case_run(&c, (swiglu_kernel_variant)99), -2);
    c.mode = 1;
    c.hidden = 100;   /* not whole blocks */
    CHECK_EQ_INT(forward_case_run(&c, SWIGLU_KERNEL_SCALAR), -3);
    for (size_t i = 0; i < c.y_bytes; i++) CHECK_EQ_INT(c.y[i], FORWARD_SENTINEL);
    forward_case_free(&c);
}

int main(void)
{
    int builds = 0;
    for (size_t vi = 0; vi < N_VARIANTS; vi++) {
        swiglu_kernel_variant v = VARIANTS[vi];
        if (!swiglu_kernel_variant_available(v)) continue;
        builds++;
        for (size_t xi = 0; xi < 2; xi++) {
            test_zero_block(v, X_DTYPES[xi]);
            test_block_with_inf_and_nan(v, X_DTYPES[xi]);
            test_fp8_rounding(v, X_DTYPES[xi]);
            test_mx_fp8_groups(v, X_DTYPES[xi]);
            test_fp4_rounding(v, X_DTYPES[xi]);
            test_fp4_special_groups(v, X_DTYPES[xi]);
            test_clamp_and_weight(v, X_DTYPES[xi]);
        }
        test_fp4_sticky_bit(v);
        test_flushing_division(v);
        test_truncation(v);
    }
    CHECK(builds >= 3);   /* scalar, baseline and the widest */
    test_builds_agree();
    test_refused_arguments();
    return emu_test_finish("test_forward_kernel");
}
