/*
 * The SwiGLU-backward kernel of the emulator (SPEC section 1), free of any emulator state so
 * that tests and benchmarks can drive it directly.
 */
#ifndef ACL_SWIGLU_SWIGLU_KERNEL_H
#define ACL_SWIGLU_SWIGLU_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#include "acl/acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SWIGLU_MAX_RANK 8

/* A strided view: `data` is the address of element 0 (offset already applied). */
typedef struct {
    char *data;
    int64_t ndim;
    int64_t dims[SWIGLU_MAX_RANK];
    int64_t strides[SWIGLU_MAX_RANK];   /* elements */
} swiglu_view;

typedef enum {
    SWIGLU_GROUPS_NONE = 0,
    SWIGLU_GROUPS_HOST = 1,     /* revision 1: values copied at phase 1 */
    SWIGLU_GROUPS_DEVICE = 2    /* revision 2: an INT64 tensor read when the kernel runs */
} swiglu_group_mode;

typedef struct {
    aclDataType dtype;          /* of gradY, x, yOrigin and gradX */
    int64_t rows;               /* T */
    int64_t hidden;             /* H */
    swiglu_view grad_y, x, y_origin, grad_x;
    int has_weight;
    swiglu_view weight, grad_weight;
    int clamp_on;
    float clamp;
    swiglu_group_mode group_mode;
    const int64_t *group_values;   /* SWIGLU_GROUPS_HOST */
    uint64_t group_count;
    swiglu_view group_index;       /* SWIGLU_GROUPS_DEVICE */
} swiglu_kernel_args;

typedef enum {
    SWIGLU_KERNEL_VECTOR = 0,          /* the widest vector build this CPU runs (the default) */
    SWIGLU_KERNEL_SCALAR = 1,          /* one element at a time: the reference the others match */
    SWIGLU_KERNEL_VECTOR_BASELINE = 2, /* 8 lanes, no instruction-set extension */
    SWIGLU_KERNEL_VECTOR_AVX2 = 3,     /* 8 lanes, x86-64 AVX2 and F16C */
    SWIGLU_KERNEL_VECTOR_AVX512 = 4    /* 16 lanes, x86-64 AVX-512 (F, DQ, BW, VL) */
} swiglu_kernel_variant;

/* 1 when this build and CPU can run the variant. */
int swiglu_kernel_variant_available(swiglu_kernel_variant variant);

/* The variant's device_exp over n floats (for tests); -2 when the variant cannot run here. */
int swiglu_kernel_exp(swiglu_kernel_variant variant, const float *in, float *out, size_t n);

/* Rows to compute: min(uint32 wrapping sum of the groups, T), or T without groups. */
int64_t swiglu_trunc(const swiglu_kernel_args *args);

/* Runs the kernel over all rows with up to `threads` threads. The bytes written depend on
 * neither the thread count nor the variant. Returns 0, -1 when host memory for scratch ran out,
 * -2 when the variant cannot run here (nothing written in either case). */
int swiglu_kernel_run(const swiglu_kernel_args *args, int threads, swiglu_kernel_variant variant);

/* The device's exp (exposed for tests): fp32, flushes subnormal results to 0, overflows to
 * +inf for x >= 88.72284. */
float swiglu_device_expf(float x);

#ifdef __cplusplus
}
#endif

#endif /* ACL_SWIGLU_SWIGLU_KERNEL_H */
