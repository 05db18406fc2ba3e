/* Every vectorised build of the kernel this CPU runs (baseline, AVX2, AVX-512) writes the same
 * bytes as the scalar reference kernel, for every dtype, option, width (H not a multiple of the
 * vector or chunk size included) and layout, on data full of special values; and the same bytes
 * whatever the thread count and whatever floating-point environment the caller set. */
#define _GNU_SOURCE 1   /* feenableexcept */
#include <fenv.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "emu_test.h"
#include "kernel_args.h"
#include "opapi/swiglu_kernel.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static int variants_run[5];

static uint64_t next_random(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Mostly moderate values, with NaN, +-inf, huge, tiny, subnormal, exact clamp edges and the
 * exp overflow and flush regions mixed in. */
static float random_value(void)
{
    static const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, 95.0f, -95.0f, 88.72284f,
                                     88.7228f, -87.33654f, -87.4f, 1.0f, -1.0f, 2.5f, -2.5f,
                                     0.0f, -0.0f, 1e-40f, -1e-40f, 3e38f, 65520.0f, 1e-8f};
    uint64_t r = next_random();
    if (r % 13 == 0) {
        return specials[(r >> 8) % (sizeof specials / sizeof specials[0])];
    }
    return (float)((int64_t)(r >> 20) % 200001 - 100000) * 6e-5f;
}

static void fill(void *data, size_t count, aclDataType dtype)
{
    for (size_t i = 0; i < count; i++) {
        float f = random_value();
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        if (dtype == ACL_FLOAT) {
            ((float *)data)[i] = f;
        } else if (dtype == ACL_BF16) {
            ((uint16_t *)data)[i] = (uint16_t)(u >> 16);
        } else {
            _Float16 h = (_Float16)f;
            memcpy((uint16_t *)data + i, &h, sizeof h);
        }
    }
}

static void run_case(aclDataType dtype, int64_t rows, int64_t hidden, int step, int clamp_on,
                     int has_weight, int groups)
{
    size_t es = dtype == ACL_FLOAT ? 4 : 2;
    int64_t x_pitch = 2 * hidden * step + 3, y_pitch = hidden * step + 1;
    char *gy = malloc((size_t)(rows * y_pitch) * es), *x = malloc((size_t)(rows * x_pitch) * es);
    char *yo = malloc((size_t)(rows * y_pitch) * es);
    size_t gx_bytes = (size_t)(rows * x_pitch) * es;
    char *gx_scalar = malloc(gx_bytes), *gx_vector = malloc(gx_bytes);
    float *w = malloc((size_t)rows * sizeof(float));
    float *gw_scalar = malloc((size_t)rows * sizeof(float)), *gw_vector = malloc((size_t)rows * sizeof(float));
    fill(gy, (size_t)(rows * y_pitch), dtype);
    fill(x, (size_t)(rows * x_pitch), dtype);
    fill(yo, (size_t)(rows * y_pitch), dtype);
    for (int64_t t = 0; t < rows; t++) w[t] = random_value();
    memset(gx_scalar, 0xAB, gx_bytes);
    memset(gx_vector, 0xAB, gx_bytes);
    int64_t counts[2] = {rows / 3, rows / 3};

    swiglu_kernel_args a;
    memset(&a, 0, sizeof a);
    a.dtype = dtype;
    a.rows = rows;
    a.hidden = hidden;
    view(&a.grad_y, gy, rows, hidden, y_pitch, step);
    view(&a.x, x, rows, 2 * hidden, x_pitch, step);
    view(&a.y_origin, yo, rows, hidden, y_pitch, step);
    a.has_weight = has_weight;
    view(&a.weight, w, rows, 1, 1, 1);
    a.clamp_on = clamp_on;
    a.clamp = 2.5f;
    a.group_mode = groups ? SWIGLU_GROUPS_HOST : SWIGLU_GROUPS_NONE;
    a.group_values = counts;
    a.group_count = 2;

    view(&a.grad_x, gx_scalar, rows, 2 * hidden, x_pitch, step);
    view(&a.grad_weight, gw_scalar, rows, 1, 1, 1);
    CHECK_EQ_INT(swiglu_kernel_run(&a, 1, SWIGLU_KERNEL_SCALAR), 0);
    static const swiglu_kernel_variant variants[] = {SWIGLU_KERNEL_VECTOR, SWIGLU_KERNEL_VECTOR_BASELINE,
                                                     SWIGLU_KERNEL_VECTOR_AVX2, SWIGLU_KERNEL_VECTOR_AVX512,
                                                     SWIGLU_KERNEL_VECTOR_AVX512_BF16};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        if (!swiglu_kernel_variant_available(variants[v])) {
            continue;
        }
        variants_run[v]++;
        for (int threads = 1; threads <= 3; threads += 2) {
            memset(gx_vector, 0xAB, gx_bytes);
            view(&a.grad_x, gx_vector, rows, 2 * hidden, x_pitch, step);
            view(&a.grad_weight, gw_vector, rows, 1, 1, 1);
            CHECK_EQ_INT(swiglu_kernel_run(&a, threads, variants[v]), 0);
            int same_gx = memcmp(gx_scalar, gx_vector, gx_bytes) == 0;
            int same_gw = !has_weight || memcmp(gw_scalar, gw_vector, (size_t)rows * sizeof(float)) == 0;
            if (!same_gx || !same_gw) {
                fprintf(stderr, "variant %d dtype %d rows %lld H %lld step %d clamp %d weight %d groups %d "
                        "threads %d: gradX %s, gradWeight %s\n", (int)variants[v], (int)dtype, (long long)rows,
                        (long long)hidden, step, clamp_on, has_weight, groups, threads,
                        same_gx ? "same" : "DIFFERS", same_gw ? "same" : "DIFFERS");
            }
            CHECK(same_gx && same_gw);
        }
    }
    free(gy); free(x); free(yo); free(gx_scalar); free(gx_vector); free(w); free(gw_scalar); free(gw_vector);
}

static int64_t exp_mismatches;

/* Compares a vector build's device_exp with the scalar one on inputs[0..n). */
static void exp_compare(swiglu_kernel_variant variant, const float *in, size_t n)
{
    static float want[1 << 16], got[1 << 16];
    swiglu_kernel_exp(SWIGLU_KERNEL_SCALAR, in, want, n);
    swiglu_kernel_exp(variant, in, got, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &want[i], sizeof a);
        memcpy(&b, &got[i], sizeof b);
        if (a != b && !(isnan(want[i]) && isnan(got[i])) && exp_mismatches++ < 5) {
            fprintf(stderr, "variant %d: exp(%a) = %a, scalar %a\n", (int)variant, (double)in[i], (double)got[i],
                    (double)want[i]);
        }
    }
}

/* A vector build's device_exp takes a shortcut when all lanes lie in (-86.5, 88); it must give
 * the scalar one's bits everywhere: every 61st float pattern, and every float near the edges of
 * the shortcut's range and of exp's overflow and flush points. */
static void exp_against_scalar(swiglu_kernel_variant variant)
{
    enum { BATCH = 1 << 16 };
    static float in[BATCH];
    size_t n = 0;
    exp_mismatches = 0;
    for (uint64_t bits = 0; bits < ((uint64_t)1 << 32); bits += 61) {
        uint32_t u = (uint32_t)bits;
        memcpy(&in[n++], &u, sizeof u);
        if (n == BATCH) { exp_compare(variant, in, n); n = 0; }
    }
    static const float edges[] = {-104.0f, -87.33654f, -86.5f, 88.0f, 88.72284f, 89.0f};
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++) {
        float x = edges[e];
        for (int k = 0; k < 200000; k++) x = nextafterf(x, -INFINITY);
        for (int k = 0; k < 400000; k++) {
            in[n++] = x;
            x = nextafterf(x, INFINITY);
            if (n == BATCH) { exp_compare(variant, in, n); n = 0; }
        }
    }
    exp_compare(variant, in, n);
    CHECK_EQ_INT(exp_mismatches, 0);
}

#if defined(__x86_64__)
#include <xmmintrin.h>

/* A caller's flush-to-zero / denormals-are-zero mode must not change the bytes: data made of
 * subnormal and tiny values, run with both modes set, against the scalar kernel run without. */
static void flush_modes_do_not_change_results(void)
{
    enum { ROWS = 9, H = 200 };
    static float gy[ROWS * H], x[ROWS * 2 * H], yo[ROWS * H], w[ROWS];
    static float want_gx[ROWS * 2 * H], got_gx[ROWS * 2 * H], want_gw[ROWS], got_gw[ROWS];
    for (int i = 0; i < ROWS * H; i++) {
        gy[i] = (i % 3 ? 1e-38f : 3e-39f) * (float)(1 + i % 7);   /* around FLT_MIN: products are subnormal */
        yo[i] = 1e-3f * (float)(i % 5);
    }
    for (int i = 0; i < ROWS * 2 * H; i++) x[i] = (i % 2 ? 0.75f : -2.0f) + 1e-3f * (float)(i % 11);
    for (int t = 0; t < ROWS; t++) w[t] = 0.5f;
    swiglu_kernel_args a;
    contiguous_args(&a, ACL_FLOAT, ROWS, H, gy, x, yo, w, want_gx, want_gw);
    CHECK_EQ_INT(swiglu_kernel_run(&a, 1, SWIGLU_KERNEL_SCALAR), 0);
    int subnormal = 0;
    for (int i = 0; i < ROWS * 2 * H; i++) subnormal += want_gx[i] != 0.0f && fabsf(want_gx[i]) < 1.17549435e-38f;
    CHECK(subnormal > 0);   /* the data does reach subnormal results */
    unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);   /* FTZ and DAZ */
    view(&a.grad_x, got_gx, ROWS, 2 * H, 2 * H, 1);
    view(&a.grad_weight, got_gw, ROWS, 1, 1, 1);
    CHECK_EQ_INT(swiglu_kernel_run(&a, 1, SWIGLU_KERNEL_VECTOR), 0);
    unsigned int after = _mm_getcsr();
    _mm_setcsr(csr);
    CHECK_EQ_INT(after & 0x8040u, 0x8040u);   /* the caller's modes are put back */
    CHECK(memcmp(want_gx, got_gx, sizeof want_gx) == 0);
    CHECK(memcmp(want_gw, got_gw, sizeof want_gw) == 0);
}
#endif

/* The caller's rounding mode (and, where the CPU traps them, unmasked exceptions) must not change
 * the bytes: every dtype with weight, clamp and groups, every variant, 1 and 3 threads, in each
 * directed mode, against the scalar kernel in round-to-nearest; the caller's mode is put back. */
static void rounding_modes_do_not_change_results(void)
{
    static const int modes[] = {FE_DOWNWARD, FE_UPWARD, FE_TOWARDZERO};
    static const aclDataType dtypes[] = {ACL_FLOAT, ACL_FLOAT16, ACL_BF16};
    static const swiglu_kernel_variant variants[] = {SWIGLU_KERNEL_SCALAR, SWIGLU_KERNEL_VECTOR,
                                                     SWIGLU_KERNEL_VECTOR_BASELINE, SWIGLU_KERNEL_VECTOR_AVX2,
                                                     SWIGLU_KERNEL_VECTOR_AVX512, SWIGLU_KERNEL_VECTOR_AVX512_BF16};
    enum { ROWS = 300, H = 1100 };   /* enough work for 3 threads; rows split into tiles with fp32 */
    size_t cells = (size_t)ROWS * 2 * H;
    float *gy = malloc(cells * 2), *x = malloc(cells * 4), *yo = malloc(cells * 2), *w = malloc(ROWS * 4);
    char *want = malloc(cells * 4), *got = malloc(cells * 4);
    float want_gw[ROWS], got_gw[ROWS];
    int64_t counts[2] = {ROWS / 2, ROWS / 3};
    /* the modes are real: 1/3 rounds differently in each */
    volatile float one = 1.0f, three = 3.0f;
    uint32_t quotient[3];
    for (int m = 0; m < 3; m++) {
        fesetround(modes[m]);
        float q = one / three;
        memcpy(&quotient[m], &q, sizeof q);
        fesetround(FE_TONEAREST);
    }
    CHECK(quotient[0] != quotient[1] && quotient[0] == quotient[2]);
    for (size_t d = 0; d < 3; d++) {
        aclDataType dtype = dtypes[d];
        size_t es = dtype == ACL_FLOAT ? 4 : 2;
        fill(gy, (size_t)ROWS * H, dtype);
        fill(x, cells, dtype);
        fill(yo, (size_t)ROWS * H, dtype);
        for (int t = 0; t < ROWS; t++) w[t] = random_value();
        swiglu_kernel_args a;
        contiguous_args(&a, dtype, ROWS, H, gy, x, yo, w, want, want_gw);
        a.clamp_on = 1;
        a.clamp = 2.5f;
        a.group_mode = SWIGLU_GROUPS_HOST;
        a.group_values = counts;
        a.group_count = 2;
        CHECK_EQ_INT(swiglu_kernel_run(&a, 1, SWIGLU_KERNEL_SCALAR), 0);
        view(&a.grad_x, got, ROWS, 2 * H, 2 * H, 1);
        view(&a.grad_weight, got_gw, ROWS, 1, 1, 1);
        for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
            if (!swiglu_kernel_variant_available(variants[v])) continue;
            for (int m = 0; m < 3; m++) {
                for (int threads = 1; threads <= 3; threads += 2) {
                    memset(got, 0xAB, cells * es);
                    fesetround(modes[m]);
                    feclearexcept(FE_ALL_EXCEPT);   /* a raised flag would trap as soon as it is unmasked */
                    int trapping = feenableexcept(FE_ALL_EXCEPT) != -1;
                    int rc = swiglu_kernel_run(&a, threads, variants[v]);
                    int mode_after = fegetround();
                    int traps_after = fegetexcept();
                    if (trapping) fedisableexcept(FE_ALL_EXCEPT);
                    fesetround(FE_TONEAREST);
                    CHECK_EQ_INT(rc, 0);
                    CHECK_EQ_INT(mode_after, modes[m]);
                    if (trapping) CHECK_EQ_INT(traps_after, FE_ALL_EXCEPT);
                    int same = memcmp(want, got, cells * es) == 0 && memcmp(want_gw, got_gw, sizeof want_gw) == 0;
                    if (!same) {
                        fprintf(stderr, "dtype %d variant %d rounding mode 0x%x threads %d: bytes differ from "
                                "round-to-nearest\n", (int)dtype, (int)variants[v], modes[m], threads);
                    }
                    CHECK(same);
                }
            }
        }
    }
    /* the clamp limit's conversion: 1.1 to the nearest float in every mode */
    for (int m = 0; m < 3; m++) {
        fesetround(modes[m]);
        float c = swiglu_float_nearest(1.1);
        fesetround(FE_TONEAREST);
        uint32_t bits;
        memcpy(&bits, &c, sizeof bits);
        CHECK_EQ_INT(bits, 0x3F8CCCCDu);
    }
    free(gy); free(x); free(yo); free(w); free(want); free(got);
}

/* The CPU's bf16 narrowing flushes subnormals and keeps NaN payloads; the kernel must not let it
 * do either. bf16 rows where vector k has lane k % 16 special: a subnormal gradient (gy a bf16
 * subnormal, x0 = 1), a NaN with a payload (gy a signaling NaN), or nothing. */
static void bf16_narrowing_special_lanes(void)
{
    enum { ROWS = 3, H = 16 * 48 };
    static uint16_t gy[ROWS * H], x[ROWS * 2 * H], want[ROWS * 2 * H], got[ROWS * 2 * H];
    for (int i = 0; i < ROWS * H; i++) {
        int vector = (i % H) / 16, lane = (i % H) % 16;
        gy[i] = 0x3FC0;                                                  /* 1.5 */
        if (lane == vector % 16 && vector % 3 == 0) gy[i] = 0x000B;     /* 1.01e-39 */
        if (lane == vector % 16 && vector % 3 == 1) gy[i] = 0x7FA1;     /* a signaling NaN */
        x[(i / H) * 2 * H + i % H] = 0x3F80;                             /* x0 = 1 */
        x[(i / H) * 2 * H + H + i % H] = 0xBF00 | (uint16_t)(i % 64);   /* x1 = -0.5 ... */
    }
    swiglu_kernel_args a;
    contiguous_args(&a, ACL_BF16, ROWS, H, gy, x, NULL, NULL, want, NULL);
    CHECK_EQ_INT(swiglu_kernel_run(&a, 1, SWIGLU_KERNEL_SCALAR), 0);
    int subnormal = 0, nan = 0;
    for (int i = 0; i < ROWS * 2 * H; i++) {
        subnormal += (want[i] & 0x7F80) == 0 && (want[i] & 0x7F) != 0;
        nan += want[i] == 0x7FC0;
    }
    CHECK(subnormal >= ROWS * 16 && nan >= ROWS * 16);   /* the data reaches both kinds of lane */
    static const swiglu_kernel_variant variants[] = {SWIGLU_KERNEL_VECTOR, SWIGLU_KERNEL_VECTOR_AVX512,
                                                     SWIGLU_KERNEL_VECTOR_AVX512_BF16};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        if (!swiglu_kernel_variant_available(variants[v])) continue;
        memset(got, 0xAB, sizeof got);
        view(&a.grad_x, got, ROWS, 2 * H, 2 * H, 1);
        CHECK_EQ_INT(swiglu_kernel_run(&a, 1, variants[v]), 0);
        CHECK(memcmp(want, got, sizeof got) == 0);
    }
}

int main(void)
{
    bf16_narrowing_special_lanes();
#if defined(__x86_64__)
    flush_modes_do_not_change_results();
#endif
    rounding_modes_do_not_change_results();
    static const swiglu_kernel_variant vector_builds[] = {SWIGLU_KERNEL_VECTOR_BASELINE, SWIGLU_KERNEL_VECTOR_AVX2,
                                                          SWIGLU_KERNEL_VECTOR_AVX512};   /* (the bf16 one has AVX-512's exp) */
    for (size_t v = 0; v < sizeof vector_builds / sizeof vector_builds[0]; v++) {
        if (swiglu_kernel_variant_available(vector_builds[v])) {
            exp_against_scalar(vector_builds[v]);
        }
    }
    static const aclDataType dtypes[] = {ACL_FLOAT, ACL_FLOAT16, ACL_BF16};
    /* 4100: three tiles of a weighted fp16/bf16 row (2032 + 2032 + 36), so the fused loops also
     * add into the accumulator, and a tail past the last whole vector in each. */
    static const int64_t widths[] = {1, 7, 8, 15, 16, 17, 24, 63, 64, 65, 511, 512, 513, 1100, 4100};
    for (size_t d = 0; d < 3; d++) {
        for (size_t k = 0; k < sizeof widths / sizeof widths[0]; k++) {
            for (int options = 0; options < 8; options++) {
                run_case(dtypes[d], 37, widths[k], 1, options & 1, (options >> 1) & 1, (options >> 2) & 1);
            }
            run_case(dtypes[d], 11, widths[k], 2, 1, 1, 0);
        }
        /* Enough work for several threads. */
        run_case(dtypes[d], 700, 1024, 1, 1, 1, 1);
    }
    /* The default and the baseline build run everywhere; say which others this CPU ran. */
    CHECK(variants_run[0] > 0 && variants_run[1] > 0);
    printf("vector builds compared with the scalar kernel: default %d, baseline %d, avx2 %d, avx512 %d, "
           "avx512 with bf16 instructions %d cases\n",
           variants_run[0], variants_run[1], variants_run[2], variants_run[3], variants_run[4]);
    return emu_test_finish("test_kernel_variants");
}
