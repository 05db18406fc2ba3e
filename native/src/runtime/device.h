/* Initialisation state and the emulated devices, as the rest of libascendcl.so sees them. */
#ifndef ACL_SWIGLU_RUNTIME_DEVICE_H
#define ACL_SWIGLU_RUNTIME_DEVICE_H

#include <stdint.h>

#define EMU_MAX_DEVICES 64

/* aclInit and aclFinalize change the state with this lock held. */
void aclEmu_device_lock(void);
void aclEmu_device_unlock(void);
int aclEmu_devices_up_locked(void);
/* Marks ACL initialised with `count` devices. */
void aclEmu_devices_start_locked(uint32_t count);
/* Marks ACL finalised: no thread's current device counts any more. */
void aclEmu_devices_stop_locked(void);

uint32_t aclEmu_device_count(void);

void aclEmu_device_lock_for_fork(void);
void aclEmu_device_unlock_after_fork(void);

#endif
