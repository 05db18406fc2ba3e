/* Building the kernel's arguments in the tests that drive it directly. */
#ifndef ACL_SWIGLU_TESTS_KERNEL_ARGS_H
#define ACL_SWIGLU_TESTS_KERNEL_ARGS_H

#include <string.h>

#include "opapi/swiglu_kernel.h"

/* A [rows, cols] view into a buffer with a row pitch and a column step (elements). */
static void view(swiglu_view *v, void *data, int64_t rows, int64_t cols, int64_t pitch, int64_t step)
{
    memset(v, 0, sizeof *v);
    v->data = data;
    v->ndim = 2;
    v->dims[0] = rows;
    v->dims[1] = cols;
    v->strides[0] = pitch;
    v->strides[1] = step;
}

/* Contiguous [rows, hidden] gradY and yOrigin, [rows, 2 hidden] x and gradX, [rows, 1] weight and
 * gradWeight; a weight when `weight` is not NULL (yOrigin then too); no clamp, no groups. */
static void contiguous_args(swiglu_kernel_args *a, aclDataType dtype, int64_t rows, int64_t hidden, void *grad_y,
                            void *x, void *y_origin, float *weight, void *grad_x, float *grad_weight)
{
    memset(a, 0, sizeof *a);
    a->dtype = dtype;
    a->rows = rows;
    a->hidden = hidden;
    view(&a->grad_y, grad_y, rows, hidden, hidden, 1);
    view(&a->x, x, rows, 2 * hidden, 2 * hidden, 1);
    view(&a->grad_x, grad_x, rows, 2 * hidden, 2 * hidden, 1);
    if (weight != NULL) {
        a->has_weight = 1;
        view(&a->y_origin, y_origin, rows, hidden, hidden, 1);
        view(&a->weight, weight, rows, 1, 1, 1);
        view(&a->grad_weight, grad_weight, rows, 1, 1, 1);
    }
}

#endif /* ACL_SWIGLU_TESTS_KERNEL_ARGS_H */
