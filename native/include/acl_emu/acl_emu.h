/*
 * acl-swiglu emulator extras: queries and controls that only the CPU emulator has.
 * Exported by the emulator's libascendcl.so; a real CANN install does not have them.
 */
#ifndef ACL_SWIGLU_ACL_EMU_H
#define ACL_SWIGLU_ACL_EMU_H

#include "acl/acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every kind of handle the emulator hands out: X(enum suffix, value, name in messages). The
 * enum, the registry's names and the leak report all come from this one table. */
#define ACL_EMU_HANDLE_KINDS(X)                  \
    X(TENSOR, 0, "aclTensor")                    \
    X(INT_ARRAY, 1, "aclIntArray")               \
    X(EXECUTOR, 2, "aclOpExecutor")              \
    X(STREAM, 3, "aclrtStream")                  \
    X(ALLOCATION, 4, "device allocation")

typedef enum {
#define ACL_EMU_KIND_ENUM(suffix, value, name) ACL_EMU_KIND_##suffix = value,
    ACL_EMU_HANDLE_KINDS(ACL_EMU_KIND_ENUM)
#undef ACL_EMU_KIND_ENUM
    ACL_EMU_KIND_COUNT
} aclEmuHandleKind;

/* Version string of the emulator; also the canary that tells it from a real CANN. */
ACL_FUNC_VISIBILITY const char *aclEmuVersion(void);

/* Live handles of one kind (-1 for an unknown kind). */
ACL_FUNC_VISIBILITY int64_t aclEmuLiveCount(aclEmuHandleKind kind);

/* The live handles of one kind: their number (-1 for an unknown kind), the first `capacity` of
 * them written to `handles` (for tests that must release what a failed destroy left). */
ACL_FUNC_VISIBILITY int64_t aclEmuLiveHandles(aclEmuHandleKind kind, void **handles, int64_t capacity);

/* Bytes of device memory currently allocated. */
ACL_FUNC_VISIBILITY int64_t aclEmuLiveBytes(void);

/* Replace the fault plan: "name:N:code[,name:N:code...]" makes the Nth call (counted from now)
 * of API `name` fail with `code`; NULL or "" clears it. Returns ACL_ERROR_INVALID_PARAM
 * (and keeps the old plan) when the text does not parse. ACL_EMU_FAIL sets it at load. */
ACL_FUNC_VISIBILITY aclError aclEmuSetFaults(const char *spec);

/* Number of faults injected since the plan was last set. */
ACL_FUNC_VISIBILITY int64_t aclEmuFaultsInjected(void);

/* Kernel implementation: 0 = vectorised (default), 1 = the scalar reference; both write the same
 * bytes (ACL_EMU_KERNEL=vector|scalar sets it at load). */
ACL_FUNC_VISIBILITY aclError aclEmuSetKernelVariant(int32_t variant);

/* The operator ABI revision the emulator implements (1 or 2), by the rules of ACL_EMU_ABI and
 * ACL_SWIGLU_ABI; 0 when the variable in charge holds something else. */
ACL_FUNC_VISIBILITY int32_t aclEmuAbiRevision(void);

/* Kernel worker threads (0 = one per online CPU, the default; ACL_EMU_THREADS sets it at load). */
ACL_FUNC_VISIBILITY aclError aclEmuSetThreads(int32_t threads);

#ifdef __cplusplus
}
#endif

#endif /* ACL_SWIGLU_ACL_EMU_H */
