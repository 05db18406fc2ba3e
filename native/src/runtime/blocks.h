/* The host memory behind device allocations, as memory.c sees it. */
#ifndef ACL_SWIGLU_RUNTIME_BLOCKS_H
#define ACL_SWIGLU_RUNTIME_BLOCKS_H

#include <stddef.h>

/* A block of at least `size` bytes, 64-byte aligned, its first `size` bytes (rounded up to 64)
 * filled with `fill` whether it is fresh or reused; *mapped is what aclEmu_block_put needs back.
 * NULL when the host is out of memory. */
void *aclEmu_block_get(size_t size, int fill, size_t *mapped);
/* Returns a block: large ones are kept in a bounded cache for reuse. */
void aclEmu_block_put(void *block, size_t mapped);
/* Gives the cached blocks back to the system. */
void aclEmu_blocks_release_cached(void);

void aclEmu_blocks_lock_for_fork(void);
void aclEmu_blocks_unlock_after_fork(void);

#endif
