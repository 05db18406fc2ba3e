"""NumPy dtypes and their aclDataType values (SPEC section 2).

bfloat16 is ml_dtypes' dtype. ml_dtypes is imported on first need, not with the package (its
import costs more than the rest of the package's): an array that has the dtype means whoever
made it imported ml_dtypes already, and a dtype named "bfloat16" is checked against it only then.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

ACL_FLOAT = 0
ACL_FLOAT16 = 1
ACL_INT32 = 3
ACL_INT64 = 9
ACL_BF16 = 27
ACL_FORMAT_ND = 2

_bfloat16: List[np.dtype] = []


def bfloat16_dtype() -> np.dtype:
    """ml_dtypes' bfloat16, as a NumPy dtype (imports ml_dtypes the first time)."""
    if not _bfloat16:
        import ml_dtypes
        _bfloat16.append(np.dtype(ml_dtypes.bfloat16))
    return _bfloat16[0]


def as_dtype(value: npt.DTypeLike) -> np.dtype:
    """numpy.dtype(value); the name "bfloat16" works before ml_dtypes is imported too (it
    registers the name with NumPy)."""
    try:
        return np.dtype(value)
    except TypeError:
        if isinstance(value, str) and value == "bfloat16":
            return bfloat16_dtype()
        raise


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether `dtype` is ml_dtypes' bfloat16 (without importing ml_dtypes for any other dtype)."""
    return dtype.name == "bfloat16" and dtype == bfloat16_dtype()


# ml_dtypes' types an aclTensor can describe, by name: checked against ml_dtypes only for a dtype
# of one of these names (whose maker imported ml_dtypes already).
_ML_CODES = {"bfloat16": 27, "float8_e5m2": 35, "float8_e4m3fn": 36, "float8_e8m0fnu": 37}


_ml_found: Dict[np.dtype, Optional[int]] = {}   # (each dtype checked once)


def _ml_code(dtype: np.dtype) -> Optional[int]:
    found = _ml_found.get(dtype, -1)
    if found != -1:
        return found
    code = _ML_CODES.get(dtype.name)
    if code is not None:
        import ml_dtypes
        code = code if dtype == np.dtype(getattr(ml_dtypes, dtype.name)) else None
    _ml_found[dtype] = code
    return code


# Every NumPy dtype an aclTensor can describe (aclDataType, SPEC section 2): what a device
# array may hold. Each operator then accepts its own few. None stands for bfloat16.
_ACL_CODES: Tuple[Tuple[Optional[np.dtype], int], ...] = (
    (np.dtype(np.float32), ACL_FLOAT),
    (np.dtype(np.float16), ACL_FLOAT16),
    (None, ACL_BF16),
    (np.dtype(np.int64), ACL_INT64),
    (np.dtype(np.int32), ACL_INT32),
    (np.dtype(np.int8), 2),
    (np.dtype(np.uint8), 4),
    (np.dtype(np.int16), 6),
    (np.dtype(np.uint16), 7),
    (np.dtype(np.uint32), 8),
    (np.dtype(np.uint64), 10),
    (np.dtype(np.float64), 11),
    (np.dtype(np.bool_), 12),
    (np.dtype(np.complex64), 16),
    (np.dtype(np.complex128), 17),
)
_TO_ACL: Dict[np.dtype, int] = {dtype: code for dtype, code in _ACL_CODES if dtype is not None}
_FLOAT_IO = (np.dtype(np.float32), np.dtype(np.float16))


def is_io_dtype(dtype: np.dtype) -> bool:
    """The data types of gradY / x / yOrigin / gradX: float32, float16, bfloat16."""
    return dtype in _FLOAT_IO or is_bfloat16(dtype)

#: What the dtype arguments accept: anything numpy.dtype() takes.
DTypeLike = Union[np.dtype, type, str]


def acl_dtype(dtype: DTypeLike) -> int:
    """The aclDataType of a NumPy dtype the package uses (KeyError for another)."""
    dtype = as_dtype(dtype)
    code = _TO_ACL.get(dtype)
    if code is None:
        code = _ml_code(dtype)
        if code is None:
            raise KeyError(dtype)
    return code


def is_device_dtype(dtype: np.dtype) -> bool:
    """True for the dtypes an aclTensor can describe (device arrays hold only these)."""
    return (dtype in _TO_ACL or _ml_code(dtype) is not None) and dtype.isnative


def allowed_dtype_text() -> str:
    return ", ".join(["bfloat16" if d is None else dtype_name(d) for d, _ in _ACL_CODES] +
                     ["float8_e5m2", "float8_e4m3fn", "float8_e8m0fnu"])


def dtype_name(dtype: DTypeLike) -> str:
    dtype = as_dtype(dtype)
    if not dtype.isnative:
        return f"{dtype.name} in non-native byte order ({dtype.str!r})"
    return str(dtype.name)


def parse_dtype(name_or_dtype: DTypeLike) -> np.dtype:
    """'fp32'/'float32', 'fp16'/'float16', 'bf16'/'bfloat16' or a dtype -> NumPy dtype."""
    f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
    aliases: Dict[str, Optional[np.dtype]] = {"fp32": f32, "float32": f32, "fp16": f16, "float16": f16, "bf16": None,
                                              "bfloat16": None}
    if isinstance(name_or_dtype, str):
        if name_or_dtype.lower() not in aliases:
            raise ValueError(f"unknown dtype {name_or_dtype!r}: use fp32, fp16 or bf16")
        return aliases[name_or_dtype.lower()] or bfloat16_dtype()
    return as_dtype(name_or_dtype)
