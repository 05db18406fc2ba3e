"""NumPy dtypes and their aclDataType values (SPEC section 2)."""

from __future__ import annotations

from typing import Dict, Tuple, Union

import numpy as np
import ml_dtypes

ACL_FLOAT = 0
ACL_FLOAT16 = 1
ACL_INT32 = 3
ACL_INT64 = 9
ACL_BF16 = 27
ACL_FORMAT_ND = 2

bfloat16: np.dtype = np.dtype(ml_dtypes.bfloat16)

# Every NumPy dtype an aclTensor can describe (aclDataType, SPEC section 2): what a device
# array may hold. Each operator then accepts its own few.
_TO_ACL: Dict[np.dtype, int] = {
    np.dtype(np.float32): ACL_FLOAT,
    np.dtype(np.float16): ACL_FLOAT16,
    bfloat16: ACL_BF16,
    np.dtype(np.int64): ACL_INT64,
    np.dtype(np.int32): ACL_INT32,
    np.dtype(np.int8): 2,
    np.dtype(np.uint8): 4,
    np.dtype(np.int16): 6,
    np.dtype(np.uint16): 7,
    np.dtype(np.uint32): 8,
    np.dtype(np.uint64): 10,
    np.dtype(np.float64): 11,
    np.dtype(np.bool_): 12,
    np.dtype(np.complex64): 16,
    np.dtype(np.complex128): 17,
}

# Data types of gradY / x / yOrigin / gradX.
IO_DTYPES: Tuple[np.dtype, ...] = (np.dtype(np.float32), np.dtype(np.float16), bfloat16)

#: What the dtype arguments accept: anything numpy.dtype() takes.
DTypeLike = Union[np.dtype, type, str]


def acl_dtype(dtype: DTypeLike) -> int:
    """The aclDataType of a NumPy dtype the package uses."""
    return _TO_ACL[np.dtype(dtype)]


def is_device_dtype(dtype: np.dtype) -> bool:
    """True for the dtypes an aclTensor can describe (device arrays hold only these)."""
    return dtype in _TO_ACL and dtype.isnative


def allowed_dtype_text() -> str:
    return ", ".join(dtype_name(d) for d in _TO_ACL)


def dtype_name(dtype: DTypeLike) -> str:
    dtype = np.dtype(dtype)
    if not dtype.isnative:
        return f"{dtype.name} in non-native byte order ({dtype.str!r})"
    return "bfloat16" if dtype == bfloat16 else dtype.name


def parse_dtype(name_or_dtype: DTypeLike) -> np.dtype:
    """'fp32'/'float32', 'fp16'/'float16', 'bf16'/'bfloat16' or a dtype -> NumPy dtype."""
    f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
    aliases: Dict[str, np.dtype] = {"fp32": f32, "float32": f32, "fp16": f16, "float16": f16, "bf16": bfloat16, "bfloat16": bfloat16}
    if isinstance(name_or_dtype, str):
        if name_or_dtype.lower() not in aliases:
            raise ValueError(f"unknown dtype {name_or_dtype!r}: use fp32, fp16 or bf16")
        return aliases[name_or_dtype.lower()]
    return np.dtype(name_or_dtype)
