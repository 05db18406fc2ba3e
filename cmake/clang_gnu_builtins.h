/*
 * Forced into every compile by cmake/toolchain-zig.cmake. zig's compiler is clang, which lacks
 * GCC's __builtin_shuffle(a, b, mask); the kernel's vector code uses it with constant masks.
 * This spells it lane by lane (clang folds a constant mask into one shuffle): a pure data move,
 * so results are the same bits as GCC's.
 */
#if defined(__clang__) && !__has_builtin(__builtin_shuffle)
#define __builtin_shuffle(a, b, mask)                                                          \
    __extension__({                                                                            \
        __typeof__(a) shuffle_lo_ = (a), shuffle_hi_ = (b), shuffle_out_;                      \
        __typeof__(mask) shuffle_mask_ = (mask);                                               \
        const int shuffle_lanes_ = (int)(sizeof(shuffle_lo_) / sizeof(shuffle_lo_[0]));        \
        for (int shuffle_i_ = 0; shuffle_i_ < shuffle_lanes_; shuffle_i_++)                    \
            shuffle_out_[shuffle_i_] = shuffle_mask_[shuffle_i_] < shuffle_lanes_              \
                ? shuffle_lo_[shuffle_mask_[shuffle_i_]]                                       \
                : shuffle_hi_[shuffle_mask_[shuffle_i_] - shuffle_lanes_];                     \
        shuffle_out_;                                                                          \
    })
#endif
