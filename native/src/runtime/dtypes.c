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
    case ACL_HIFLOAT8: return "HIFLOAT8";
    case ACL_FLOAT8_E5M2: return "FLOAT8_E5M2";
    case ACL_FLOAT8_E4M3FN: return "FLOAT8_E4M3FN";
    case ACL_FLOAT8_E8M0: return "FLOAT8_E8M0";
    case ACL_FLOAT4_E2M1: return "FLOAT4_E2M1";
    case ACL_FLOAT4_E1M2: return "FLOAT4_E1M2";
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

unsigned aclEmu_dtype_bits(int dtype)
{
    switch (dtype) {
    case ACL_FLOAT4_E2M1: case ACL_FLOAT4_E1M2: return 4;
    case ACL_INT8: case ACL_UINT8: case ACL_BOOL: case ACL_HIFLOAT8: case ACL_FLOAT8_E5M2:
    case ACL_FLOAT8_E4M3FN: case ACL_FLOAT8_E8M0: return 8;
    case ACL_FLOAT16: case ACL_BF16: case ACL_INT16: case ACL_UINT16: return 16;
    case ACL_FLOAT: case ACL_INT32: case ACL_UINT32: return 32;
    case ACL_INT64: case ACL_UINT64: case ACL_DOUBLE: case ACL_COMPLEX64: return 64;
    case ACL_COMPLEX128: return 128;
    default: return 0;
    }
}

size_t aclEmu_dtype_size(int dtype)
{
    unsigned bits = aclEmu_dtype_bits(dtype);
    return bits % 8 == 0 ? bits / 8 : 0;
}

int aclEmu_element_bytes(int dtype, int64_t first, int64_t count, uint64_t *first_byte, uint64_t *bytes)
{
    unsigned bits = aclEmu_dtype_bits(dtype);
    int64_t start, end;
    if (bits == 0 || first < 0 || count < 0 || __builtin_add_overflow(first, count, &end)) {
        return -1;
    }
    if (bits % 8 == 0) {
        const int64_t size = (int64_t)(bits / 8);
        if (__builtin_mul_overflow(first, size, &start) || __builtin_mul_overflow(end, size, &end)) {
            return -1;
        }
    } else {
        /* Two elements a byte: the range takes in every byte that holds one of its nibbles. */
        start = first / 2;
        end = count == 0 ? start : end / 2 + end % 2;
    }
    *first_byte = (uint64_t)start;
    *bytes = (uint64_t)(end - start);
    return 0;
}
