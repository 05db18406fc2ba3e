/* The vectorised forward kernel for AVX2 and F16C: see swiglu_quant_vector.c. */
#define KERNEL_LANES 8
#define QUANT_TABLE swiglu_quant_vector_avx2
#include "swiglu_quant_vector.c"
