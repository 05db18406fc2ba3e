/*
 * Internal interface between the three emulator libraries. libascendcl.so owns the process
 * state (initialisation, devices, error text, the handle registry, device memory, streams and
 * fault injection) and exports these aclEmu_* functions for libnnopbase.so and libopapi.so.
 * They are not part of any public API.
 */
#ifndef ACL_SWIGLU_EMU_INTERNAL_H
#define ACL_SWIGLU_EMU_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "acl/acl.h"
#include "acl_emu/acl_emu.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EMU_EXPORT __attribute__((visibility("default")))
#define EMU_PRINTF(fmt_index, args_index) __attribute__((format(printf, fmt_index, args_index)))

/* ---- error text (per thread) ---- */

/* Adds "<api>: <message> [status code]" to the calling thread's unread error texts (newest
 * first) and returns `code`. */
EMU_EXPORT int aclEmu_fail(int code, const char *api, const char *fmt, ...) EMU_PRINTF(3, 4);
EMU_EXPORT int aclEmu_vfail(int code, const char *api, const char *fmt, va_list ap);

/* ---- process state ---- */

/* 0 when aclInit has been called, else ACL_ERROR_UNINITIALIZE with the message set. */
EMU_EXPORT int aclEmu_require_init(const char *api);
/* 0 when the calling thread has a device set (after aclInit), else the real code, message set. */
EMU_EXPORT int aclEmu_require_device(const char *api);
/* The calling thread's current device, or -1 when it has none. */
EMU_EXPORT int32_t aclEmu_current_device(void);
/* 0 when `owner` (the device a resource was made on) is the calling thread's current device;
 * else `code`, with a message naming `what`, its device and the current one. */
EMU_EXPORT int aclEmu_require_owner(const char *api, int code, const char *what, int32_t owner);

/* ---- settings ---- */

/* The operator ABI revision to implement: ACL_EMU_ABI, else ACL_SWIGLU_ABI, else 2, each read
 * with the same rule (ASCII whitespace around the value is ignored; empty means unset; else
 * exactly "1" or "2"). Re-read only when the process environment changed. Returns 0 with *abi
 * set, or `invalid_code` with a message naming the variable and its value. */
EMU_EXPORT int aclEmu_abi_revision(const char *api, int invalid_code, int *abi);

/* ---- fault injection ---- */

/* Counts a call of `api`; returns the planned failure code for this call (message set) or 0. */
EMU_EXPORT int aclEmu_fault(const char *api);

/* ---- handle registry ---- */

EMU_EXPORT void aclEmu_handle_add(aclEmuHandleKind kind, const void *handle);
/* Removes a live handle; `reason` is remembered for later messages ("destroyed", "consumed").
 * Returns 1 when it was live with that kind, 0 otherwise. */
EMU_EXPORT int aclEmu_handle_remove(aclEmuHandleKind kind, const void *handle, const char *reason);
/* 1 when `handle` is live with that kind. */
EMU_EXPORT int aclEmu_handle_is(aclEmuHandleKind kind, const void *handle);
/* Writes why `handle` is not a live handle of `kind` ("was destroyed", "is an aclIntArray", ...). */
EMU_EXPORT void aclEmu_handle_describe(aclEmuHandleKind kind, const void *handle, char *buf,
                                       size_t size);
EMU_EXPORT const char *aclEmu_kind_name(aclEmuHandleKind kind);
/* 0 when `handle` is a live handle of `kind`; else `code` with a
 * message "<what>: <why it is not>" set. */
EMU_EXPORT int aclEmu_require_handle(const char *api, int code, const char *what,
                                     aclEmuHandleKind kind, const void *handle);

/* ---- device memory ---- */

typedef struct {
    uintptr_t base;   /* start of the allocation holding the range */
    size_t size;      /* its size as requested */
    size_t offset;    /* where the range starts in it */
    int32_t device;   /* the device it was allocated on */
} aclEmuRegion;

typedef enum {
    EMU_RANGE_DEVICE = 0,     /* wholly inside one live allocation */
    EMU_RANGE_HOST = 1,       /* touches no live allocation */
    EMU_RANGE_STRADDLES = 2   /* starts or ends inside an allocation but does not fit in it */
} aclEmuRangeClass;

/* Classifies [ptr, ptr + len) (len 0 is treated as 1 byte); fills `region` for DEVICE and
 * STRADDLES (the allocation it touches first). */
EMU_EXPORT aclEmuRangeClass aclEmu_mem_classify(const void *ptr, size_t len, aclEmuRegion *region);

/* Pins up to `n` ranges that must be device memory while work reads or writes them, so that a
 * concurrent aclrtFree waits instead of pulling memory from under the work. Returns 0, or the
 * index+1 of the first range that is not wholly inside a live allocation (nothing pinned). */
EMU_EXPORT size_t aclEmu_mem_pin(const void *const *ptrs, const size_t *lens, size_t n);
EMU_EXPORT void aclEmu_mem_unpin(const void *const *ptrs, size_t n);

/* Describes `ptr` for messages: "device memory (allocation 0x.. of N bytes, offset M)" etc. */
EMU_EXPORT void aclEmu_mem_describe(const void *ptr, size_t len, char *buf, size_t size);

/* ---- streams ---- */

typedef struct aclEmuTask aclEmuTask;
struct aclEmuTask {
    aclEmuTask *next;
    /* Runs the work; returns 0 or a runtime error code after setting the message. */
    int (*run)(aclEmuTask *task);
    /* Frees the task (run or not). */
    void (*release)(aclEmuTask *task);
};

/* Resolves NULL to the current device's default stream and takes a reference on it. Returns NULL
 * with the message set and *code filled when `stream` is not a live stream (`invalid_code`) or
 * belongs to another device (ACL_ERROR_RT_STREAM_CONTEXT). */
EMU_EXPORT void *aclEmu_stream_resolve(aclrtStream stream, const char *api, int invalid_code,
                                       int *code);
/* Queues `task` on a resolved stream (it runs at the next synchronisation) and drops the
 * reference resolve took. */
EMU_EXPORT void aclEmu_stream_enqueue(void *resolved_stream, aclEmuTask *task);
/* Drops the reference without queueing anything. */
EMU_EXPORT void aclEmu_stream_unref(void *resolved_stream);

/* ---- kernel settings ---- */
EMU_EXPORT int aclEmu_thread_count(void);
/* 0: vectorised kernel (default), 1: scalar reference kernel. */
EMU_EXPORT int aclEmu_kernel_variant(void);

/* ---- small helpers ---- */
EMU_EXPORT const char *aclEmu_dtype_name(int dtype);
EMU_EXPORT const char *aclEmu_format_name(int format);
/* Element size in bits (4 for the FLOAT4 types, which pack two elements per byte); 0 for types
 * with no fixed size or unknown values. */
EMU_EXPORT unsigned aclEmu_dtype_bits(int dtype);
/* Element size in bytes; 0 for unknown types and for the sub-byte FLOAT4 types, whose sizes go
 * through aclEmu_dtype_bits or aclEmu_element_bytes. */
EMU_EXPORT size_t aclEmu_dtype_size(int dtype);
/* The bytes that hold elements [first, first + count) of a storage of `dtype` (element 0 at
 * byte 0; a FLOAT4 element 2i in the low nibble of byte i, 2i+1 in its high nibble): the first
 * byte and the byte count (0 for count 0). -1 for an unknown dtype, a negative argument, or a
 * range whose bits do not fit int64. */
EMU_EXPORT int aclEmu_element_bytes(int dtype, int64_t first, int64_t count, uint64_t *first_byte,
                                    uint64_t *bytes);

#ifdef __cplusplus
}
#endif

#endif /* ACL_SWIGLU_EMU_INTERNAL_H */
