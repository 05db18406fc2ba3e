/* Emulated device memory, as the rest of libascendcl.so sees it. */
#ifndef ACL_SWIGLU_RUNTIME_MEMORY_H
#define ACL_SWIGLU_RUNTIME_MEMORY_H

#include <stdio.h>

#include "common/emu_internal.h"

void aclEmu_mem_set_capacity(uint64_t bytes);
/* One line per live allocation with its size. */
void aclEmu_mem_report(FILE *out);
/* Frees every allocation (after work running on them finished). */
void aclEmu_mem_release_all(void);

void aclEmu_mem_lock_for_fork(void);
void aclEmu_mem_unlock_after_fork(void);
/* In a forked child: the lock is released and the pins of threads that do not exist there
 * are dropped. */
void aclEmu_mem_reset_in_child(void);

#endif
