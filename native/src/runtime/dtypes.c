/* Names and sizes of the ACL enums, for validation and messages. */
#include "common/emu_internal.h"

const char *aclEmu_dtype_name(int dtype)
{
    switch (dtype) {
    case ACL_DT_UNDEFINED: return "DT_UNDEFINED";
    case ACL_FLOAT: return "FLOAT";
    case ACL_FLOAT16: return "FLOAT16";
    case ACL_INT8: return "INT8";
    case ACL_INT32: return "INT32";
    case ACL_UINT8: return "UINT8";
    case ACL_INT16: return "INT16";
    case ACL_UINT16: return "UINT16";
    case ACL_UINT32: return "UINT32";
    case ACL_INT64: return "INT64";
    case ACL_UINT64: return "UINT64";
    case ACL_DOUBLE: return "DOUBLE";
    case ACL_BOOL: return "BOOL";
    case ACL_STRING: return "STRING";
    case ACL_COMPLEX64: return "COMPLEX64";
    case ACL_COMPLEX128: return "COMPLEX128";
    case ACL_BF16: return "BF16";
    default: return "unknown";
    }
}

const char *aclEmu_format_name(int format)
{
    switch (format) {
    case ACL_FORMAT_UNDEFINED: return "UNDEFINED";
    case ACL_FORMAT_NCHW: return "NCHW";
    case ACL_FORMAT_NHWC: return "NHWC";
    case ACL_FORMAT_ND: return "ND";
    case ACL_FORMAT_NCL: return "NCL";
    default: return "unknown";
    }
}

size_t aclEmu_dtype_size(int dtype)
{
    switch (dtype) {
    case ACL_INT8: case ACL_UINT8: case ACL_BOOL: return 1;
    case ACL_FLOAT16: case ACL_BF16: case ACL_INT16: case ACL_UINT16: return 2;
    case ACL_FLOAT: case ACL_INT32: case ACL_UINT32: return 4;
    case ACL_INT64: case ACL_UINT64: case ACL_DOUBLE: case ACL_COMPLEX64: return 8;
    case ACL_COMPLEX128: return 16;
    default: return 0;
    }
}
