/*
 * White-box checks of the kernel's static helpers (conversions, device exp, tree sum, trunc):
 * the kernel source is included here so that this test has its own copy of them.
 *
 * References that share no code with the kernel: GCC's _Float16 conversions (round half to
 * even on x86-64), a bf16 rounding computed through double, glibc's expf and exp, and a
 * recursive formulation of the adjacent-pair tree.
 */
#include "opapi/swiglu_kernel.c"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "emu_test.h"

static uint16_t gcc_half_bits(float f)
{
    volatile _Float16 h = (_Float16)f;
    _Float16 copy = h;
    uint16_t bits;
    memcpy(&bits, &copy, sizeof bits);
    return bits;
}

static float gcc_half_to_float(uint16_t bits)
{
    _Float16 h;
    memcpy(&h, &bits, sizeof h);
    volatile float f = (float)h;
    return f;
}

static int is_nan_bits(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

/* ---- fp16 ---- */

/* Every fp16 pattern: widening is exact (as GCC's), and narrowing gives the pattern back;
 * NaNs stay NaN and narrow to the canonical 0x7E00 (docs/kernel.md). */
static void test_half_round_trip_exhaustive(void)
{
    int64_t widen_bad = 0, trip_bad = 0, nan_bad = 0, nans = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = half_to_float((uint16_t)h);
        float g = gcc_half_to_float((uint16_t)h);
        int is_nan = (h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0;
        if (is_nan) {
            nans++;
            if (!isnan(f)) nan_bad++;
            if (float_to_half(f) != (uint16_t)0x7E00u) nan_bad++;
            continue;
        }
        if (bits_of(f) != bits_of(g)) {
            if (widen_bad++ < 5) fprintf(stderr, "half_to_float(0x%04x) = %a, GCC says %a\n", h, (double)f, (double)g);
        }
        if (float_to_half(f) != h) {
            if (trip_bad++ < 5) fprintf(stderr, "fp16 0x%04x -> %a -> 0x%04x\n", h, (double)f, float_to_half(f));
        }
    }
    CHECK_EQ_INT(nans, 2 * 1023);
    CHECK_EQ_INT(widen_bad, 0);
    CHECK_EQ_INT(trip_bad, 0);
    CHECK_EQ_INT(nan_bad, 0);
}

static int64_t half_mismatches;

static void compare_half(uint32_t u)
{
    float f = float_of(u);
    uint16_t got = float_to_half(f);
    if (is_nan_bits(u)) {
        if (got != (uint16_t)0x7E00u) {
            if (half_mismatches++ < 8) fprintf(stderr, "float_to_half(NaN 0x%08x) = 0x%04x\n", u, got);
        }
        return;
    }
    uint16_t want = gcc_half_bits(f);
    if (got != want && half_mismatches++ < 8) {
        fprintf(stderr, "float_to_half(0x%08x = %a) = 0x%04x, GCC _Float16 gives 0x%04x\n", u, (double)f, got, want);
    }
}

/* float -> fp16 against GCC over tens of millions of patterns: every tie of the normal range
 * (and its neighbours), every subnormal tie, the overflow boundary, and a sweep of all floats. */
static void test_float_to_half_vs_gcc(void)
{
    static const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x0800, 0x1800};
    int64_t compared = 0;
    half_mismatches = 0;
    for (uint32_t hi = 0; hi < (1u << 19); hi++) { /* sign, exponent, top 10 mantissa bits */
        for (size_t k = 0; k < sizeof lows / sizeof lows[0]; k++) {
            compare_half((hi << 13) | lows[k]);
            compared++;
        }
    }
    /* fp16 subnormal ties: (2k+1) * 2^-25, and the floats either side */
    for (uint32_t k = 0; k < 2048; k++) {
        float tie = ldexpf((float)(2 * k + 1), -25);
        for (int sign = 0; sign < 2; sign++) {
            uint32_t u = bits_of(tie) | ((uint32_t)sign << 31);
            compare_half(u - 1);
            compare_half(u);
            compare_half(u + 1);
            compared += 3;
        }
    }
    /* everything from 65280 to 2^17: 65504 is the largest fp16, 65520 the first to round to inf */
    for (uint32_t u = bits_of(65280.0f); u <= bits_of(131072.0f); u++) {
        compare_half(u);
        compare_half(u | 0x80000000u);
        compared += 2;
    }
    /* a sweep of all float patterns */
    for (uint64_t u = 0; u < ((uint64_t)1 << 32); u += 61) {
        compare_half((uint32_t)u);
        compared++;
    }
    CHECK(compared > 40000000);
    CHECK_EQ_INT(half_mismatches, 0);
    /* the overflow boundary by hand */
    CHECK_EQ_INT(float_to_half(65504.0f), 0x7BFF);
    CHECK_EQ_INT(float_to_half(nextafterf(65520.0f, 0.0f)), 0x7BFF);
    CHECK_EQ_INT(float_to_half(65520.0f), 0x7C00);
    CHECK_EQ_INT(float_to_half(-65520.0f), 0xFC00);
    CHECK_EQ_INT(float_to_half(INFINITY), 0x7C00);
    CHECK_EQ_INT(float_to_half(-INFINITY), 0xFC00);
    CHECK_EQ_INT(float_to_half(FLT_MAX), 0x7C00);
    CHECK_EQ_INT(float_to_half(-NAN), 0x7E00);   /* canonical: positive */
    CHECK_EQ_INT(float_to_half(float_of(0x7F800001u)), 0x7E00); /* signalling NaN */
    CHECK_EQ_INT(float_to_half(-0.0f), 0x8000);
    CHECK_EQ_INT(float_to_half(0x1p-25f), 0x0000);       /* tie 0 | 1 -> even 0 */
    CHECK_EQ_INT(float_to_half(0x1.8p-24f), 0x0002);     /* tie 1 | 2 -> even 2 */
    CHECK_EQ_INT(float_to_half(0x1.ffcp-15f), 0x0400);   /* 1023.5 * 2^-24 -> 2^-14, the smallest normal */
    CHECK_EQ_INT(float_to_half(1.0f + 0x1p-11f), 0x3C00); /* tie, even below */
    CHECK_EQ_INT(float_to_half(1.0f + 0x1.8p-10f), 0x3C02); /* tie, odd below */
}

/* ---- bf16 ---- */

/* An independent float -> bf16: round the value to 8 significant bits (quantum at least
 * 2^-133), half to even, in double; past the largest bf16 is inf; NaN the canonical 0x7FC0. */
static uint16_t ref_bf16(uint32_t u)
{
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (is_nan_bits(u)) return 0xFFFF; /* checked separately */
    double v = fabs((double)float_of(u));
    if (isinf(v)) return sign | 0x7F80;
    if (v == 0.0) return sign;
    int ex;
    frexp(v, &ex);
    int q = ex - 8 < -133 ? -133 : ex - 8;
    double r = ldexp(nearbyint(ldexp(v, -q)), q);
    if (r >= 0x1p128) return sign | 0x7F80;
    if (r < 0x1p-126) return sign | (uint16_t)ldexp(r, 133);
    frexp(r, &ex);
    int e = ex - 1;
    return sign | (uint16_t)((e + 127) << 7) | (uint16_t)(ldexp(r, 7 - e) - 128.0);
}

static int64_t bf16_mismatches;

static void compare_bf16(uint32_t u)
{
    uint16_t got = float_to_bf16(float_of(u));
    if (is_nan_bits(u)) {
        /* the canonical quiet NaN */
        if (got != 0x7FC0u) {
            if (bf16_mismatches++ < 8) fprintf(stderr, "float_to_bf16(NaN 0x%08x) = 0x%04x\n", u, got);
        }
        return;
    }
    uint16_t want = ref_bf16(u);
    if (got != want && bf16_mismatches++ < 8) {
        fprintf(stderr, "float_to_bf16(0x%08x) = 0x%04x, expected 0x%04x\n", u, got, want);
    }
}

static void test_float_to_bf16(void)
{
    static const uint32_t lows[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000};
    int64_t compared = 0;
    bf16_mismatches = 0;
    for (uint32_t hi = 0; hi < 65536; hi++) { /* every tie and its neighbours, NaNs and infs included */
        for (size_t k = 0; k < sizeof lows / sizeof lows[0]; k++) {
            compare_bf16((hi << 16) | lows[k]);
            compared++;
        }
    }
    for (uint64_t u = 0; u < ((uint64_t)1 << 32); u += 89) {
        compare_bf16((uint32_t)u);
        compared++;
    }
    CHECK(compared > 40000000);
    CHECK_EQ_INT(bf16_mismatches, 0);
    CHECK_EQ_INT(float_to_bf16(1.0f), 0x3F80);
    CHECK_EQ_INT(float_to_bf16(float_of(0x3F808000u)), 0x3F80); /* tie, even below: down */
    CHECK_EQ_INT(float_to_bf16(float_of(0x3F818000u)), 0x3F82); /* tie, odd below: up */
    CHECK_EQ_INT(float_to_bf16(float_of(0x7F7F7FFFu)), 0x7F7F); /* just under the tie: the largest */
    CHECK_EQ_INT(float_to_bf16(float_of(0x7F7F8000u)), 0x7F80); /* tie past the largest: inf */
    CHECK_EQ_INT(float_to_bf16(FLT_MAX), 0x7F80);
    CHECK_EQ_INT(float_to_bf16(-FLT_MAX), 0xFF80);
    CHECK_EQ_INT(float_to_bf16(INFINITY), 0x7F80);
    CHECK_EQ_INT(float_to_bf16(-INFINITY), 0xFF80);
    CHECK_EQ_INT(float_to_bf16(float_of(0x7F800001u)), 0x7FC0);  /* payload below bit 16: still NaN */
    CHECK_EQ_INT(float_to_bf16(float_of(0xFFC00000u)), 0x7FC0);  /* canonical: positive */
    CHECK_EQ_INT(float_to_bf16(float_of(0x00008000u)), 0x0000);  /* subnormal tie, even below */
    CHECK_EQ_INT(float_to_bf16(float_of(0x00018000u)), 0x0002);  /* subnormal tie, odd below */
    CHECK_EQ_INT(float_to_bf16(-0.0f), 0x8000);
    /* widening is the upper half, for every pattern */
    int64_t widen_bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if (bits_of(bf16_to_float((uint16_t)h)) != h << 16) widen_bad++;
    }
    CHECK_EQ_INT(widen_bad, 0);
}

/* ---- device exp ---- */

static int64_t ordered(float f)
{
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i < 0 ? (int64_t)INT32_MIN - i : i;
}

static int64_t ulp_distance(float a, float b)
{
    int64_t d = ordered(a) - ordered(b);
    return d < 0 ? -d : d;
}

static void test_exp_overflow_boundary(void)
{
    const float x_ovf = 88.72283935546875f;
    /* the threshold is the first float whose true exp passes FLT_MAX */
    CHECK(exp((double)x_ovf) > (double)FLT_MAX);
    CHECK(exp((double)nextafterf(x_ovf, 0.0f)) <= (double)FLT_MAX);
    int64_t bad = 0;
    float x = x_ovf;
    for (int i = 0; i < 100000; i++, x = nextafterf(x, INFINITY)) {
        if (bits_of(device_expf(x)) != 0x7F800000u) bad++;
    }
    static const float above[] = {89.0f, 89.5f, 100.0f, 1e10f, FLT_MAX, INFINITY};
    for (size_t i = 0; i < sizeof above / sizeof above[0]; i++) {
        if (bits_of(device_expf(above[i])) != 0x7F800000u) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    /* finite just below, and within 2 ulp of expf there */
    x = nextafterf(x_ovf, 0.0f);
    int64_t finite_bad = 0;
    for (int i = 0; i < 100000; i++, x = nextafterf(x, 0.0f)) {
        float e = device_expf(x);
        if (!(e <= FLT_MAX) || ulp_distance(e, expf(x)) > 2) finite_bad++;
    }
    CHECK_EQ_INT(finite_bad, 0);
    float below = device_expf(nextafterf(x_ovf, 0.0f));
    CHECK(isfinite(below) && below > 3.4e38f);
}

static void test_exp_flush_point(void)
{
    /* walk down from -87 to the first float whose exp the device flushes */
    float x = -87.0f;
    while (device_expf(x) != 0.0f && x > -90.0f) x = nextafterf(x, -INFINITY);
    float flush_from = x;                                    /* largest flushed input */
    float first_kept = nextafterf(flush_from, 0.0f);
    printf("device_expf flushes from x = %.9g (0x%08x) down; exp(%.9g) = %a\n", (double)flush_from,
           bits_of(flush_from), (double)first_kept, (double)device_expf(first_kept));
    CHECK(flush_from < -87.33f && flush_from > -87.35f);    /* ln(FLT_MIN) = -87.3365 */
    CHECK(device_expf(first_kept) >= FLT_MIN);                /* a normal float just above */
    CHECK(device_expf(first_kept) < 1.2e-38f);
    /* every float from the flush point down to -90 gives exactly +0, and none anywhere in
     * [-90, -86] gives a subnormal */
    int64_t not_zero = 0, subnormal = 0;
    for (float y = flush_from; y >= -90.0f; y = nextafterf(y, -INFINITY)) {
        if (bits_of(device_expf(y)) != 0) not_zero++;
    }
    for (float y = -86.0f; y >= -90.0f; y = nextafterf(y, -INFINITY)) {
        float e = device_expf(y);
        if (e != 0.0f && e < FLT_MIN) subnormal++;
    }
    CHECK_EQ_INT(not_zero, 0);
    CHECK_EQ_INT(subnormal, 0);
    static const float far_below[] = {-100.0f, -103.97f, -104.0f, -104.5f, -1000.0f, -FLT_MAX, -INFINITY};
    for (size_t i = 0; i < sizeof far_below / sizeof far_below[0]; i++) {
        CHECK_EQ_INT(bits_of(device_expf(far_below[i])), 0);
    }
}

static void test_exp_special(void)
{
    static const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7FC12345u, 0xFFFFFFFFu, 0x7FFFFFFFu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        CHECK_EQ_INT(bits_of(device_expf(float_of(nans[i]))), nans[i]); /* result = x */
    }
    CHECK(isnan(device_expf(float_of(0x7F800001u))));
    CHECK_EQ_INT(bits_of(device_expf(0.0f)), bits_of(1.0f));
    CHECK_EQ_INT(bits_of(device_expf(-0.0f)), bits_of(1.0f));
    CHECK_EQ_INT(bits_of(swiglu_device_expf(0.0f)), bits_of(1.0f));
    CHECK(ulp_distance(device_expf(1.0f), 2.7182817f) <= 2);
}

/* Within 2 ulp of expf (and of exp in double, rounded) over [-87, 88.7]. */
static void test_exp_accuracy(void)
{
    int64_t worst = 0, worst_double = 0, count = 0;
    float worst_x = 0.0f;
    /* evenly spaced values */
    const int64_t n = 4000000;
    for (int64_t i = 0; i <= n; i++) {
        float x = (float)(-87.0 + (88.7 + 87.0) * (double)i / (double)n);
        int64_t d = ulp_distance(device_expf(x), expf(x));
        int64_t dd = ulp_distance(device_expf(x), (float)exp((double)x));
        if (d > worst) {
            worst = d;
            worst_x = x;
        }
        if (dd > worst_double) worst_double = dd;
        count++;
    }
    /* every 23rd float pattern of the range, both signs (dense near 0 too) */
    for (uint32_t u = 0; u <= bits_of(88.7f); u += 23) {
        float x = float_of(u);
        int64_t d = ulp_distance(device_expf(x), expf(x));
        if (d > worst) {
            worst = d;
            worst_x = x;
        }
        count++;
    }
    for (uint32_t u = 0x80000000u; u <= bits_of(-87.0f); u += 23) {
        float x = float_of(u);
        int64_t d = ulp_distance(device_expf(x), expf(x));
        if (d > worst) {
            worst = d;
            worst_x = x;
        }
        count++;
    }
    printf("device_expf: %lld inputs, worst %lld ulp from expf (at %.9g), %lld ulp from exp\n",
           (long long)count, (long long)worst, (double)worst_x, (long long)worst_double);
    CHECK(count > 50000000);
    CHECK(worst <= 2);
    CHECK(worst_double <= 2);
}

/* ---- tree sum ---- */

static float recursive_tree(const float *v, size_t n)
{
    if (n == 0) return 0.0f;
    if (n == 1) return v[0];
    size_t half = 1;
    while (half * 2 < n) half *= 2;
    return recursive_tree(v, half) + recursive_tree(v + half, n - half);
}

static float sum_left_to_right(const float *v, size_t n)
{
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += v[i];
    return s;
}

static float tree64_of(const float *v, size_t n)
{
    float lanes[64] = {0};   /* +0.0 past the data */
    memcpy(lanes, v, n * sizeof *v);
    return tree64_scalar(lanes);
}

/* The 64-lane tree: a perfect binary tree of adjacent pairs (the recursive halves of 64 are the
 * adjacent pairs of each level), lanes past the data +0.0. */
static void test_tree64(void)
{
    float v[64];
    const float u = 0x1p-24f;
    memset(v, 0, sizeof v);
    CHECK_EQ_INT(bits_of(tree64_of(v, 0)), 0);
    v[0] = -0.0f;
    CHECK_EQ_INT(bits_of(tree64_of(v, 1)), 0); /* -0 meets a +0 lane: +0 */
    for (int i = 0; i < 64; i++) v[i] = -0.0f;
    CHECK_EQ_INT(bits_of(tree64_of(v, 64)), 0x80000000u); /* all 64 lanes -0: -0 */
    v[0] = 3.5f;
    CHECK_EQ_INT(bits_of(tree64_of(v, 1)), bits_of(3.5f));
    v[0] = NAN;
    CHECK(isnan(tree64_of(v, 1)));
    v[0] = 1.0f;
    v[1] = u;
    v[2] = u;
    CHECK_EQ_INT(bits_of(tree64_of(v, 3)), bits_of(1.0f)); /* (1 + u) + (u + 0), each rounding to even */
    v[0] = u;
    v[1] = u;
    v[2] = 1.0f;
    CHECK_EQ_INT(bits_of(tree64_of(v, 3)), bits_of(1.0f + 2 * u)); /* (u + u) + 1 */
    uint64_t state = 12345;
    int differs = 0;
    for (int trial = 0; trial < 200; trial++) {
        for (size_t i = 0; i < 64; i++) {
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
            int e = (int)((state >> 33) % 30) - 15;
            float m = (float)((double)(state >> 40) / (double)(1ULL << 24)) - 0.5f;
            v[i] = ldexpf(m, e);
        }
        CHECK_EQ_INT(bits_of(tree64_of(v, 64)), bits_of(recursive_tree(v, 64)));
        if (bits_of(recursive_tree(v, 64)) != bits_of(sum_left_to_right(v, 64))) differs++;
    }
    CHECK(differs > 20); /* the data shows the order */
    /* 1 and 63 u's: the first pair rounds to 1, the other 31 pairs give 2u each, which add exactly */
    v[0] = 1.0f;
    for (int i = 1; i < 64; i++) v[i] = u;
    CHECK_EQ_INT(bits_of(tree64_of(v, 64)), bits_of(recursive_tree(v, 64)));
    CHECK(tree64_of(v, 64) > 1.0f); /* the tree kept the small terms that left to right loses */
    CHECK_EQ_INT(bits_of(sum_left_to_right(v, 64)), bits_of(1.0f));
}

/* ---- trunc ---- */

static void test_trunc_helper(void)
{
    swiglu_kernel_args a;
    memset(&a, 0, sizeof a);
    a.rows = 10;
    CHECK_EQ_INT(swiglu_trunc(&a), 10);
    int64_t host[3] = {-1, 4, 0};
    a.group_mode = SWIGLU_GROUPS_HOST;
    a.group_values = host;
    a.group_count = 2;
    CHECK_EQ_INT(swiglu_trunc(&a), 3);
    host[0] = (int64_t)0xFFFFFFFF;
    host[1] = (int64_t)0xFFFFFFFF;
    host[2] = 12; /* 2^33 - 2 + 12 wraps to 10 */
    a.group_count = 3;
    CHECK_EQ_INT(swiglu_trunc(&a), 10);
    host[2] = 7;
    CHECK_EQ_INT(swiglu_trunc(&a), 5);
    a.group_count = 0;
    CHECK_EQ_INT(swiglu_trunc(&a), 0);
    /* device mode with a stride: elements 0, 2, 4 */
    int64_t dev[5] = {2, 100, 3, 100, (int64_t)1 << 32};
    a.group_mode = SWIGLU_GROUPS_DEVICE;
    a.group_index.data = (char *)dev;
    a.group_index.ndim = 1;
    a.group_index.dims[0] = 3;
    a.group_index.strides[0] = 2;
    CHECK_EQ_INT(swiglu_trunc(&a), 5);
    a.group_index.dims[0] = 0;
    CHECK_EQ_INT(swiglu_trunc(&a), 0);
}

int main(void)
{
    test_half_round_trip_exhaustive();
    test_float_to_half_vs_gcc();
    test_float_to_bf16();
    test_exp_overflow_boundary();
    test_exp_flush_point();
    test_exp_special();
    test_exp_accuracy();
    test_tree64();
    test_trunc_helper();
    return emu_test_finish("test_kernel_internals");
}
