/* The handle registry, as the rest of libascendcl.so sees it. */
#ifndef ACL_SWIGLU_RUNTIME_REGISTRY_H
#define ACL_SWIGLU_RUNTIME_REGISTRY_H

#include <stdio.h>

#include "common/emu_internal.h"

int64_t aclEmu_live_count(aclEmuHandleKind kind);
/* One line per live handle, and a summary line by kind; returns the number of live handles. */
int64_t aclEmu_report_live_handles(FILE *out);

void aclEmu_registry_lock_for_fork(void);
void aclEmu_registry_unlock_after_fork(void);

#endif
