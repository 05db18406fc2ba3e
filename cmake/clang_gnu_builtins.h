/*
 * Forced into every compile by cmake/toolchain-zig.cmake. zig's compiler is clang, which lacks
 * GCC's __builtin_shuffle(a, b, mask); the kernel's vector code uses it with constant masks.
 * This spells it as indexing into the concatenation of the two vectors, which clang turns into
 * shuffles for a constant mask (as fast as GCC's build here): a pure data move, so results are
 * the same bits as GCC's.
 */
#if defined(__clang__) && !__has_builtin(__builtin_shuffle)
#define __builtin_shuffle(a, b, mask)                                                          \
    __extension__({                                                                            \
        enum { shuffle_lanes_ = sizeof(a) / sizeof((a)[0]) };                                  \
        __typeof__((a)[0]) shuffle_both_[2 * shuffle_lanes_];                                  \
        __typeof__(a) shuffle_lo_ = (a), shuffle_hi_ = (b), shuffle_out_;                      \
        __typeof__(mask) shuffle_mask_ = (mask);                                               \
        __builtin_memcpy(shuffle_both_, &shuffle_lo_, sizeof shuffle_lo_);                     \
        __builtin_memcpy(shuffle_both_ + shuffle_lanes_, &shuffle_hi_, sizeof shuffle_hi_);    \
        for (int shuffle_i_ = 0; shuffle_i_ < shuffle_lanes_; shuffle_i_++)                    \
            shuffle_out_[shuffle_i_] = shuffle_both_[shuffle_mask_[shuffle_i_]];               \
        shuffle_out_;                                                                          \
    })
#endif

/*
 * zig's runtime library answers __builtin_cpu_supports with "no" for every feature (its
 * __cpu_indicator_init fills nothing in), which would leave the kernel on its baseline build.
 * The kernel asks only about the features below; they are read here from CPUID, together with
 * the operating system's consent (XGETBV) to use the registers they need. A feature not listed
 * is reported absent, which only costs speed: every build writes the same bytes.
 */
#if defined(__clang__) && defined(__x86_64__)
#include <cpuid.h> /* the compiler's own header: no libc header may come before the file's
                      * feature-test macros */

static inline int clang_gnu_same_name(const char *a, const char *b)
{
    while (*a != '\0' && *a == *b) a++, b++;
    return *a == *b;
}

static inline int clang_gnu_cpu_supports(const char *feature)
{
    unsigned a, b, c, d, xcr0_lo = 0, xcr0_hi = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
    int f16c = (c & bit_F16C) != 0;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    (void)xcr0_hi;
    int ymm_state = (xcr0_lo & 0x6u) == 0x6u;                /* SSE and AVX state */
    int zmm_state = ymm_state && (xcr0_lo & 0xE0u) == 0xE0u; /* opmask, upper ZMM, ZMM16-31 */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (clang_gnu_same_name(feature, "avx2")) return ymm_state && (b & bit_AVX2);
    if (clang_gnu_same_name(feature, "f16c")) return ymm_state && f16c;
    if (clang_gnu_same_name(feature, "avx512f")) return zmm_state && (b & bit_AVX512F);
    if (clang_gnu_same_name(feature, "avx512dq")) return zmm_state && (b & bit_AVX512DQ);
    if (clang_gnu_same_name(feature, "avx512bw")) return zmm_state && (b & bit_AVX512BW);
    if (clang_gnu_same_name(feature, "avx512vl")) return zmm_state && (b & bit_AVX512VL);
    return 0;
}
#define __builtin_cpu_init() ((void)0)
#define __builtin_cpu_supports(feature) clang_gnu_cpu_supports(feature)
#endif
