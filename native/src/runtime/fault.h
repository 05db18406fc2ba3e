/* Fault injection, as the rest of libascendcl.so sees it. */
#ifndef ACL_SWIGLU_RUNTIME_FAULT_H
#define ACL_SWIGLU_RUNTIME_FAULT_H

void aclEmu_fault_lock_for_fork(void);
void aclEmu_fault_unlock_after_fork(void);

#endif
