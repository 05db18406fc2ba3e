/* The vectorised forward kernel for AVX-512 (F, DQ, BW, VL): see swiglu_quant_vector.c. */
#define KERNEL_LANES 16
#define QUANT_TABLE swiglu_quant_vector_avx512
#include "swiglu_quant_vector.c"
