/*
 * SwiGLU backward (docs/operator.md) in fp32, operation by operation in the device's order
 * (docs/kernel.md). Every operation is a plain IEEE single-precision one (the file is built
 * with -ffp-contract=off), and every NaN is stored in one canonical form, so the output bits do
 * not depend on the vector width, the instruction set or the thread count: rows are independent
 * and each row is computed by exactly one thread.
 *
 * Two implementations of the same arithmetic: the scalar one here (the reference, one element
 * at a time) and the vectorised one (swiglu_kernel_vector.c, GCC vector extensions, built for
 * baseline x86-64, AVX2 and AVX-512; the widest the CPU runs is used). Tests run them all and
 * compare the bytes.
 */
#include "swiglu_kernel.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/work_threads.h"
#include "swiglu_fpenv.h"
#include "swiglu_kernel_impl.h"
#include "swiglu_tiling.h"


/* With a weight the factor is at least 12 + 4, so a first tile never outgrows the accumulator. */
_Static_assert((TILING_AVAILABLE - TILING_ROW_EXTRA) / (4 * 16) <= SWIGLU_REDUCE_MAX,
               "the first tile of a weighted row fits SWIGLU_REDUCE_MAX");

float swiglu_device_expf(float x) { return device_expf(x); }

/* ---- the scalar implementation ---- */

static void grad_scalar(const float *gy, float *x0, float *x1, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float silu, dsilu;
        silu_with_derivative(x0[i], &silu, &dsilu);
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
        float silu, dsilu;
        silu_with_derivative(a, &silu, &dsilu);
        float g = gy[i];
        float gx0 = (g * b) * dsilu;
        float gx1 = g * silu;
        /* Masks on the original values, applied by multiplication. */
        x0[i] = gx0 * (a_orig < c ? 1.0f : 0.0f);
        x1[i] = gx1 * ((-c < b_orig && b_orig < c) ? 1.0f : 0.0f);
    }
}

static void products_scalar(const float *gy, const float *yo, float *acc, size_t n, int accumulate)
{
    for (size_t i = 0; i < n; i++) acc[i] = accumulate ? acc[i] + gy[i] * yo[i] : gy[i] * yo[i];
}

static float reduce_sum_scalar(const float *acc, size_t n) { return reduce_sum_with(acc, n, tree64_scalar); }

static void scale_scalar(float *v, size_t n, float w)
{
    for (size_t i = 0; i < n; i++) v[i] = v[i] * w;
}

static void exp_block_scalar(const float *in, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = device_expf(in[i]);
}

#define SCALAR_COMMON grad_scalar, grad_clamped_scalar, products_scalar, reduce_sum_scalar, scale_scalar, \
    exp_block_scalar
static const kernel_impl scalar_impls[3] = {
    {load_f32_scalar, store_f32_scalar, SCALAR_COMMON, {{NULL, NULL}, {NULL, NULL}}},
    {load_f16_scalar, store_f16_scalar, SCALAR_COMMON, {{NULL, NULL}, {NULL, NULL}}},
    {load_bf16_scalar, store_bf16_scalar, SCALAR_COMMON, {{NULL, NULL}, {NULL, NULL}}},
};

/* The implementation table for a variant, or NULL when this CPU cannot run it. */
static const kernel_impl *implementation(swiglu_kernel_variant variant)
{
    switch (variant) {
    case SWIGLU_KERNEL_SCALAR:
        return scalar_impls;
    case SWIGLU_KERNEL_VECTOR_BASELINE:
        return swiglu_vector_impls_baseline;
#if defined(SWIGLU_HAVE_X86_VARIANTS)
    case SWIGLU_KERNEL_VECTOR_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") ? swiglu_vector_impls_avx2 : NULL;
    case SWIGLU_KERNEL_VECTOR_AVX512:
        __builtin_cpu_init();
        return (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
                   ? swiglu_vector_impls_avx512
                   : NULL;
    case SWIGLU_KERNEL_VECTOR_AVX512_BF16:
        return implementation(SWIGLU_KERNEL_VECTOR_AVX512) != NULL && __builtin_cpu_supports("avx512bf16")
                   ? swiglu_vector_impls_avx512_bf16
                   : NULL;
#endif
    case SWIGLU_KERNEL_VECTOR: {
        static const swiglu_kernel_variant widest_first[] = {SWIGLU_KERNEL_VECTOR_AVX512_BF16,
                                                             SWIGLU_KERNEL_VECTOR_AVX512,
                                                             SWIGLU_KERNEL_VECTOR_AVX2};
        for (size_t i = 0; i < sizeof widest_first / sizeof widest_first[0]; i++) {
            const kernel_impl *impl = implementation(widest_first[i]);
            if (impl != NULL) return impl;
        }
        return swiglu_vector_impls_baseline;
    }
    default:
        return NULL;
    }
}

int swiglu_kernel_variant_available(swiglu_kernel_variant variant)
{
    return implementation(variant) != NULL;
}

int swiglu_kernel_exp(swiglu_kernel_variant variant, const float *in, float *out, size_t n)
{
    const kernel_impl *table = implementation(variant);
    if (table == NULL) {
        return -2;
    }
    fp_env saved = fp_env_enter();
    table[0].exp_block(in, out, n);
    fp_env_leave(saved);
    return 0;
}

int swiglu_kernel_reduce_sum(swiglu_kernel_variant variant, const float *in, size_t n, float *out)
{
    const kernel_impl *table = implementation(variant);
    if (table == NULL) {
        return -2;
    }
    if (n > SWIGLU_REDUCE_MAX) {
        return -1;
    }
    fp_env saved = fp_env_enter();
    *out = table[0].reduce_sum(in, n);
    fp_env_leave(saved);
    return 0;
}

float swiglu_float_nearest(double value)
{
    volatile double wide = value;   /* in memory, so that the conversion stays between the switches */
    volatile float narrow;
    fp_env saved = fp_env_enter();
    narrow = (float)wide;
    fp_env_leave(saved);
    return narrow;
}

/* ---- the release whose tiling decides the gradWeight order ---- */

int swiglu_tiling_of_release(const char *release) { return tiling_of_release(release); }

int64_t swiglu_tile_length(aclDataType dtype, int has_weight, int clamp_on, int64_t hidden, swiglu_tiling tiling)
{
    return tiling_first_tile(dtype, has_weight, clamp_on, hidden, tiling);
}

static pthread_once_t environment_once = PTHREAD_ONCE_INIT;
static swiglu_tiling environment_tiling = SWIGLU_TILING_CURRENT;   /* written once, under environment_once */

static void read_environment_tiling(void)
{
    const char *text = getenv("ACL_EMU_CANN_VERSION");
    if (text == NULL || *text == '\0') {
        return;
    }
    int tiling = tiling_of_release(text);
    if (tiling < 0) {
        fprintf(stderr, "acl-swiglu emulator: ignoring ACL_EMU_CANN_VERSION=%s (expected a release of the "
                "operator such as 9.1.0, 9.2.0-beta.1 or 9.2.0; it ships from 9.1.0)\n", text);
        return;
    }
    environment_tiling = (swiglu_tiling)tiling;
}

swiglu_tiling swiglu_environment_tiling(void)
{
    pthread_once(&environment_once, read_environment_tiling);
    return environment_tiling;
}

/* ---- rows ---- */

/* Scratch of one thread: a block of each operand in fp32, and gradWeight's accumulator (as long
 * as the first tile). */
typedef struct {
    float gy[BLOCK], x0[BLOCK], x1[BLOCK], yo[BLOCK];
    float acc[SWIGLU_REDUCE_MAX];
} row_scratch;

typedef struct {
    const swiglu_kernel_args *args;
    const kernel_impl *impl;
    int64_t trunc;
    int64_t tile;          /* columns per tile: the first tile's length with a weight, else H */
    int64_t first_row;
    int64_t end_row;
    /* Several threads: the next row no thread has taken yet, shared by all of them (atomic), and
     * how many rows a thread takes at a time; NULL with one thread, which runs
     * [first_row, end_row). */
    int64_t *next_row;
    int64_t chunk;
    row_scratch *scratch;  /* zeroed, so the spare lanes of a short block hold plain numbers */
    const silu_pair *table;   /* the fused loops' silu table (fp16 and bf16), else NULL */
    silu_pair at_limit;       /* silu and its derivative at the clamp limit */
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

/* Elements [from, n) of a block through scratch: load, compute, store. */
static void block_via_scratch(const row_range *r, const char *gy, int64_t sy, const char *x0,
                              const char *x1, int64_t sx, const char *yo, int64_t so, char *gx0,
                              char *gx1, int64_t sg, size_t from, size_t n, float w, float *acc,
                              int accumulate, row_scratch *scratch)
{
    const swiglu_kernel_args *a = r->args;
    const kernel_impl *impl = r->impl;
    const int64_t es = a->dtype == ACL_FLOAT ? 4 : 2;
    size_t m = n - from;
    impl->load(gy + (int64_t)from * sy * es, sy, scratch->gy, m);
    impl->load(x0 + (int64_t)from * sx * es, sx, scratch->x0, m);
    impl->load(x1 + (int64_t)from * sx * es, sx, scratch->x1, m);
    if (a->has_weight) {
        /* gradWeight uses the raw gy, before weighting and without the clamp mask. */
        impl->load(yo + (int64_t)from * so * es, so, scratch->yo, m);
        impl->products(scratch->gy, scratch->yo, acc + from, m, accumulate);
        impl->scale(scratch->gy, m, w);
    }
    if (a->clamp_on) {
        impl->grad_clamped(scratch->gy, scratch->x0, scratch->x1, m, a->clamp);
    } else {
        impl->grad(scratch->gy, scratch->x0, scratch->x1, m);
    }
    impl->store(gx0 + (int64_t)from * sg * es, sg, scratch->x0, m);
    impl->store(gx1 + (int64_t)from * sg * es, sg, scratch->x1, m);
}

static void compute_row(const row_range *r, int64_t t, row_scratch *scratch)
{
    const swiglu_kernel_args *a = r->args;
    const kernel_impl *impl = r->impl;
    const int64_t es = a->dtype == ACL_FLOAT ? 4 : 2;
    const int64_t H = a->hidden;
    const int64_t sy = last_stride(&a->grad_y), sx = last_stride(&a->x);
    const int64_t so = a->has_weight ? last_stride(&a->y_origin) : 1, sg = last_stride(&a->grad_x);
    const char *gy_row = a->grad_y.data + row_offset(&a->grad_y, t) * es;
    const char *x_row = a->x.data + row_offset(&a->x, t) * es;
    char *gx_row = a->grad_x.data + row_offset(&a->grad_x, t) * es;
    const char *yo_row = a->has_weight ? a->y_origin.data + row_offset(&a->y_origin, t) * es : NULL;
    float w = a->has_weight ? *((const float *)a->weight.data + element_offset(&a->weight, t)) : 1.0f;
    size_t (*fused)(const fused_block *) = (sy == 1 && sx == 1 && so == 1 && sg == 1)
                                               ? impl->fused[a->clamp_on != 0][a->has_weight != 0]
                                               : NULL;

    /* Tile by tile: the first writes gradWeight's accumulator, each later one adds to its head. */
    for (int64_t t0 = 0; t0 < H; t0 += r->tile) {
        const int64_t tile_end = H - t0 < r->tile ? H : t0 + r->tile;
        for (int64_t h0 = t0; h0 < tile_end; h0 += BLOCK) {
            size_t n = (size_t)(tile_end - h0 < BLOCK ? tile_end - h0 : BLOCK);
            const char *gy = gy_row + h0 * sy * es, *x0 = x_row + h0 * sx * es;
            const char *x1 = x_row + (H + h0) * sx * es, *yo = yo_row ? yo_row + h0 * so * es : NULL;
            char *gx0 = gx_row + h0 * sg * es, *gx1 = gx_row + (H + h0) * sg * es;
            float *acc = scratch->acc + (h0 - t0);
            int accumulate = t0 > 0;
            size_t done = 0;
            if (fused != NULL) {
                fused_block block = {gy, x0, x1, yo, gx0, gx1, n, w, a->clamp, acc, accumulate, r->table,
                                     r->at_limit};
                done = fused(&block);
            }
            if (done < n) {
                block_via_scratch(r, gy, sy, x0, x1, sx, yo, so, gx0, gx1, sg, done, n, w, acc, accumulate,
                                  scratch);
            }
        }
    }
    if (a->has_weight) {
        float *gw = (float *)a->grad_weight.data + element_offset(&a->grad_weight, t);
        *gw = canonical_f32(impl->reduce_sum(scratch->acc, (size_t)(H < r->tile ? H : r->tile)));
    }
}

static void *run_rows(void *arg)
{
    const row_range *r = arg;
    static const float zeros[BLOCK];
    fp_env saved = fp_env_enter();
    int64_t first = r->first_row, end = r->end_row;
    for (;;) {
        if (r->next_row != NULL) {
            /* Rows in chunks, taken as threads get free: a thread that shares its core with other
             * work takes fewer. Each row is still computed by exactly one thread. */
            first = __atomic_fetch_add(r->next_row, r->chunk, __ATOMIC_RELAXED);
            if (first >= r->end_row) break;
            end = r->end_row - first < r->chunk ? r->end_row : first + r->chunk;
        }
        for (int64_t t = first; t < end; t++) {
            if (t < r->trunc) {
                compute_row(r, t, r->scratch);
            } else {
                zero_row(r, t, zeros);
            }
        }
        if (r->next_row == NULL) break;
    }
    fp_env_leave(saved);
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
    const kernel_impl *table = implementation(variant);
    if (table == NULL) {
        return -2;
    }
    const kernel_impl *impl = &table[io];
    int64_t trunc = swiglu_trunc(args);
    threads = work_thread_count(threads, (uint64_t)(args->rows * (args->hidden > 0 ? args->hidden : 1)),
                                KERNEL_MIN_ELEMENTS_PER_THREAD, (uint64_t)args->rows);

    int64_t tile = args->hidden;
    if (args->has_weight) {
        swiglu_tiling tiling = args->tiling == SWIGLU_TILING_FROM_ENVIRONMENT ? swiglu_environment_tiling()
                                                                              : args->tiling;
        tile = tiling_first_tile(args->dtype, 1, args->clamp_on, args->hidden, tiling);
        if (tile <= 0 && args->hidden > 0) {
            return -3;
        }
    }
    const silu_pair *silu_table = NULL;
    silu_pair at_limit = {0.0f, 0.0f};
    if (impl->fused[0][0] != NULL && args->dtype != ACL_FLOAT && trunc > 0) {
        silu_table = swiglu_silu_table(args->dtype);
        fp_env saved = fp_env_enter();
        silu_with_derivative(args->clamp, &at_limit.silu, &at_limit.dsilu);
        fp_env_leave(saved);
    }
    if (threads == 1) {
        /* The common small launch: everything on this thread, nothing to allocate. */
        static __thread row_scratch own_scratch;   /* zero at thread start */
        row_range range = {args, impl, trunc, tile, 0, args->rows, NULL, 0, &own_scratch, silu_table, at_limit};
        run_rows(&range);
        return 0;
    }
    row_range *ranges = calloc((size_t)threads, sizeof *ranges);
    row_scratch *scratch = calloc((size_t)threads, sizeof *scratch);
    if (ranges == NULL || scratch == NULL) {
        free(ranges);
        free(scratch);
        return -1;
    }
    /* About 16 chunks per thread: few atomic operations, and little left for the others to wait
     * for when one thread is slowed down. */
    int64_t next_row = 0;
    int64_t chunk = args->rows / ((int64_t)threads * 16);
    if (chunk < 1) chunk = 1;
    for (int k = 0; k < threads; k++) {
        ranges[k] = (row_range){args, impl, trunc, tile, 0, args->rows, &next_row, chunk, &scratch[k], silu_table,
                                at_limit};
    }
    work_run_ranges(run_rows, ranges, sizeof *ranges, threads);
    free(ranges);
    free(scratch);
    return 0;
}
