/*
 * The kernel of aclnnSwigluGroupQuant's quant modes 0 and 1 (docs/forward.md): the SwiGLU
 * forward, then FP8 block quantisation (mode 0) or MX quantisation to FP8 or FP4 (mode 1). Free
 * of any emulator state, so that tests can drive it directly.
 */
#ifndef ACL_SWIGLU_SWIGLU_QUANT_KERNEL_H
#define ACL_SWIGLU_SWIGLU_QUANT_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#include "acl/acl_base.h"
#include "swiglu_kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* As many dims as an aclTensor has: releases before 9.2.0 do not check the ranks of weight,
 * groupIndex, y or yScale. */
#define SWIGLU_QUANT_MAX_DIMS 16

/* Elements per quantisation block: mode 0 scales blocks of 128, mode 1 groups of 32. */
#define SWIGLU_QUANT_BLOCK 128
#define SWIGLU_QUANT_GROUP 32

/* A strided view of device memory: element i of its row-major order lies `offset +
 * sum(index_d * strides[d])` elements from `base` (FLOAT4 elements are half a byte: element e
 * is the low nibble of byte e / 2 when e is even, the high nibble when odd). */
typedef struct {
    char *base;
    int64_t offset;
    int64_t ndim;
    int64_t dims[SWIGLU_QUANT_MAX_DIMS];
    int64_t strides[SWIGLU_QUANT_MAX_DIMS];
} swiglu_quant_view;

typedef enum {
    SWIGLU_QUANT_MODE_BLOCK = 0,   /* FP8, blocks of 128, FLOAT scales */
    SWIGLU_QUANT_MODE_MX = 1       /* FP8 or FP4, groups of 32, FLOAT8_E8M0 scales */
} swiglu_quant_mode;

typedef struct {
    aclDataType x_dtype;      /* FLOAT16 or BF16 */
    aclDataType dst;          /* FLOAT8_E4M3FN, FLOAT8_E5M2 (modes 0, 1), FLOAT4_E2M1, FLOAT4_E1M2 (mode 1) */
    swiglu_quant_mode mode;
    int round_scale;          /* mode 0: power-of-two scales (mode 1 always has them) */
    int64_t rows;             /* T */
    int64_t hidden;           /* H, a multiple of 128 */
    swiglu_quant_view x;      /* [..., 2H]: row t is x's row t; x0 = the first half (the gate) */
    int has_weight;
    swiglu_quant_view weight; /* T elements, row t's in row-major position t */
    int has_groups;
    swiglu_quant_view group_index;   /* INT64 counts, summed in row-major order */
    int clamp_on;
    float clamp;
    /* Row t's H codes go to row-major elements [t*H, (t+1)*H) of y, its scales to elements
     * [t*S, (t+1)*S) of y_scale (S = H/128 FLOAT in mode 0, H/32 E8M0 bytes in mode 1). With
     * the shapes the operator checks that is row t of each; the views must hold T rows. */
    swiglu_quant_view y;
    swiglu_quant_view y_scale;
} swiglu_quant_args;

/* Rows the kernel computes: min(int64 wrapping sum of the groups, T), or T without groups;
 * <= 0 means none. Reads the group counts (host-accessible memory here). */
int64_t swiglu_quant_trunc(const swiglu_quant_args *args);

/* Runs the kernel over rows [0, trunc) with up to `threads` threads, in the kernel's own
 * floating-point environment; rows >= trunc of y and y_scale are not written. The bytes written
 * depend on neither the thread count, the variant nor the caller's floating-point environment.
 * Returns 0, -1 when host memory for threads ran out, -2 when the variant cannot run here, -3
 * for arguments the kernel does not take (nothing written in these cases). */
int swiglu_quant_run(const swiglu_quant_args *args, int threads, swiglu_kernel_variant variant);

#ifdef __cplusplus
}
#endif

#endif /* ACL_SWIGLU_SWIGLU_QUANT_KERNEL_H */
