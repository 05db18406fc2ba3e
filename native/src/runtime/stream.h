/* Streams, as the rest of libascendcl.so sees them. */
#ifndef ACL_SWIGLU_RUNTIME_STREAM_H
#define ACL_SWIGLU_RUNTIME_STREAM_H

#include <stdint.h>

/* Creates the default stream of each of `devices` devices; 0 or ACL_ERROR_BAD_ALLOC. */
int aclEmu_streams_init(uint32_t devices);
/* Waits for running work, drops queued work and destroys every stream. */
void aclEmu_streams_release_all(void);

/* Takes the list lock and every stream's locks, so that no stream is being drained while the
 * process forks; the child starts with idle streams. */
void aclEmu_streams_lock_for_fork(void);
void aclEmu_streams_unlock_after_fork(void);

#endif
