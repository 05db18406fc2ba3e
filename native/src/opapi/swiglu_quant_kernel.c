/*
 * The forward kernel of aclnnSwigluGroupQuant, quant modes 0 and 1 (docs/forward.md): per row,
 * the SwiGLU in fp32 in the device's order, then the block or MX quantisation, to the bit. Every
 * operation is a plain IEEE single-precision one (built with -ffp-contract=off) or an integer
 * one on the bits, and every NaN is stored as one code, so the output does not depend on the
 * vector width, the instruction set or the thread count: rows are independent, and the blocks
 * and groups of a row too.
 *
 * Two implementations of the same arithmetic: the scalar one here (the reference, one element
 * at a time) and the vectorised one (swiglu_quant_vector.c, built for baseline x86-64 / any
 * CPU, AVX2 and AVX-512).
 */
#include "swiglu_quant_kernel.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/work_threads.h"
#include "swiglu_fpenv.h"
#include "swiglu_quant_impl.h"


_Static_assert(QUANT_CHUNK % SWIGLU_QUANT_BLOCK == 0, "chunks hold whole blocks");

/* ---- the scalar implementation ---- */

static void core_scalar(const quant_core *c, const uint16_t *x0, const uint16_t *x1, float *y, size_t n)
{
    const int fp16 = c->x_dtype == ACL_FLOAT16;
    for (size_t i = 0; i < n; i++) y[i] = quant_swiglu(c, quant_widen(x0[i], fp16), quant_widen(x1[i], fp16)) + 0.0f;
}

static void core_narrow_scalar(const quant_core *c, const uint16_t *x0, const uint16_t *x1, uint16_t *v, size_t n)
{
    const int fp16 = c->x_dtype == ACL_FLOAT16;
    for (size_t i = 0; i < n; i++) {
        float y = quant_swiglu(c, quant_widen(x0[i], fp16), quant_widen(x1[i], fp16));
        v[i] = fp16 ? float_to_half(y) : float_to_bf16(y);
    }
}

static void block_fp8_scalar(const float *y, size_t n, aclDataType dst, int round_scale, uint8_t *codes,
                             float *scales)
{
    for (size_t b = 0; b < n / SWIGLU_QUANT_BLOCK; b++) {
        const float *block = y + b * SWIGLU_QUANT_BLOCK;
        uint32_t amax = 0;
        for (size_t i = 0; i < SWIGLU_QUANT_BLOCK; i++) {
            uint32_t a = bits_of(block[i]) & 0x7FFFFFFFu;
            a = a < 0x7F800000u ? a : 0;   /* inf and NaN count as +0 */
            amax = a > amax ? a : amax;
        }
        float inv;
        quant_block_scale(amax, dst, round_scale, &scales[b], &inv);
        for (size_t i = 0; i < SWIGLU_QUANT_BLOCK; i++) {
            float q = block[i] * inv;
            q = (bits_of(q) & 0x7FFFFFFFu) < 0x7F800000u ? q : block[i];   /* not finite: y itself */
            codes[b * SWIGLU_QUANT_BLOCK + i] = quant_fp8(q, dst);
        }
    }
}

static void mx_fp8_scalar(const float *y, size_t n, aclDataType dst, uint8_t *codes, uint8_t *scales)
{
    for (size_t g = 0; g < n / SWIGLU_QUANT_GROUP; g++) {
        const float *group = y + g * SWIGLU_QUANT_GROUP;
        uint32_t amax = 0;
        for (size_t i = 0; i < SWIGLU_QUANT_GROUP; i++) {
            uint32_t a = bits_of(group[i]) & 0x7FFFFFFFu;   /* NaN bits lie above inf's */
            amax = a > amax ? a : amax;
        }
        float inv;
        quant_mx_fp8_scale(amax, dst, &scales[g], &inv);
        for (size_t i = 0; i < SWIGLU_QUANT_GROUP; i++) codes[g * SWIGLU_QUANT_GROUP + i] = quant_fp8(group[i] * inv, dst);
    }
}

static void mx_fp4_scalar(const uint16_t *v, size_t n, aclDataType x_dtype, aclDataType dst, uint8_t *packed,
                          uint8_t *scales)
{
    const int fp16 = x_dtype == ACL_FLOAT16;
    for (size_t g = 0; g < n / SWIGLU_QUANT_GROUP; g++) {
        const uint16_t *group = v + g * SWIGLU_QUANT_GROUP;
        uint32_t key = 0;
        for (size_t i = 0; i < SWIGLU_QUANT_GROUP; i++) {
            uint32_t k = quant_fp4_key(group[i], fp16);
            key = k > key ? k : key;
        }
        uint16_t recip;
        quant_mx_fp4_scale(key, dst, &scales[g], &recip);
        for (size_t i = 0; i < SWIGLU_QUANT_GROUP; i += 2) {
            uint8_t low = quant_fp4_element(group[i], fp16, dst, recip);
            uint8_t high = quant_fp4_element(group[i + 1], fp16, dst, recip);
            packed[(g * SWIGLU_QUANT_GROUP + i) / 2] = (uint8_t)(low | high << 4);
        }
    }
}

static const quant_impl scalar_impl = {core_scalar, core_narrow_scalar, block_fp8_scalar, mx_fp8_scalar,
                                       mx_fp4_scalar};

static const quant_impl *implementation(swiglu_kernel_variant variant)
{
    if (!swiglu_kernel_variant_available(variant)) return NULL;
    switch (variant) {
    case SWIGLU_KERNEL_SCALAR:
        return &scalar_impl;
    case SWIGLU_KERNEL_VECTOR_BASELINE:
        return &swiglu_quant_vector_baseline;
#if defined(SWIGLU_QUANT_HAVE_X86_VARIANTS)
    case SWIGLU_KERNEL_VECTOR_AVX2:
        return &swiglu_quant_vector_avx2;
    case SWIGLU_KERNEL_VECTOR_AVX512:
    case SWIGLU_KERNEL_VECTOR_AVX512_BF16:   /* the forward narrows nothing to bf16 the instruction could do */
        return &swiglu_quant_vector_avx512;
    case SWIGLU_KERNEL_VECTOR:
        if (swiglu_kernel_variant_available(SWIGLU_KERNEL_VECTOR_AVX512)) return &swiglu_quant_vector_avx512;
        if (swiglu_kernel_variant_available(SWIGLU_KERNEL_VECTOR_AVX2)) return &swiglu_quant_vector_avx2;
        return &swiglu_quant_vector_baseline;
#else
    case SWIGLU_KERNEL_VECTOR:
        return &swiglu_quant_vector_baseline;
#endif
    default:
        return NULL;
    }
}

/* ---- views ---- */

/* Elements from the view's base of its row-major element `flat`. */
static int64_t view_element(const swiglu_quant_view *v, int64_t flat)
{
    int64_t at = v->offset;
    for (int64_t d = v->ndim - 1; d >= 0; d--) {
        int64_t extent = v->dims[d];
        at += (flat % extent) * v->strides[d];
        flat /= extent;
    }
    return at;
}

/* Whether row-major element i of the view is element offset + i (dims of 1 may have any stride). */
static int view_contiguous(const swiglu_quant_view *v)
{
    int64_t expected = 1;
    for (int64_t d = v->ndim - 1; d >= 0; d--) {
        if (v->dims[d] != 1 && v->strides[d] != expected) return 0;
        expected *= v->dims[d];
    }
    return 1;
}

static void put_nibble(char *base, int64_t element, uint8_t code)
{
    unsigned char *byte = (unsigned char *)base + element / 2;
    *byte = element % 2 ? (unsigned char)((*byte & 0x0Fu) | code << 4) : (unsigned char)((*byte & 0xF0u) | code);
}

/* ---- rows ---- */

typedef struct {
    uint16_t x0[QUANT_CHUNK], x1[QUANT_CHUNK];
    float y[QUANT_CHUNK];
    uint16_t v[QUANT_CHUNK];
    uint8_t codes[QUANT_CHUNK];
    float scales[QUANT_CHUNK / SWIGLU_QUANT_BLOCK];
    uint8_t scale_bytes[QUANT_CHUNK / SWIGLU_QUANT_GROUP];
} quant_scratch;

typedef struct {
    const swiglu_quant_args *args;
    const quant_impl *impl;
    int y_contiguous, scale_contiguous;
    int64_t first_row, end_row;
    quant_scratch *scratch;
} quant_range;

/* Writes `count` codes (FP4: `count` elements, packed two a byte in `codes`) from row-major
 * element `flat` of y on. */
static void store_codes(const quant_range *r, int64_t flat, const uint8_t *codes, size_t count)
{
    const swiglu_quant_view *y = &r->args->y;
    const int fp4 = r->args->dst == ACL_FLOAT4_E2M1 || r->args->dst == ACL_FLOAT4_E1M2;
    if (!fp4) {
        if (r->y_contiguous) {
            memcpy(y->base + y->offset + flat, codes, count);
        } else {
            for (size_t i = 0; i < count; i++) y->base[view_element(y, flat + (int64_t)i)] = (char)codes[i];
        }
        return;
    }
    if (r->y_contiguous && (y->offset + flat) % 2 == 0) {
        memcpy(y->base + (y->offset + flat) / 2, codes, count / 2);
        return;
    }
    for (size_t i = 0; i < count; i++) {
        uint8_t code = (uint8_t)(i % 2 ? codes[i / 2] >> 4 : codes[i / 2] & 0x0Fu);
        int64_t element = r->y_contiguous ? y->offset + flat + (int64_t)i : view_element(y, flat + (int64_t)i);
        put_nibble(y->base, element, code);
    }
}

static void store_scales(const quant_range *r, int64_t flat, const void *scales, size_t count)
{
    const swiglu_quant_view *s = &r->args->y_scale;
    const size_t size = r->args->mode == SWIGLU_QUANT_MODE_BLOCK ? sizeof(float) : 1;
    if (r->scale_contiguous) {
        memcpy(s->base + (size_t)(s->offset + flat) * size, scales, count * size);
        return;
    }
    for (size_t i = 0; i < count; i++) {
        memcpy(s->base + (size_t)view_element(s, flat + (int64_t)i) * size, (const char *)scales + i * size, size);
    }
}

static void compute_row(const quant_range *r, int64_t t)
{
    const swiglu_quant_args *a = r->args;
    const quant_impl *impl = r->impl;
    quant_scratch *s = r->scratch;
    const int64_t H = a->hidden;
    const int fp4 = a->dst == ACL_FLOAT4_E2M1 || a->dst == ACL_FLOAT4_E1M2;
    const int64_t per_scale = a->mode == SWIGLU_QUANT_MODE_BLOCK ? SWIGLU_QUANT_BLOCK : SWIGLU_QUANT_GROUP;
    const int64_t scales_per_row = H / per_scale;
    const int64_t column_stride = a->x.strides[a->x.ndim - 1];
    const uint16_t *row = (const uint16_t *)a->x.base + view_element(&a->x, t * 2 * H);
    quant_core core = {a->x_dtype, a->clamp_on, a->clamp, a->has_weight, 1.0f};
    if (a->has_weight) core.weight = *((const float *)a->weight.base + view_element(&a->weight, t));

    for (int64_t h0 = 0; h0 < H; h0 += QUANT_CHUNK) {
        const size_t n = (size_t)(H - h0 < QUANT_CHUNK ? H - h0 : QUANT_CHUNK);
        const uint16_t *x0 = row + h0, *x1 = row + H + h0;
        if (column_stride != 1) {
            for (size_t i = 0; i < n; i++) {
                s->x0[i] = row[(h0 + (int64_t)i) * column_stride];
                s->x1[i] = row[(H + h0 + (int64_t)i) * column_stride];
            }
            x0 = s->x0;
            x1 = s->x1;
        }
        const int64_t first_scale = t * scales_per_row + h0 / per_scale;
        if (fp4) {
            impl->core_narrow(&core, x0, x1, s->v, n);
            impl->mx_fp4(s->v, n, a->x_dtype, a->dst, s->codes, s->scale_bytes);
            store_scales(r, first_scale, s->scale_bytes, n / SWIGLU_QUANT_GROUP);
        } else if (a->mode == SWIGLU_QUANT_MODE_BLOCK) {
            impl->core(&core, x0, x1, s->y, n);
            impl->block_fp8(s->y, n, a->dst, a->round_scale, s->codes, s->scales);
            store_scales(r, first_scale, s->scales, n / SWIGLU_QUANT_BLOCK);
        } else {
            impl->core(&core, x0, x1, s->y, n);
            impl->mx_fp8(s->y, n, a->dst, s->codes, s->scale_bytes);
            store_scales(r, first_scale, s->scale_bytes, n / SWIGLU_QUANT_GROUP);
        }
        store_codes(r, t * H + h0, s->codes, n);
    }
}

static void *run_rows(void *arg)
{
    const quant_range *r = arg;
    fp_env saved = fp_env_enter();
    for (int64_t t = r->first_row; t < r->end_row; t++) compute_row(r, t);
    fp_env_leave(saved);
    return NULL;
}

int64_t swiglu_quant_trunc(const swiglu_quant_args *a)
{
    if (!a->has_groups) return a->rows;
    const swiglu_quant_view *g = &a->group_index;
    int64_t count = 1;
    for (int64_t d = 0; d < g->ndim; d++) count *= g->dims[d];
    uint64_t sum = 0;   /* int64 on the device, wrapping */
    for (int64_t i = 0; i < count; i++) sum += (uint64_t)*((const int64_t *)g->base + view_element(g, i));
    int64_t total = (int64_t)sum;
    return total < a->rows ? total : a->rows;
}

static int arguments_taken(const swiglu_quant_args *a)
{
    const int fp8 = a->dst == ACL_FLOAT8_E4M3FN || a->dst == ACL_FLOAT8_E5M2;
    const int fp4 = a->dst == ACL_FLOAT4_E2M1 || a->dst == ACL_FLOAT4_E1M2;
    return (a->x_dtype == ACL_FLOAT16 || a->x_dtype == ACL_BF16) && a->hidden > 0 &&
           a->hidden % SWIGLU_QUANT_BLOCK == 0 && a->x.ndim >= 1 && a->x.ndim <= SWIGLU_QUANT_MAX_DIMS &&
           a->x.dims[a->x.ndim - 1] == 2 * a->hidden &&
           ((a->mode == SWIGLU_QUANT_MODE_BLOCK && fp8) || (a->mode == SWIGLU_QUANT_MODE_MX && (fp8 || fp4)));
}

int swiglu_quant_run(const swiglu_quant_args *args, int threads, swiglu_kernel_variant variant)
{
    const quant_impl *impl = implementation(variant);
    if (impl == NULL) return -2;
    if (!arguments_taken(args)) return -3;
    int64_t trunc = swiglu_quant_trunc(args);
    if (trunc <= 0) return 0;
    const int fp4 = args->dst == ACL_FLOAT4_E2M1 || args->dst == ACL_FLOAT4_E1M2;
    const int y_contiguous = view_contiguous(&args->y);
    const int scale_contiguous = view_contiguous(&args->y_scale);
    threads = work_thread_count(threads, (uint64_t)(trunc * args->hidden), KERNEL_MIN_ELEMENTS_PER_THREAD,
                                (uint64_t)trunc);
    /* Rows of a FLOAT4 y that do not start on a byte share bytes: one thread writes them all. */
    if (fp4 && !(y_contiguous && args->y.offset % 2 == 0)) threads = 1;

    if (threads == 1) {
        static __thread quant_scratch own_scratch;
        quant_range range = {args, impl, y_contiguous, scale_contiguous, 0, trunc, &own_scratch};
        run_rows(&range);
        return 0;
    }
    quant_range *ranges = calloc((size_t)threads, sizeof *ranges);
    quant_scratch *scratch = malloc((size_t)threads * sizeof *scratch);
    if (ranges == NULL || scratch == NULL) {
        free(ranges);
        free(scratch);
        return -1;
    }
    for (int k = 0; k < threads; k++) {
        ranges[k] = (quant_range){args, impl, y_contiguous, scale_contiguous, trunc * k / threads,
                                  trunc * (k + 1) / threads, &scratch[k]};
    }
    work_run_ranges(run_rows, ranges, sizeof *ranges, threads);
    free(ranges);
    free(scratch);
    return 0;
}
