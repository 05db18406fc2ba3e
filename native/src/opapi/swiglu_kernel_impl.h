/*
 * Pieces shared by the kernel's implementations (swiglu_kernel.c: the scalar one, the rows and
 * the threads; swiglu_kernel_vector.c: the vectorised ones, compiled once per instruction set).
 * Internal to the emulator.
 */
#ifndef ACL_SWIGLU_SWIGLU_KERNEL_IMPL_H
#define ACL_SWIGLU_SWIGLU_KERNEL_IMPL_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "swiglu_kernel.h"

/* Columns handled per step of a row; a multiple of the vector width. */
#define BLOCK 512
/* Lanes of the device's ReduceSum. */
#define REDUCE_LANES 64

/* The stored NaNs: positive quiet NaN in each format. */
#define CANONICAL_NAN_F32 0x7FC00000u
#define CANONICAL_NAN_F16 0x7E00u
#define CANONICAL_NAN_BF16 0x7FC0u

static inline uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- the device's exp, scalar ---- */

#define EXP_OVERFLOW_FROM 88.72283935546875f   /* first float whose exp exceeds FLT_MAX */
#define EXP_LOG2E 1.44269502162933349609375f
#define EXP_ROUNDER 12582912.0f                /* 1.5 * 2^23: adding it rounds to an integer */
#define EXP_LN2_HI 0.693145751953125f          /* ln 2 with trailing zero bits */
#define EXP_LN2_LO 1.428606765330187045e-06f
/* p * 2^-126 rounds to a normal float exactly when p >= 1 - 2^-24. */
#define EXP_FLUSH_P 0.99999994039535522461f

/* exp(x) = 2^n * exp(r), n = round(x / ln 2), |r| <= ln2/2, exp(r) by a degree-7 Taylor
 * polynomial in Horner form. Results below FLT_MIN flush to +0. Those are recognised from n and
 * p before scaling, and computed as 1 * 2^-126 meanwhile, so that no subnormal is ever formed:
 * x86 handles subnormal results in microcode, a hundred times slower. */
static inline float device_expf(float x)
{
    float xc = x < -104.0f ? -104.0f : x;    /* NaN stays NaN through both compares */
    xc = xc > 89.0f ? 89.0f : xc;
    float t = xc * EXP_LOG2E + EXP_ROUNDER;
    float nf = t - EXP_ROUNDER;
    float r = xc - nf * EXP_LN2_HI;
    r = r - nf * EXP_LN2_LO;
    float p = 1.98412698412698412526e-4f;    /* 1/5040 */
    p = p * r + 1.38888888888888894189e-3f;  /* 1/720 */
    p = p * r + 8.33333333333333321769e-3f;  /* 1/120 */
    p = p * r + 4.16666666666666643537e-2f;  /* 1/24 */
    p = p * r + 1.66666666666666657415e-1f;  /* 1/6 */
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t n = (int32_t)(bits_of(t) - bits_of(EXP_ROUNDER));
    int flush = (n < -126) | ((n == -126) & (p < EXP_FLUSH_P));
    float p_safe = flush ? 1.0f : p;
    int32_t n_safe = n < -126 ? -126 : n;
    int32_t n_low = n_safe >> 1;
    int32_t n_high = n_safe - n_low;
    /* Two exact power-of-two scalings keep each factor a normal float for n in [-126, 129]. */
    float result = (p_safe * float_of((uint32_t)(n_low + 127) << 23)) *
                   float_of((uint32_t)(n_high + 127) << 23);
    result = flush ? 0.0f : result;
    result = result > FLT_MAX ? FLT_MAX : result;
    result = x >= EXP_OVERFLOW_FROM ? INFINITY : result;
    result = x != x ? x : result;
    return result;
}

/* silu(a) = a * s and its derivative s * ((1 - s) * a + 1), s = e / (e + 1) with the device's exp:
 * the one definition the scalar rows and the 16-bit lookup tables (swiglu_silu_table.c) share, so
 * that a looked-up pair has the bits the scalar rows compute. */
static inline void silu_with_derivative(float a, float *silu, float *dsilu)
{
    float e = device_expf(a);
    float s = e / (e + 1.0f);
    *silu = a * s;
    *dsilu = s * (((1.0f - s) * a) + 1.0f);
}

/* ---- conversions, scalar (round half to even; inf kept; NaN canonical) ---- */

static inline float canonical_f32(float f) { return f != f ? float_of(CANONICAL_NAN_F32) : f; }

static inline float bf16_to_float(uint16_t h) { return float_of((uint32_t)h << 16); }

static inline uint16_t float_to_bf16(float f)
{
    uint32_t u = bits_of(f);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? CANONICAL_NAN_BF16 : rounded);
}

static inline float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t magnitude = h & 0x7FFFu;
    uint32_t normal = (magnitude << 13) + 0x38000000u;          /* rebias 15 -> 127 */
    uint32_t inf_nan = (magnitude << 13) | 0x7F800000u;
    uint32_t subnormal = bits_of((float)magnitude * 5.9604644775390625e-8f);   /* m * 2^-24 */
    uint32_t u = magnitude >= 0x7C00u ? inf_nan : normal;
    u = magnitude < 0x0400u ? subnormal : u;
    return float_of(u | sign);
}

static inline uint16_t float_to_half(float f)
{
    uint32_t u = bits_of(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7FFFFFFFu;
    /* Normal range: rebias 127 -> 15 and round the 13 dropped bits half to even. */
    uint32_t normal = (a - 0x38000000u + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
    /* Below 2^-14: adding 0.5 rounds to a multiple of 2^-24, the fp16 subnormal step. */
    uint32_t subnormal = bits_of(float_of(a) + 0.5f) - 0x3F000000u;
    uint32_t h = (a < 0x38800000u ? subnormal : normal) | sign;
    h = a >= 0x477FF000u ? (0x7C00u | sign) : h;     /* 65520 and up round to inf */
    h = a > 0x7F800000u ? CANONICAL_NAN_F16 : h;
    return (uint16_t)h;
}

/* silu and its derivative at one 16-bit input, as silu_with_derivative gives them. */
typedef struct {
    float silu, dsilu;
} silu_pair;

#define SILU_TABLE_ENTRIES 65536

/* The pairs of every fp16 (ACL_FLOAT16) or bf16 (ACL_BF16) bit pattern, indexed by the pattern;
 * built at the first call for that dtype, then shared read-only. NULL for any other dtype. */
const silu_pair *swiglu_silu_table(aclDataType dtype);

/* A contiguous block of one row, for the fused vector loop. */
typedef struct {
    const char *gy, *x0, *x1, *yo;
    char *gx0, *gx1;
    size_t n;
    float weight;
    float clamp;
    float *acc;        /* gradWeight's accumulator at this block's place in its tile */
    int accumulate;    /* 0 in the first tile: acc = gy * yo; later tiles: acc = acc + gy * yo */
    /* fp16 and bf16: swiglu_silu_table(dtype), and the pair at the clamp limit (for the lanes the
     * clamp lowers to it). Unused for fp32. */
    const silu_pair *table;
    silu_pair at_limit;
} fused_block;

typedef struct {
    void (*load)(const char *src, int64_t stride, float *out, size_t n);
    void (*store)(char *dst, int64_t stride, const float *in, size_t n);
    /* In place: x0 becomes gx0 and x1 becomes gx1; `gy` already carries the weight. */
    void (*grad)(const float *gy, float *x0, float *x1, size_t n);
    void (*grad_clamped)(const float *gy, float *x0, float *x1, size_t n, float c);
    /* acc[i] = gy[i] * yo[i], or with `accumulate` acc[i] = acc[i] + gy[i] * yo[i]; exactly n written */
    void (*products)(const float *gy, const float *yo, float *acc, size_t n, int accumulate);
    /* The device's ReduceSum of acc[0..n), n <= SWIGLU_REDUCE_MAX */
    float (*reduce_sum)(const float *acc, size_t n);
    void (*scale)(float *v, size_t n, float w);
    /* device_exp over an array (tests compare it with the scalar one). */
    void (*exp_block)(const float *in, float *out, size_t n);
    /* Loads, computes and stores whole vectors of a contiguous block in one pass, indexed
     * [clamp_on][has_weight]; returns how many elements it did (the rest is a short tail).
     * NULL in the scalar implementation. */
    size_t (*fused[2][2])(const fused_block *block);
} kernel_impl;

/* ---- gradWeight's ReduceSum (docs/operator.md, docs/kernel.md) ---- */

/* acc[0..n), n <= 256, as the 64 lanes the device's ReduceSum first makes of it: lane i is
 * (acc[i] + acc[64+i]) + (acc[128+i] + acc[192+i]) with the terms past n left out (and
 * acc[128+i] alone when acc[192+i] is absent); lanes past the data are +0.0. */
static inline void fold_into_lanes(const float *acc, size_t n, float lanes[REDUCE_LANES])
{
    for (size_t i = 0; i < REDUCE_LANES; i++) {
        float s = i < n ? acc[i] : 0.0f;
        if (64 + i < n) s = s + acc[64 + i];
        if (128 + i < n) {
            float upper = acc[128 + i];
            if (192 + i < n) upper = upper + acc[192 + i];
            s = s + upper;
        }
        lanes[i] = s;
    }
}

/* ReduceSum with a given 64-lane tree (a perfect tree of adjacent pairs): n <= 256 folded into
 * 64 lanes, then the tree; above, the tree of each 64-element chunk (the last padded with +0.0),
 * then the tree of the chunk sums (padded with +0.0). n <= SWIGLU_REDUCE_MAX, so at most 64
 * chunks. */
static inline __attribute__((always_inline)) float reduce_sum_with(const float *acc, size_t n,
                                                                   float (*tree64)(const float *))
{
    float lanes[REDUCE_LANES];
    if (n <= 4 * REDUCE_LANES) {
        fold_into_lanes(acc, n, lanes);
        return tree64(lanes);
    }
    float sums[REDUCE_LANES];
    size_t chunks = 0;
    for (size_t c0 = 0; c0 < n; c0 += REDUCE_LANES) {
        if (n - c0 >= REDUCE_LANES) {
            sums[chunks++] = tree64(acc + c0);
        } else {
            fold_into_lanes(acc + c0, n - c0, lanes);
            sums[chunks++] = tree64(lanes);
        }
    }
    while (chunks < REDUCE_LANES) sums[chunks++] = 0.0f;
    return tree64(sums);
}

/* A perfect tree of adjacent pairs over n = 2^k elements, level by level; destroys v. */
static inline float tree_pow2(float *v, size_t n)
{
    for (; n > 1; n /= 2) {
        for (size_t i = 0; i < n / 2; i++) v[i] = v[2 * i] + v[2 * i + 1];
    }
    return v[0];
}

/* The 64-lane tree one addition at a time: the reference the vector trees match. */
static inline float tree64_scalar(const float *v)
{
    float lanes[REDUCE_LANES];
    memcpy(lanes, v, sizeof lanes);
    return tree_pow2(lanes, REDUCE_LANES);
}

/* ---- strided (and reference) loads and stores, scalar ---- */

static inline void load_f32_scalar(const char *src, int64_t stride, float *out, size_t n)
{
    const float *p = (const float *)src;
    for (size_t i = 0; i < n; i++) out[i] = p[(int64_t)i * stride];
}

static inline void load_f16_scalar(const char *src, int64_t stride, float *out, size_t n)
{
    const uint16_t *p = (const uint16_t *)src;
    for (size_t i = 0; i < n; i++) out[i] = half_to_float(p[(int64_t)i * stride]);
}

static inline void load_bf16_scalar(const char *src, int64_t stride, float *out, size_t n)
{
    const uint16_t *p = (const uint16_t *)src;
    for (size_t i = 0; i < n; i++) out[i] = bf16_to_float(p[(int64_t)i * stride]);
}

static inline void store_f32_scalar(char *dst, int64_t stride, const float *in, size_t n)
{
    float *p = (float *)dst;
    for (size_t i = 0; i < n; i++) p[(int64_t)i * stride] = canonical_f32(in[i]);
}

static inline void store_f16_scalar(char *dst, int64_t stride, const float *in, size_t n)
{
    uint16_t *p = (uint16_t *)dst;
    for (size_t i = 0; i < n; i++) p[(int64_t)i * stride] = float_to_half(in[i]);
}

static inline void store_bf16_scalar(char *dst, int64_t stride, const float *in, size_t n)
{
    uint16_t *p = (uint16_t *)dst;
    for (size_t i = 0; i < n; i++) p[(int64_t)i * stride] = float_to_bf16(in[i]);
}

/* The vectorised implementations, one table of three (FLOAT, FLOAT16, BF16) per instruction
 * set; the ones this build has are declared, the CPU decides which can run. */
extern const kernel_impl swiglu_vector_impls_baseline[3];
#if defined(__x86_64__)
#define SWIGLU_HAVE_X86_VARIANTS 1
extern const kernel_impl swiglu_vector_impls_avx2[3];
extern const kernel_impl swiglu_vector_impls_avx512[3];
extern const kernel_impl swiglu_vector_impls_avx512_bf16[3];
#endif

#endif /* ACL_SWIGLU_SWIGLU_KERNEL_IMPL_H */
