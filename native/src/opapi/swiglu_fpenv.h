/*
 * The floating-point environment the kernel computes in, whatever the caller set: round to
 * nearest even, subnormals kept (no flush-to-zero, no denormals-are-zero), no trapping
 * exceptions. fp_env_enter sets it on the calling thread and returns the caller's state;
 * fp_env_leave puts that state back. Internal to the kernel.
 */
#ifndef ACL_SWIGLU_SWIGLU_FPENV_H
#define ACL_SWIGLU_SWIGLU_FPENV_H

#include <stdint.h>

/* The switches are compiler barriers ("memory"): no load of the kernel's inputs moves before the
 * switch in, no store of its results after the switch back. */
#if defined(__x86_64__)

/* MXCSR: every exception masked (bits 7-12), round to nearest (RC, bits 13-14, zero), FTZ (bit 15)
 * and DAZ (bit 6) off, no exception flag raised. The kernel's arithmetic is all SSE/AVX, which
 * MXCSR alone controls. */
#define FP_ENV_KERNEL_MXCSR 0x1F80u

typedef uint32_t fp_env;

static inline fp_env fp_env_enter(void)
{
    uint32_t saved, kernel = FP_ENV_KERNEL_MXCSR;
    __asm__ __volatile__("stmxcsr %0" : "=m"(saved) : : "memory");
    __asm__ __volatile__("ldmxcsr %0" : : "m"(kernel) : "memory");
    return saved;
}

static inline void fp_env_leave(fp_env saved) { __asm__ __volatile__("ldmxcsr %0" : : "m"(saved) : "memory"); }

#elif defined(__aarch64__)

/* FPCR controls that change results or trap: FIZ (bit 0), AH (1), NEP (2), the trap enables
 * IOE..IXE (8-12) and IDE (15), EBF (13), FZ16 (19), RMode (22-23), FZ (24), DN (25), AHP (26).
 * All clear is round to nearest, subnormals kept, IEEE half precision, NaNs propagated. */
#define FP_ENV_FPCR_CONTROLS 0x07C8BF07u

typedef uint64_t fp_env;

static inline fp_env fp_env_enter(void)
{
    uint64_t saved;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved));
    uint64_t kernel = saved & ~(uint64_t)FP_ENV_FPCR_CONTROLS;
    __asm__ __volatile__("msr fpcr, %0" : : "r"(kernel) : "memory");
    return saved;
}

static inline void fp_env_leave(fp_env saved) { __asm__ __volatile__("msr fpcr, %0" : : "r"(saved) : "memory"); }

#else
#error "the kernel sets its floating-point environment on x86-64 and aarch64 only"
#endif

#endif /* ACL_SWIGLU_SWIGLU_FPENV_H */
