/*
 * SwiGLU backward (SPEC section 1) in fp32, operation by operation in the device's order
 * (docs/kernel.md). Every operation is a plain IEEE single-precision one (the file is built
 * with -ffp-contract=off), and every NaN is stored in one canonical form, so the output bits do
 * not depend on the vector width, the instruction set or the thread count: rows are independent
 * and each row is computed by exactly one thread.
 *
 * Two implementations of the same arithmetic: a scalar one (the reference, one element at a
 * time) and a vectorised one (eight lanes, GCC vector extensions, compiled for AVX2 and for
 * baseline x86-64 and picked at load time). Tests run both and compare the bytes.
 */
#include "swiglu_kernel.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Columns handled per step of a row; a multiple of the 64-element gradWeight chunk and of the
 * vector width. */
#define BLOCK 512
#define CHUNK 64
/* Rows below this many elements per thread are not worth a thread. */
#define MIN_ELEMENTS_PER_THREAD ((int64_t)1 << 16)
#define MAX_THREADS 256

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

float swiglu_device_expf(float x) { return device_expf(x); }

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

/* ---- vectors ----
 * GCC vector extensions: eight fp32 lanes, each lane the same IEEE operation as the scalar
 * code. Hot functions are compiled for AVX2 and for baseline x86-64 and picked at load. */

#define LANES 8
typedef float vfloat __attribute__((vector_size(32)));
typedef int32_t vint __attribute__((vector_size(32)));
typedef uint32_t vuint __attribute__((vector_size(32)));
typedef uint16_t vhalf __attribute__((vector_size(16)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define HOT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define HOT_CLONES
#endif
#define INLINE static inline __attribute__((always_inline))

INLINE vfloat vload(const float *p) { vfloat v; memcpy(&v, p, sizeof v); return v; }
INLINE void vstore(float *p, vfloat v) { memcpy(p, &v, sizeof v); }
INLINE vfloat vsplat(float f) { return (vfloat){f, f, f, f, f, f, f, f}; }
INLINE vint vsplat_int(int32_t i) { return (vint){i, i, i, i, i, i, i, i}; }
/* Mask lanes are all ones or all zeros, as vector comparisons give them. */
INLINE vfloat vselect(vint mask, vfloat yes, vfloat no)
{
    return (vfloat)((mask & (vint)yes) | (~mask & (vint)no));
}
INLINE vint vselect_int(vint mask, vint yes, vint no) { return (mask & yes) | (~mask & no); }

INLINE vfloat device_expv(vfloat x)
{
    vfloat xc = vselect(x < -104.0f, vsplat(-104.0f), x);
    xc = vselect(xc > 89.0f, vsplat(89.0f), xc);
    vfloat t = xc * EXP_LOG2E + EXP_ROUNDER;
    vfloat nf = t - EXP_ROUNDER;
    vfloat r = xc - nf * EXP_LN2_HI;
    r = r - nf * EXP_LN2_LO;
    vfloat p = vsplat(1.98412698412698412526e-4f);
    p = p * r + 1.38888888888888894189e-3f;
    p = p * r + 8.33333333333333321769e-3f;
    p = p * r + 4.16666666666666643537e-2f;
    p = p * r + 1.66666666666666657415e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    vint n = (vint)t - (vint)vsplat(EXP_ROUNDER);
    vint flush = (n < -126) | ((n == -126) & (p < EXP_FLUSH_P));
    vfloat p_safe = vselect(flush, vsplat(1.0f), p);
    vint n_safe = vselect_int(n < -126, vsplat_int(-126), n);
    vint n_low = n_safe >> 1;
    vint n_high = n_safe - n_low;
    vfloat result = (p_safe * (vfloat)((n_low + 127) << 23)) * (vfloat)((n_high + 127) << 23);
    result = vselect(flush, vsplat(0.0f), result);
    result = vselect(result > FLT_MAX, vsplat(FLT_MAX), result);
    result = vselect(x >= EXP_OVERFLOW_FROM, vsplat(INFINITY), result);
    return vselect(x != x, x, result);
}

INLINE vfloat canonical_f32v(vfloat f)
{
    return vselect(f != f, (vfloat)vsplat_int((int32_t)CANONICAL_NAN_F32), f);
}

INLINE vfloat bf16_to_floatv(vhalf h) { return (vfloat)(__builtin_convertvector(h, vuint) << 16); }

INLINE vhalf float_to_bf16v(vfloat f)
{
    vuint u = (vuint)f;
    vuint rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    vint nan = (vint)((u & 0x7FFFFFFFu) > 0x7F800000u);
    vuint out = (vuint)vselect_int(nan, vsplat_int(CANONICAL_NAN_BF16), (vint)rounded);
    return __builtin_convertvector(out, vhalf);
}

INLINE vfloat half_to_floatv(vhalf h)
{
    vuint w = __builtin_convertvector(h, vuint);
    vuint sign = (w & 0x8000u) << 16;
    vuint magnitude = w & 0x7FFFu;
    vuint normal = (magnitude << 13) + 0x38000000u;
    vuint inf_nan = (magnitude << 13) | 0x7F800000u;
    vuint subnormal = (vuint)(__builtin_convertvector((vint)magnitude, vfloat) * 5.9604644775390625e-8f);
    vint u = vselect_int((vint)(magnitude >= 0x7C00u), (vint)inf_nan, (vint)normal);
    u = vselect_int((vint)(magnitude < 0x0400u), (vint)subnormal, u);
    return (vfloat)((vuint)u | sign);
}

INLINE vhalf float_to_halfv(vfloat f)
{
    vuint u = (vuint)f;
    vuint sign = (u >> 16) & 0x8000u;
    vuint a = u & 0x7FFFFFFFu;
    vuint normal = (a - 0x38000000u + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
    vuint subnormal = (vuint)((vfloat)a + 0.5f) - 0x3F000000u;
    vint h = vselect_int((vint)(a < 0x38800000u), (vint)subnormal, (vint)normal) | (vint)sign;
    h = vselect_int((vint)(a >= 0x477FF000u), (vint)(sign | 0x7C00u), h);
    h = vselect_int((vint)(a > 0x7F800000u), vsplat_int(CANONICAL_NAN_F16), h);
    return __builtin_convertvector((vuint)h, vhalf);
}

/* ---- one implementation: loads, stores and the math of one block of columns ---- */

typedef struct {
    void (*load)(const char *src, int64_t stride, float *out, size_t n);
    void (*store)(char *dst, int64_t stride, const float *in, size_t n);
    /* In place: x0 becomes gx0 and x1 becomes gx1; `gy` already carries the weight. */
    void (*grad)(const float *gy, float *x0, float *x1, size_t n);
    void (*grad_clamped)(const float *gy, float *x0, float *x1, size_t n, float c);
    /* Forms gy * yo in yo and writes the tree sum of each 64-chunk; returns the chunk count. */
    size_t (*chunk_sums)(const float *gy, float *yo, size_t n, float *partials);
    void (*scale)(float *v, size_t n, float w);
} kernel_impl;

/* Pairwise sum of adjacent elements, level by level; an odd last element moves up as is.
 * Destroys v. The empty sum is +0. */
static float tree_sum(float *v, size_t n)
{
    while (n > 1) {
        size_t half = n / 2;
        for (size_t i = 0; i < half; i++) {
            v[i] = v[2 * i] + v[2 * i + 1];
        }
        if (n & 1) {
            v[half] = v[n - 1];
        }
        n = half + (n & 1);
    }
    return n ? v[0] : 0.0f;
}

/* -- scalar -- */

static void load_f32_scalar(const char *src, int64_t stride, float *out, size_t n)
{
    const float *p = (const float *)src;
    for (size_t i = 0; i < n; i++) out[i] = p[(int64_t)i * stride];
}

static void load_f16_scalar(const char *src, int64_t stride, float *out, size_t n)
{
    const uint16_t *p = (const uint16_t *)src;
    for (size_t i = 0; i < n; i++) out[i] = half_to_float(p[(int64_t)i * stride]);
}

static void load_bf16_scalar(const char *src, int64_t stride, float *out, size_t n)
{
    const uint16_t *p = (const uint16_t *)src;
    for (size_t i = 0; i < n; i++) out[i] = bf16_to_float(p[(int64_t)i * stride]);
}

static void store_f32_scalar(char *dst, int64_t stride, const float *in, size_t n)
{
    float *p = (float *)dst;
    for (size_t i = 0; i < n; i++) p[(int64_t)i * stride] = canonical_f32(in[i]);
}

static void store_f16_scalar(char *dst, int64_t stride, const float *in, size_t n)
{
    uint16_t *p = (uint16_t *)dst;
    for (size_t i = 0; i < n; i++) p[(int64_t)i * stride] = float_to_half(in[i]);
}

static void store_bf16_scalar(char *dst, int64_t stride, const float *in, size_t n)
{
    uint16_t *p = (uint16_t *)dst;
    for (size_t i = 0; i < n; i++) p[(int64_t)i * stride] = float_to_bf16(in[i]);
}

static void grad_scalar(const float *gy, float *x0, float *x1, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float a = x0[i];
        float e = device_expf(a);
        float s = e / (e + 1.0f);
        float silu = a * s;
        float dsilu = s * (((1.0f - s) * a) + 1.0f);
        float g = gy[i];
        x0[i] = (g * x1[i]) * dsilu;
        x1[i] = g * silu;
    }
}

static void grad_clamped_scalar(const float *gy, float *x0, float *x1, size_t n, float c)
{
    for (size_t i = 0; i < n; i++) {
        float a_orig = x0[i];
        float b_orig = x1[i];
        /* min/max propagate NaN, so a NaN input stays NaN through the clamp. */
        float a = (a_orig < c || a_orig != a_orig) ? a_orig : c;
        float b = (b_orig > -c || b_orig != b_orig) ? b_orig : -c;
        b = (b < c || b != b) ? b : c;
        float e = device_expf(a);
        float s = e / (e + 1.0f);
        float silu = a * s;
        float dsilu = s * (((1.0f - s) * a) + 1.0f);
        float g = gy[i];
        float gx0 = (g * b) * dsilu;
        float gx1 = g * silu;
        /* Masks on the original values, applied by multiplication. */
        x0[i] = gx0 * (a_orig < c ? 1.0f : 0.0f);
        x1[i] = gx1 * ((-c < b_orig && b_orig < c) ? 1.0f : 0.0f);
    }
}

static size_t chunk_sums_scalar(const float *gy, float *yo, size_t n, float *partials)
{
    for (size_t i = 0; i < n; i++) yo[i] = gy[i] * yo[i];
    size_t chunks = 0;
    for (size_t c0 = 0; c0 < n; c0 += CHUNK) {
        partials[chunks++] = tree_sum(yo + c0, n - c0 < CHUNK ? n - c0 : CHUNK);
    }
    return chunks;
}

static void scale_scalar(float *v, size_t n, float w)
{
    for (size_t i = 0; i < n; i++) v[i] = v[i] * w;
}

/* -- vectorised: strided segments fall back to the scalar loops; blocks are processed in
 * whole vectors (scratch is BLOCK long), lanes past n compute on stale scratch and are never
 * stored -- */

static void load_f32_vector(const char *src, int64_t stride, float *out, size_t n)
{
    if (stride != 1) {
        load_f32_scalar(src, stride, out, n);
        return;
    }
    memcpy(out, src, n * sizeof *out);
}

HOT_CLONES static void load_f16_vector(const char *src, int64_t stride, float *out, size_t n)
{
    const uint16_t *p = (const uint16_t *)src;
    if (stride != 1) {
        load_f16_scalar(src, stride, out, n);
        return;
    }
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        vhalf h;
        memcpy(&h, p + i, sizeof h);
        vstore(out + i, half_to_floatv(h));
    }
    for (; i < n; i++) out[i] = half_to_float(p[i]);
}

HOT_CLONES static void load_bf16_vector(const char *src, int64_t stride, float *out, size_t n)
{
    const uint16_t *p = (const uint16_t *)src;
    if (stride != 1) {
        load_bf16_scalar(src, stride, out, n);
        return;
    }
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        vhalf h;
        memcpy(&h, p + i, sizeof h);
        vstore(out + i, bf16_to_floatv(h));
    }
    for (; i < n; i++) out[i] = bf16_to_float(p[i]);
}

HOT_CLONES static void store_f32_vector(char *dst, int64_t stride, const float *in, size_t n)
{
    float *p = (float *)dst;
    if (stride != 1) {
        store_f32_scalar(dst, stride, in, n);
        return;
    }
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) vstore(p + i, canonical_f32v(vload(in + i)));
    for (; i < n; i++) p[i] = canonical_f32(in[i]);
}

HOT_CLONES static void store_f16_vector(char *dst, int64_t stride, const float *in, size_t n)
{
    uint16_t *p = (uint16_t *)dst;
    if (stride != 1) {
        store_f16_scalar(dst, stride, in, n);
        return;
    }
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        vhalf h = float_to_halfv(vload(in + i));
        memcpy(p + i, &h, sizeof h);
    }
    for (; i < n; i++) p[i] = float_to_half(in[i]);
}

HOT_CLONES static void store_bf16_vector(char *dst, int64_t stride, const float *in, size_t n)
{
    uint16_t *p = (uint16_t *)dst;
    if (stride != 1) {
        store_bf16_scalar(dst, stride, in, n);
        return;
    }
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        vhalf h = float_to_bf16v(vload(in + i));
        memcpy(p + i, &h, sizeof h);
    }
    for (; i < n; i++) p[i] = float_to_bf16(in[i]);
}

HOT_CLONES static void grad_vector(const float *restrict gy, float *restrict x0,
                                   float *restrict x1, size_t n)
{
    for (size_t i = 0; i < n; i += LANES) {
        vfloat a = vload(x0 + i);
        vfloat e = device_expv(a);
        vfloat s = e / (e + 1.0f);
        vfloat silu = a * s;
        vfloat dsilu = s * (((1.0f - s) * a) + 1.0f);
        vfloat g = vload(gy + i);
        vstore(x0 + i, (g * vload(x1 + i)) * dsilu);
        vstore(x1 + i, g * silu);
    }
}

HOT_CLONES static void grad_clamped_vector(const float *restrict gy, float *restrict x0,
                                           float *restrict x1, size_t n, float c)
{
    const vfloat limit = vsplat(c), neg_limit = vsplat(-c), one = vsplat(1.0f), zero = vsplat(0.0f);
    for (size_t i = 0; i < n; i += LANES) {
        vfloat a_orig = vload(x0 + i);
        vfloat b_orig = vload(x1 + i);
        vfloat a = vselect((a_orig < limit) | (a_orig != a_orig), a_orig, limit);
        vfloat b = vselect((b_orig > neg_limit) | (b_orig != b_orig), b_orig, neg_limit);
        b = vselect((b < limit) | (b != b), b, limit);
        vfloat e = device_expv(a);
        vfloat s = e / (e + 1.0f);
        vfloat silu = a * s;
        vfloat dsilu = s * (((1.0f - s) * a) + 1.0f);
        vfloat g = vload(gy + i);
        vfloat gx0 = (g * b) * dsilu;
        vfloat gx1 = g * silu;
        vstore(x0 + i, gx0 * vselect(a_orig < limit, one, zero));
        vstore(x1 + i, gx1 * vselect((neg_limit < b_orig) & (b_orig < limit), one, zero));
    }
}

/* One tree level over two vectors: lanes (0+1, 2+3, ..., 14+15) of a:b. */
INLINE vfloat pair_sums(vfloat a, vfloat b)
{
    vfloat even = __builtin_shuffle(a, b, (vint){0, 2, 4, 6, 8, 10, 12, 14});
    vfloat odd = __builtin_shuffle(a, b, (vint){1, 3, 5, 7, 9, 11, 13, 15});
    return even + odd;
}

/* tree_sum of 64 elements: the same additions in the same order, eight lanes at a time. */
INLINE float tree_sum64(const float *v)
{
    vfloat l1[4], l2[2];
    for (int k = 0; k < 4; k++) l1[k] = pair_sums(vload(v + 16 * k), vload(v + 16 * k + 8));
    for (int k = 0; k < 2; k++) l2[k] = pair_sums(l1[2 * k], l1[2 * k + 1]);
    float rest[LANES];
    vstore(rest, pair_sums(l2[0], l2[1]));
    return tree_sum(rest, LANES);
}

HOT_CLONES static size_t chunk_sums_vector(const float *restrict gy, float *restrict yo, size_t n,
                                           float *restrict partials)
{
    for (size_t i = 0; i < n; i += LANES) vstore(yo + i, vload(gy + i) * vload(yo + i));
    size_t chunks = 0, c0 = 0;
    for (; c0 + CHUNK <= n; c0 += CHUNK) partials[chunks++] = tree_sum64(yo + c0);
    if (c0 < n) partials[chunks++] = tree_sum(yo + c0, n - c0);
    return chunks;
}

HOT_CLONES static void scale_vector(float *v, size_t n, float w)
{
    for (size_t i = 0; i < n; i += LANES) vstore(v + i, vload(v + i) * w);
}

static const kernel_impl scalar_impls[3] = {
    {load_f32_scalar, store_f32_scalar, grad_scalar, grad_clamped_scalar, chunk_sums_scalar, scale_scalar},
    {load_f16_scalar, store_f16_scalar, grad_scalar, grad_clamped_scalar, chunk_sums_scalar, scale_scalar},
    {load_bf16_scalar, store_bf16_scalar, grad_scalar, grad_clamped_scalar, chunk_sums_scalar, scale_scalar},
};
static const kernel_impl vector_impls[3] = {
    {load_f32_vector, store_f32_vector, grad_vector, grad_clamped_vector, chunk_sums_vector, scale_vector},
    {load_f16_vector, store_f16_vector, grad_vector, grad_clamped_vector, chunk_sums_vector, scale_vector},
    {load_bf16_vector, store_bf16_vector, grad_vector, grad_clamped_vector, chunk_sums_vector, scale_vector},
};

/* ---- rows ---- */

typedef struct {
    const swiglu_kernel_args *args;
    const kernel_impl *impl;
    int64_t trunc;
    int64_t first_row;
    int64_t end_row;
    float *partials;   /* ceil(H / CHUNK) floats */
} row_range;

/* Element offset of the start of row t of a [..., last] view. */
static int64_t row_offset(const swiglu_view *v, int64_t t)
{
    int64_t offset = 0;
    for (int64_t d = v->ndim - 2; d >= 0; d--) {
        int64_t extent = v->dims[d];
        offset += (t % extent) * v->strides[d];
        t /= extent;
    }
    return offset;
}

/* Element offset of flat element t of a view (row-major order over all of its dims). */
static int64_t element_offset(const swiglu_view *v, int64_t t)
{
    int64_t offset = 0;
    for (int64_t d = v->ndim - 1; d >= 0; d--) {
        int64_t extent = v->dims[d];
        offset += (t % extent) * v->strides[d];
        t /= extent;
    }
    return offset;
}

static int64_t last_stride(const swiglu_view *v)
{
    return v->ndim > 0 ? v->strides[v->ndim - 1] : 1;
}

static void zero_row(const row_range *r, int64_t t, const float *zeros)
{
    const swiglu_kernel_args *a = r->args;
    int64_t es = a->dtype == ACL_FLOAT ? 4 : 2;
    int64_t gs = last_stride(&a->grad_x);
    char *gx = a->grad_x.data + row_offset(&a->grad_x, t) * es;
    int64_t width = 2 * a->hidden;
    for (int64_t h0 = 0; h0 < width; h0 += BLOCK) {
        size_t n = (size_t)(width - h0 < BLOCK ? width - h0 : BLOCK);
        r->impl->store(gx + h0 * gs * es, gs, zeros, n);
    }
    if (a->has_weight) {
        float *gw = (float *)a->grad_weight.data + element_offset(&a->grad_weight, t);
        *gw = 0.0f;
    }
}

static void compute_row(const row_range *r, int64_t t, float *gy, float *x0, float *x1,
                        float *yo)
{
    const swiglu_kernel_args *a = r->args;
    const kernel_impl *impl = r->impl;
    const int64_t es = a->dtype == ACL_FLOAT ? 4 : 2;
    const int64_t H = a->hidden;
    const int64_t sy = last_stride(&a->grad_y), sx = last_stride(&a->x);
    const int64_t so = last_stride(&a->y_origin), sg = last_stride(&a->grad_x);
    const char *gy_row = a->grad_y.data + row_offset(&a->grad_y, t) * es;
    const char *x_row = a->x.data + row_offset(&a->x, t) * es;
    char *gx_row = a->grad_x.data + row_offset(&a->grad_x, t) * es;
    const char *yo_row = a->has_weight ? a->y_origin.data + row_offset(&a->y_origin, t) * es : NULL;
    float w = a->has_weight ? *((const float *)a->weight.data + element_offset(&a->weight, t)) : 1.0f;
    size_t chunks = 0;

    for (int64_t h0 = 0; h0 < H; h0 += BLOCK) {
        size_t n = (size_t)(H - h0 < BLOCK ? H - h0 : BLOCK);
        impl->load(gy_row + h0 * sy * es, sy, gy, n);
        impl->load(x_row + h0 * sx * es, sx, x0, n);
        impl->load(x_row + (H + h0) * sx * es, sx, x1, n);
        if (a->has_weight) {
            /* gradWeight uses the raw gy, before weighting and without the clamp mask. */
            impl->load(yo_row + h0 * so * es, so, yo, n);
            chunks += impl->chunk_sums(gy, yo, n, r->partials + chunks);
            impl->scale(gy, n, w);
        }
        if (a->clamp_on) {
            impl->grad_clamped(gy, x0, x1, n, a->clamp);
        } else {
            impl->grad(gy, x0, x1, n);
        }
        impl->store(gx_row + h0 * sg * es, sg, x0, n);
        impl->store(gx_row + (H + h0) * sg * es, sg, x1, n);
    }
    if (a->has_weight) {
        float *gw = (float *)a->grad_weight.data + element_offset(&a->grad_weight, t);
        *gw = canonical_f32(tree_sum(r->partials, chunks));
    }
}

static void *run_rows(void *arg)
{
    const row_range *r = arg;
    /* Zeroed once so that the first short block's spare lanes hold plain numbers. */
    float gy[BLOCK] = {0}, x0[BLOCK] = {0}, x1[BLOCK] = {0}, yo[BLOCK] = {0};
    static const float zeros[BLOCK];
    for (int64_t t = r->first_row; t < r->end_row; t++) {
        if (t < r->trunc) {
            compute_row(r, t, gy, x0, x1, yo);
        } else {
            zero_row(r, t, zeros);
        }
    }
    return NULL;
}

int64_t swiglu_trunc(const swiglu_kernel_args *a)
{
    if (a->group_mode == SWIGLU_GROUPS_NONE) {
        return a->rows;
    }
    uint32_t sum = 0;
    if (a->group_mode == SWIGLU_GROUPS_HOST) {
        for (uint64_t g = 0; g < a->group_count; g++) {
            sum += (uint32_t)a->group_values[g];
        }
    } else {
        const int64_t *base = (const int64_t *)a->group_index.data;
        int64_t stride = a->group_index.ndim > 0 ? a->group_index.strides[0] : 1;
        int64_t count = a->group_index.ndim > 0 ? a->group_index.dims[0] : 1;
        for (int64_t g = 0; g < count; g++) {
            sum += (uint32_t)base[g * stride];
        }
    }
    return (int64_t)sum < a->rows ? (int64_t)sum : a->rows;
}

int swiglu_kernel_run(const swiglu_kernel_args *args, int threads, swiglu_kernel_variant variant)
{
    if (args->rows <= 0) {
        return 0;
    }
    int io = args->dtype == ACL_FLOAT ? 0 : args->dtype == ACL_FLOAT16 ? 1 : 2;
    const kernel_impl *impl = variant == SWIGLU_KERNEL_SCALAR ? &scalar_impls[io] : &vector_impls[io];
    int64_t trunc = swiglu_trunc(args);
    int64_t work = args->rows * (args->hidden > 0 ? args->hidden : 1);
    int64_t useful = work / MIN_ELEMENTS_PER_THREAD;
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > useful) threads = useful > 1 ? (int)useful : 1;
    if (threads > args->rows) threads = (int)args->rows;

    size_t chunks = (size_t)((args->hidden + CHUNK - 1) / CHUNK);
    size_t per_thread = chunks ? chunks : 1;
    row_range *ranges = calloc((size_t)threads, sizeof *ranges);
    float *partials = malloc((size_t)threads * per_thread * sizeof *partials);
    pthread_t *ids = calloc((size_t)threads, sizeof *ids);
    if (ranges == NULL || partials == NULL || ids == NULL) {
        free(ranges);
        free(partials);
        free(ids);
        return -1;
    }
    for (int k = 0; k < threads; k++) {
        ranges[k] = (row_range){args, impl, trunc, args->rows * k / threads,
                                args->rows * (k + 1) / threads, partials + (size_t)k * per_thread};
    }
    /* Threads beyond the first run the upper row ranges; if one cannot start, its rows run
     * here, so the result never depends on how many threads there were. */
    int started[MAX_THREADS] = {0};
    for (int k = 1; k < threads; k++) {
        started[k] = pthread_create(&ids[k], NULL, run_rows, &ranges[k]) == 0;
    }
    run_rows(&ranges[0]);
    for (int k = 1; k < threads; k++) {
        if (started[k]) {
            pthread_join(ids[k], NULL);
        } else {
            run_rows(&ranges[k]);
        }
    }
    free(ranges);
    free(partials);
    free(ids);
    return 0;
}
