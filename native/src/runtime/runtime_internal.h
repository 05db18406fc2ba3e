/* Declarations shared by the source files of libascendcl.so only. */
#ifndef ACL_SWIGLU_RUNTIME_INTERNAL_H
#define ACL_SWIGLU_RUNTIME_INTERNAL_H

#include <stdio.h>

#include "common/emu_internal.h"

/* registry.c */
int64_t aclEmu_live_count(aclEmuHandleKind kind);
void aclEmu_report_live_handles(FILE *out);
void aclEmu_registry_lock_for_fork(void);
void aclEmu_registry_unlock_after_fork(void);

/* memory.c */
int64_t aclEmu_mem_live_bytes(void);
void aclEmu_mem_report(FILE *out);
void aclEmu_mem_release_all(void);
void aclEmu_mem_set_capacity(uint64_t bytes);
void aclEmu_mem_lock_for_fork(void);
void aclEmu_mem_unlock_after_fork(void);

/* stream.c */
int aclEmu_streams_init(void);
void aclEmu_streams_release_all(void);
void aclEmu_streams_lock_for_fork(void);
void aclEmu_streams_unlock_after_fork(void);

/* fault.c */
int aclEmu_fault_set(const char *spec);
int64_t aclEmu_fault_injected(void);
void aclEmu_fault_lock_for_fork(void);
void aclEmu_fault_unlock_after_fork(void);

/* state.c: reads an environment variable as an unsigned number; `fallback` when unset/bad. */
uint64_t aclEmu_env_u64(const char *name, uint64_t fallback);

#endif /* ACL_SWIGLU_RUNTIME_INTERNAL_H */
