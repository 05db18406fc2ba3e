/* A forward-kernel problem for the C tests that drive swiglu_quant_run directly: host buffers for
 * x, weight, group counts and the outputs (filled with a sentinel), and a way to set chosen y
 * values exactly. With x0 = 128, exp(-128) flushes to 0, so the swish is 128 / 1 = 128 and
 * y = 128 * x1 without rounding: x1 = value / 128 makes y = value for any value that x's dtype
 * holds after the division. */
#ifndef ACL_SWIGLU_TESTS_FORWARD_CASE_H
#define ACL_SWIGLU_TESTS_FORWARD_CASE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "emu_test.h"
#include "opapi/swiglu_quant_kernel.h"

#define FORWARD_SENTINEL 0xA5

typedef struct {
    aclDataType x_dtype, dst;
    int mode, round_scale;
    int64_t rows, hidden;
    uint16_t *x;              /* [rows, 2 hidden] */
    float *weight;            /* NULL: none */
    int64_t groups[8];
    int64_t group_count;      /* -1: no groups */
    int clamp_on;
    float clamp;
    uint8_t *y;               /* [rows, hidden] codes, or [rows, hidden / 2] FP4 bytes */
    uint8_t *scales;          /* [rows, hidden / 128] fp32, or [rows, hidden / 32] E8M0 bytes */
    size_t y_bytes, scale_bytes;
} forward_case;

static inline int forward_is_fp4(aclDataType dst) { return dst == ACL_FLOAT4_E2M1 || dst == ACL_FLOAT4_E1M2; }

static inline uint16_t forward_bits16(aclDataType dtype, float value)
{
    if (dtype == ACL_BF16) return (uint16_t)(bits_f(value) >> 16);
    _Float16 h = (_Float16)value;
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

static inline float forward_float16(aclDataType dtype, uint16_t bits)
{
    if (dtype == ACL_BF16) return f_bits((uint32_t)bits << 16);
    _Float16 h;
    memcpy(&h, &bits, sizeof h);
    return (float)h;
}

/* x0 = 128 and x1 = +0 everywhere (y = +0), outputs all sentinel bytes. */
static inline void forward_case_init(forward_case *c, aclDataType x_dtype, aclDataType dst, int mode, int round_scale,
                                     int64_t rows, int64_t hidden)
{
    memset(c, 0, sizeof *c);
    c->x_dtype = x_dtype;
    c->dst = dst;
    c->mode = mode;
    c->round_scale = round_scale;
    c->rows = rows;
    c->hidden = hidden;
    c->group_count = -1;
    c->x = calloc((size_t)(rows * 2 * hidden), sizeof *c->x);
    c->y_bytes = (size_t)(rows * hidden) / (forward_is_fp4(dst) ? 2 : 1);
    c->scale_bytes = mode == 0 ? (size_t)(rows * hidden / 128) * 4 : (size_t)(rows * hidden / 32);
    c->y = malloc(c->y_bytes);
    c->scales = malloc(c->scale_bytes);
    CHECK(c->x != NULL && c->y != NULL && c->scales != NULL);
    memset(c->y, FORWARD_SENTINEL, c->y_bytes);
    memset(c->scales, FORWARD_SENTINEL, c->scale_bytes);
    for (int64_t t = 0; t < rows; t++) {
        for (int64_t h = 0; h < hidden; h++) c->x[t * 2 * hidden + h] = forward_bits16(x_dtype, 128.0f);
    }
}

/* Makes y[t, h] = value exactly (checked). */
static inline void forward_set_y(forward_case *c, int64_t t, int64_t h, float value)
{
    uint16_t bits = forward_bits16(c->x_dtype, value / 128.0f);
    float back = forward_float16(c->x_dtype, bits);
    CHECK(back * 128.0f == value || (value != value && back != back));
    c->x[t * 2 * c->hidden + c->hidden + h] = bits;
}

static inline void forward_set_x(forward_case *c, int64_t t, int64_t h, uint16_t x0, uint16_t x1)
{
    c->x[t * 2 * c->hidden + h] = x0;
    c->x[t * 2 * c->hidden + c->hidden + h] = x1;
}

static inline void forward_view(swiglu_quant_view *v, void *base, int64_t ndim, const int64_t *dims)
{
    memset(v, 0, sizeof *v);
    v->base = base;
    v->ndim = ndim;
    int64_t stride = 1;
    for (int64_t d = ndim - 1; d >= 0; d--) {
        v->dims[d] = dims[d];
        v->strides[d] = stride;
        stride *= dims[d];
    }
}

static inline void forward_args(const forward_case *c, swiglu_quant_args *a)
{
    memset(a, 0, sizeof *a);
    a->x_dtype = c->x_dtype;
    a->dst = c->dst;
    a->mode = c->mode == 0 ? SWIGLU_QUANT_MODE_BLOCK : SWIGLU_QUANT_MODE_MX;
    a->round_scale = c->round_scale;
    a->rows = c->rows;
    a->hidden = c->hidden;
    forward_view(&a->x, c->x, 2, (int64_t[]){c->rows, 2 * c->hidden});
    if (c->weight != NULL) {
        a->has_weight = 1;
        forward_view(&a->weight, c->weight, 1, (int64_t[]){c->rows});
    }
    if (c->group_count >= 0) {
        a->has_groups = 1;
        forward_view(&a->group_index, (void *)c->groups, 1, (int64_t[]){c->group_count});
    }
    a->clamp_on = c->clamp_on;
    a->clamp = c->clamp;
    forward_view(&a->y, c->y, 2, (int64_t[]){c->rows, c->hidden});
    if (c->mode == 0) {
        forward_view(&a->y_scale, c->scales, 2, (int64_t[]){c->rows, c->hidden / 128});
    } else {
        forward_view(&a->y_scale, c->scales, 3, (int64_t[]){c->rows, c->hidden / 64, 2});
    }
}

static inline int forward_case_run(forward_case *c, swiglu_kernel_variant variant)
{
    swiglu_quant_args a;
    forward_args(c, &a);
    return swiglu_quant_run(&a, 1, variant);
}

/* Row t's scale k: fp32 bits (mode 0) or the E8M0 byte (mode 1). */
static inline uint32_t forward_scale(const forward_case *c, int64_t t, int64_t k)
{
    if (c->mode == 0) {
        uint32_t u;
        memcpy(&u, c->scales + ((size_t)(t * (c->hidden / 128) + k)) * 4, sizeof u);
        return u;
    }
    return c->scales[t * (c->hidden / 32) + k];
}

/* Row t's code h (FP4: the nibble). */
static inline uint8_t forward_code(const forward_case *c, int64_t t, int64_t h)
{
    if (!forward_is_fp4(c->dst)) return c->y[t * c->hidden + h];
    uint8_t byte = c->y[(t * c->hidden + h) / 2];
    return (uint8_t)(h % 2 ? byte >> 4 : byte & 0x0F);
}

static inline void forward_case_free(forward_case *c)
{
    free(c->x);
    free(c->y);
    free(c->scales);
    c->x = NULL;
    c->y = c->scales = NULL;
}

#endif /* ACL_SWIGLU_TESTS_FORWARD_CASE_H */
