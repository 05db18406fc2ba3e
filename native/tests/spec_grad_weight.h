/*
 * gradWeight's summation order written for the tests straight from the text of docs/operator.md
 * (tiling of a row, accumulation over tiles, ReduceSum by element count), in a form of its own:
 * the 64-lane tree recursively by halves, each ReduceSum case as its own formula. It shares no
 * code with the kernel.
 */
#ifndef ACL_SWIGLU_TESTS_SPEC_GRAD_WEIGHT_H
#define ACL_SWIGLU_TESTS_SPEC_GRAD_WEIGHT_H

#include <stdint.h>
#include <stdlib.h>

/* The tree over lanes [lo, lo + width) of 64, lanes at and past n being +0.0. */
static float spec_tree_lanes(const float *v, size_t n, size_t lo, size_t width)
{
    if (width == 1) return lo < n ? v[lo] : 0.0f;
    float left = spec_tree_lanes(v, n, lo, width / 2);
    float right = spec_tree_lanes(v, n, lo + width / 2, width / 2);
    return left + right;
}

static float spec_tree64(const float *v, size_t n) { return spec_tree_lanes(v, n, 0, 64); }

/* ReduceSum of acc[0..n), n <= 4096. */
static float spec_reduce_sum(const float *acc, size_t n)
{
    float lanes[64];
    if (n > 4096) abort();   /* no first tile is that long */
    if (n <= 64) return spec_tree64(acc, n);
    for (size_t i = 0; i < 64; i++) {
        if (n <= 128) {
            lanes[i] = 64 + i < n ? acc[i] + acc[64 + i] : acc[i];
        } else if (n <= 192) {
            float low = acc[i] + acc[64 + i];
            lanes[i] = 128 + i < n ? low + acc[128 + i] : low;
        } else if (n <= 256) {
            float low = acc[i] + acc[64 + i];
            float high = 192 + i < n ? acc[128 + i] + acc[192 + i] : acc[128 + i];
            lanes[i] = low + high;
        }
    }
    if (n <= 256) return spec_tree64(lanes, 64);
    float sums[64];
    size_t chunks = 0;
    for (size_t c0 = 0; c0 < n; c0 += 64) sums[chunks++] = spec_tree64(acc + c0, n - c0 < 64 ? n - c0 : 64);
    return spec_tree64(sums, chunks);
}

/* The first tile's length (H itself when the row is one tile). */
static int64_t spec_first_tile(int narrow_dtype, int weight, int clamp, int64_t H, int release_9_1)
{
    const int64_t avail = 253952 - 32 - 8192;
    int64_t f = release_9_1 ? 12 + (clamp ? 8 : 0) + (weight ? 4 : 0)
                            : 14 + (narrow_dtype ? 2 : 0) + (clamp ? 8 : 0) + (weight ? 4 : 0) +
                                  (weight && narrow_dtype ? 2 : 0);
    if (f * H * 4 + 64 <= avail) return H;
    int64_t tile = (avail - 64) / (f * 4);
    tile -= tile % 16;
    return tile < 16 ? 16 : tile;
}

/* gradWeight of one row from its products p[0..H): acc from the first tile, later tiles added
 * in order into acc's head, then ReduceSum of the first tile's length. */
static float spec_grad_weight(const float *p, int64_t H, int64_t tile)
{
    int64_t n = H < tile ? H : tile;
    float *acc = malloc((size_t)(n > 0 ? n : 1) * sizeof *acc);
    if (acc == NULL) abort();
    for (int64_t j = 0; j < n; j++) acc[j] = p[j];
    for (int64_t start = tile; start < H; start += tile) {
        for (int64_t j = 0; j < tile && start + j < H; j++) acc[j] = acc[j] + p[start + j];
    }
    float s = spec_reduce_sum(acc, (size_t)n);
    free(acc);
    return s;
}

#endif /* ACL_SWIGLU_TESTS_SPEC_GRAD_WEIGHT_H */
