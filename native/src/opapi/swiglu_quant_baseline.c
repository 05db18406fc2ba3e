/* The vectorised forward kernel for baseline x86-64 (and any other CPU): see swiglu_quant_vector.c. */
#define KERNEL_LANES 8
#define QUANT_TABLE swiglu_quant_vector_baseline
#include "swiglu_quant_vector.c"
