/*
 * acl-swiglu: minimal ACL base declarations (types, enums, status codes).
 * Written for this project from the facts in docs/c_abi.md; values match CANN.
 */
#ifndef ACL_SWIGLU_ACL_BASE_H
#define ACL_SWIGLU_ACL_BASE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define ACL_FUNC_VISIBILITY
#else
#define ACL_FUNC_VISIBILITY __attribute__((visibility("default")))
#endif

typedef int aclError;
typedef void *aclrtStream;

#define ACL_SUCCESS 0

/* Parameter and usage errors. */
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_UNINITIALIZE 100001
#define ACL_ERROR_REPEAT_INITIALIZE 100002
#define ACL_ERROR_INVALID_FILE 100003
#define ACL_ERROR_REPEAT_FINALIZE 100037
#define ACL_ERROR_RT_PARAM_INVALID 107000
#define ACL_ERROR_RT_INVALID_DEVICEID 107001
#define ACL_ERROR_RT_CONTEXT_NULL 107002
#define ACL_ERROR_RT_STREAM_CONTEXT 107003

/* Resource errors. */
#define ACL_ERROR_BAD_ALLOC 200000
#define ACL_ERROR_INVALID_DEVICE 200002
#define ACL_ERROR_INVALID_RESOURCE_HANDLE 200005
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001
#define ACL_ERROR_RT_DEVICE_OOM 207018

/* Internal errors. */
#define ACL_ERROR_INTERNAL_ERROR 500000
#define ACL_ERROR_RT_INTERNAL_ERROR 507000
#define ACL_ERROR_RT_AICORE_EXCEPTION 507015
#define ACL_ERROR_RT_VECTOR_CORE_TIMEOUT 507034

typedef enum {
    ACL_DT_UNDEFINED = -1,
    ACL_FLOAT = 0,
    ACL_FLOAT16 = 1,
    ACL_INT8 = 2,
    ACL_INT32 = 3,
    ACL_UINT8 = 4,
    ACL_INT16 = 6,
    ACL_UINT16 = 7,
    ACL_UINT32 = 8,
    ACL_INT64 = 9,
    ACL_UINT64 = 10,
    ACL_DOUBLE = 11,
    ACL_BOOL = 12,
    ACL_STRING = 13,
    ACL_COMPLEX64 = 16,
    ACL_COMPLEX128 = 17,
    ACL_BF16 = 27,
    ACL_HIFLOAT8 = 34,
    ACL_FLOAT8_E5M2 = 35,
    ACL_FLOAT8_E4M3FN = 36,
    ACL_FLOAT8_E8M0 = 37,
    ACL_FLOAT4_E2M1 = 40,  /* 4-bit elements, two per byte */
    ACL_FLOAT4_E1M2 = 41
} aclDataType;

typedef enum {
    ACL_FORMAT_UNDEFINED = -1,
    ACL_FORMAT_NCHW = 0,
    ACL_FORMAT_NHWC = 1,
    ACL_FORMAT_ND = 2,
    ACL_FORMAT_NCL = 47
} aclFormat;

#ifdef __cplusplus
}
#endif

#endif /* ACL_SWIGLU_ACL_BASE_H */
