/* The vectorised kernel for AVX512: see swiglu_kernel_vector.c. */
#define KERNEL_LANES 16
#define KERNEL_TABLE swiglu_vector_impls_avx512
#include "swiglu_kernel_vector.c"
