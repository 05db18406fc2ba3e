/* Copies and fills of device memory, large ones spread over the emulator's threads. */
#ifndef ACL_SWIGLU_RUNTIME_BULK_H
#define ACL_SWIGLU_RUNTIME_BULK_H

#include <stddef.h>

/* memmove(dst, src, count). */
void aclEmu_bulk_copy(void *dst, const void *src, size_t count);
/* memset(dst, byte, count). */
void aclEmu_bulk_fill(void *dst, int byte, size_t count);

#endif
