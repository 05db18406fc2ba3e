/*
 * The vectorised implementation of the forward kernel (docs/forward.md), compiled once per
 * instruction set: the including file defines KERNEL_LANES (8 or 16) and QUANT_TABLE (the name
 * of the table it exports). Every lane does the same IEEE and integer operations as the scalar
 * implementation in swiglu_quant_impl.h, in the same order, so each build writes the same bytes
 * (native/tests/test_forward_kernel.c compares them). Lengths are whole blocks and groups, so
 * there is never a tail.
 */
#include "swiglu_quant_impl.h"
#include "swiglu_vector.h"

#if KERNEL_LANES == 16
typedef uint8_t vbyte __attribute__((vector_size(16)));
#else
typedef uint8_t vbyte __attribute__((vector_size(8)));
#endif

_Static_assert(SWIGLU_QUANT_GROUP % (2 * LANES) == 0, "a group is whole pairs of vectors");

INLINE vuint vsplat_uint(uint32_t u) { return (vuint)vsplat_int((int32_t)u); }
INLINE vuint vselect_uint(vint mask, vuint yes, vuint no) { return (vuint)vselect_int(mask, (vint)yes, (vint)no); }

INLINE vhalf load_half(const uint16_t *p)
{
    vhalf h;
    memcpy(&h, p, sizeof h);
    return h;
}

INLINE void store_bytes(uint8_t *p, vuint codes)
{
    vbyte b = __builtin_convertvector(codes, vbyte);
    memcpy(p, &b, sizeof b);
}

INLINE vint max_lanes(vint a, vint b) { return vselect_int(a > b, a, b); }

/* The lanes 8, 4, 2 and 1 away (with wrap-around within each group of twice that). Masks are
 * macros, and the shuffles take two operands: clang builds (cmake/clang_gnu_builtins.h) spell
 * __builtin_shuffle as a macro of three arguments, and a brace list would split into more. */
#define LANES_8_AWAY {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}
#if KERNEL_LANES == 16
#define LANES_4_AWAY {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11}
#define LANES_2_AWAY {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13}
#define LANES_1_AWAY {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}
#else
#define LANES_4_AWAY {4, 5, 6, 7, 0, 1, 2, 3}
#define LANES_2_AWAY {2, 3, 0, 1, 6, 7, 4, 5}
#define LANES_1_AWAY {1, 0, 3, 2, 5, 4, 7, 6}
#endif

/* The largest lane, by halving: each step takes the maximum with the lanes half a width away. */
INLINE uint32_t max_lane(vint v)
{
#if KERNEL_LANES == 16
    v = max_lanes(v, __builtin_shuffle(v, v, (vint)LANES_8_AWAY));
#endif
    v = max_lanes(v, __builtin_shuffle(v, v, (vint)LANES_4_AWAY));
    v = max_lanes(v, __builtin_shuffle(v, v, (vint)LANES_2_AWAY));
    v = max_lanes(v, __builtin_shuffle(v, v, (vint)LANES_1_AWAY));
    return (uint32_t)v[0];
}

/* ---- the SwiGLU core ---- */

INLINE vfloat widen(int fp16, const uint16_t *p)
{
    return fp16 ? half_to_floatv(load_half(p)) : bf16_to_floatv(load_half(p));
}

INLINE vfloat flush_subnormal(vfloat f)
{
    vuint u = (vuint)f;
    return (vfloat)vselect_uint((vint)((u & 0x7F800000u) == 0), u & 0x80000000u, u);
}

/* Two vectors of y from element i: the clamp, both exps at once, then the rest as
 * quant_swiglu does it (the divisor e + 1 is never subnormal, so only the dividend and the
 * quotient are flushed). The flags are constants where the callers below inline it. */
INLINE void swiglu_pair(const quant_core *c, const uint16_t *x0, const uint16_t *x1, size_t i, vfloat y[2], int fp16,
                        int clamp_on, int has_weight, int plus_zero)
{
    const vfloat limit = vsplat(c->clamp), neg_limit = vsplat(-c->clamp), weight = vsplat(c->weight);
    vfloat a[2], b[2], minus[2], e[2];
    for (int k = 0; k < 2; k++) {
        a[k] = widen(fp16, x0 + i + (size_t)k * LANES);
        b[k] = widen(fp16, x1 + i + (size_t)k * LANES);
        if (clamp_on) {
            a[k] = vmin_nan_second(limit, a[k]);
            b[k] = vmin_nan_second(limit, vmax_nan_second(neg_limit, b[k]));
        }
        minus[k] = -a[k];
    }
    device_expv2(minus, e);
    for (int k = 0; k < 2; k++) {
        vfloat v = flush_subnormal(flush_subnormal(a[k]) / (e[k] + 1.0f)) * b[k];
        if (has_weight) v = v * weight;
        if (plus_zero) v = v + 0.0f;
        y[k] = v;
    }
}

INLINE void core_body(const quant_core *c, const uint16_t *x0, const uint16_t *x1, float *y, uint16_t *narrow,
                      size_t n, int fp16, int clamp_on, int has_weight)
{
    for (size_t i = 0; i < n; i += 2 * LANES) {
        vfloat v[2];
        swiglu_pair(c, x0, x1, i, v, fp16, clamp_on, has_weight, narrow == NULL);
        for (int k = 0; k < 2; k++) {
            if (narrow == NULL) {
                vstore(y + i + (size_t)k * LANES, v[k]);
            } else {
                vhalf h = fp16 ? float_to_halfv(v[k]) : float_to_bf16v(v[k]);
                memcpy(narrow + i + (size_t)k * LANES, &h, sizeof h);
            }
        }
    }
}

#define DEFINE_CORE(name, fp16, clamp_on, has_weight)                                                             \
    static void name(const quant_core *c, const uint16_t *x0, const uint16_t *x1, float *y, uint16_t *narrow,   \
                     size_t n)                                                                                 \
    {                                                                                                          \
        if (narrow == NULL) core_body(c, x0, x1, y, NULL, n, fp16, clamp_on, has_weight);                      \
        else core_body(c, x0, x1, NULL, narrow, n, fp16, clamp_on, has_weight);                                \
    }
DEFINE_CORE(core_bf16, 0, 0, 0)
DEFINE_CORE(core_bf16_w, 0, 0, 1)
DEFINE_CORE(core_bf16_c, 0, 1, 0)
DEFINE_CORE(core_bf16_cw, 0, 1, 1)
DEFINE_CORE(core_f16, 1, 0, 0)
DEFINE_CORE(core_f16_w, 1, 0, 1)
DEFINE_CORE(core_f16_c, 1, 1, 0)
DEFINE_CORE(core_f16_cw, 1, 1, 1)

typedef void (*core_fn)(const quant_core *, const uint16_t *, const uint16_t *, float *, uint16_t *, size_t);

static core_fn core_for(const quant_core *c)
{
    static const core_fn cores[2][2][2] = {{{core_bf16, core_bf16_w}, {core_bf16_c, core_bf16_cw}},
                                           {{core_f16, core_f16_w}, {core_f16_c, core_f16_cw}}};
    return cores[c->x_dtype == ACL_FLOAT16][c->clamp_on != 0][c->has_weight != 0];
}

/* y with the +0 step (the callers' FP8 paths ask for it), or rounded to x's format without it. */
static void core_vector(const quant_core *c, const uint16_t *x0, const uint16_t *x1, float *y, size_t n)
{
    core_for(c)(c, x0, x1, y, NULL, n);
}

static void core_narrow_vector(const quant_core *c, const uint16_t *x0, const uint16_t *x1, uint16_t *out, size_t n)
{
    core_for(c)(c, x0, x1, NULL, out, n);
}

/* ---- FP8 ---- */

INLINE vuint e4m3v(vfloat f)
{
    vuint u = (vuint)f, sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
    vuint normal = (a - (120u << 23) + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
    vuint subnormal = (vuint)((vfloat)a * 512.0f + 8388608.0f) - 0x4B000000u;
    vuint code = vselect_uint((vint)a < 0x3C800000, subnormal, normal);
    vint nan = ((vint)a > 0x7F800000) | ((vint)code > 0x7E);
    return vselect_uint(nan, vsplat_uint(QUANT_NAN_E4M3), code | sign);
}

INLINE vuint e5m2v(vfloat f)
{
    vuint u = (vuint)f, sign = (u >> 24) & 0x80u, a = u & 0x7FFFFFFFu;
    vuint normal = (a - (112u << 23) + 0xFFFFFu + ((a >> 21) & 1u)) >> 21;
    vuint subnormal = (vuint)((vfloat)a * 65536.0f + 8388608.0f) - 0x4B000000u;
    vuint code = vselect_uint((vint)a < 0x38800000, subnormal, normal);
    code = vselect_uint((vint)code > 0x7C, vsplat_uint(0x7Cu), code);
    return vselect_uint((vint)a > 0x7F800000, vsplat_uint(QUANT_NAN_E5M2), code | sign);
}

INLINE vuint fp8v(vfloat f, aclDataType dst) { return dst == ACL_FLOAT8_E4M3FN ? e4m3v(f) : e5m2v(f); }

static void block_fp8_vector(const float *y, size_t n, aclDataType dst, int round_scale, uint8_t *codes,
                             float *scales)
{
    for (size_t b = 0; b < n / SWIGLU_QUANT_BLOCK; b++) {
        const float *block = y + b * SWIGLU_QUANT_BLOCK;
        vint amax = vsplat_int(0);
        for (size_t i = 0; i < SWIGLU_QUANT_BLOCK; i += LANES) {
            vint a = (vint)vload(block + i) & 0x7FFFFFFF;
            amax = max_lanes(amax, vselect_int(a < 0x7F800000, a, vsplat_int(0)));
        }
        float inv;
        quant_block_scale(max_lane(amax), dst, round_scale, &scales[b], &inv);
        for (size_t i = 0; i < SWIGLU_QUANT_BLOCK; i += LANES) {
            vfloat v = vload(block + i), q = v * inv;
            q = vselect(((vint)q & 0x7FFFFFFF) < 0x7F800000, q, v);
            store_bytes(codes + b * SWIGLU_QUANT_BLOCK + i, fp8v(q, dst));
        }
    }
}

static void mx_fp8_vector(const float *y, size_t n, aclDataType dst, uint8_t *codes, uint8_t *scales)
{
    for (size_t g = 0; g < n / SWIGLU_QUANT_GROUP; g++) {
        const float *group = y + g * SWIGLU_QUANT_GROUP;
        vint amax = vsplat_int(0);
        for (size_t i = 0; i < SWIGLU_QUANT_GROUP; i += LANES) amax = max_lanes(amax, (vint)vload(group + i) & 0x7FFFFFFF);
        float inv;
        quant_mx_fp8_scale(max_lane(amax), dst, &scales[g], &inv);
        for (size_t i = 0; i < SWIGLU_QUANT_GROUP; i += LANES) {
            store_bytes(codes + g * SWIGLU_QUANT_GROUP + i, fp8v(vload(group + i) * inv, dst));
        }
    }
}

/* ---- FP4 ---- */

INLINE vint fp4_keys(const uint16_t *p, int fp16)
{
    vhalf h = load_half(p);
    vint v = __builtin_convertvector(h, vint);
    if (!fp16) return v & 0x7F80;
    vint key = ((vint)half_to_floatv(h) >> 16) & 0x7F80;
    return vselect_int((v & 0x7C00) == 0x7C00, vsplat_int((int32_t)QUANT_KEY_INF_NAN), key);
}

/* The codes of LANES elements (quant_fp4_element lane by lane). */
INLINE vint fp4_codes(const uint16_t *p, int fp16, aclDataType dst, vfloat recip)
{
    vhalf h = load_half(p);
    vfloat operand;
    if (fp16) {
        vint v = __builtin_convertvector(h, vint);
        vint low = v & (dst == ACL_FLOAT4_E2M1 ? 0x00FF : 0x007F);
        v = vselect_int((low > 0) & (low < 8), v | 0x0008, v);
        operand = (vfloat)((vint)half_to_floatv(__builtin_convertvector(v, vhalf)) & (int32_t)0xFFFF0000u);
    } else {
        operand = bf16_to_floatv(h);
    }
    vint product = __builtin_convertvector(float_to_bf16v(operand * recip), vint);
    vint a = product & 0x7FFF;
    vfloat m = (vfloat)(a << 16);
    vint count;   /* comparisons give -1 per threshold passed */
    if (dst == ACL_FLOAT4_E2M1) {
        count = (m > 0.25f) + (m >= 0.75f) + (m > 1.25f) + (m >= 1.75f) + (m > 2.5f) + (m >= 3.5f) + (m > 5.0f);
    } else {
        count = (m > 0.125f) + (m >= 0.375f) + (m > 0.625f) + (m >= 0.875f) + (m > 1.125f) + (m >= 1.375f) +
                (m > 1.625f);
    }
    vint code = ((product >> 12) & 0x8) | -count;
    return vselect_int(a > 0x7F80, vsplat_int(0), code);
}

static void mx_fp4_vector(const uint16_t *v, size_t n, aclDataType x_dtype, aclDataType dst, uint8_t *packed,
                          uint8_t *scales)
{
    const int fp16 = x_dtype == ACL_FLOAT16;
    for (size_t g = 0; g < n / SWIGLU_QUANT_GROUP; g++) {
        const uint16_t *group = v + g * SWIGLU_QUANT_GROUP;
        vint keys = vsplat_int(0);
        for (size_t i = 0; i < SWIGLU_QUANT_GROUP; i += LANES) keys = max_lanes(keys, fp4_keys(group + i, fp16));
        uint16_t recip_bits;
        quant_mx_fp4_scale(max_lane(keys), dst, &scales[g], &recip_bits);
        const vfloat recip = vsplat(bf16_to_float(recip_bits));
        for (size_t i = 0; i < SWIGLU_QUANT_GROUP; i += 2 * LANES) {
            vint first = fp4_codes(group + i, fp16, dst, recip);
            vint second = fp4_codes(group + i + LANES, fp16, dst, recip);
            vint even = __builtin_shuffle(first, second, (vint)EVEN_LANES);
            vint odd = __builtin_shuffle(first, second, (vint)ODD_LANES);
            store_bytes(packed + (g * SWIGLU_QUANT_GROUP + i) / 2, (vuint)(even | odd << 4));
        }
    }
}

const quant_impl QUANT_TABLE = {core_vector, core_narrow_vector, block_fp8_vector, mx_fp8_vector, mx_fp4_vector};
