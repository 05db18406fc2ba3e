/*
 * The SwiGLU-backward kernel of the emulator (docs/operator.md), free of any emulator state so
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

/* The release whose tiling of a row decides the gradWeight summation order (docs/kernel.md). */
typedef enum {
    SWIGLU_TILING_FROM_ENVIRONMENT = 0, /* the release ACL_EMU_CANN_VERSION names (read once); unset: current */
    SWIGLU_TILING_CURRENT = 1,          /* 9.2.0-beta.2 and later: factor 14, dtype terms */
    SWIGLU_TILING_9_1 = 2               /* 9.1.0 and 9.2.0-beta.1: factor 12, no dtype terms */
} swiglu_tiling;

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
    swiglu_tiling tiling;          /* zero (the default): from the environment */
} swiglu_kernel_args;

typedef enum {
    SWIGLU_KERNEL_VECTOR = 0,          /* the widest vector build this CPU runs (the default) */
    SWIGLU_KERNEL_SCALAR = 1,          /* one element at a time: the reference the others match */
    SWIGLU_KERNEL_VECTOR_BASELINE = 2, /* 8 lanes, no instruction-set extension */
    SWIGLU_KERNEL_VECTOR_AVX2 = 3,     /* 8 lanes, x86-64 AVX2 and F16C */
    SWIGLU_KERNEL_VECTOR_AVX512 = 4,   /* 16 lanes, x86-64 AVX-512 (F, DQ, BW, VL) */
    SWIGLU_KERNEL_VECTOR_AVX512_BF16 = 5 /* the same with the CPU's bf16 narrowing (AVX512_BF16) */
} swiglu_kernel_variant;

/* 1 when this build and CPU can run the variant. */
int swiglu_kernel_variant_available(swiglu_kernel_variant variant);

/* The variant's device_exp over n floats (for tests); -2 when the variant cannot run here. */
int swiglu_kernel_exp(swiglu_kernel_variant variant, const float *in, float *out, size_t n);

/* The tiling of a release string ("9.1.0", "9.2.0-beta.1", "v9.2.0", ...): SWIGLU_TILING_9_1 from
 * 9.1.0 up to 9.2.0-beta.1, SWIGLU_TILING_CURRENT from 9.2.0-beta.2 on; -1 for text that is not
 * a release or a release before 9.1.0 (which has no such operator). */
int swiglu_tiling_of_release(const char *release);

/* The tiling launches with SWIGLU_TILING_FROM_ENVIRONMENT use: ACL_EMU_CANN_VERSION read at the
 * first call (a value that is not a release is reported on stderr once and ignored). */
swiglu_tiling swiglu_environment_tiling(void);

/* Length of the first tile of a row of `hidden` elements (all of it when the row fits the unified
 * buffer), as the release's tiling cuts it; 0 for an unknown tiling or hidden < 0. */
int64_t swiglu_tile_length(aclDataType dtype, int has_weight, int clamp_on, int64_t hidden, swiglu_tiling tiling);

/* The largest n swiglu_kernel_reduce_sum takes (the first tile of a weighted row is shorter). */
#define SWIGLU_REDUCE_MAX 4096

/* The variant's ReduceSum of in[0..n) (docs/operator.md, for tests): 0, -1 when n > SWIGLU_REDUCE_MAX,
 * -2 when the variant cannot run here. */
int swiglu_kernel_reduce_sum(swiglu_kernel_variant variant, const float *in, size_t n, float *out);

/* Rows to compute: min(uint32 wrapping sum of the groups, T), or T without groups. */
int64_t swiglu_trunc(const swiglu_kernel_args *args);

/* Runs the kernel over all rows with up to `threads` threads, in the kernel's own floating-point
 * environment (round to nearest, subnormals kept; the caller's is put back after). The bytes
 * written depend on neither the thread count, the variant nor the caller's floating-point
 * environment. Returns 0, -1 when host memory for scratch ran out, -2 when the variant cannot run
 * here, -3 when args->tiling is no known tiling (nothing written in these cases). */
int swiglu_kernel_run(const swiglu_kernel_args *args, int threads, swiglu_kernel_variant variant);

/* (float)value rounded to nearest even whatever rounding mode the caller set (the clamp limit's
 * conversion, so that the caller's mode cannot change which limit the kernel uses). */
float swiglu_float_nearest(double value);

/* The device's exp (exposed for tests): fp32, flushes subnormal results to 0, overflows to
 * +inf for x >= 88.72284. */
float swiglu_device_expf(float x);

#ifdef __cplusplus
}
#endif

#endif /* ACL_SWIGLU_SWIGLU_KERNEL_H */
