/*
 * The kernel's math through the public ACL path (aclInit, aclrtSetDevice, aclrtMalloc,
 * aclrtMemcpy, aclCreateTensor, both operator phases, aclrtSynchronizeStream, copy back), for
 * FLOAT, FLOAT16 and BF16.
 *
 * Expected values come from two sources that do not share code with the emulator:
 *  - ref_*: docs/kernel.md followed step by step in fp32 (own device_exp, gradWeight's order from
 *    spec_grad_weight.h, own conversions computed through double), compared bit for bit;
 *  - literals worked out by hand or in double precision, compared exactly where the math is
 *    exact (x0 = 0 gives e = 1, s = 0.5) and with a tolerance elsewhere.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "aclnnop/aclnn_swiglu_group_quant_grad.h"
#include "acl_emu/acl_emu.h"
#include "emu_test.h"
#include "spec_grad_weight.h"

#define MAX_DIMS 8

static aclrtStream g_stream;

/* ------------------------------------------------------------------------------------------ */
/* bits and independent conversions                                                            */
/* ------------------------------------------------------------------------------------------ */

static size_t dtype_size(aclDataType dt) { return dt == ACL_FLOAT ? 4 : 2; }

static const char *dtype_name(aclDataType dt)
{
    return dt == ACL_FLOAT ? "FLOAT" : dt == ACL_FLOAT16 ? "FLOAT16" : "BF16";
}

/* fp16 -> fp32 from the fields (NaN: a quiet NaN with the sign and payload). */
static float ref_half_to_float(uint16_t h)
{
    int negative = h >> 15;
    int e = (h >> 10) & 0x1F;
    int m = h & 0x3FF;
    if (e == 0x1F && m != 0) {
        return f_bits(((uint32_t)negative << 31) | 0x7FC00000u | ((uint32_t)m << 13));
    }
    float v = e == 0x1F ? INFINITY : e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m + 1024), e - 25);
    return negative ? -v : v;
}

static float ref_bf16_to_float(uint16_t h) { return f_bits((uint32_t)h << 16); }

/* Round |f| to `digits` significant bits with quantum at least 2^min_q, half to even, in
 * double (exact: every float and every rounding point is a double). */
static double round_significand(double v, int digits, int min_q)
{
    int ex;
    frexp(v, &ex); /* v = m * 2^ex, m in [0.5, 1) */
    int q = ex - digits;
    if (q < min_q) q = min_q;
    return ldexp(nearbyint(ldexp(v, -q)), q); /* nearbyint: round half to even */
}

/* fp32 -> fp16, round half to even; NaN -> 0x7E00 with the sign (docs/kernel.md). */
static uint16_t ref_float_to_half(float f)
{
    uint16_t sign = (uint16_t)((bits_f(f) >> 16) & 0x8000u);
    if (isnan(f)) return sign | 0x7E00;
    double v = fabs((double)f);
    if (v == 0.0) return sign;
    if (isinf(f)) return sign | 0x7C00;
    double r = round_significand(v, 11, -24);
    if (r >= 65536.0) return sign | 0x7C00;
    if (r < ldexp(1.0, -14)) return sign | (uint16_t)ldexp(r, 24); /* subnormal: r / 2^-24 */
    int ex;
    frexp(r, &ex);
    int e = ex - 1; /* r = 1.f * 2^e */
    uint16_t mant = (uint16_t)(ldexp(r, 10 - e) - 1024.0);
    return sign | (uint16_t)((e + 15) << 10) | mant;
}

/* fp32 -> bf16, round half to even; NaN -> a quiet NaN; past the largest bf16 -> inf. */
static uint16_t ref_float_to_bf16(float f)
{
    uint16_t sign = (uint16_t)((bits_f(f) >> 16) & 0x8000u);
    if (isnan(f)) return sign | 0x7FC0;
    double v = fabs((double)f);
    if (v == 0.0) return sign;
    if (isinf(f)) return sign | 0x7F80;
    double r = round_significand(v, 8, -133);
    if (r >= ldexp(1.0, 128)) return sign | 0x7F80;
    if (r < ldexp(1.0, -126)) return sign | (uint16_t)ldexp(r, 133);
    int ex;
    frexp(r, &ex);
    int e = ex - 1;
    uint16_t mant = (uint16_t)(ldexp(r, 7 - e) - 128.0);
    return sign | (uint16_t)((e + 127) << 7) | mant;
}

/* Storage bits (zero-extended) of a float in a dtype. */
static uint32_t narrow_bits(aclDataType dt, float v)
{
    return dt == ACL_FLOAT ? bits_f(v) : dt == ACL_FLOAT16 ? ref_float_to_half(v) : ref_float_to_bf16(v);
}

static float widen_bits(aclDataType dt, uint32_t b)
{
    return dt == ACL_FLOAT ? f_bits(b) : dt == ACL_FLOAT16 ? ref_half_to_float((uint16_t)b)
                                                         : ref_bf16_to_float((uint16_t)b);
}

/* The nearest value of the dtype. */
static float quantize(aclDataType dt, float v) { return widen_bits(dt, narrow_bits(dt, v)); }

static uint32_t load_elem(aclDataType dt, const void *buf, size_t i)
{
    if (dt == ACL_FLOAT) {
        uint32_t u;
        memcpy(&u, (const char *)buf + 4 * i, 4);
        return u;
    }
    uint16_t h;
    memcpy(&h, (const char *)buf + 2 * i, 2);
    return h;
}

static void store_elem(aclDataType dt, void *buf, size_t i, uint32_t bits)
{
    if (dt == ACL_FLOAT) {
        memcpy((char *)buf + 4 * i, &bits, 4);
    } else {
        uint16_t h = (uint16_t)bits;
        memcpy((char *)buf + 2 * i, &h, 2);
    }
}

/* A stored NaN as the docs require: the canonical positive quiet NaN of the format. */
static int is_doc_nan(aclDataType dt, uint32_t b)
{
    if (dt == ACL_FLOAT) return b == 0x7FC00000u;
    if (dt == ACL_FLOAT16) return b == 0x7E00u;
    return b == 0x7FC0u;
}

static uint32_t zero_bits(aclDataType dt, int negative)
{
    if (!negative) return 0;
    return dt == ACL_FLOAT ? 0x80000000u : 0x8000u;
}

static uint32_t pos_inf_bits(aclDataType dt)
{
    return dt == ACL_FLOAT ? 0x7F800000u : dt == ACL_FLOAT16 ? 0x7C00u : 0x7F80u;
}

/* ------------------------------------------------------------------------------------------ */
/* the reference: docs/kernel.md, step by step in fp32                                         */
/* ------------------------------------------------------------------------------------------ */

static float ref_device_exp(float x)
{
    const float X_OVF = 88.72283935546875f;
    const float LOG2E = 1.44269502162933349609375f;
    const float ROUNDER = 12582912.0f;
    const float LN2_HI = 0.693145751953125f;
    const float LN2_LO = (float)1.428606765330187045e-06;
    float xc = x;
    if (xc < -104.0f) xc = -104.0f;
    if (xc > 89.0f) xc = 89.0f;
    float product = xc * LOG2E;
    float t = product + ROUNDER;
    float nf = t - ROUNDER;
    float hi_part = nf * LN2_HI;
    float r = xc - hi_part;
    float lo_part = nf * LN2_LO;
    r = r - lo_part;
    static const double coef[] = {1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0};
    float p = (float)(1.0 / 5040);
    for (size_t i = 0; i < sizeof coef / sizeof coef[0]; i++) {
        float pr = p * r;
        p = pr + (float)coef[i];
    }
    int32_t n = (int32_t)(bits_f(t) - bits_f(ROUNDER));
    int32_t lo = n >> 1;
    int32_t hi = n - lo;
    float result = p * ldexpf(1.0f, (int)lo);
    result = result * ldexpf(1.0f, (int)hi);
    if (result < FLT_MIN) result = 0.0f;
    if (result > FLT_MAX) result = FLT_MAX;
    if (x >= X_OVF) result = INFINITY;
    if (isnan(x)) result = x;
    return result;
}

static float nan_min(float a, float b) { return isnan(a) ? a : isnan(b) ? b : (a < b ? a : b); }
static float nan_max(float a, float b) { return isnan(a) ? a : isnan(b) ? b : (a > b ? a : b); }

static float left_to_right(const float *p, size_t n)
{
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s = s + p[i];
    return s;
}

typedef struct {
    int64_t T, H, trunc;
    int narrow_dtype;             /* fp16 or bf16: the tiling counts it */
    const float *gy, *x, *yo, *w; /* widened inputs, contiguous; w NULL = no weight */
    int clamp_on;
    float c;
    float *gx; /* out: T * 2H */
    float *gw; /* out: T */
} ref_args;

static void ref_compute(const ref_args *a)
{
    const int64_t T = a->T, H = a->H;
    float *p = malloc((size_t)(H > 0 ? H : 1) * sizeof *p);
    for (int64_t t = 0; t < T; t++) {
        float *gx_row = a->gx + t * 2 * H;
        if (t >= a->trunc) {
            for (int64_t h = 0; h < 2 * H; h++) gx_row[h] = 0.0f;
            if (a->w) a->gw[t] = 0.0f;
            continue;
        }
        for (int64_t h = 0; h < H; h++) {
            float gy = a->gy[t * H + h];
            float x0 = a->x[t * 2 * H + h];
            float x1 = a->x[t * 2 * H + H + h];
            if (a->w) {
                p[h] = gy * a->yo[t * H + h];
                gy = gy * a->w[t];
            }
            float av = x0, bv = x1;
            if (a->clamp_on) {
                av = nan_min(x0, a->c);
                bv = nan_min(nan_max(x1, -a->c), a->c);
            }
            float e = ref_device_exp(av);
            float e1 = e + 1.0f;
            float s = e / e1;
            float silu = av * s;
            float one_minus = 1.0f - s;
            float inner = one_minus * av;
            inner = inner + 1.0f;
            float dsilu = s * inner;
            float gyb = gy * bv;
            float gx0 = gyb * dsilu;
            float gx1 = gy * silu;
            if (a->clamp_on) {
                gx0 = gx0 * (x0 < a->c ? 1.0f : 0.0f);
                gx1 = gx1 * ((-a->c < x1 && x1 < a->c) ? 1.0f : 0.0f);
            }
            gx_row[h] = gx0;
            gx_row[H + h] = gx1;
        }
        if (a->w) a->gw[t] = spec_grad_weight(p, H, spec_first_tile(a->narrow_dtype, 1, a->clamp_on, H, 0));
    }
    free(p);
}

/* ------------------------------------------------------------------------------------------ */
/* the harness: one operator call through the public ACL path                                  */
/* ------------------------------------------------------------------------------------------ */

enum { T_GY, T_X, T_YO, T_W, T_GX, T_GW, T_COUNT };

enum { GROUPS_NONE, GROUPS_ARRAY, GROUPS_TENSOR };

typedef struct {
    const int64_t *strides; /* NULL: contiguous */
    int64_t offset;         /* elements */
    int64_t storage;        /* elements allocated; 0: just what the view needs */
} layout;

typedef struct {
    aclDataType dtype;
    int ndim;
    int64_t dims[MAX_DIMS]; /* gradY's shape; x and gradX double the last dim */
    const float *gy, *x;    /* T*H and T*2H values, exactly representable in dtype */
    const float *yo, *w;    /* T*H and T values, or NULL (w requires yo) */
    int w_ndim;             /* 0: gradY's leading dims followed by 1 */
    int64_t w_dims[MAX_DIMS];
    int group_mode;
    const int64_t *groups;
    int64_t group_count;
    int64_t group_stride;        /* GROUPS_TENSOR: element stride, 0 = 1 */
    const int64_t *groups_later; /* GROUPS_TENSOR: copied in after phase 2, before the sync */
    double clamp;
    int abi; /* 1, or 2 (also 0) */
    const layout *lay[T_COUNT];
    int null_empty; /* empty tensors get a NULL data pointer (allowed: nothing to read) */
} op_case;

typedef struct {
    int status;   /* phase 1's status */
    uint64_t workspace;
    uint8_t *gx;  /* T*2H elements of dtype, gathered in row-major order of the view */
    float *gw;    /* T */
} op_out;

static int64_t case_rows(const op_case *c)
{
    int64_t T = 1;
    for (int d = 0; d < c->ndim - 1; d++) T *= c->dims[d];
    return T;
}

static int64_t case_hidden(const op_case *c) { return c->dims[c->ndim - 1]; }

static int64_t numel_of(int ndim, const int64_t *dims)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= dims[d];
    return n;
}

static void contiguous_strides(int ndim, const int64_t *dims, int64_t *strides)
{
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = s;
        s *= dims[d] > 0 ? dims[d] : 1;
    }
}

/* Storage position of flat (row-major) element i of a view. */
static int64_t view_position(int ndim, const int64_t *dims, const int64_t *strides, int64_t offset,
                             int64_t i)
{
    int64_t pos = offset;
    for (int d = ndim - 1; d >= 0; d--) {
        pos += (i % dims[d]) * strides[d];
        i /= dims[d];
    }
    return pos;
}

typedef struct {
    int present, output;
    aclDataType dt;
    size_t es;
    int ndim;
    int64_t dims[MAX_DIMS], strides[MAX_DIMS];
    int64_t offset, storage, numel;
    size_t bytes;
    void *dev;
    uint8_t *host; /* the bytes copied in (outputs: the sentinel) */
    aclTensor *tensor;
} tensor_slot;

#define OUTPUT_SENTINEL 0xA5

static void slot_prepare(tensor_slot *s, const layout *lay, const float *values, int null_empty)
{
    s->numel = numel_of(s->ndim, s->dims);
    if (lay != NULL && lay->strides != NULL) {
        memcpy(s->strides, lay->strides, (size_t)s->ndim * sizeof(int64_t));
    } else {
        contiguous_strides(s->ndim, s->dims, s->strides);
    }
    s->offset = lay != NULL ? lay->offset : 0;
    int64_t need = 0;
    if (s->numel > 0) {
        need = s->offset + 1;
        for (int d = 0; d < s->ndim; d++) need += (s->dims[d] - 1) * s->strides[d];
    }
    s->storage = lay != NULL && lay->storage > need ? lay->storage : need;
    s->bytes = (size_t)s->storage * s->es;
    size_t alloc = s->bytes > 64 ? s->bytes : 64;
    s->host = malloc(alloc);
    memset(s->host, s->output ? OUTPUT_SENTINEL : 0xFF, alloc);
    if (!s->output) {
        for (int64_t i = 0; i < s->numel; i++) {
            int64_t pos = view_position(s->ndim, s->dims, s->strides, s->offset, i);
            store_elem(s->dt, s->host, (size_t)pos, narrow_bits(s->dt, values[i]));
        }
    }
    if (!(null_empty && s->numel == 0)) {
        CHECK_EQ_INT(aclrtMalloc(&s->dev, alloc, ACL_MEM_MALLOC_HUGE_FIRST), 0);
        CHECK_EQ_INT(aclrtMemcpy(s->dev, alloc, s->host, alloc, ACL_MEMCPY_HOST_TO_DEVICE), 0);
    }
    int64_t storage_dims[1] = {s->storage};
    s->tensor = aclCreateTensor(s->dims, (uint64_t)s->ndim, s->dt, s->strides, s->offset,
                                ACL_FORMAT_ND, storage_dims, 1, s->dev);
    CHECK(s->tensor != NULL);
}

/* Copies an output back: its view gathered into `out`, the rest must still be the sentinel. */
static void slot_collect(const tensor_slot *s, void *out, const char *what)
{
    if (s->dev == NULL) return; /* an empty view without memory */
    size_t alloc = s->bytes > 64 ? s->bytes : 64;
    uint8_t *back = malloc(alloc);
    uint8_t *in_view = calloc((size_t)(s->storage > 0 ? s->storage : 1), 1);
    CHECK_EQ_INT(aclrtMemcpy(back, alloc, s->dev, alloc, ACL_MEMCPY_DEVICE_TO_HOST), 0);
    for (int64_t i = 0; i < s->numel; i++) {
        int64_t pos = view_position(s->ndim, s->dims, s->strides, s->offset, i);
        in_view[pos] = 1;
        memcpy((uint8_t *)out + (size_t)i * s->es, back + (size_t)pos * s->es, s->es);
    }
    int64_t touched = 0;
    for (int64_t pos = 0; pos < s->storage; pos++) {
        if (!in_view[pos] && memcmp(back + (size_t)pos * s->es, s->host + (size_t)pos * s->es, s->es) != 0) {
            touched++;
        }
    }
    for (size_t b = s->bytes; b < alloc; b++) {
        if (back[b] != OUTPUT_SENTINEL) touched++;
    }
    if (touched) fprintf(stderr, "%s: %lld storage elements outside the view were written\n", what, (long long)touched);
    CHECK_EQ_INT(touched, 0);
    free(back);
    free(in_view);
}

static void out_free(op_out *o)
{
    free(o->gx);
    free(o->gw);
    memset(o, 0, sizeof *o);
}

/* Runs the operator. Returns phase 1's status (outputs are filled only on success). */
static int run_op(const op_case *c, op_out *out, const char *what)
{
    const int64_t T = case_rows(c), H = case_hidden(c);
    const float *values[T_COUNT] = {c->gy, c->x, c->yo, c->w, NULL, NULL};
    tensor_slot slots[T_COUNT];
    memset(slots, 0, sizeof slots);
    memset(out, 0, sizeof *out);

    for (int k = 0; k < T_COUNT; k++) {
        tensor_slot *s = &slots[k];
        s->present = k == T_GY || k == T_X || k == T_GX || (k == T_YO && c->yo) ||
                     ((k == T_W || k == T_GW) && c->w);
        s->output = k == T_GX || k == T_GW;
        if (!s->present) continue;
        s->dt = (k == T_W || k == T_GW) ? ACL_FLOAT : c->dtype;
        s->es = dtype_size(s->dt);
        if (k == T_W || k == T_GW) {
            if (c->w_ndim > 0) {
                s->ndim = c->w_ndim;
                memcpy(s->dims, c->w_dims, sizeof s->dims);
            } else {
                s->ndim = c->ndim;
                memcpy(s->dims, c->dims, sizeof s->dims);
                s->dims[c->ndim - 1] = 1;
            }
        } else {
            s->ndim = c->ndim;
            memcpy(s->dims, c->dims, sizeof s->dims);
            if (k == T_X || k == T_GX) s->dims[c->ndim - 1] *= 2;
        }
        slot_prepare(s, c->lay[k], values[k], c->null_empty);
    }

    aclIntArray *group_array = NULL;
    aclTensor *group_tensor = NULL;
    void *group_dev = NULL;
    int64_t *group_host = NULL;
    size_t group_bytes = 0;
    int64_t group_stride = c->group_stride > 0 ? c->group_stride : 1;
    static const int64_t no_groups[1] = {0};
    if (c->group_mode == GROUPS_ARRAY) {
        group_array = aclCreateIntArray(c->groups ? c->groups : no_groups, (uint64_t)c->group_count);
        CHECK(group_array != NULL);
    } else if (c->group_mode == GROUPS_TENSOR) {
        int64_t storage = c->group_count > 0 ? (c->group_count - 1) * group_stride + 1 : 0;
        group_bytes = (size_t)(storage > 8 ? storage : 8) * sizeof(int64_t);
        group_host = malloc(group_bytes);
        for (size_t i = 0; i < group_bytes / sizeof(int64_t); i++) group_host[i] = 1000003; /* junk */
        for (int64_t g = 0; g < c->group_count; g++) group_host[g * group_stride] = c->groups[g];
        CHECK_EQ_INT(aclrtMalloc(&group_dev, group_bytes, ACL_MEM_MALLOC_HUGE_FIRST), 0);
        CHECK_EQ_INT(aclrtMemcpy(group_dev, group_bytes, group_host, group_bytes, ACL_MEMCPY_HOST_TO_DEVICE), 0);
        int64_t gdims[1] = {c->group_count}, gstrides[1] = {group_stride}, gstorage[1] = {storage};
        group_tensor = aclCreateTensor(gdims, 1, ACL_INT64, gstrides, 0, ACL_FORMAT_ND, gstorage, 1, group_dev);
        CHECK(group_tensor != NULL);
    }

    if (c->abi == 1) {
        setenv("ACL_SWIGLU_ABI", "1", 1);
    } else {
        unsetenv("ACL_SWIGLU_ABI");
    }
    const aclTensor *group_arg = group_array != NULL ? (const aclTensor *)group_array : group_tensor;
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    int rc = aclnnSwigluGroupQuantGradGetWorkspaceSize(
        slots[T_GY].tensor, slots[T_X].tensor, slots[T_W].tensor, slots[T_YO].tensor, group_arg,
        c->clamp, slots[T_GX].tensor, slots[T_GW].tensor, &ws, &ex);
    unsetenv("ACL_SWIGLU_ABI");
    out->status = rc;
    out->workspace = ws;
    if (rc == 0) {
        void *wsp = NULL;
        if (ws > 0) CHECK_EQ_INT(aclrtMalloc(&wsp, ws, ACL_MEM_MALLOC_HUGE_FIRST), 0);
        CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(wsp, ws, ex, g_stream), 0);
        if (c->groups_later && group_dev) {
            /* revision 2 reads the values when the kernel runs: this write must count */
            for (int64_t g = 0; g < c->group_count; g++) group_host[g * group_stride] = c->groups_later[g];
            CHECK_EQ_INT(aclrtMemcpy(group_dev, group_bytes, group_host, group_bytes, ACL_MEMCPY_HOST_TO_DEVICE), 0);
        }
        int sync = aclrtSynchronizeStream(g_stream);
        CHECK_EQ_INT(sync, 0);
        if (sync != 0) fprintf(stderr, "%s: sync: %s\n", what, aclGetRecentErrMsg());
        out->gx = calloc((size_t)(T * 2 * H > 0 ? T * 2 * H : 1), dtype_size(c->dtype));
        out->gw = calloc((size_t)(T > 0 ? T : 1), sizeof(float));
        slot_collect(&slots[T_GX], out->gx, what);
        if (c->w) slot_collect(&slots[T_GW], out->gw, what);
        if (wsp) CHECK_EQ_INT(aclrtFree(wsp), 0);
    } else {
        CHECK(aclGetRecentErrMsg() != NULL); /* a failing phase 1 leaves its message */
    }

    for (int k = 0; k < T_COUNT; k++) {
        if (!slots[k].present) continue;
        CHECK_EQ_INT(aclDestroyTensor(slots[k].tensor), 0);
        if (slots[k].dev) CHECK_EQ_INT(aclrtFree(slots[k].dev), 0);
        free(slots[k].host);
    }
    if (group_array) CHECK_EQ_INT(aclDestroyIntArray(group_array), 0);
    if (group_tensor) CHECK_EQ_INT(aclDestroyTensor(group_tensor), 0);
    if (group_dev) CHECK_EQ_INT(aclrtFree(group_dev), 0);
    free(group_host);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* expectations                                                                                */
/* ------------------------------------------------------------------------------------------ */

static int64_t expected_trunc(const op_case *c)
{
    int64_t T = case_rows(c);
    if (c->group_mode == GROUPS_NONE) return T;
    const int64_t *g = c->groups_later ? c->groups_later : c->groups;
    uint32_t sum = 0;
    for (int64_t i = 0; i < c->group_count; i++) sum += (uint32_t)g[i];
    return (int64_t)sum < T ? (int64_t)sum : T;
}

static int clamp_on_for(const op_case *c)
{
    return c->abi == 1 ? c->clamp > 0.0 : c->clamp != -1.0;
}

/* The inputs the test wrote must be exactly representable (else the test itself is wrong). */
static void check_representable(const op_case *c, const char *what)
{
    int64_t T = case_rows(c), H = case_hidden(c), bad = 0;
    const float *arrays[3] = {c->gy, c->x, c->yo};
    int64_t counts[3] = {T * H, T * 2 * H, T * H};
    for (int a = 0; a < 3; a++) {
        if (!arrays[a]) continue;
        for (int64_t i = 0; i < counts[a]; i++) {
            float v = arrays[a][i];
            if (!isnan(v) && bits_f(quantize(c->dtype, v)) != bits_f(v)) bad++;
        }
    }
    if (bad) fprintf(stderr, "%s: %lld inputs are not %s values (test bug)\n", what, (long long)bad, dtype_name(c->dtype));
    CHECK_EQ_INT(bad, 0);
}

/* Reference outputs for a case: gx (T*2H fp32, before narrowing) and gw (T). */
static void reference_for(const op_case *c, float **gx, float **gw)
{
    int64_t T = case_rows(c), H = case_hidden(c);
    float *gyq = malloc((size_t)(T * H + 1) * sizeof(float));
    float *xq = malloc((size_t)(T * 2 * H + 1) * sizeof(float));
    float *yoq = malloc((size_t)(T * H + 1) * sizeof(float));
    for (int64_t i = 0; i < T * H; i++) gyq[i] = quantize(c->dtype, c->gy[i]);
    for (int64_t i = 0; i < T * 2 * H; i++) xq[i] = quantize(c->dtype, c->x[i]);
    for (int64_t i = 0; c->yo && i < T * H; i++) yoq[i] = quantize(c->dtype, c->yo[i]);
    *gx = calloc((size_t)(T * 2 * H + 1), sizeof(float));
    *gw = calloc((size_t)(T + 1), sizeof(float));
    ref_args a = {T, H, expected_trunc(c), c->dtype != ACL_FLOAT, gyq, xq, c->w ? yoq : NULL, c->w, clamp_on_for(c),
                  (float)c->clamp, *gx, *gw};
    ref_compute(&a);
    free(gyq);
    free(xq);
    free(yoq);
}

/* gradX bits against the reference narrowed to the dtype (NaN: a NaN of the documented form). */
static void compare_gx(const char *what, aclDataType dt, const uint8_t *actual, const float *expected, int64_t n)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t got = load_elem(dt, actual, (size_t)i);
        int ok = isnan(expected[i]) ? is_doc_nan(dt, got) : got == narrow_bits(dt, expected[i]);
        if (!ok && bad++ < 6) {
            fprintf(stderr, "%s: gradX[%lld] (%s) is 0x%08x (%.9g), expected 0x%08x (%.9g)\n", what,
                    (long long)i, dtype_name(dt), got, (double)widen_bits(dt, got),
                    narrow_bits(dt, expected[i]), (double)expected[i]);
        }
    }
    CHECK_EQ_INT(bad, 0);
}

static void compare_gw(const char *what, const float *actual, const float *expected, int64_t n)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int ok = isnan(expected[i]) ? bits_f(actual[i]) == 0x7FC00000u : bits_f(actual[i]) == bits_f(expected[i]);
        if (!ok && bad++ < 6) {
            fprintf(stderr, "%s: gradWeight[%lld] is 0x%08x (%.9g), expected 0x%08x (%.9g)\n", what,
                    (long long)i, bits_f(actual[i]), (double)actual[i], bits_f(expected[i]),
                    (double)expected[i]);
        }
    }
    CHECK_EQ_INT(bad, 0);
}

/* Runs a case and compares everything with the reference; keeps the outputs in *keep if given. */
static void check_case(const op_case *c, const char *what, op_out *keep)
{
    check_representable(c, what);
    op_out out;
    int rc = run_op(c, &out, what);
    CHECK_EQ_INT(rc, 0);
    if (rc != 0) {
        out_free(&out);
        if (keep) memset(keep, 0, sizeof *keep);
        return;
    }
    float *gx, *gw;
    reference_for(c, &gx, &gw);
    int64_t T = case_rows(c), H = case_hidden(c);
    compare_gx(what, c->dtype, out.gx, gx, T * 2 * H);
    if (c->w) compare_gw(what, out.gw, gw, T);
    free(gx);
    free(gw);
    if (keep) {
        *keep = out;
    } else {
        out_free(&out);
    }
}

static uint32_t gx_bits(const op_case *c, const op_out *o, int64_t t, int64_t col)
{
    return load_elem(c->dtype, o->gx, (size_t)(t * 2 * case_hidden(c) + col));
}

static float gx_value(const op_case *c, const op_out *o, int64_t t, int64_t col)
{
    return widen_bits(c->dtype, gx_bits(c, o, t, col));
}

/* The math in double (sigmoid as 1/(1+exp(-x))), against the device's fp32 result. */
static void check_close_to_double(const op_case *c, const op_out *o, const char *what, double rtol,
                                  double atol)
{
    int64_t H = case_hidden(c), trunc = expected_trunc(c), bad = 0;
    int clamp = clamp_on_for(c);
    double cl = (double)(float)c->clamp;
    for (int64_t t = 0; t < trunc; t++) {
        double w = c->w ? c->w[t] : 1.0, gw = 0.0, gw_abs = 0.0;
        for (int64_t h = 0; h < H; h++) {
            double gy = quantize(c->dtype, c->gy[t * H + h]);
            double x0 = quantize(c->dtype, c->x[t * 2 * H + h]);
            double x1 = quantize(c->dtype, c->x[t * 2 * H + H + h]);
            if (c->w) {
                double p = gy * quantize(c->dtype, c->yo[t * H + h]);
                gw += p;
                gw_abs += fabs(p);
            }
            gy *= w;
            double a = clamp ? fmin(x0, cl) : x0;
            double b = clamp ? fmin(fmax(x1, -cl), cl) : x1;
            double s = 1.0 / (1.0 + exp(-a));
            double g0 = gy * b * s * (1.0 + a * (1.0 - s));
            double g1 = gy * a * s;
            if (clamp) {
                g0 *= x0 < cl ? 1.0 : 0.0;
                g1 *= (-cl < x1 && x1 < cl) ? 1.0 : 0.0;
            }
            double scale0 = fabs(gy * b) * (1.0 + fabs(a)), scale1 = fabs(gy * a);
            double a0 = gx_value(c, o, t, h), a1 = gx_value(c, o, t, H + h);
            if (!(fabs(a0 - g0) <= atol * scale0 + rtol * fabs(g0)) && bad++ < 6) {
                fprintf(stderr, "%s: gradX[%lld][%lld] = %.9g, double says %.9g\n", what, (long long)t, (long long)h, a0, g0);
            }
            if (!(fabs(a1 - g1) <= atol * scale1 + rtol * fabs(g1)) && bad++ < 6) {
                fprintf(stderr, "%s: gradX[%lld][%lld] = %.9g, double says %.9g\n", what, (long long)t, (long long)(H + h), a1, g1);
            }
        }
        if (c->w && !(fabs(o->gw[t] - gw) <= 1e-6 * gw_abs + 1e-30) && bad++ < 6) {
            fprintf(stderr, "%s: gradWeight[%lld] = %.9g, double says %.9g\n", what, (long long)t, (double)o->gw[t], gw);
        }
    }
    CHECK_EQ_INT(bad, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* input generation                                                                            */
/* ------------------------------------------------------------------------------------------ */

static uint64_t rng_state;

static double rng_uniform(double lo, double hi)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

static float *random_values(aclDataType dt, int64_t n, double lo, double hi)
{
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = quantize(dt, (float)rng_uniform(lo, hi));
    return v;
}

typedef struct {
    float *gy, *x, *yo, *w;
} inputs;

static inputs make_inputs(aclDataType dt, int64_t T, int64_t H, uint64_t seed)
{
    rng_state = seed * 0x9E3779B97F4A7C15ULL + 1;
    inputs in;
    in.gy = random_values(dt, T * H, -2.0, 2.0);
    in.x = random_values(dt, T * 2 * H, -6.0, 6.0);
    in.yo = random_values(dt, T * H, -1.5, 1.5);
    in.w = random_values(ACL_FLOAT, T, 0.25, 1.75);
    return in;
}

static void free_inputs(inputs *in)
{
    free(in->gy);
    free(in->x);
    free(in->yo);
    free(in->w);
}

static const aclDataType all_dtypes[3] = {ACL_FLOAT, ACL_FLOAT16, ACL_BF16};

static op_case base_case(aclDataType dt, int64_t T, int64_t H, const inputs *in)
{
    op_case c;
    memset(&c, 0, sizeof c);
    c.dtype = dt;
    c.ndim = 2;
    c.dims[0] = T;
    c.dims[1] = H;
    c.gy = in->gy;
    c.x = in->x;
    c.yo = in->yo;
    c.w = in->w;
    c.clamp = -1.0;
    c.abi = 2;
    return c;
}

/* ------------------------------------------------------------------------------------------ */
/* tests                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* x0 = 0: device_exp(0) = 1 exactly, s = 0.5, silu = 0, dsilu = 0.5, so gx0 = (gy * w * x1) / 2
 * and gx1 = gy * w * 0 — all exact, checked against hand-written bits. */
static void test_hand_values_x0_zero(void)
{
    static const uint32_t gx0_bits[3][4] = {
        {0x40400000u, 0xC0C00000u, 0xC0700000u, 0x40000000u}, /* 3, -6, -3.75, 2 */
        {0x4200u, 0xC600u, 0xC380u, 0x4000u},
        {0x4040u, 0xC0C0u, 0xC070u, 0x4000u}};
    for (int d = 0; d < 3; d++) {
        aclDataType dt = all_dtypes[d];
        float gy[4] = {1.5f, -2.0f, 3.0f, 0.25f};
        float x[8] = {0, 0, 0, 0, 2.0f, 3.0f, -1.25f, 8.0f};
        float yo[4] = {1.0f, 0.5f, -2.0f, 4.0f};
        float w[1] = {2.0f};
        inputs in = {gy, x, yo, w};
        op_case c = base_case(dt, 1, 4, &in);
        op_out o;
        check_case(&c, "x0 = 0", &o);
        if (!o.gx) continue;
        for (int h = 0; h < 4; h++) {
            CHECK_EQ_INT(gx_bits(&c, &o, 0, h), gx0_bits[d][h]);
            /* gx1 = (gy * w) * (+0 * 0.5): +0 for positive gy, -0 for negative gy */
            CHECK_EQ_INT(gx_bits(&c, &o, 0, 4 + h), zero_bits(dt, gy[h] < 0));
        }
        /* gradWeight = 1.5*1 + -2*0.5 + 3*-2 + 0.25*4 = 1.5 - 1 - 6 + 1 = -4.5 */
        CHECK_EQ_INT(bits_f(o.gw[0]), bits_f(-4.5f));
        out_free(&o);
    }
}

/* Values worked out in double (Python, math.exp): the fp32 result is within a few ulp. */
static void test_double_values_fp32(void)
{
    float gy[3] = {1.0f, 0.5f, -1.25f};
    float x[6] = {1.0f, -2.0f, 3.5f, 2.0f, 3.0f, -0.75f};
    const double want_gx0[3] = {1.8553410237429737, -0.1361763731773432, 1.0033812682759857};
    const double want_gx1[3] = {0.7310585786300049, -0.11920292202211755, -4.246758990462816};
    inputs in = {gy, x, NULL, NULL};
    op_case c = base_case(ACL_FLOAT, 1, 3, &in);
    op_out o;
    check_case(&c, "double values", &o);
    if (!o.gx) return;
    for (int h = 0; h < 3; h++) {
        double a0 = gx_value(&c, &o, 0, h), a1 = gx_value(&c, &o, 0, 3 + h);
        CHECK(fabs(a0 - want_gx0[h]) <= 4 * FLT_EPSILON * fabs(want_gx0[h]));
        CHECK(fabs(a1 - want_gx1[h]) <= 4 * FLT_EPSILON * fabs(want_gx1[h]));
    }
    out_free(&o);
}

/* Many values of each dtype, with and without weight, clamp and groups: bit-exact against the
 * fp32 reference and close to the double math. */
static void test_reference_all_dtypes(void)
{
    static const int64_t groups[2] = {20, 10};
    static const double rtol[3] = {2e-5, 2e-3, 1.6e-2}, atol[3] = {2e-6, 1e-3, 8e-3};
    for (int d = 0; d < 3; d++) {
        aclDataType dt = all_dtypes[d];
        inputs in = make_inputs(dt, 37, 150, 11 + (uint64_t)d);
        for (int variant = 0; variant < 4; variant++) {
            op_case c = base_case(dt, 37, 150, &in);
            char what[96];
            if (variant == 0) { /* everything on */
                c.clamp = 4.0;
                c.group_mode = GROUPS_TENSOR;
                c.groups = groups;
                c.group_count = 2;
            } else if (variant == 1) { /* no weight, no clamp, no groups */
                c.w = NULL;
                c.yo = NULL;
            } else if (variant == 2) { /* weight, no clamp */
                c.group_mode = GROUPS_ARRAY;
                c.groups = groups;
                c.group_count = 2;
                c.abi = 1;
                c.clamp = 0.0;
            } else { /* clamp without weight, small c */
                c.w = NULL;
                c.yo = NULL;
                c.clamp = 0.75;
            }
            snprintf(what, sizeof what, "reference %s variant %d", dtype_name(dt), variant);
            op_out o;
            check_case(&c, what, &o);
            if (o.gx) check_close_to_double(&c, &o, what, rtol[d], atol[d]);
            out_free(&o);
        }
        free_inputs(&in);
    }
}

/* Strict masks on the original values, by multiplication: x0 == c, x1 == c, x1 == -c are
 * masked, and a masked negative is -0.0. */
static void test_clamp_masks(void)
{
    /* columns: x0, x1 */
    static const float x0s[8] = {2.0f, 2.0f, 0.5f, 0.5f, -1.0f, 3.0f, 3.0f, 1.5f};
    static const float x1s[8] = {1.0f, -1.0f, 2.0f, -2.0f, 2.0f, 5.0f, 0.5f, -3.0f};
    for (int d = 0; d < 3; d++) {
        aclDataType dt = all_dtypes[d];
        float gy[16], x[32];
        for (int t = 0; t < 2; t++) {
            for (int h = 0; h < 8; h++) {
                gy[t * 8 + h] = t == 0 ? 1.0f : -1.0f;
                x[t * 16 + h] = x0s[h];
                x[t * 16 + 8 + h] = x1s[h];
            }
        }
        inputs in = {gy, x, NULL, NULL};
        op_case c = base_case(dt, 2, 8, &in);
        c.clamp = 2.0;
        op_out o;
        check_case(&c, "clamp masks", &o);
        if (!o.gx) continue;
        for (int t = 0; t < 2; t++) {
            int neg = t == 1; /* gy = -1 flips every sign */
            /* x0 == c: gx0 masked; unmasked gx0 = (gy*x1)*dsilu(2) has the sign of gy*x1 */
            CHECK_EQ_INT(gx_bits(&c, &o, t, 0), zero_bits(dt, neg));
            CHECK_EQ_INT(gx_bits(&c, &o, t, 1), zero_bits(dt, !neg)); /* masked negative: -0.0 */
            CHECK(gx_value(&c, &o, t, 8 + 0) != 0.0f);                /* gx1 kept */
            /* x1 == c and x1 == -c: gx1 masked (silu(0.5) > 0), gx0 kept with b = +-c */
            CHECK_EQ_INT(gx_bits(&c, &o, t, 8 + 2), zero_bits(dt, neg));
            CHECK_EQ_INT(gx_bits(&c, &o, t, 8 + 3), zero_bits(dt, neg));
            CHECK(gx_value(&c, &o, t, 2) != 0.0f && gx_value(&c, &o, t, 2) == -gx_value(&c, &o, t, 3));
            /* x0 = -1, x1 = c: gx1 = gy * silu(-1) < 0 for gy = 1, masked to -0.0 */
            CHECK_EQ_INT(gx_bits(&c, &o, t, 8 + 4), zero_bits(dt, !neg));
            /* x0 = 3 > c, x1 = 5 > c: both masked */
            CHECK_EQ_INT(gx_bits(&c, &o, t, 5), zero_bits(dt, neg));
            CHECK_EQ_INT(gx_bits(&c, &o, t, 8 + 5), zero_bits(dt, neg));
            /* x0 = 3 > c, x1 = 0.5: gx1 = gy * silu(c) (the clamped x0), same as x0 == c's */
            CHECK_EQ_INT(gx_bits(&c, &o, t, 8 + 6), gx_bits(&c, &o, t, 8 + 0));
            /* x1 = -3 < -c: gx0 uses b = -c, same as column 3 (x0 differs: only sign checked) */
            CHECK(gx_value(&c, &o, t, 7) * (neg ? -1.0f : 1.0f) < 0.0f);
            CHECK_EQ_INT(gx_bits(&c, &o, t, 8 + 7), zero_bits(dt, neg));
        }
        out_free(&o);
    }
}

/* x0 >= 88.72284 without clamp: exp overflows, s = inf/inf = NaN, both gradients NaN. */
static void test_exp_overflow(void)
{
    for (int d = 0; d < 3; d++) {
        aclDataType dt = all_dtypes[d];
        float big[6], below;
        if (dt == ACL_FLOAT) {
            float f[6] = {88.72283935546875f, 88.73f, 89.0f, 100.0f, 1e30f, INFINITY};
            memcpy(big, f, sizeof f);
            below = nextafterf(88.72283935546875f, 0.0f);
        } else if (dt == ACL_FLOAT16) {
            float f[6] = {88.75f, 89.0f, 100.0f, 1000.0f, 65504.0f, INFINITY};
            memcpy(big, f, sizeof f);
            below = 88.6875f;
        } else {
            float f[6] = {89.0f, 90.0f, 100.0f, 1e30f, 3e38f, INFINITY};
            for (int i = 0; i < 6; i++) f[i] = quantize(dt, f[i]);
            memcpy(big, f, sizeof f);
            below = 88.5f;
        }
        float gy[7], x[14];
        for (int h = 0; h < 7; h++) {
            gy[h] = h == 3 ? 0.0f : 0.5f; /* even gy = 0 gives NaN */
            x[h] = h < 6 ? big[h] : below;
            x[7 + h] = 1.0f;
        }
        inputs in = {gy, x, NULL, NULL};
        op_case c = base_case(dt, 1, 7, &in);
        op_out o;
        check_case(&c, "exp overflow", &o);
        if (!o.gx) continue;
        for (int h = 0; h < 6; h++) {
            CHECK(is_doc_nan(dt, gx_bits(&c, &o, 0, h)));
            CHECK(is_doc_nan(dt, gx_bits(&c, &o, 0, 7 + h)));
        }
        /* just below the threshold: finite; gx1 = gy * x0 * s with s = 1 */
        CHECK(isfinite(gx_value(&c, &o, 0, 6)) && isfinite(gx_value(&c, &o, 0, 13)));
        CHECK(gx_value(&c, &o, 0, 13) > 40.0f);
        out_free(&o);

        /* with clamp: c = 100 keeps x0 = 89 (NaN, mask 1); c = 1 masks gx0 and makes gx1 finite */
        float gy2[1] = {0.5f}, x2[2] = {89.0f, 0.5f};
        inputs in2 = {gy2, x2, NULL, NULL};
        op_case c2 = base_case(dt, 1, 1, &in2);
        c2.clamp = 100.0;
        check_case(&c2, "exp overflow, clamp 100", &o);
        if (o.gx) {
            CHECK(is_doc_nan(dt, gx_bits(&c2, &o, 0, 0)) && is_doc_nan(dt, gx_bits(&c2, &o, 0, 1)));
        }
        out_free(&o);
        c2.clamp = 1.0;
        check_case(&c2, "exp overflow, clamp 1", &o);
        if (o.gx) {
            CHECK_EQ_INT(gx_bits(&c2, &o, 0, 0), 0);
            CHECK(isfinite(gx_value(&c2, &o, 0, 1)) && gx_value(&c2, &o, 0, 1) > 0.3f);
        }
        out_free(&o);
    }
}

/* x0 < -87.4: exp flushes to +0, so s = 0, silu = x0 * 0 = -0.0, dsilu = 0 * (x0 + 1) = -0.0;
 * gx0 = (gy*x1) * -0.0 and gx1 = gy * -0.0 take their signs from the products. */
static void test_exp_flush(void)
{
    for (int d = 0; d < 3; d++) {
        aclDataType dt = all_dtypes[d];
        static const float x0s[4] = {-88.0f, -100.0f, -104.0f, -200.0f};
        float gy[10], x[20];
        for (int h = 0; h < 8; h++) {
            gy[h] = (h & 1) ? -1.0f : 1.0f;
            x[h] = x0s[h / 2];
            x[10 + h] = (h & 2) ? -1.0f : 1.0f;
        }
        /* -87: exp(-87) = 1.6e-38 is still a normal float, not flushed */
        gy[8] = 1.0f;
        x[8] = -87.0f;
        x[18] = 1.0f;
        gy[9] = 1.0f;
        x[9] = quantize(dt, -87.5f);
        x[19] = 1.0f;
        inputs in = {gy, x, NULL, NULL};
        op_case c = base_case(dt, 1, 10, &in);
        op_out o;
        check_case(&c, "exp flush", &o);
        if (!o.gx) continue;
        for (int h = 0; h < 8; h++) {
            int gy_neg = h & 1, x1_neg = (h & 2) != 0;
            /* gx0 = (gy*x1) * -0.0: negative when gy*x1 > 0 */
            CHECK_EQ_INT(gx_bits(&c, &o, 0, h), zero_bits(dt, gy_neg == x1_neg));
            /* gx1 = gy * -0.0: negative when gy > 0 */
            CHECK_EQ_INT(gx_bits(&c, &o, 0, 10 + h), zero_bits(dt, !gy_neg));
        }
        CHECK_EQ_INT(gx_bits(&c, &o, 0, 19), zero_bits(dt, 1)); /* -87.5 flushed */
        if (dt == ACL_FLOAT) {
            /* not flushed: gx1 = -87 * 1.6e-38 ~ -1.4e-36 */
            CHECK(gx_value(&c, &o, 0, 18) < -1e-36f && gx_value(&c, &o, 0, 18) > -2e-36f);
        }
        out_free(&o);
    }
}

/* NaN inputs: x0 NaN poisons both gradients (even masked); x1 NaN poisons gx0 and, with clamp,
 * leaves gx1 masked to zero; gradY NaN poisons both and gradWeight; yOrigin NaN only gradWeight;
 * weight NaN the whole gradX row but not gradWeight. */
static void test_nan_inputs(void)
{
    for (int d = 0; d < 3; d++) {
        aclDataType dt = all_dtypes[d];
        const int64_t T = 4, H = 5;
        float gy[20], x[40], yo[20], w[4];
        for (int t = 0; t < T; t++) {
            w[t] = 0.75f;
            for (int h = 0; h < H; h++) {
                gy[t * H + h] = quantize(dt, 0.5f + 0.25f * (float)h);
                x[t * 2 * H + h] = quantize(dt, -1.0f + 0.5f * (float)h);
                x[t * 2 * H + H + h] = 1.0f;
                yo[t * H + h] = 0.5f;
            }
        }
        x[0] = NAN;          /* row 0: x0 NaN */
        x[H + 1] = NAN;      /* row 0: x1 NaN, x0 = -0.5 < c */
        x[3] = 3.0f;         /* row 0, col 3: x0 = 3 >= c (masked) ... */
        x[H + 3] = NAN;      /* ... with x1 NaN */
        x[4] = NAN;          /* row 0, col 4: x0 NaN with x1 out of range */
        x[H + 4] = 4.0f;
        gy[1 * H + 2] = NAN; /* row 1: gradY NaN */
        yo[2 * H + 3] = NAN; /* row 2: yOrigin NaN */
        w[3] = NAN;          /* row 3: weight NaN */
        for (int clamp = 0; clamp < 2; clamp++) {
            inputs in = {gy, x, yo, w};
            op_case c = base_case(dt, T, H, &in);
            c.clamp = clamp ? 2.0 : -1.0;
            op_out o;
            check_case(&c, clamp ? "NaN inputs, clamp" : "NaN inputs", &o);
            if (!o.gx) continue;
            CHECK(is_doc_nan(dt, gx_bits(&c, &o, 0, 0)) && is_doc_nan(dt, gx_bits(&c, &o, 0, H + 0)));
            CHECK(is_doc_nan(dt, gx_bits(&c, &o, 0, 1)));
            CHECK(is_doc_nan(dt, gx_bits(&c, &o, 0, 4)) && is_doc_nan(dt, gx_bits(&c, &o, 0, H + 4)));
            if (clamp) {
                /* x1 NaN fails -c < x1 < c: gx1 = gy*silu(-0.5) (negative) * 0 = -0.0 */
                CHECK_EQ_INT(gx_bits(&c, &o, 0, H + 1), zero_bits(dt, 1));
                /* x0 = 3 masked but (gy*NaN)*dsilu is NaN: NaN * 0 stays NaN */
                CHECK(is_doc_nan(dt, gx_bits(&c, &o, 0, 3)));
                CHECK_EQ_INT(gx_bits(&c, &o, 0, H + 3), 0); /* gy*silu(2) > 0, masked */
            } else {
                float g1 = gx_value(&c, &o, 0, H + 1);
                CHECK(isfinite(g1) && g1 < 0.0f);
                CHECK(is_doc_nan(dt, gx_bits(&c, &o, 0, 3)));
            }
            CHECK(isfinite(o.gw[0]));
            CHECK(is_doc_nan(dt, gx_bits(&c, &o, 1, 2)) && is_doc_nan(dt, gx_bits(&c, &o, 1, H + 2)));
            CHECK(isnan(o.gw[1]));
            CHECK(isnan(o.gw[2]));
            int finite2 = 1, nan3 = 1;
            for (int h = 0; h < 2 * H; h++) {
                finite2 &= isfinite(gx_value(&c, &o, 2, h)) != 0;
                nan3 &= is_doc_nan(dt, gx_bits(&c, &o, 3, h));
            }
            CHECK(finite2);
            CHECK(nan3);
            CHECK(isfinite(o.gw[3]));
            out_free(&o);
        }
    }
}

/* Infinite inputs follow the same formulas: x1 = inf without clamp gives gx0 = +-inf, with
 * clamp b = c and gx1 masked; x0 = -inf gives silu = -inf * 0 = NaN. */
static void test_inf_inputs(void)
{
    for (int d = 0; d < 3; d++) {
        aclDataType dt = all_dtypes[d];
        float gy[3] = {1.0f, 1.0f, 1.0f};
        float x[6] = {0.5f, -INFINITY, 1.0f, INFINITY, 1.0f, -INFINITY};
        for (int clamp = 0; clamp < 2; clamp++) {
            inputs in = {gy, x, NULL, NULL};
            op_case c = base_case(dt, 1, 3, &in);
            c.clamp = clamp ? 2.0 : -1.0;
            op_out o;
            check_case(&c, "inf inputs", &o);
            if (!o.gx) continue;
            if (clamp) {
                CHECK(isfinite(gx_value(&c, &o, 0, 0)) && gx_value(&c, &o, 0, 0) > 0.0f);
                CHECK_EQ_INT(gx_bits(&c, &o, 0, 3), 0); /* x1 = inf masked */
                /* x0 = -inf clamps to nothing (min(-inf, c) = -inf): still NaN */
                CHECK(is_doc_nan(dt, gx_bits(&c, &o, 0, 1)) && is_doc_nan(dt, gx_bits(&c, &o, 0, 4)));
            } else {
                CHECK_EQ_INT(gx_bits(&c, &o, 0, 0), pos_inf_bits(dt));
                CHECK(is_doc_nan(dt, gx_bits(&c, &o, 0, 1)) && is_doc_nan(dt, gx_bits(&c, &o, 0, 4)));
            }
            out_free(&o);
        }
    }
}

/* Rows at and past trunc are +0.0 (bit pattern 0) in gradX and gradWeight; rows before are
 * computed (and non-zero with these inputs). */
static void check_truncated(const op_case *c, const op_out *o, int64_t trunc, const char *what)
{
    int64_t T = case_rows(c), H = case_hidden(c), bad = 0;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = 0; h < 2 * H; h++) {
            uint32_t b = gx_bits(c, o, t, h);
            if ((t >= trunc) != (b == 0)) bad++;
        }
        if (c->w && (t >= trunc) != (bits_f(o->gw[t]) == 0)) bad++;
    }
    if (bad) fprintf(stderr, "%s: %lld elements break the trunc = %lld pattern\n", what, (long long)bad, (long long)trunc);
    CHECK_EQ_INT(bad, 0);
}

typedef struct {
    int64_t values[4];
    int64_t count;
    int64_t trunc; /* by hand */
} group_case;

static void test_trunc(void)
{
    static const group_case cases[] = {
        {{1, 2}, 2, 3},                                  /* sum < T */
        {{4, 5}, 2, 6},                                  /* sum > T */
        {{6}, 1, 6},                                     /* sum == T */
        {{-1, 3}, 2, 2},                                 /* 0xFFFFFFFF + 3 wraps to 2 */
        {{-5}, 1, 6},                                    /* 0xFFFFFFFB: huge, min with T */
        {{((int64_t)1 << 32) + 2}, 1, 2},                /* the element itself wraps */
        {{0xFFFFFFFFLL, 0xFFFFFFFFLL, 3}, 3, 1},         /* the sum passes 2^32 twice */
        {{(int64_t)1 << 31, (int64_t)1 << 31, 4}, 3, 4}, /* 2^32 + 4 wraps */
        {{-((int64_t)1 << 32) + 5}, 1, 5},
        {{0, 0, 0}, 3, 0},
        {{0}, 0, 0}, /* G = 0 */
    };
    for (int d = 0; d < 3; d++) {
        aclDataType dt = all_dtypes[d];
        inputs in = make_inputs(dt, 6, 3, 21);
        for (int i = 0; i < 6 * 6; i++) {
            if (in.x[i] == 0.0f) in.x[i] = 1.0f;
        }
        for (int i = 0; i < 6 * 3; i++) {
            if (in.gy[i] == 0.0f) in.gy[i] = 1.0f;
            if (in.yo[i] == 0.0f) in.yo[i] = 1.0f;
        }
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            for (int abi = 1; abi <= 2; abi++) {
                op_case c = base_case(dt, 6, 3, &in);
                c.abi = abi;
                c.clamp = abi == 1 ? 0.0 : -1.0;
                c.group_mode = abi == 1 ? GROUPS_ARRAY : GROUPS_TENSOR;
                c.groups = cases[k].values;
                c.group_count = cases[k].count;
                CHECK_EQ_INT(expected_trunc(&c), cases[k].trunc);
                char what[96];
                snprintf(what, sizeof what, "trunc case %zu, %s, revision %d", k, dtype_name(dt), abi);
                op_out o;
                check_case(&c, what, &o);
                if (o.gx) check_truncated(&c, &o, cases[k].trunc, what);
                out_free(&o);
            }
        }
        free_inputs(&in);
    }
}

/* Revision 2 reads groupIndex when the kernel runs (a value written after phase 2 counts),
 * and through the tensor's strides. */
static void test_trunc_device_tensor(void)
{
    inputs in = make_inputs(ACL_FLOAT, 6, 3, 23);
    static const int64_t first[1] = {6}, later[1] = {2};
    op_case c = base_case(ACL_FLOAT, 6, 3, &in);
    c.group_mode = GROUPS_TENSOR;
    c.groups = first;
    c.groups_later = later;
    c.group_count = 1;
    op_out o;
    check_case(&c, "groupIndex written after launch", &o);
    if (o.gx) check_truncated(&c, &o, 2, "groupIndex written after launch");
    out_free(&o);

    static const int64_t strided[3] = {1, 1, 2};
    c.groups_later = NULL;
    c.groups = strided;
    c.group_count = 3;
    c.group_stride = 3; /* junk between the elements */
    check_case(&c, "strided groupIndex", &o);
    if (o.gx) check_truncated(&c, &o, 4, "strided groupIndex");
    out_free(&o);
    free_inputs(&in);
}

/* [B, S, H] with weight [B, S, 1] (both revisions; revision 2 also [T] and [S, B]) gives the
 * same bits as the [T, H] call. */
static void test_3d_shapes(void)
{
    for (int d = 0; d < 3; d++) {
        aclDataType dt = all_dtypes[d];
        inputs in = make_inputs(dt, 6, 70, 31);
        op_case flat = base_case(dt, 6, 70, &in);
        flat.clamp = 3.0;
        op_out ref;
        check_case(&flat, "3-D: the 2-D call", &ref);
        for (int variant = 0; variant < 4; variant++) {
            op_case c = flat;
            c.ndim = 3;
            c.dims[0] = 2;
            c.dims[1] = 3;
            c.dims[2] = 70;
            if (variant == 1) {
                c.abi = 1;
                c.clamp = 3.0;
            } else if (variant == 2) {
                c.w_ndim = 1;
                c.w_dims[0] = 6;
            } else if (variant == 3) {
                c.w_ndim = 2;
                c.w_dims[0] = 3;
                c.w_dims[1] = 2;
            }
            op_out o;
            check_case(&c, "3-D", &o);
            if (o.gx && ref.gx) {
                CHECK(memcmp(o.gx, ref.gx, 6 * 140 * dtype_size(dt)) == 0);
                CHECK(memcmp(o.gw, ref.gw, 6 * sizeof(float)) == 0);
            }
            out_free(&o);
        }
        out_free(&ref);
        free_inputs(&in);
    }
}

/* Rank 1: gradY [H], x [2H], weight [1]: one row, T = 1. */
static void test_rank1(void)
{
    for (int d = 0; d < 3; d++) {
        aclDataType dt = all_dtypes[d];
        inputs in = make_inputs(dt, 1, 9, 41);
        op_case two = base_case(dt, 1, 9, &in);
        two.clamp = 2.5;
        op_out ref;
        check_case(&two, "rank 1: the [1, H] call", &ref);
        op_case c = two;
        c.ndim = 1;
        c.dims[0] = 9;
        op_out o;
        check_case(&c, "rank 1", &o);
        if (o.gx && ref.gx) {
            CHECK(memcmp(o.gx, ref.gx, 18 * dtype_size(dt)) == 0);
            CHECK_EQ_INT(bits_f(o.gw[0]), bits_f(ref.gw[0]));
        }
        out_free(&o);
        static const int64_t zero[1] = {0}, five[1] = {5};
        c.group_mode = GROUPS_TENSOR;
        c.group_count = 1;
        c.groups = zero;
        check_case(&c, "rank 1, trunc 0", &o);
        if (o.gx) check_truncated(&c, &o, 0, "rank 1, trunc 0");
        out_free(&o);
        c.groups = five; /* min(5, T = 1) */
        check_case(&c, "rank 1, trunc 1", &o);
        if (o.gx && ref.gx) CHECK(memcmp(o.gx, ref.gx, 18 * dtype_size(dt)) == 0);
        out_free(&o);
        out_free(&ref);
        free_inputs(&in);
    }
}

/* Non-contiguous views give the same values as the contiguous call, and write nothing outside
 * their view. */
static void run_strided(const op_case *contiguous, const op_out *ref, const layout *lay[T_COUNT], const char *what)
{
    op_case c = *contiguous;
    for (int k = 0; k < T_COUNT; k++) c.lay[k] = lay[k];
    op_out o;
    check_case(&c, what, &o);
    int64_t T = case_rows(&c), H = case_hidden(&c);
    if (o.gx && ref->gx) {
        CHECK(memcmp(o.gx, ref->gx, (size_t)(T * 2 * H) * dtype_size(c.dtype)) == 0);
        CHECK(memcmp(o.gw, ref->gw, (size_t)T * sizeof(float)) == 0);
    }
    out_free(&o);
}

static void test_noncontiguous(void)
{
    static const int64_t groups[1] = {5};
    for (int d = 0; d < 3; d++) {
        aclDataType dt = all_dtypes[d];
        const int64_t T = 6, H = 70;
        inputs in = make_inputs(dt, T, H, 51);
        op_case base = base_case(dt, T, H, &in);
        base.clamp = 3.0;
        base.group_mode = GROUPS_TENSOR;
        base.groups = groups;
        base.group_count = 1;
        op_out ref;
        check_case(&base, "non-contiguous: the contiguous call", &ref);

        /* every other row of a larger allocation (outputs in the odd rows, with an offset) */
        {
            const int64_t s_gy[2] = {2 * H, 1}, s_x[2] = {4 * H, 1}, s_w[2] = {2, 1};
            layout gy = {s_gy, 0, 0}, x = {s_x, 0, 0}, yo = {s_gy, H, 0}, w = {s_w, 0, 0};
            layout gx = {s_x, 2 * H, 0}, gw = {s_w, 1, 0};
            const layout *lay[T_COUNT] = {&gy, &x, &yo, &w, &gx, &gw};
            run_strided(&base, &ref, lay, "every other row");
        }
        /* a last-dim stride of 2 (outputs interleaved, offset 1) */
        {
            const int64_t s_gy[2] = {2 * H, 2}, s_x[2] = {4 * H, 2}, s_w[2] = {3, 1};
            layout gy = {s_gy, 1, 0}, x = {s_x, 0, 0}, yo = {s_gy, 0, 0}, w = {s_w, 2, 0};
            layout gx = {s_x, 1, 0}, gw = {s_w, 0, 0};
            const layout *lay[T_COUNT] = {&gy, &x, &yo, &w, &gx, &gw};
            run_strided(&base, &ref, lay, "last-dim stride 2");
        }
        /* [B, S, H] = [2, 3, H] read from [S, B, H] storage: the leading dims transposed */
        {
            op_case c3 = base;
            c3.ndim = 3;
            c3.dims[0] = 2;
            c3.dims[1] = 3;
            c3.dims[2] = H;
            const int64_t s_gy[3] = {H, 2 * H, 1}, s_x[3] = {2 * H, 4 * H, 1}, s_w[3] = {1, 2, 1};
            layout gy = {s_gy, 0, 0}, x = {s_x, 0, 0}, w = {s_w, 0, 0};
            const layout *lay[T_COUNT] = {&gy, &x, &gy, &w, &x, &w};
            run_strided(&c3, &ref, lay, "transposed leading dims");
        }
        out_free(&ref);
        free_inputs(&in);
    }
}

/* Empty tensors: T = 0 does nothing (workspace 0, NULL accepted); H = 0 with T > 0 writes
 * gradWeight = +0.0 for every row. */
static void test_empty(void)
{
    static const int64_t groups[1] = {3};
    for (int d = 0; d < 3; d++) {
        aclDataType dt = all_dtypes[d];
        float one[1] = {1.0f};
        float w[3] = {0.5f, 0.5f, 0.5f};
        inputs in = {one, one, one, w};

        op_case c = base_case(dt, 0, 4, &in);
        c.clamp = 1.0;
        c.group_mode = GROUPS_TENSOR;
        c.groups = groups;
        c.group_count = 1;
        op_out o;
        CHECK_EQ_INT(run_op(&c, &o, "T = 0"), 0);
        CHECK_EQ_INT(o.workspace, 0);
        out_free(&o);
        c.ndim = 3;
        c.dims[0] = 2;
        c.dims[1] = 0;
        c.dims[2] = 4;
        CHECK_EQ_INT(run_op(&c, &o, "B, 0, H"), 0);
        CHECK_EQ_INT(o.workspace, 0);
        out_free(&o);
        c.null_empty = 1; /* every tensor empty, every address NULL, workspace NULL */
        CHECK_EQ_INT(run_op(&c, &o, "B, 0, H, NULL data"), 0);
        CHECK_EQ_INT(o.workspace, 0);
        out_free(&o);

        for (int variant = 0; variant < 4; variant++) {
            op_case h0 = base_case(dt, 3, 0, &in);
            if (variant == 1) {
                h0.group_mode = GROUPS_TENSOR;
                h0.groups = groups;
                h0.group_count = 1;
                h0.clamp = 1.0;
            } else if (variant == 2) {
                h0.ndim = 1;
                h0.dims[0] = 0; /* T = 1 */
            } else if (variant == 3) {
                h0.null_empty = 1; /* gradY, x, yOrigin, gradX empty with NULL data */
            }
            check_case(&h0, "H = 0", &o);
            if (o.gx) {
                int64_t T = case_rows(&h0);
                for (int64_t t = 0; t < T; t++) CHECK_EQ_INT(bits_f(o.gw[t]), 0);
            }
            out_free(&o);
        }
    }
}

/* gradWeight's order through the whole operator (docs/operator.md's ReduceSum, rows of one tile).
 * Products chosen so that the order and a left-to-right sum differ. */
static void test_gradweight_order(void)
{
    const float u = 0x1p-24f; /* 1 + u rounds (half to even) back to 1 */
    /* H = 4: (1 + u) + (u + u) = 1 + 2u; left to right: 1 */
    {
        float gy[4] = {1.0f, u, u, u}, yo[4] = {1, 1, 1, 1}, x[8] = {0}, w[1] = {1.0f};
        inputs in = {gy, x, yo, w};
        for (int d = 0; d < 3; d++) { /* 2^-24 is exact in every dtype (an fp16 subnormal) */
            op_case c = base_case(all_dtypes[d], 1, 4, &in);
            op_out o;
            check_case(&c, "gradWeight tree, H = 4", &o);
            if (o.gx) CHECK_EQ_INT(bits_f(o.gw[0]), 0x3F800001u);
            out_free(&o);
        }
    }
    /* H = 256: lane 0 is (1 + u) + (u + u) = 1 + 2u, the other lanes 0; left to right gives 1 */
    {
        float gy[256] = {0}, yo[256], x[512] = {0}, w[1] = {1.0f};
        for (int h = 0; h < 256; h++) yo[h] = 1.0f;
        gy[0] = 1.0f;
        gy[64] = gy[128] = gy[192] = u;
        inputs in = {gy, x, yo, w};
        op_case c = base_case(ACL_FLOAT, 1, 256, &in);
        op_out o;
        check_case(&c, "gradWeight lanes of 256", &o);
        if (o.gx) CHECK_EQ_INT(bits_f(o.gw[0]), 0x3F800001u);
        CHECK_EQ_INT(bits_f(left_to_right(gy, 256)), 0x3F800000u);
        out_free(&o);
    }
    /* wide dynamic range, H = 1000 (15 full chunks and one of 40), every dtype */
    for (int d = 0; d < 3; d++) {
        aclDataType dt = all_dtypes[d];
        const int64_t T = 4, H = 1000;
        inputs in = make_inputs(dt, T, H, 61);
        for (int64_t i = 0; i < T * H; i++) {
            in.gy[i] = quantize(dt, (float)ldexp(rng_uniform(-1.0, 1.0), (int)rng_uniform(-12.0, 12.0)));
        }
        op_case c = base_case(dt, T, H, &in);
        op_out o;
        check_case(&c, "gradWeight tree, H = 1000", &o);
        int differs = 0;
        float *p = malloc((size_t)H * sizeof *p);
        for (int64_t t = 0; t < T; t++) {
            for (int64_t h = 0; h < H; h++) p[h] = in.gy[t * H + h] * in.yo[t * H + h];
            if (bits_f(left_to_right(p, (size_t)H)) != bits_f(spec_grad_weight(p, H, H))) differs++;
        }
        CHECK(differs > 0); /* the data tells the orders apart */
        free(p);
        out_free(&o);
        free_inputs(&in);
    }
}

/* fp16/bf16 outputs round half to even. x0 = 0 makes gx0 = (gy * x1) / 2 exactly, so the fp32
 * result can be put on a tie by hand. */
typedef struct {
    float gy, x1;
    uint16_t bits; /* expected output, by hand */
} tie_case;

static void run_ties(aclDataType dt, const tie_case *cases, int n, const char *what)
{
    float gy[16], x[32];
    for (int i = 0; i < n; i++) {
        gy[i] = cases[i].gy;
        x[i] = 0.0f;
        x[n + i] = cases[i].x1;
    }
    inputs in = {gy, x, NULL, NULL};
    op_case c = base_case(dt, 1, n, &in);
    op_out o;
    check_case(&c, what, &o);
    if (o.gx) {
        for (int i = 0; i < n; i++) {
            uint32_t got = gx_bits(&c, &o, 0, i);
            if (got != cases[i].bits) {
                fprintf(stderr, "%s: case %d: gy %a * x1 %a / 2 = %a stored as 0x%04x, expected 0x%04x\n",
                        what, i, (double)cases[i].gy, (double)cases[i].x1,
                        (double)(cases[i].gy * cases[i].x1 * 0.5f), got, cases[i].bits);
            }
            CHECK_EQ_INT(got, cases[i].bits);
        }
    }
    out_free(&o);
}

static void test_round_half_even(void)
{
    static const tie_case fp16[] = {
        {3.0f, 1.0f + 0x1p-10f, 0x3E02},        /* 1.5 + 1.5*2^-10: tie, odd below -> up */
        {3.0f, 1.0f + 3 * 0x1p-10f, 0x3E04},    /* 1.5 + 4.5*2^-10: tie, even below -> down */
        {-3.0f, 1.0f + 0x1p-10f, 0xBE02},
        {-3.0f, 1.0f + 3 * 0x1p-10f, 0xBE04},
        {45.0f, 91 * 0x1p-10f, 0x4000},         /* 2 - 2^-11: tie into the next binade */
        {0x1p-14f, 0x1p-10f, 0x0000},           /* 2^-25: subnormal tie 0 | 1 -> 0 */
        {0x1p-14f, 3 * 0x1p-10f, 0x0002},       /* 1.5 * 2^-24 -> 2 * 2^-24 */
        {0x1p-14f, 5 * 0x1p-10f, 0x0002},       /* 2.5 * 2^-24 -> 2 * 2^-24 */
        {0x1p-14f, 0x1p-9f, 0x0001},            /* exactly 2^-24 */
        {3.0f, 1.0f + 0x1p-9f, 0x3E03},         /* 1.5 + 3*2^-10: exact */
        {1365.0f, 96.0f, 0x7C00},               /* 65520: overflow to inf */
        {-1365.0f, 96.0f, 0xFC00},
        {2047.0f, 64.0f, 0x7BFF},               /* 65504: the largest fp16 */
        {1365.0f, 95.9375f, 0x7BFE},            /* 65477.34 -> 65472 */
        {431.0f, 304.0f, 0x7BFF},               /* 65512: below 65520, rounds to 65504 */
    };
    static const tie_case bf16[] = {
        {3.0f, 1.0f + 0x1p-7f, 0x3FC2},         /* tie, odd below -> up */
        {3.0f, 1.0f + 3 * 0x1p-7f, 0x3FC4},     /* tie, even below -> down */
        {-3.0f, 1.0f + 0x1p-7f, 0xBFC2},
        {7.0f, 73 * 0x1p-7f, 0x4000},           /* 2 - 2^-8: tie into the next binade */
        {0x1p-60f, 0x1p-73f, 0x0000},           /* 2^-134: subnormal tie 0 | 1 -> 0 */
        {3 * 0x1p-60f, 0x1p-73f, 0x0002},       /* 1.5 * 2^-133 -> 2 * 2^-133 */
        {127 * 0x1p100f, 0x1p20f, 0x7E7E},      /* 127 * 2^119: exact */
        {0x1p127f, 4.0f, 0x7F80},               /* fp32 overflow: inf stays inf */
        {-0x1p127f, 4.0f, 0xFF80},
    };
    run_ties(ACL_FLOAT16, fp16, (int)(sizeof fp16 / sizeof fp16[0]), "fp16 round half to even");
    run_ties(ACL_BF16, bf16, (int)(sizeof bf16 / sizeof bf16[0]), "bf16 round half to even");
    /* the same products in FLOAT are exact */
    float gy[2] = {3.0f, 1365.0f}, x[4] = {0, 0, 1.0f + 0x1p-10f, 96.0f};
    inputs in = {gy, x, NULL, NULL};
    op_case c = base_case(ACL_FLOAT, 1, 2, &in);
    op_out o;
    check_case(&c, "fp32 of the tie products", &o);
    if (o.gx) {
        CHECK_EQ_INT(gx_bits(&c, &o, 0, 0), bits_f(1.5f + 1.5f * 0x1p-10f));
        CHECK_EQ_INT(gx_bits(&c, &o, 0, 1), bits_f(65520.0f));
    }
    out_free(&o);
}

/* Clamp by ABI revision: revision 1 takes 0 for off and an aclIntArray; revision 2 -1.0 for off
 * and an INT64 device tensor. Both give the same bits for the same meaning. */
static void test_clamp_revisions(void)
{
    static const int64_t groups[2] = {3, 1};
    for (int d = 0; d < 3; d++) {
        aclDataType dt = all_dtypes[d];
        inputs in = make_inputs(dt, 5, 40, 71);
        op_out r1_off, r2_off, r1_on, r2_on;
        op_case c = base_case(dt, 5, 40, &in);
        c.abi = 1;
        c.clamp = 0.0;
        c.group_mode = GROUPS_ARRAY;
        c.groups = groups;
        c.group_count = 2;
        check_case(&c, "revision 1, clamp 0 (off)", &r1_off);
        c.clamp = 1.0;
        check_case(&c, "revision 1, clamp 1", &r1_on);
        c.abi = 2;
        c.group_mode = GROUPS_TENSOR;
        c.clamp = -1.0;
        check_case(&c, "revision 2, clamp -1 (off)", &r2_off);
        c.clamp = 1.0;
        check_case(&c, "revision 2, clamp 1", &r2_on);
        size_t bytes = 5 * 80 * dtype_size(dt);
        if (r1_off.gx && r2_off.gx && r1_on.gx && r2_on.gx) {
            CHECK(memcmp(r1_off.gx, r2_off.gx, bytes) == 0);
            CHECK(memcmp(r1_on.gx, r2_on.gx, bytes) == 0);
            CHECK(memcmp(r1_on.gx, r1_off.gx, bytes) != 0); /* the clamp did something */
            CHECK(memcmp(r1_off.gw, r2_off.gw, 5 * sizeof(float)) == 0);
            CHECK(memcmp(r1_on.gw, r1_off.gw, 5 * sizeof(float)) == 0); /* no mask on gradWeight */
        }
        out_free(&r1_off);
        out_free(&r2_off);
        out_free(&r1_on);
        out_free(&r2_on);

        /* the other revision's "off" is out of range */
        op_out o;
        c.clamp = 0.0;
        CHECK_EQ_INT(run_op(&c, &o, "revision 2, clamp 0"), ACLNN_ERR_INNER_TILING_ERROR);
        out_free(&o);
        c.abi = 1;
        c.group_mode = GROUPS_ARRAY;
        c.clamp = -1.0;
        CHECK_EQ_INT(run_op(&c, &o, "revision 1, clamp -1"), ACLNN_ERR_INNER_TILING_ERROR);
        out_free(&o);
        free_inputs(&in);
    }
}

/* c is (float)clampLimit and the comparisons are fp32: with clampLimit = 0.100000002 (double),
 * c = 0.1f, so x0 = x1 = 0.1f equal c and are masked (a double comparison would keep them). */
static void test_clamp_is_float(void)
{
    float gy[1] = {1.0f}, x[2] = {0.1f, 0.1f};
    inputs in = {gy, x, NULL, NULL};
    op_case c = base_case(ACL_FLOAT, 1, 1, &in);
    c.clamp = 0.100000002;
    CHECK((float)c.clamp == 0.1f && (double)0.1f < c.clamp);
    op_out o;
    check_case(&c, "clamp as fp32", &o);
    if (o.gx) {
        CHECK_EQ_INT(gx_bits(&c, &o, 0, 0), 0);
        CHECK_EQ_INT(gx_bits(&c, &o, 0, 1), 0);
    }
    out_free(&o);
}

int main(void)
{
    CHECK_EQ_INT(aclInit(NULL), 0);
    CHECK_EQ_INT(aclrtSetDevice(0), 0);
    CHECK_EQ_INT(aclrtCreateStream(&g_stream), 0);

    test_hand_values_x0_zero();
    test_double_values_fp32();
    test_reference_all_dtypes();
    test_clamp_masks();
    test_exp_overflow();
    test_exp_flush();
    test_nan_inputs();
    test_inf_inputs();
    test_trunc();
    test_trunc_device_tensor();
    test_3d_shapes();
    test_rank1();
    test_noncontiguous();
    test_empty();
    test_gradweight_order();
    test_round_half_even();
    test_clamp_revisions();
    test_clamp_is_float();

    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_TENSOR), 0);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_INT_ARRAY), 0);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_EXECUTOR), 0);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_ALLOCATION), 0);
    CHECK_EQ_INT(aclrtDestroyStream(g_stream), 0);
    CHECK_EQ_INT(aclEmuLiveCount(ACL_EMU_KIND_STREAM), 0);
    CHECK_EQ_INT(aclrtResetDevice(0), 0);
    CHECK_EQ_INT(aclFinalize(), 0);
    return emu_test_finish("test_kernel");
}
