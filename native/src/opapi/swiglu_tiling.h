/*
 * How the device's kernel cuts a row of H elements into tiles of its unified buffer (UB), per
 * release (docs/operator.md and docs/cann_releases.md, docs/kernel.md): the tiles decide the order in which gradWeight
 * is summed. Pure functions, internal to the kernel.
 */
#ifndef ACL_SWIGLU_SWIGLU_TILING_H
#define ACL_SWIGLU_SWIGLU_TILING_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/emu_release.h"
#include "swiglu_kernel.h"

/* Unified buffer of the Ascend 950, less the 32 bytes and the 8 KiB the kernel keeps for itself. */
#define TILING_UB_BYTES 253952
#define TILING_AVAILABLE (TILING_UB_BYTES - 32 - 8192)
#define TILING_ROW_EXTRA 64
#define TILING_ALIGN 16

/* fp32 buffers of H elements the kernel keeps in UB per row. */
static inline int64_t tiling_factor(aclDataType dtype, int has_weight, int clamp_on, swiglu_tiling tiling)
{
    int narrow = dtype == ACL_FLOAT16 || dtype == ACL_BF16;
    if (tiling == SWIGLU_TILING_9_1) {
        return 12 + (clamp_on ? 8 : 0) + (has_weight ? 4 : 0);
    }
    return 14 + (narrow ? 2 : 0) + (clamp_on ? 8 : 0) + (has_weight ? 4 + (narrow ? 2 : 0) : 0);
}

/* The first tile's length: H when f*H*4 + 64 fits the available UB, else the largest multiple of
 * 16 (at least 16) with f*tile*4 + 64 <= available. */
static inline int64_t tiling_first_tile(aclDataType dtype, int has_weight, int clamp_on, int64_t hidden,
                                        swiglu_tiling tiling)
{
    if (hidden < 0 || (tiling != SWIGLU_TILING_CURRENT && tiling != SWIGLU_TILING_9_1)) {
        return 0;
    }
    int64_t bytes_per_element = tiling_factor(dtype, has_weight, clamp_on, tiling) * 4;
    int64_t fits = (TILING_AVAILABLE - TILING_ROW_EXTRA) / bytes_per_element;   /* no overflow: H is not multiplied */
    if (hidden <= fits) {
        return hidden;
    }
    int64_t tile = fits / TILING_ALIGN * TILING_ALIGN;
    return tile < TILING_ALIGN ? TILING_ALIGN : tile;
}

/* What a release does that matters to the emulator. */
typedef struct {
    swiglu_tiling tiling;       /* the UB factors that cut a row into tiles */
    int clamp_off_band;         /* "off" is |c + 1| <= 1e-6 in fp32 (9.2.0 on), not only c == -1 */
    int hangs_on_partial_trunc; /* 0 < trunc < min(T, vector cores) deadlocks the kernel */
} swiglu_release_traits;

/* The traits of a release from its key: 9.1.0 up to 9.2.0-beta.1 have the first kernel (factor
 * 12, the group_index deadlock), 9.2.0-beta.2 on the current one, 9.2.0 on the clamp band too.
 * -1 for a key before 9.1.0, which has no such operator. */
static inline int tiling_traits_of_key(const int64_t key[EMU_RELEASE_KEY_PARTS], swiglu_release_traits *traits)
{
    static const int64_t first_release[EMU_RELEASE_KEY_PARTS] = {9, 1, 0, EMU_RELEASE_STAGE_FINAL, 0};
    static const int64_t current_from[EMU_RELEASE_KEY_PARTS] = {9, 2, 0, 1, 2};   /* 9.2.0-beta.2 */
    static const int64_t clamp_band_from[EMU_RELEASE_KEY_PARTS] = {9, 2, 0, EMU_RELEASE_STAGE_FINAL, 0};
    if (emu_release_before(key, first_release)) {
        return -1;
    }
    int first_kernel = emu_release_before(key, current_from);
    traits->tiling = first_kernel ? SWIGLU_TILING_9_1 : SWIGLU_TILING_CURRENT;
    traits->hangs_on_partial_trunc = first_kernel;
    traits->clamp_off_band = !emu_release_before(key, clamp_band_from);
    return 0;
}

static inline int tiling_of_release(const char *text)
{
    int64_t key[EMU_RELEASE_KEY_PARTS];
    swiglu_release_traits traits;
    if (emu_release_key(text, key) != 0 || tiling_traits_of_key(key, &traits) != 0) {
        return -1;
    }
    return traits.tiling;
}

#endif /* ACL_SWIGLU_SWIGLU_TILING_H */
