/*
 * silu and its derivative for every 16-bit input (fp16 and bf16): a 16-bit input has only 65,536
 * values, so the vectorised kernel looks the pair up instead of computing the device's exp and a
 * division for each element. Each table is filled once, by silu_with_derivative (the function the
 * scalar rows call) in the kernel's floating-point environment, so a looked-up pair has the bits
 * the scalar path computes for that input (native/tests/test_kernel_silu_table.c checks every
 * entry against the scalar kernel).
 */
#include <pthread.h>

#include "swiglu_fpenv.h"
#include "swiglu_kernel_impl.h"

/* 512 KiB each; static rather than allocated, so that building one cannot fail. Written only
 * inside their pthread_once, read-only after it. */
static silu_pair half_table[SILU_TABLE_ENTRIES];
static silu_pair bf16_table[SILU_TABLE_ENTRIES];
static pthread_once_t half_once = PTHREAD_ONCE_INIT;
static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;

static void fill(silu_pair *table, float (*widen)(uint16_t))
{
    /* The caller's rounding mode or flush-to-zero must not reach the shared table. */
    fp_env saved = fp_env_enter();
    for (uint32_t bits = 0; bits < SILU_TABLE_ENTRIES; bits++) {
        silu_with_derivative(widen((uint16_t)bits), &table[bits].silu, &table[bits].dsilu);
    }
    fp_env_leave(saved);
}

static void fill_half(void) { fill(half_table, half_to_float); }

static void fill_bf16(void) { fill(bf16_table, bf16_to_float); }

const silu_pair *swiglu_silu_table(aclDataType dtype)
{
    switch (dtype) {
    case ACL_FLOAT16:
        pthread_once(&half_once, fill_half);
        return half_table;
    case ACL_BF16:
        pthread_once(&bf16_once, fill_bf16);
        return bf16_table;
    default:
        return NULL;
    }
}
