/*
 * SwiGLU backward (SPEC section 1) in fp32, operation by operation in the device's order.
 * Every operation is a plain IEEE single-precision one (this file is compiled with
 * -ffp-contract=off), so the result is the same bits whatever the vector width or thread
 * count: rows are independent and each row is computed by exactly one thread.
 */
#include "swiglu_kernel.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Columns handled per step of a row; a multiple of the 64-element gradWeight chunk. */
#define BLOCK 512
#define CHUNK 64
/* Rows below this many elements per thread are not worth a thread. */
#define MIN_ELEMENTS_PER_THREAD ((int64_t)1 << 16)

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

/* ---- the device's exp ---- */

#define EXP_OVERFLOW_FROM 88.72283935546875f   /* first float whose exp exceeds FLT_MAX */
#define EXP_LOG2E 1.44269502162933349609375f
#define EXP_ROUNDER 12582912.0f                /* 1.5 * 2^23: adding it rounds to an integer */
#define EXP_LN2_HI 0.693145751953125f          /* ln 2 with trailing zero bits */
#define EXP_LN2_LO 1.428606765330187045e-06f

/* exp(x) = 2^n * exp(r), n = round(x / ln 2), |r| <= ln2/2, exp(r) by a degree-7 Taylor
 * polynomial in Horner form. Branch-free so that loops calling it vectorise. */
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
    int32_t n_low = n >> 1;
    int32_t n_high = n - n_low;
    /* Two exact power-of-two scalings keep each factor a normal float for n in [-150, 129]. */
    float result = (p * float_of((uint32_t)(n_low + 127) << 23)) *
                   float_of((uint32_t)(n_high + 127) << 23);
    result = result < FLT_MIN ? 0.0f : result;          /* the device flushes subnormals */
    result = result > FLT_MAX ? FLT_MAX : result;
    result = x >= EXP_OVERFLOW_FROM ? INFINITY : result;
    result = x != x ? x : result;
    return result;
}

float swiglu_device_expf(float x) { return device_expf(x); }

/* ---- conversions (round half to even; inf and NaN kept) ---- */

static inline float bf16_to_float(uint16_t h) { return float_of((uint32_t)h << 16); }

static inline uint16_t float_to_bf16(float f)
{
    uint32_t u = bits_of(f);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
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
    uint32_t h = a < 0x38800000u ? subnormal : normal;
    h = a >= 0x477FF000u ? 0x7C00u : h;     /* 65520 and up round to inf */
    h = a > 0x7F800000u ? 0x7E00u : h;
    return (uint16_t)(h | sign);
}

/* ---- loads and stores of n elements of one row segment ---- */

typedef void (*load_fn)(const char *src, int64_t stride, float *out, size_t n);
typedef void (*store_fn)(char *dst, int64_t stride, const float *in, size_t n);

static void load_f32(const char *src, int64_t stride, float *out, size_t n)
{
    const float *p = (const float *)src;
    if (stride == 1) {
        memcpy(out, p, n * sizeof *out);
        return;
    }
    for (size_t i = 0; i < n; i++) out[i] = p[(int64_t)i * stride];
}

static void load_f16(const char *src, int64_t stride, float *out, size_t n)
{
    const uint16_t *p = (const uint16_t *)src;
    if (stride == 1) {
        for (size_t i = 0; i < n; i++) out[i] = half_to_float(p[i]);
        return;
    }
    for (size_t i = 0; i < n; i++) out[i] = half_to_float(p[(int64_t)i * stride]);
}

static void load_bf16(const char *src, int64_t stride, float *out, size_t n)
{
    const uint16_t *p = (const uint16_t *)src;
    if (stride == 1) {
        for (size_t i = 0; i < n; i++) out[i] = bf16_to_float(p[i]);
        return;
    }
    for (size_t i = 0; i < n; i++) out[i] = bf16_to_float(p[(int64_t)i * stride]);
}

static void store_f32(char *dst, int64_t stride, const float *in, size_t n)
{
    float *p = (float *)dst;
    if (stride == 1) {
        memcpy(p, in, n * sizeof *in);
        return;
    }
    for (size_t i = 0; i < n; i++) p[(int64_t)i * stride] = in[i];
}

static void store_f16(char *dst, int64_t stride, const float *in, size_t n)
{
    uint16_t *p = (uint16_t *)dst;
    if (stride == 1) {
        for (size_t i = 0; i < n; i++) p[i] = float_to_half(in[i]);
        return;
    }
    for (size_t i = 0; i < n; i++) p[(int64_t)i * stride] = float_to_half(in[i]);
}

static void store_bf16(char *dst, int64_t stride, const float *in, size_t n)
{
    uint16_t *p = (uint16_t *)dst;
    if (stride == 1) {
        for (size_t i = 0; i < n; i++) p[i] = float_to_bf16(in[i]);
        return;
    }
    for (size_t i = 0; i < n; i++) p[(int64_t)i * stride] = float_to_bf16(in[i]);
}

/* ---- the math of one block of columns ---- */

/* In place: x0 becomes gx0 and x1 becomes gx1. `gy` already carries the weight. */
static void swiglu_grad_block(const float *restrict gy, float *restrict x0, float *restrict x1,
                              size_t n)
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

static void swiglu_grad_block_clamped(const float *restrict gy, float *restrict x0,
                                      float *restrict x1, size_t n, float c)
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

static void scale(float *v, size_t n, float w)
{
    for (size_t i = 0; i < n; i++) v[i] = v[i] * w;
}

/* acc[i] = a[i] * acc[i] */
static void multiply_into(float *restrict acc, const float *restrict a, size_t n)
{
    for (size_t i = 0; i < n; i++) acc[i] = a[i] * acc[i];
}

/* ---- rows ---- */

typedef struct {
    const swiglu_kernel_args *args;
    load_fn load;
    store_fn store;
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
    size_t es = a->dtype == ACL_FLOAT ? 4 : 2;
    int64_t gs = last_stride(&a->grad_x);
    char *gx = a->grad_x.data + row_offset(&a->grad_x, t) * (int64_t)es;
    int64_t width = 2 * a->hidden;
    for (int64_t h0 = 0; h0 < width; h0 += BLOCK) {
        size_t n = (size_t)(width - h0 < BLOCK ? width - h0 : BLOCK);
        r->store(gx + h0 * gs * (int64_t)es, gs, zeros, n);
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
        r->load(gy_row + h0 * sy * es, sy, gy, n);
        r->load(x_row + h0 * sx * es, sx, x0, n);
        r->load(x_row + (H + h0) * sx * es, sx, x1, n);
        if (a->has_weight) {
            /* gradWeight uses the raw gy, before weighting and without the clamp mask. */
            r->load(yo_row + h0 * so * es, so, yo, n);
            multiply_into(yo, gy, n);
            for (size_t c0 = 0; c0 < n; c0 += CHUNK) {
                size_t len = n - c0 < CHUNK ? n - c0 : CHUNK;
                r->partials[chunks++] = tree_sum(yo + c0, len);
            }
            scale(gy, n, w);
        }
        if (a->clamp_on) {
            swiglu_grad_block_clamped(gy, x0, x1, n, a->clamp);
        } else {
            swiglu_grad_block(gy, x0, x1, n);
        }
        r->store(gx_row + h0 * sg * es, sg, x0, n);
        r->store(gx_row + (H + h0) * sg * es, sg, x1, n);
    }
    if (a->has_weight) {
        float *gw = (float *)a->grad_weight.data + element_offset(&a->grad_weight, t);
        *gw = tree_sum(r->partials, chunks);
    }
}

static void *run_rows(void *arg)
{
    const row_range *r = arg;
    float gy[BLOCK], x0[BLOCK], x1[BLOCK], yo[BLOCK];
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

int swiglu_kernel_run(const swiglu_kernel_args *args, int threads)
{
    if (args->rows <= 0) {
        return 0;
    }
    load_fn load = args->dtype == ACL_FLOAT ? load_f32 : args->dtype == ACL_FLOAT16 ? load_f16 : load_bf16;
    store_fn store = args->dtype == ACL_FLOAT ? store_f32 : args->dtype == ACL_FLOAT16 ? store_f16 : store_bf16;
    int64_t trunc = swiglu_trunc(args);
    int64_t work = args->rows * (args->hidden > 0 ? args->hidden : 1);
    int64_t useful = work / MIN_ELEMENTS_PER_THREAD;
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    if (threads > useful) threads = useful > 1 ? (int)useful : 1;
    if (threads > args->rows) threads = (int)args->rows;

    size_t chunks = (size_t)((args->hidden + CHUNK - 1) / CHUNK);
    row_range *ranges = calloc((size_t)threads, sizeof *ranges);
    float *partials = malloc((size_t)threads * (chunks ? chunks : 1) * sizeof *partials);
    pthread_t *ids = calloc((size_t)threads, sizeof *ids);
    if (ranges == NULL || partials == NULL || ids == NULL) {
        free(ranges);
        free(partials);
        free(ids);
        return -1;
    }
    for (int k = 0; k < threads; k++) {
        ranges[k] = (row_range){args, load, store, trunc, args->rows * k / threads,
                                args->rows * (k + 1) / threads, partials + (size_t)k * (chunks ? chunks : 1)};
    }
    /* Threads beyond the first run the upper row ranges; if one cannot start, its rows run
     * here, so the result never depends on how many threads there were. */
    int started[256] = {0};
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
