/*
 * Pieces shared by the forward kernel's implementations (swiglu_quant_kernel.c: the scalar one,
 * rows and threads; swiglu_quant_vector.c: the vectorised ones, built once per instruction set):
 * the per-element rules of docs/forward.md one value at a time, and the per-block scale rules.
 * Internal to the emulator.
 */
#ifndef ACL_SWIGLU_SWIGLU_QUANT_IMPL_H
#define ACL_SWIGLU_SWIGLU_QUANT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "swiglu_kernel_impl.h"
#include "swiglu_quant_kernel.h"

/* Columns of a row handled per step: a multiple of the 128-element block. */
#define QUANT_CHUNK 2048

/* The amax floor 1e-4f, the scale factors fp32(1/448) and fp32(1/57344), as bits. */
#define QUANT_AMAX_FLOOR 0x38D1B717u
#define QUANT_FACTOR_E4M3 0x3B124925u
#define QUANT_FACTOR_E5M2 0x37924925u
#define QUANT_MAX_E4M3 448.0f
#define QUANT_MAX_E5M2 57344.0f

/* The stored NaN codes: positive, all mantissa bits set (E4M3FN has no other) / quiet. */
#define QUANT_NAN_E4M3 0x7Fu
#define QUANT_NAN_E5M2 0x7Eu

/* FP4 exponent keys (bf16 exponent fields, in place): inf/NaN, and the exponent of each type's
 * maximum (6 = 1.5 * 2^2, 1.75 = 1.75 * 2^0) taken as bf16 bits above the 1.0 key. */
#define QUANT_KEY_INF_NAN 0x7F80u
#define QUANT_EMAX_E2M1 0x0100u
#define QUANT_EMAX_E1M2 0x0000u

typedef struct {
    aclDataType x_dtype;
    int clamp_on;
    float clamp;
    int has_weight;
    float weight;     /* row t's */
} quant_core;

typedef struct {
    /* y[0..n) (n a multiple of 32) from x0[0..n) and x1[0..n) in x's 16-bit format, with the
     * FP8 paths' +0 step. */
    void (*core)(const quant_core *c, const uint16_t *x0, const uint16_t *x1, float *y, size_t n);
    /* y without the +0 step, rounded to x's format (the FP4 path's v). */
    void (*core_narrow)(const quant_core *c, const uint16_t *x0, const uint16_t *x1, uint16_t *v, size_t n);
    /* Mode 0 over n (a multiple of 128) values: codes[0..n) and scales[0..n/128). */
    void (*block_fp8)(const float *y, size_t n, aclDataType dst, int round_scale, uint8_t *codes, float *scales);
    /* Mode 1, FP8, over n (a multiple of 32): codes[0..n) and E8M0 bytes[0..n/32). */
    void (*mx_fp8)(const float *y, size_t n, aclDataType dst, uint8_t *codes, uint8_t *scales);
    /* Mode 1, FP4, over n (a multiple of 32) 16-bit v: packed[0..n/2) and E8M0 bytes[0..n/32). */
    void (*mx_fp4)(const uint16_t *v, size_t n, aclDataType x_dtype, aclDataType dst, uint8_t *packed,
                   uint8_t *scales);
} quant_impl;

extern const quant_impl swiglu_quant_vector_baseline;
#if defined(__x86_64__)
#define SWIGLU_QUANT_HAVE_X86_VARIANTS 1
extern const quant_impl swiglu_quant_vector_avx2;
extern const quant_impl swiglu_quant_vector_avx512;
#endif

/* ---- the SwiGLU core ---- */

static inline float quant_widen(uint16_t h, int fp16) { return fp16 ? half_to_float(h) : bf16_to_float(h); }

/* vdiv flushes subnormal operands and results to zero (keeping the sign); IEEE division between. */
static inline float quant_flush(float f)
{
    uint32_t u = bits_of(f);
    return (u & 0x7F800000u) == 0 ? float_of(u & 0x80000000u) : f;
}

static inline float quant_div(float num, float den) { return quant_flush(quant_flush(num) / quant_flush(den)); }

/* y for one column: the clamp (x0 above only, x1 both sides; NaN stays NaN), the swish
 * x0 / (1 + exp(-x0)), times x1, times the weight (the +0 step is the caller's). */
static inline float quant_swiglu(const quant_core *c, float x0, float x1)
{
    if (c->clamp_on) {
        const float limit = c->clamp;
        x0 = (x0 < limit || x0 != x0) ? x0 : limit;
        x1 = (x1 > -limit || x1 != x1) ? x1 : -limit;
        x1 = (x1 < limit || x1 != x1) ? x1 : limit;
    }
    float e = device_expf(-x0);
    float y = quant_div(x0, e + 1.0f) * x1;
    if (c->has_weight) y = y * c->weight;
    return y;
}

/* ---- scales ---- */

/* ceil(log2 s) for a normal s, from its bits: the exponent, plus one when the mantissa is not
 * zero (inf gives 128, NaN 129). */
static inline int32_t quant_pow2_exponent(float s)
{
    uint32_t u = bits_of(s);
    return (int32_t)((u >> 23) & 0xFFu) - 127 + ((u & 0x7FFFFFu) != 0);
}

static inline float quant_factor(aclDataType dst)
{
    return float_of(dst == ACL_FLOAT8_E4M3FN ? QUANT_FACTOR_E4M3 : QUANT_FACTOR_E5M2);
}

/* Mode 0: the block's scale and the multiplier of its elements, from the bits of its amax over
 * finite |y| (a non-negative finite float). */
static inline void quant_block_scale(uint32_t amax_bits, aclDataType dst, int round_scale, float *scale, float *inv)
{
    float amax = float_of(amax_bits > QUANT_AMAX_FLOOR ? amax_bits : QUANT_AMAX_FLOOR);
    float s = amax * quant_factor(dst);
    if (round_scale) {
        int32_t e = quant_pow2_exponent(s);   /* amax >= 1e-4: s is normal, e in [-29, 120] */
        *scale = float_of((uint32_t)(e + 127) << 23);
        *inv = float_of((uint32_t)(127 - e) << 23);
    } else {
        *scale = s;
        *inv = quant_div(dst == ACL_FLOAT8_E4M3FN ? QUANT_MAX_E4M3 : QUANT_MAX_E5M2, amax);
    }
}

/* Mode 1, FP8: the E8M0 byte (E + 127 truncated to 8 bits) and the multiplier 2^-E written as
 * bits ((127 - E) << 23) mod 2^32, from the bits of the group's max |y| (NaN above inf). */
static inline void quant_mx_fp8_scale(uint32_t amax_bits, aclDataType dst, uint8_t *byte, float *inv)
{
    float amax = float_of(amax_bits > QUANT_AMAX_FLOOR ? amax_bits : QUANT_AMAX_FLOOR);
    int32_t e = quant_pow2_exponent(amax * quant_factor(dst));
    *byte = (uint8_t)(uint32_t)(e + 127);
    *inv = float_of((uint32_t)(127 - e) << 23);
}

/* Mode 1, FP4: the E8M0 byte and the bf16 multiplier from the group's largest exponent key. */
static inline void quant_mx_fp4_scale(uint32_t key, aclDataType dst, uint8_t *byte, uint16_t *recip)
{
    const uint32_t emax = dst == ACL_FLOAT4_E2M1 ? QUANT_EMAX_E2M1 : QUANT_EMAX_E1M2;
    const uint32_t shift = (key > emax ? key : emax) - emax;
    uint16_t r = (uint16_t)(0x7F00u - shift);
    if (key == QUANT_KEY_INF_NAN) r = 0x7F81u;   /* NaN */
    if (key == 0) r = 0;
    if (shift == 0x7F00u) r = 0x0040u;           /* 2^-127, a bf16 subnormal */
    *byte = key == QUANT_KEY_INF_NAN ? 0xFFu : key == 0 ? 0 : (uint8_t)(shift >> 7);
    *recip = r;
}

/* ---- element codes ---- */

/* fp32 -> FLOAT8_E4M3FN, round half to even, not saturating: past 448 (from 464 on) and +-inf
 * give NaN; NaN is stored as QUANT_NAN_E4M3. */
static inline uint8_t quant_e4m3(float f)
{
    uint32_t u = bits_of(f), sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
    uint32_t normal = (a - (120u << 23) + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
    uint32_t subnormal = bits_of(float_of(a) * 512.0f + 8388608.0f) - 0x4B000000u;   /* steps of 2^-9 */
    uint32_t code = a < 0x3C800000u ? subnormal : normal;
    return (a > 0x7F800000u || code > 0x7Eu) ? (uint8_t)QUANT_NAN_E4M3 : (uint8_t)(code | sign);
}

/* fp32 -> FLOAT8_E5M2, round half to even, not saturating: from 61440 on and +-inf give +-inf;
 * NaN is stored as QUANT_NAN_E5M2. */
static inline uint8_t quant_e5m2(float f)
{
    uint32_t u = bits_of(f), sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
    uint32_t normal = (a - (112u << 23) + 0xFFFFFu + ((a >> 21) & 1u)) >> 21;
    uint32_t subnormal = bits_of(float_of(a) * 65536.0f + 8388608.0f) - 0x4B000000u; /* steps of 2^-16 */
    uint32_t code = a < 0x38800000u ? subnormal : normal;
    code = code > 0x7Cu ? 0x7Cu : code;
    return a > 0x7F800000u ? (uint8_t)QUANT_NAN_E5M2 : (uint8_t)(code | sign);
}

static inline uint8_t quant_fp8(float f, aclDataType dst) { return dst == ACL_FLOAT8_E4M3FN ? quant_e4m3(f) : quant_e5m2(f); }

/* The exponent key of a 16-bit v: its bf16 exponent field in place (fp16: inf/NaN give the
 * inf/NaN key, the rest the exponent of the value truncated to bf16, which truncation never
 * changes). */
static inline uint32_t quant_fp4_key(uint16_t v, int fp16)
{
    if (!fp16) return v & 0x7F80u;
    if ((v & 0x7C00u) == 0x7C00u) return QUANT_KEY_INF_NAN;
    return (bits_of(half_to_float(v)) >> 16) & 0x7F80u;
}

/* The bf16 operand of the scaling: bf16 v as is; fp16 v with the sticky bit kept (bits 0-2,
 * which truncation to bf16 drops, folded into bit 3 when the bits below the FP4 rounding bit
 * are otherwise zero), then truncated to bf16. */
static inline uint16_t quant_fp4_operand(uint16_t v, int fp16, aclDataType dst)
{
    if (!fp16) return v;
    uint16_t low = (uint16_t)(v & (dst == ACL_FLOAT4_E2M1 ? 0x00FFu : 0x007Fu));
    if (low > 0 && low < 8) v = (uint16_t)(v | 0x0008u);
    return (uint16_t)(bits_of(half_to_float(v)) >> 16);
}

/* bf16 -> FP4 code (bit 3 sign), round half to even, saturating (+-inf to +-max); NaN gives +0.
 * Each comparison is one rounding threshold, the midpoint between neighbouring codes: strict
 * above an even code (a tie stays on it), inclusive above an odd one (a tie goes up). */
static inline uint8_t quant_fp4_code(uint16_t p, aclDataType dst)
{
    uint32_t a = p & 0x7FFFu;
    if (a > 0x7F80u) return 0;
    float m = float_of(a << 16);
    uint32_t code;
    if (dst == ACL_FLOAT4_E2M1) {   /* 0, 0.5, 1, 1.5, 2, 3, 4, 6 */
        code = (m > 0.25f) + (m >= 0.75f) + (m > 1.25f) + (m >= 1.75f) + (m > 2.5f) + (m >= 3.5f) + (m > 5.0f);
    } else {                        /* 0, 0.25, ..., 1.75 */
        code = (m > 0.125f) + (m >= 0.375f) + (m > 0.625f) + (m >= 0.875f) + (m > 1.125f) + (m >= 1.375f) +
               (m > 1.625f);
    }
    return (uint8_t)(((p >> 12) & 0x8u) | code);
}

/* One FP4 element: scaled by the bf16 multiplier with bf16 Mul semantics, then coded. */
static inline uint8_t quant_fp4_element(uint16_t v, int fp16, aclDataType dst, uint16_t recip)
{
    float product = bf16_to_float(quant_fp4_operand(v, fp16, dst)) * bf16_to_float(recip);
    return quant_fp4_code(float_to_bf16(product), dst);
}

#endif /* ACL_SWIGLU_SWIGLU_QUANT_IMPL_H */
