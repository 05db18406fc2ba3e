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

/* "M.m.p" with an optional leading 'v' and an optional "-alpha.N", "-beta.N" or "-rc.N" (which
 * come before M.m.p itself, in that order). Fills a key that sorts like the releases; 0 on
 * success, -1 for anything else. */
static inline int tiling_release_key(const char *text, int64_t key[5])
{
    static const char *const stages[] = {"alpha", "beta", "rc"};
    const char *p = text;
    if (p == NULL) return -1;
    if (*p == 'v') p++;
    for (int part = 0; part < 3; part++) {
        if (*p < '0' || *p > '9') return -1;
        char *end = NULL;
        unsigned long value = strtoul(p, &end, 10);
        if (value > 100000) return -1;
        key[part] = (int64_t)value;
        p = end;
        if (part < 2 && *p++ != '.') return -1;
    }
    key[3] = 3;   /* the release itself sorts after its pre-releases */
    key[4] = 0;
    if (*p == '\0') return 0;
    if (*p++ != '-') return -1;
    for (int s = 0; s < 3; s++) {
        size_t length = 0;
        while (stages[s][length] != '\0') length++;
        if (strncmp(p, stages[s], length) == 0 && p[length] == '.') {
            const char *digits = p + length + 1;
            if (*digits < '0' || *digits > '9') return -1;
            char *end = NULL;
            unsigned long value = strtoul(digits, &end, 10);
            if (*end != '\0' || value > 100000) return -1;
            key[3] = s;
            key[4] = (int64_t)value;
            return 0;
        }
    }
    return -1;
}

static inline int tiling_key_before(const int64_t a[5], const int64_t b[5])
{
    for (int i = 0; i < 5; i++) {
        if (a[i] != b[i]) return a[i] < b[i];
    }
    return 0;
}

static inline int tiling_of_release(const char *text)
{
    static const int64_t first_release[5] = {9, 1, 0, 3, 0};    /* 9.1.0 */
    static const int64_t current_from[5] = {9, 2, 0, 1, 2};     /* 9.2.0-beta.2 */
    int64_t key[5];
    if (tiling_release_key(text, key) != 0 || tiling_key_before(key, first_release)) {
        return -1;
    }
    return tiling_key_before(key, current_from) ? SWIGLU_TILING_9_1 : SWIGLU_TILING_CURRENT;
}

#endif /* ACL_SWIGLU_SWIGLU_TILING_H */
