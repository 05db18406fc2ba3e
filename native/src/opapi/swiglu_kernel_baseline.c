/* The vectorised kernel for baseline x86-64 (and any other CPU): see swiglu_kernel_vector.c. */
#define KERNEL_LANES 8
#define KERNEL_TABLE swiglu_vector_impls_baseline
#include "swiglu_kernel_vector.c"
