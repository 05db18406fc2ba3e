/*
 * Vectors of fp32 lanes for the kernels' vectorised builds (GCC vector extensions), shared by
 * the SwiGLU backward (swiglu_kernel_vector.c) and the forward (swiglu_quant_vector.c): the
 * including file defines KERNEL_LANES (8 or 16) before including it, once per translation unit.
 * Every lane does the same IEEE operation as the scalar code of swiglu_kernel_impl.h (device_expf,
 * the fp16/bf16 conversions), so every instruction set gives the same bytes. Internal to the
 * emulator.
 */
#ifndef ACL_SWIGLU_SWIGLU_VECTOR_H
#define ACL_SWIGLU_SWIGLU_VECTOR_H

#ifndef KERNEL_LANES
#error "define KERNEL_LANES (8 or 16) before including swiglu_vector.h"
#endif

#include "swiglu_kernel_impl.h"

#if defined(__AVX__) || defined(__F16C__)
#include <immintrin.h>
#endif

/* ---- vectors ----
 * GCC vector extensions: LANES fp32 lanes, each lane the same IEEE operation as the scalar
 * code, so every instruction set gives the same bytes. */

#if KERNEL_LANES == 16
#define LANES 16
typedef float vfloat __attribute__((vector_size(64)));
typedef int32_t vint __attribute__((vector_size(64)));
typedef uint32_t vuint __attribute__((vector_size(64)));
typedef uint16_t vhalf __attribute__((vector_size(32)));
#define SPLAT(v) {v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v}
#define EVEN_LANES {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}
#define ODD_LANES {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}
#else
#define LANES 8
typedef float vfloat __attribute__((vector_size(32)));
typedef int32_t vint __attribute__((vector_size(32)));
typedef uint32_t vuint __attribute__((vector_size(32)));
typedef uint16_t vhalf __attribute__((vector_size(16)));
#define SPLAT(v) {v, v, v, v, v, v, v, v}
#define EVEN_LANES {0, 2, 4, 6, 8, 10, 12, 14}
#define ODD_LANES {1, 3, 5, 7, 9, 11, 13, 15}
#endif
#define INLINE static inline __attribute__((always_inline))

INLINE vfloat vload(const float *p) { vfloat v; memcpy(&v, p, sizeof v); return v; }
INLINE void vstore(float *p, vfloat v) { memcpy(p, &v, sizeof v); }
INLINE vfloat vsplat(float f) { return (vfloat)SPLAT(f); }
INLINE vint vsplat_int(int32_t i) { return (vint)SPLAT(i); }
/* Mask lanes are all ones or all zeros, as vector comparisons give them. */
#if defined(__AVX512F__) && KERNEL_LANES == 16
/* One blend on a mask register (the generic form costs two instructions here). */
INLINE vint vselect_int(vint mask, vint yes, vint no)
{
    return (vint)_mm512_mask_blend_epi32(_mm512_movepi32_mask((__m512i)mask), (__m512i)no, (__m512i)yes);
}
#else
INLINE vint vselect_int(vint mask, vint yes, vint no) { return (mask & yes) | (~mask & no); }
#endif
INLINE vfloat vselect(vint mask, vfloat yes, vfloat no) { return (vfloat)vselect_int(mask, (vint)yes, (vint)no); }

/* first < second ? first : second, so a NaN `second` comes out as is: the x86 min/max
 * instructions return their second operand when the comparison is false. */
INLINE vfloat vmin_nan_second(vfloat first, vfloat second)
{
#if defined(__AVX512F__) && KERNEL_LANES == 16
    return (vfloat)_mm512_min_ps((__m512)first, (__m512)second);
#elif defined(__AVX__) && KERNEL_LANES == 8
    return (vfloat)_mm256_min_ps((__m256)first, (__m256)second);
#else
    return vselect(first < second, first, second);
#endif
}

/* first > second ? first : second */
INLINE vfloat vmax_nan_second(vfloat first, vfloat second)
{
#if defined(__AVX512F__) && KERNEL_LANES == 16
    return (vfloat)_mm512_max_ps((__m512)first, (__m512)second);
#elif defined(__AVX__) && KERNEL_LANES == 8
    return (vfloat)_mm256_max_ps((__m256)first, (__m256)second);
#else
    return vselect(first > second, first, second);
#endif
}

/* device_exp's core for lanes already clamped to [-104, 89]: x = n ln2 + r, and the polynomial
 * p ~ e^r; e^x is p * 2^n once the caller has handled what n's range needs. */
INLINE vfloat expv_reduced(vfloat x, vint *n)
{
    vfloat t = x * EXP_LOG2E + EXP_ROUNDER;
    vfloat nf = t - EXP_ROUNDER;
    vfloat r = x - nf * EXP_LN2_HI;
    r = r - nf * EXP_LN2_LO;
    vfloat p = vsplat(1.98412698412698412526e-4f);
    p = p * r + 1.38888888888888894189e-3f;
    p = p * r + 8.33333333333333321769e-3f;
    p = p * r + 4.16666666666666643537e-2f;
    p = p * r + 1.66666666666666657415e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    *n = (vint)t - (vint)vsplat(EXP_ROUNDER);
    return p;
}

INLINE vfloat device_expv_full(vfloat x)
{
    vfloat xc = vselect(x < -104.0f, vsplat(-104.0f), x);
    xc = vselect(xc > 89.0f, vsplat(89.0f), xc);
    vint n;
    vfloat p = expv_reduced(xc, &n);
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

/* Lane masks of the hot loop's comparisons (NaN compares false): AVX-512 keeps them in mask
 * registers, the others in vectors of all ones / all zeros. */
#if defined(__AVX512F__) && KERNEL_LANES == 16
typedef __mmask16 lane_mask;
INLINE lane_mask lanes_less(vfloat a, vfloat b) { return _mm512_cmp_ps_mask((__m512)a, (__m512)b, _CMP_LT_OQ); }
INLINE int all_lanes(lane_mask mask) { return mask == 0xFFFF; }
INLINE vfloat zero_unless(lane_mask mask, vfloat v) { return (vfloat)_mm512_maskz_mov_ps(mask, (__m512)v); }
INLINE vfloat select_lanes(lane_mask mask, vfloat yes, vfloat no)
{
    return (vfloat)_mm512_mask_blend_ps(mask, (__m512)no, (__m512)yes);
}
#else
typedef vint lane_mask;
INLINE lane_mask lanes_less(vfloat a, vfloat b) { return a < b; }
INLINE int all_lanes(lane_mask mask)
{
#if defined(__AVX__) && KERNEL_LANES == 8
    return _mm256_movemask_ps((__m256)mask) == 0xFF;
#else
    int32_t lanes[LANES];
    memcpy(lanes, &mask, sizeof lanes);
    int all = -1;
    for (int i = 0; i < LANES; i++) all &= lanes[i];
    return all != 0;
#endif
}
INLINE vfloat zero_unless(lane_mask mask, vfloat v) { return vselect(mask, v, vsplat(0.0f)); }
INLINE vfloat select_lanes(lane_mask mask, vfloat yes, vfloat no) { return vselect(mask, yes, no); }
#endif

/* device_exp for lanes known to lie in (-86.5, 88): no clamp, no flush, no overflow, no NaN
 * can happen there, and p * 2^n is one exact scaling (n in [-125, 127]), so this gives the
 * same bits as device_expv_full with fewer operations. */
INLINE vfloat device_expv_in_range(vfloat x)
{
    vint n;
    vfloat p = expv_reduced(x, &n);
    return p * (vfloat)((n + 127) << 23);
}

INLINE lane_mask exp_in_range(vfloat x) { return lanes_less(vsplat(-86.5f), x) & lanes_less(x, vsplat(88.0f)); }

INLINE vfloat device_expv(vfloat x)
{
    if (all_lanes(exp_in_range(x))) {
        return device_expv_in_range(x);
    }
    return device_expv_full(x);
}

/* Two vectors at once: with both in range, the two exps are one stretch of code the CPU can
 * overlap. */
INLINE void device_expv2(const vfloat x[2], vfloat e[2])
{
    if (all_lanes(exp_in_range(x[0]) & exp_in_range(x[1]))) {
        e[0] = device_expv_in_range(x[0]);
        e[1] = device_expv_in_range(x[1]);
        return;
    }
    e[0] = device_expv(x[0]);
    e[1] = device_expv(x[1]);
}

INLINE vfloat canonical_f32v(vfloat f)
{
    return vselect(f != f, (vfloat)vsplat_int((int32_t)CANONICAL_NAN_F32), f);
}

INLINE vfloat bf16_to_floatv(vhalf h)
{
#if defined(__AVX512F__) && KERNEL_LANES == 16
    return (vfloat)_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16);
#elif defined(__AVX2__) && KERNEL_LANES == 8
    return (vfloat)_mm256_slli_epi32(_mm256_cvtepu16_epi32((__m128i)h), 16);
#else
    return (vfloat)(__builtin_convertvector(h, vuint) << 16);
#endif
}

/* 16-bit patterns zero-extended to 32-bit lanes. */
INLINE vint widen_bits(vhalf h)
{
#if defined(__AVX512F__) && KERNEL_LANES == 16
    return (vint)_mm512_cvtepu16_epi32((__m256i)h);
#elif defined(__AVX2__) && KERNEL_LANES == 8
    return (vint)_mm256_cvtepu16_epi32((__m128i)h);
#else
    return __builtin_convertvector(h, vint);
#endif
}

INLINE vhalf float_to_bf16v(vfloat f)
{
    vuint u = (vuint)f;
    vuint rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    vint nan = (vint)((u & 0x7FFFFFFFu) > 0x7F800000u);
    vuint out = (vuint)vselect_int(nan, vsplat_int(CANONICAL_NAN_BF16), (vint)rounded);
    return __builtin_convertvector(out, vhalf);
}

#if defined(__AVX512F__) && KERNEL_LANES == 16
/* The CPU's own fp16 conversions: exact widening, round-half-even narrowing (subnormals and
 * overflow to inf included, as the scalar code does); NaNs are made canonical first, so the
 * narrowing gives 0x7E00 for them too. */
INLINE vfloat half_to_floatv(vhalf h) { return (vfloat)_mm512_cvtph_ps((__m256i)h); }

INLINE vhalf float_to_halfv(vfloat f)
{
    return (vhalf)_mm512_cvtps_ph((__m512)canonical_f32v(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
#elif defined(__F16C__) && KERNEL_LANES == 8
INLINE vfloat half_to_floatv(vhalf h) { return (vfloat)_mm256_cvtph_ps((__m128i)h); }

INLINE vhalf float_to_halfv(vfloat f)
{
    return (vhalf)_mm256_cvtps_ph((__m256)canonical_f32v(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
#else
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
#endif

#endif /* ACL_SWIGLU_SWIGLU_VECTOR_H */
