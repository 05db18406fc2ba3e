/* The emulator's settings from the environment, as the rest of libascendcl.so sees them. */
#ifndef ACL_SWIGLU_RUNTIME_SETTINGS_H
#define ACL_SWIGLU_RUNTIME_SETTINGS_H

#include <stdint.h>

/* An environment variable as an unsigned whole number; `fallback` when unset, or (with a
 * warning on stderr) when it does not parse. */
uint64_t aclEmu_env_u64(const char *name, uint64_t fallback);

#endif
