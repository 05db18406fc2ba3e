/* The vectorised kernel for AVX2: see swiglu_kernel_vector.c. */
#define KERNEL_LANES 8
#define KERNEL_TABLE swiglu_vector_impls_avx2
#include "swiglu_kernel_vector.c"
