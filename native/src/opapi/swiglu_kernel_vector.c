/*
 * The vectorised implementation of the kernel (docs/kernel.md), compiled once per instruction
 * set: the including file defines KERNEL_LANES (8 or 16) and KERNEL_TABLE (the name of the table
 * it exports). Every lane does the same IEEE operations as the scalar implementation, in the
 * same order, so each build writes the same bytes (native/tests/test_kernel_variants.c); for
 * fp16 and bf16 the silu step comes from a table the scalar function filled
 * (native/tests/test_kernel_silu_table.c).
 */
#include "swiglu_kernel_impl.h"
#include "swiglu_vector.h"

INLINE vfloat load_as_float(aclDataType dtype, const char *p, size_t i)
{
    if (dtype == ACL_FLOAT) return vload((const float *)p + i);
    vhalf h;
    memcpy(&h, (const uint16_t *)p + i, sizeof h);
    return dtype == ACL_FLOAT16 ? half_to_floatv(h) : bf16_to_floatv(h);
}

#if defined(__AVX2__) && KERNEL_LANES == 8
/* silu and its derivative of 8 inputs from their table (swiglu_silu_table.c): lanes 0-3 from the
 * patterns at `first`, lanes 4-7 from those at `second`. Eight 8-byte loads, indexed straight
 * from memory, beat the gather instructions (which some AVX2 CPUs run in microcode) and moving
 * the indices out of a vector. Both halves of a pair share a cache line. */
INLINE void silu_lookup_halves(const silu_pair *table, const uint16_t *first, const uint16_t *second,
                               vfloat *silu, vfloat *dsilu)
{
    __m128d p[4];
    for (int k = 0; k < 4; k++) {
        const uint16_t *patterns = k < 2 ? first + 2 * k : second + 2 * (k - 2);
        p[k] = _mm_loadh_pd(_mm_load_sd((const double *)&table[patterns[0]]), (const double *)&table[patterns[1]]);
    }
    __m256 low = _mm256_castpd_ps(_mm256_setr_m128d(p[0], p[2]));
    __m256 high = _mm256_castpd_ps(_mm256_setr_m128d(p[1], p[3]));
    /* pairs s0 d0 s1 d1 | s4 d4 s5 d5 and s2 d2 s3 d3 | s6 d6 s7 d7: even and odd floats */
    *silu = (vfloat)_mm256_shuffle_ps(low, high, _MM_SHUFFLE(2, 0, 2, 0));
    *dsilu = (vfloat)_mm256_shuffle_ps(low, high, _MM_SHUFFLE(3, 1, 3, 1));
}
#endif

/* silu and its derivative of LANES 16-bit inputs from their table (swiglu_silu_table.c):
 * `patterns` the inputs in memory, `bits` the same zero-extended in lanes. */
INLINE void silu_lookup(const silu_pair *table, const uint16_t *patterns, vint bits, vfloat *silu, vfloat *dsilu)
{
#if defined(__AVX512F__) && KERNEL_LANES == 16
    *silu = (vfloat)_mm512_i32gather_ps((__m512i)bits, &table->silu, sizeof *table);
    *dsilu = (vfloat)_mm512_i32gather_ps((__m512i)bits, &table->dsilu, sizeof *table);
#elif defined(__AVX2__) && KERNEL_LANES == 8
    silu_lookup_halves(table, patterns, patterns + 4, silu, dsilu);
#else
    float s[LANES], d[LANES];
    for (int k = 0; k < LANES; k++) {
        s[k] = table[patterns[k]].silu;
        d[k] = table[patterns[k]].dsilu;
    }
    *silu = vload(s);
    *dsilu = vload(d);
#endif
}

/* x0 of a 16-bit block: its values, and its patterns for the table. */
INLINE vfloat load_with_bits(aclDataType dtype, const char *p, size_t i, vint *bits)
{
    vhalf h;
    memcpy(&h, (const uint16_t *)p + i, sizeof h);
    *bits = widen_bits(h);
    return dtype == ACL_FLOAT16 ? half_to_floatv(h) : (vfloat)(*bits << 16);
}

#if defined(__AVX512F__) && KERNEL_LANES == 16
#define KERNEL_BF16_INSTRUCTIONS 1
/* The CPU's bf16 narrowing (AVX512_BF16): round half to even like float_to_bf16v, but it flushes
 * subnormal inputs to zero and keeps NaN payloads; vectors with such a lane take float_to_bf16v. */
__attribute__((target("avx512bf16"))) static inline vhalf float_to_bf16v_instruction(vfloat f)
{
    /* one classification: quiet NaN (0x01), subnormal (0x20), signaling NaN (0x80) */
    if (__builtin_expect(_mm512_fpclass_ps_mask((__m512)f, 0x01 | 0x20 | 0x80) != 0, 0)) {
        return float_to_bf16v(f);
    }
    return (vhalf)(__m256i)_mm512_cvtneps_pbh((__m512)f);
}
#else
#define KERNEL_BF16_INSTRUCTIONS 0
INLINE vhalf float_to_bf16v_instruction(vfloat f) { return float_to_bf16v(f); }
#endif

/* bf16_instructions: narrow bf16 with the CPU's instruction (only in functions built for it). */
INLINE void store_from_float(aclDataType dtype, char *p, size_t i, vfloat v, int bf16_instructions)
{
    if (dtype == ACL_FLOAT) {
        vstore((float *)p + i, canonical_f32v(v));
        return;
    }
    vhalf h = dtype == ACL_FLOAT16 ? float_to_halfv(v)
              : bf16_instructions  ? float_to_bf16v_instruction(v)
                                   : float_to_bf16v(v);
    memcpy((uint16_t *)p + i, &h, sizeof h);
}

/* 1 when a lane of a or b is NaN: one unordered comparison covers both vectors. */
INLINE int any_nan2(vfloat a, vfloat b)
{
#if defined(__AVX512F__) && KERNEL_LANES == 16
    return _mm512_cmp_ps_mask((__m512)a, (__m512)b, _CMP_UNORD_Q) != 0;
#elif defined(__AVX__) && KERNEL_LANES == 8
    return _mm256_movemask_ps(_mm256_cmp_ps((__m256)a, (__m256)b, _CMP_UNORD_Q)) != 0;
#else
    int32_t lanes[LANES];
    vint nan = (a != a) | (b != b);
    memcpy(lanes, &nan, sizeof lanes);
    int32_t any = 0;
    for (int i = 0; i < LANES; i++) any |= lanes[i];
    return any != 0;
#endif
}

/* 32-bit lanes whose values are below 2^16, as 16-bit lanes. */
INLINE vhalf narrow_lanes(vuint v)
{
#if defined(__AVX2__) && KERNEL_LANES == 8
    /* Two 128-bit halves packed (no saturation happens): cheaper than the generic form's mask,
     * 256-bit pack and lane permutation. */
    return (vhalf)_mm_packus_epi32(_mm256_castsi256_si128((__m256i)v), _mm256_extracti128_si256((__m256i)v, 1));
#else
    return __builtin_convertvector(v, vhalf);
#endif
}

/* float_to_halfv / float_to_bf16v for lanes known not to be NaN (the caller checked): the same
 * bits without the step that makes NaNs canonical. */
INLINE vhalf narrow_not_nan(aclDataType dtype, vfloat f)
{
    if (dtype == ACL_FLOAT16) {
#if defined(__AVX512F__) && KERNEL_LANES == 16
        return (vhalf)_mm512_cvtps_ph((__m512)f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__F16C__) && KERNEL_LANES == 8
        return (vhalf)_mm256_cvtps_ph((__m256)f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
        return float_to_halfv(f);
#endif
    }
    vuint u = (vuint)f;
    return narrow_lanes((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

INLINE void store_half(char *p, size_t i, vhalf h) { memcpy((uint16_t *)p + i, &h, sizeof h); }

/* -- vectorised loads and stores: strided segments and the tail past the last whole vector
 * go to the scalar loops -- */

typedef void (*load_fn)(const char *src, int64_t stride, float *out, size_t n);
typedef void (*store_fn)(char *dst, int64_t stride, const float *in, size_t n);

INLINE void load_vector(aclDataType dtype, load_fn scalar, const char *src, int64_t stride, float *out,
                        size_t n)
{
    if (stride != 1) {
        scalar(src, stride, out, n);
        return;
    }
    if (dtype == ACL_FLOAT) {
        memcpy(out, src, n * sizeof *out);
        return;
    }
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) vstore(out + i, load_as_float(dtype, src, i));
    scalar(src + i * sizeof(uint16_t), 1, out + i, n - i);
}

INLINE void store_vector(aclDataType dtype, store_fn scalar, char *dst, int64_t stride, const float *in,
                         size_t n)
{
    if (stride != 1) {
        scalar(dst, stride, in, n);
        return;
    }
    const size_t element = dtype == ACL_FLOAT ? sizeof(float) : sizeof(uint16_t);
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) store_from_float(dtype, dst, i, vload(in + i), 0);
    scalar(dst + i * element, 1, in + i, n - i);
}

#define DEFINE_IO(suffix, dtype)                                                                   \
    static void load_##suffix##_vector(const char *src, int64_t stride, float *out, size_t n)      \
    {                                                                                              \
        load_vector(dtype, load_##suffix##_scalar, src, stride, out, n);                           \
    }                                                                                              \
    static void store_##suffix##_vector(char *dst, int64_t stride, const float *in, size_t n)      \
    {                                                                                              \
        store_vector(dtype, store_##suffix##_scalar, dst, stride, in, n);                          \
    }
DEFINE_IO(f32, ACL_FLOAT)
DEFINE_IO(f16, ACL_FLOAT16)
DEFINE_IO(bf16, ACL_BF16)

/* -- the per-element computation of docs/kernel.md, one vector at a time: the same IEEE
 * operations in the same order as the scalar implementation -- */

/* min(x0, c) and clip(x1, -c, c); a NaN stays NaN (it is the second operand). Where x equals
 * the limit, either gives the same value (c > 0: no signed zero to tell apart). */
INLINE void clamp_inputs(vfloat a_orig, vfloat b_orig, vfloat limit, vfloat neg_limit, vfloat *a, vfloat *b)
{
    *a = vmin_nan_second(limit, a_orig);
    *b = vmin_nan_second(limit, vmax_nan_second(neg_limit, b_orig));
}

/* The gradients from e = device_exp(a). */
INLINE void grads_from_exp(vfloat g, vfloat a, vfloat b, vfloat e, vfloat *gx0, vfloat *gx1)
{
    vfloat s = e / (e + 1.0f);
    vfloat silu = a * s;
    vfloat dsilu = s * (((1.0f - s) * a) + 1.0f);
    *gx0 = (g * b) * dsilu;
    *gx1 = g * silu;
}

INLINE void swiglu_grads(vfloat g, vfloat a, vfloat b, vfloat *gx0, vfloat *gx1)
{
    grads_from_exp(g, a, b, device_expv(a), gx0, gx1);
}

/* The strict masks x0 < c and -c < x1 < c on the original values, applied by multiplication. */
INLINE void apply_masks(vfloat a_orig, vfloat b_orig, vfloat limit, vfloat neg_limit, vfloat *gx0, vfloat *gx1)
{
    const vfloat one = vsplat(1.0f);
    *gx0 = *gx0 * zero_unless(lanes_less(a_orig, limit), one);
    /* -c < x1 < c is |x1| < c (c > 0; NaN fails both), one comparison instead of two */
    *gx1 = *gx1 * zero_unless(lanes_less((vfloat)((vint)b_orig & 0x7FFFFFFF), limit), one);
}

/* -- unfused, on float scratch: blocks are processed in whole vectors (scratch is BLOCK
 * long); lanes past n compute on stale scratch and are never stored -- */

static void grad_vector(const float *restrict gy, float *restrict x0, float *restrict x1, size_t n)
{
    for (size_t i = 0; i < n; i += LANES) {
        vfloat gx0, gx1;
        swiglu_grads(vload(gy + i), vload(x0 + i), vload(x1 + i), &gx0, &gx1);
        vstore(x0 + i, gx0);
        vstore(x1 + i, gx1);
    }
}

static void grad_clamped_vector(const float *restrict gy, float *restrict x0, float *restrict x1, size_t n,
                                float c)
{
    const vfloat limit = vsplat(c), neg_limit = vsplat(-c);
    for (size_t i = 0; i < n; i += LANES) {
        vfloat a_orig = vload(x0 + i), b_orig = vload(x1 + i), a, b, gx0, gx1;
        clamp_inputs(a_orig, b_orig, limit, neg_limit, &a, &b);
        swiglu_grads(vload(gy + i), a, b, &gx0, &gx1);
        apply_masks(a_orig, b_orig, limit, neg_limit, &gx0, &gx1);
        vstore(x0 + i, gx0);
        vstore(x1 + i, gx1);
    }
}

/* One tree level over two vectors: the sums of adjacent lanes of a:b, in order. */
INLINE vfloat pair_sums(vfloat a, vfloat b)
{
    return __builtin_shuffle(a, b, (vint)EVEN_LANES) + __builtin_shuffle(a, b, (vint)ODD_LANES);
}

/* The 64-lane tree: the same additions in the same order as tree64_scalar, a vector at a time
 * until one vector is left. */
INLINE float tree64_vector(const float *v)
{
    vfloat level[REDUCE_LANES / LANES];
    size_t count = REDUCE_LANES / LANES;
    for (size_t k = 0; k < count; k++) level[k] = vload(v + LANES * k);
    while (count > 1) {
        for (size_t k = 0; k < count / 2; k++) level[k] = pair_sums(level[2 * k], level[2 * k + 1]);
        count /= 2;
    }
    float rest[LANES];
    vstore(rest, level[0]);
    return tree_pow2(rest, LANES);
}

static float reduce_sum_vector(const float *acc, size_t n) { return reduce_sum_with(acc, n, tree64_vector); }

/* gradWeight's products into its accumulator (exactly n written: acc holds later columns). */
INLINE vfloat product_into(vfloat g, vfloat yo, const float *acc, int accumulate)
{
    vfloat p = g * yo;
    return accumulate ? vload(acc) + p : p;
}

static void products_vector(const float *restrict gy, const float *restrict yo, float *restrict acc, size_t n,
                            int accumulate)
{
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) vstore(acc + i, product_into(vload(gy + i), vload(yo + i), acc + i, accumulate));
    for (; i < n; i++) acc[i] = accumulate ? acc[i] + gy[i] * yo[i] : gy[i] * yo[i];
}

/* The whole per-element computation of docs/kernel.md on whole vectors, straight from the
 * inputs to the outputs; the same operations in the same order as the unfused functions. */
/* `count` (1 or UNROLL) vectors from element i: every lane through the same operations. */
#define UNROLL 2
INLINE void fused_vectors_f32(int clamp_on, int has_weight, const fused_block *b, size_t i, size_t count)
{
    const vfloat weight = vsplat(b->weight), limit = vsplat(b->clamp), neg_limit = vsplat(-b->clamp);
    vfloat g[UNROLL], a_orig[UNROLL], b_orig[UNROLL], a[UNROLL], bv[UNROLL], e[UNROLL];
    for (size_t k = 0; k < count; k++) {
        const size_t at = i + k * LANES;
        g[k] = load_as_float(ACL_FLOAT, b->gy, at);
        a_orig[k] = a[k] = load_as_float(ACL_FLOAT, b->x0, at);
        b_orig[k] = bv[k] = load_as_float(ACL_FLOAT, b->x1, at);
        if (has_weight) {
            vstore(b->acc + at, product_into(g[k], load_as_float(ACL_FLOAT, b->yo, at), b->acc + at, b->accumulate));
            g[k] = g[k] * weight;
        }
        if (clamp_on) clamp_inputs(a_orig[k], b_orig[k], limit, neg_limit, &a[k], &bv[k]);
    }
    if (count == UNROLL) {
        device_expv2(a, e);
    } else {
        e[0] = device_expv(a[0]);
    }
    for (size_t k = 0; k < count; k++) {
        const size_t at = i + k * LANES;
        vfloat gx0, gx1;
        grads_from_exp(g[k], a[k], bv[k], e[k], &gx0, &gx1);
        if (clamp_on) apply_masks(a_orig[k], b_orig[k], limit, neg_limit, &gx0, &gx1);
        store_from_float(ACL_FLOAT, b->gx0, at, gx0, 0);
        store_from_float(ACL_FLOAT, b->gx1, at, gx1, 0);
    }
}

/* gradX of one vector of a 16-bit block from gy (weighted), x0, x1 and the table's pair at x0:
 * where the clamp lowers x0 to the limit (limit < x0), the pair at the limit; elsewhere x0
 * itself is the clamped value (NaN included), so its own entry. */
INLINE void narrow_grads(int clamp_on, const fused_block *b, vfloat g, vfloat a_orig, vfloat b_orig, vfloat silu,
                         vfloat dsilu, vfloat *gx0, vfloat *gx1)
{
    const vfloat limit = vsplat(b->clamp), neg_limit = vsplat(-b->clamp);
    vfloat bv = b_orig;
    if (clamp_on) {
        lane_mask lowered = lanes_less(limit, a_orig);
        silu = select_lanes(lowered, vsplat(b->at_limit.silu), silu);
        dsilu = select_lanes(lowered, vsplat(b->at_limit.dsilu), dsilu);
        bv = vmin_nan_second(limit, vmax_nan_second(neg_limit, b_orig));
    }
    *gx0 = (g * bv) * dsilu;
    *gx1 = g * silu;
    if (clamp_on) apply_masks(a_orig, b_orig, limit, neg_limit, gx0, gx1);
}

/* The same for fp16 and bf16, one vector, with silu and its derivative from the table.
 * `accumulate` is b->accumulate, made a constant of the loop. */
INLINE void fused_vector_narrow(aclDataType dtype, int clamp_on, int has_weight, int bf16_instructions,
                                int accumulate, const fused_block *b, size_t at)
{
    vint bits;
    vfloat g = load_as_float(dtype, b->gy, at);
    vfloat a_orig = load_with_bits(dtype, b->x0, at, &bits);
    vfloat b_orig = load_as_float(dtype, b->x1, at);
    if (has_weight) {
        vstore(b->acc + at, product_into(g, load_as_float(dtype, b->yo, at), b->acc + at, accumulate));
        g = g * b->weight;
    }
    vfloat silu, dsilu, gx0, gx1;
    silu_lookup(b->table, (const uint16_t *)b->x0 + at, bits, &silu, &dsilu);
    narrow_grads(clamp_on, b, g, a_orig, b_orig, silu, dsilu, &gx0, &gx1);
    if (bf16_instructions || __builtin_expect(any_nan2(gx0, gx1), 0)) {
        store_from_float(dtype, b->gx0, at, gx0, bf16_instructions);
        store_from_float(dtype, b->gx1, at, gx1, bf16_instructions);
        return;
    }
    /* No NaN lane (the usual case): nothing to make canonical. */
    store_half(b->gx0, at, narrow_not_nan(dtype, gx0));
    store_half(b->gx1, at, narrow_not_nan(dtype, gx1));
}

#if defined(__AVX2__) && KERNEL_LANES == 8
#define KERNEL_BF16_PAIRS 1
/* bf16 on AVX2, 16 columns at a time in the order 256-bit interleaving gives: `low` holds
 * columns 0-3 and 8-11, `high` columns 4-7 and 12-15. Widening is then one interleave with
 * zeros per vector, and the 256-bit pack of the two results restores the column order, so
 * neither direction needs a lane permutation. Every lane does the same operations as in
 * fused_vector_narrow; only gradWeight's accumulator, read in column order by the ReduceSum, is
 * written by 128-bit halves. */
INLINE void bf16_pair_load(const char *p, size_t at, vfloat *low, vfloat *high)
{
    __m256i h;
    memcpy(&h, (const uint16_t *)p + at, sizeof h);
    *low = (vfloat)_mm256_unpacklo_epi16(_mm256_setzero_si256(), h);
    *high = (vfloat)_mm256_unpackhi_epi16(_mm256_setzero_si256(), h);
}

/* float_to_bf16v of both, packed back into column order. */
INLINE void bf16_pair_store(char *p, size_t at, vfloat low, vfloat high)
{
    if (__builtin_expect(any_nan2(low, high), 0)) {
        low = canonical_f32v(low);   /* 0x7FC00000 rounds to the canonical 0x7FC0 */
        high = canonical_f32v(high);
    }
    vuint l = (vuint)low, h = (vuint)high;
    l = (l + 0x7FFFu + ((l >> 16) & 1u)) >> 16;
    h = (h + 0x7FFFu + ((h >> 16) & 1u)) >> 16;
    __m256i packed = _mm256_packus_epi32((__m256i)l, (__m256i)h);   /* below 2^16: no saturation */
    memcpy((uint16_t *)p + at, &packed, sizeof packed);
}

/* acc[0..16) in column order from a pair's 128-bit halves: low = acc[0..4) | acc[8..12),
 * high = acc[4..8) | acc[12..16). */
INLINE vfloat acc_half_pair(const float *acc, size_t first, size_t second)
{
    return (vfloat)_mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(acc + first)), _mm_loadu_ps(acc + second), 1);
}

INLINE void store_half_pair(float *acc, size_t first, size_t second, vfloat v)
{
    _mm_storeu_ps(acc + first, _mm256_castps256_ps128((__m256)v));
    _mm_storeu_ps(acc + second, _mm256_extractf128_ps((__m256)v, 1));
}

INLINE void fused_pair_bf16(int clamp_on, int has_weight, int accumulate, const fused_block *b, size_t at)
{
    vfloat g[2], a_orig[2], b_orig[2], gx0[2], gx1[2];
    bf16_pair_load(b->gy, at, &g[0], &g[1]);
    bf16_pair_load(b->x0, at, &a_orig[0], &a_orig[1]);
    bf16_pair_load(b->x1, at, &b_orig[0], &b_orig[1]);
    if (has_weight) {
        vfloat yo[2];
        bf16_pair_load(b->yo, at, &yo[0], &yo[1]);
        float *acc = b->acc + at;
        for (size_t k = 0; k < 2; k++) {
            vfloat p = g[k] * yo[k];
            if (accumulate) p = acc_half_pair(acc, 4 * k, 8 + 4 * k) + p;
            store_half_pair(acc, 4 * k, 8 + 4 * k, p);
            g[k] = g[k] * b->weight;
        }
    }
    const uint16_t *x0 = (const uint16_t *)b->x0 + at;
    for (size_t k = 0; k < 2; k++) {
        vfloat silu, dsilu;
        silu_lookup_halves(b->table, x0 + 4 * k, x0 + 8 + 4 * k, &silu, &dsilu);
        narrow_grads(clamp_on, b, g[k], a_orig[k], b_orig[k], silu, dsilu, &gx0[k], &gx1[k]);
    }
    bf16_pair_store(b->gx0, at, gx0[0], gx0[1]);
    bf16_pair_store(b->gx1, at, gx1[0], gx1[1]);
}
#else
#define KERNEL_BF16_PAIRS 0
INLINE void fused_pair_bf16(int clamp_on, int has_weight, int accumulate, const fused_block *b, size_t at) {}
#endif

/* A 16-bit block's whole vectors, with `accumulate` a constant; returns how many it did. */
INLINE size_t fused_narrow_loop(aclDataType dtype, int clamp_on, int has_weight, int bf16_instructions,
                                int accumulate, const fused_block *b)
{
    const size_t n = b->n / LANES * LANES;
    size_t i = 0;
    if (KERNEL_BF16_PAIRS && dtype == ACL_BF16 && !bf16_instructions) {
        for (; i + 2 * LANES <= n; i += 2 * LANES) fused_pair_bf16(clamp_on, has_weight, accumulate, b, i);
    }
    for (; i < n; i += LANES) fused_vector_narrow(dtype, clamp_on, has_weight, bf16_instructions, accumulate, b, i);
    return n;
}

INLINE size_t fused_body(aclDataType dtype, int clamp_on, int has_weight, int bf16_instructions,
                         const fused_block *block)
{
    const fused_block b = *block;   /* a local copy: the stores cannot change its fields */
    if (dtype != ACL_FLOAT) {
        return has_weight && b.accumulate ? fused_narrow_loop(dtype, clamp_on, has_weight, bf16_instructions, 1, &b)
                                          : fused_narrow_loop(dtype, clamp_on, has_weight, bf16_instructions, 0, &b);
    }
    const size_t n = b.n / LANES * LANES;
    size_t i = 0;
    for (; i + UNROLL * LANES <= n; i += UNROLL * LANES) fused_vectors_f32(clamp_on, has_weight, &b, i, UNROLL);
    for (; i < n; i += LANES) fused_vectors_f32(clamp_on, has_weight, &b, i, 1);
    return n;
}

#define DEFINE_FUSED(suffix, dtype, clamp_on, has_weight)                                         \
    static size_t fused_##suffix(const fused_block *b)                                             \
    {                                                                                              \
        return fused_body(dtype, clamp_on, has_weight, 0, b);                                      \
    }
DEFINE_FUSED(f32, ACL_FLOAT, 0, 0)
DEFINE_FUSED(f32_w, ACL_FLOAT, 0, 1)
DEFINE_FUSED(f32_c, ACL_FLOAT, 1, 0)
DEFINE_FUSED(f32_cw, ACL_FLOAT, 1, 1)
DEFINE_FUSED(f16, ACL_FLOAT16, 0, 0)
DEFINE_FUSED(f16_w, ACL_FLOAT16, 0, 1)
DEFINE_FUSED(f16_c, ACL_FLOAT16, 1, 0)
DEFINE_FUSED(f16_cw, ACL_FLOAT16, 1, 1)
DEFINE_FUSED(bf16, ACL_BF16, 0, 0)
DEFINE_FUSED(bf16_w, ACL_BF16, 0, 1)
DEFINE_FUSED(bf16_c, ACL_BF16, 1, 0)
DEFINE_FUSED(bf16_cw, ACL_BF16, 1, 1)

#if KERNEL_BF16_INSTRUCTIONS
#define DEFINE_FUSED_BF16_INSTRUCTIONS(suffix, clamp_on, has_weight)                               \
    __attribute__((target("avx512bf16"))) static size_t fused_##suffix##_instructions(const fused_block *b) \
    {                                                                                              \
        return fused_body(ACL_BF16, clamp_on, has_weight, 1, b);                                   \
    }
DEFINE_FUSED_BF16_INSTRUCTIONS(bf16, 0, 0)
DEFINE_FUSED_BF16_INSTRUCTIONS(bf16_w, 0, 1)
DEFINE_FUSED_BF16_INSTRUCTIONS(bf16_c, 1, 0)
DEFINE_FUSED_BF16_INSTRUCTIONS(bf16_cw, 1, 1)
#endif

static void scale_vector(float *v, size_t n, float w)
{
    for (size_t i = 0; i < n; i += LANES) vstore(v + i, vload(v + i) * w);
}

/* device_exp over an array, whole vectors and a scalar tail (for the tests). */
static void exp_block_vector(const float *in, float *out, size_t n)
{
    size_t i = 0;
    for (; i + LANES <= n; i += LANES) vstore(out + i, device_expv(vload(in + i)));
    for (; i < n; i++) out[i] = device_expf(in[i]);
}

#define VECTOR_COMMON grad_vector, grad_clamped_vector, products_vector, reduce_sum_vector, scale_vector, \
    exp_block_vector
#define VECTOR_F32 {load_f32_vector, store_f32_vector, VECTOR_COMMON, {{fused_f32, fused_f32_w}, {fused_f32_c, fused_f32_cw}}}
#define VECTOR_F16 {load_f16_vector, store_f16_vector, VECTOR_COMMON, {{fused_f16, fused_f16_w}, {fused_f16_c, fused_f16_cw}}}
const kernel_impl KERNEL_TABLE[3] = {
    VECTOR_F32,
    VECTOR_F16,
    {load_bf16_vector, store_bf16_vector, VECTOR_COMMON,
     {{fused_bf16, fused_bf16_w}, {fused_bf16_c, fused_bf16_cw}}},
};
#if KERNEL_BF16_INSTRUCTIONS
/* The same with the CPU's bf16 narrowing in the fused loops (for CPUs with AVX512_BF16). */
const kernel_impl swiglu_vector_impls_avx512_bf16[3] = {
    VECTOR_F32,
    VECTOR_F16,
    {load_bf16_vector, store_bf16_vector, VECTOR_COMMON,
     {{fused_bf16_instructions, fused_bf16_w_instructions}, {fused_bf16_c_instructions, fused_bf16_cw_instructions}}},
};
#endif
