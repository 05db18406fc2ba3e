/*
 * The vectorised kernel looks silu and its derivative up for fp16 and bf16 inputs
 * (swiglu_silu_table.c). Checked exhaustively: every entry of both tables against the scalar
 * kernel on the same input, and every x0 pattern through each vector build against the scalar
 * kernel's bytes, with and without clamp and weight, on 1 and 2 threads.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_test.h"
#include "kernel_args.h"
#include "opapi/swiglu_kernel_impl.h"

#define PATTERNS 65536

static int is_nan_bits(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

static float widen(aclDataType dtype, uint16_t h) { return dtype == ACL_BF16 ? bf16_to_float(h) : half_to_float(h); }

/* The scalar kernel in fp32 with gradY = 1 and x1 = 1 gives gradX = [dsilu(x0), silu(x0)]: both
 * products by 1 are exact, and stored fp32 is kept as it is (NaN made canonical). */
static void table_matches_scalar_kernel(aclDataType dtype)
{
    const silu_pair *table = swiglu_silu_table(dtype);
    CHECK(table != NULL);
    if (table == NULL) return;
    float *gy = malloc(PATTERNS * sizeof *gy), *x = malloc(2 * PATTERNS * sizeof *x);
    float *gx = malloc(2 * PATTERNS * sizeof *gx);
    CHECK(gy != NULL && x != NULL && gx != NULL);
    if (gy == NULL || x == NULL || gx == NULL) {
        free(gy); free(x); free(gx);
        return;
    }
    for (uint32_t h = 0; h < PATTERNS; h++) {
        gy[h] = 1.0f;
        x[h] = widen(dtype, (uint16_t)h);
        x[PATTERNS + h] = 1.0f;
    }
    swiglu_kernel_args a;
    contiguous_args(&a, ACL_FLOAT, 1, PATTERNS, gy, x, NULL, NULL, gx, NULL);
    CHECK_EQ_INT(swiglu_kernel_run(&a, 1, SWIGLU_KERNEL_SCALAR), 0);
    int64_t mismatches = 0;
    for (uint32_t h = 0; h < PATTERNS; h++) {
        uint32_t want_d = bits_f(gx[h]), want_s = bits_f(gx[PATTERNS + h]);
        uint32_t got_d = bits_f(table[h].dsilu), got_s = bits_f(table[h].silu);
        int same = (is_nan_bits(want_d) ? is_nan_bits(got_d) : got_d == want_d) &&
                   (is_nan_bits(want_s) ? is_nan_bits(got_s) : got_s == want_s);
        if (!same && mismatches++ < 5) {
            fprintf(stderr, "dtype %d pattern 0x%04x: table silu %08x dsilu %08x, scalar kernel %08x %08x\n",
                    (int)dtype, h, got_s, got_d, want_s, want_d);
        }
    }
    CHECK(mismatches == 0);
    free(gy); free(x); free(gx);
}

/* Every x0 pattern in one row per launch (with random gradY, x1, yOrigin), each vector build
 * against the scalar kernel's bytes. */
static void every_pattern_through_the_kernel(aclDataType dtype, float clamp_limit)
{
    /* Every pattern twice: enough elements for the kernel to use two threads. */
    const int64_t rows = 4, hidden = PATTERNS / 2;
    size_t n = (size_t)(rows * hidden);
    uint16_t *gy = malloc(n * 2), *yo = malloc(n * 2), *x = malloc(2 * n * 2);
    uint16_t *gx_scalar = malloc(2 * n * 2), *gx_vector = malloc(2 * n * 2);
    float w[4] = {0.75f, 1.5f, -2.0f, 1.0f}, gw_scalar[4], gw_vector[4];
    CHECK(gy && yo && x && gx_scalar && gx_vector);
    if (!(gy && yo && x && gx_scalar && gx_vector)) {
        free(gy); free(yo); free(x); free(gx_scalar); free(gx_vector);
        return;
    }
    uint32_t state = 12345u;
    for (size_t i = 0; i < n; i++) {
        state = state * 1664525u + 1013904223u;
        /* finite values of either format around 1 (exponent bits kept in range) */
        uint16_t r = (uint16_t)(state >> 16);
        gy[i] = dtype == ACL_BF16 ? (uint16_t)(0x3F00u | (r & 0x80FFu)) : (uint16_t)(0x3800u | (r & 0x87FFu));
        yo[i] = gy[i] ^ 0x8000u;
    }
    for (int64_t t = 0; t < rows; t++) {
        for (int64_t h = 0; h < hidden; h++) {
            uint32_t k = (uint32_t)(t * hidden + h);
            x[t * 2 * hidden + h] = (uint16_t)k;                      /* x0: every pattern */
            x[t * 2 * hidden + hidden + h] = (uint16_t)(k * 40503u);  /* x1: a permutation of them */
        }
    }
    for (int has_weight = 0; has_weight <= 1; has_weight++) {
        swiglu_kernel_args a;
        contiguous_args(&a, dtype, rows, hidden, gy, x, yo, has_weight ? w : NULL, gx_scalar, gw_scalar);
        a.clamp_on = clamp_limit > 0.0f;
        a.clamp = clamp_limit;
        a.tiling = SWIGLU_TILING_CURRENT;
        CHECK_EQ_INT(swiglu_kernel_run(&a, 1, SWIGLU_KERNEL_SCALAR), 0);
        static const swiglu_kernel_variant variants[] = {SWIGLU_KERNEL_VECTOR, SWIGLU_KERNEL_VECTOR_BASELINE,
                                                         SWIGLU_KERNEL_VECTOR_AVX2, SWIGLU_KERNEL_VECTOR_AVX512,
                                                         SWIGLU_KERNEL_VECTOR_AVX512_BF16};
        for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
            if (!swiglu_kernel_variant_available(variants[v])) continue;
            for (int threads = 1; threads <= 2; threads++) {
                memset(gx_vector, 0xAB, 2 * n * 2);
                a.grad_x.data = (char *)gx_vector;
                a.grad_weight.data = (char *)gw_vector;
                CHECK_EQ_INT(swiglu_kernel_run(&a, threads, variants[v]), 0);
                int same = memcmp(gx_scalar, gx_vector, 2 * n * 2) == 0 &&
                           (!has_weight || memcmp(gw_scalar, gw_vector, sizeof gw_scalar) == 0);
                if (!same) {
                    fprintf(stderr, "dtype %d clamp %g weight %d variant %d threads %d: bytes differ from the "
                            "scalar kernel's\n", (int)dtype, (double)clamp_limit, has_weight, (int)variants[v],
                            threads);
                }
                CHECK(same);
            }
            a.grad_x.data = (char *)gx_scalar;
            a.grad_weight.data = (char *)gw_scalar;
        }
    }
    free(gy); free(yo); free(x); free(gx_scalar); free(gx_vector);
}

int main(void)
{
    static const aclDataType dtypes[] = {ACL_FLOAT16, ACL_BF16};
    /* 0: no clamp; 1.0: representable in both; 0.3: in neither, so clamped lanes take the limit's
     * own pair rather than an entry of the table. */
    static const float limits[] = {0.0f, 1.0f, 0.3f};
    for (size_t d = 0; d < 2; d++) {
        table_matches_scalar_kernel(dtypes[d]);
        for (size_t c = 0; c < sizeof limits / sizeof limits[0]; c++) {
            every_pattern_through_the_kernel(dtypes[d], limits[c]);
        }
    }
    CHECK(swiglu_silu_table(ACL_FLOAT) == NULL);
    return emu_test_finish("test_kernel_silu_table");
}
