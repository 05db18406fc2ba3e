"""Checks of the arguments the device data model takes, before anything crosses into C: integers
(ctypes silently truncates an out-of-range value, 2**64 becomes 0 and 2**32 + 3 becomes 3, and a
float to an int), shapes, dtypes and sizes, host arrays, flags."""

from __future__ import annotations

from typing import Any, Iterable, Tuple, Type

import numpy as np
import numpy.typing as npt

from ._dtypes import allowed_dtype_text, as_dtype, dtype_name, is_device_dtype
from .errors import ArgumentError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
ADDRESS_MAX = 2**64 - 1   # a pointer on the 64-bit hosts CANN supports
MAX_ALLOCATION = INT64_MAX   # size_t on the device side; larger sizes would wrap in C


def whole_number(value: object, name: str, low: int = 0, high: int = INT64_MAX,
                 error: Type[Exception] = ArgumentError) -> int:
    """`value` as an int when it is a whole number (int or NumPy integer, not bool) within
    [low, high]; otherwise `error` naming `name` and the rule."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise error(f"{name} must be a whole number (int), got {type(value).__name__} {value!r}")
    number = int(value)
    if not low <= number <= high:
        raise error(f"{name} is {number}; it must be between {low} and {high}")
    return number


def check_shape(shape: Iterable[object]) -> Tuple[int, ...]:
    """A shape as a tuple of whole numbers >= 0 (an error naming `shape` otherwise)."""
    try:
        dims: Tuple[Any, ...] = tuple(shape)
    except TypeError:
        raise TypeError(f"shape must be a sequence of whole numbers, got {type(shape).__name__}") from None
    for dim in dims:
        if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
            raise TypeError(f"shape {dims} must hold whole numbers, got {type(dim).__name__}")
        if dim < 0:
            raise ArgumentError(f"shape {dims} has a negative dim")
        if dim > INT64_MAX:
            raise ArgumentError(f"shape {dims} has a dim beyond int64")
    return tuple(int(d) for d in dims)


def check_device_dtype(dtype: npt.DTypeLike, name: str = "dtype") -> np.dtype:
    """`dtype` as a NumPy dtype when device arrays can hold it (an ArgumentError otherwise)."""
    try:
        dtype = as_dtype(dtype)
    except TypeError:
        raise ArgumentError(f"{name} {dtype!r} is not a dtype; allowed: {allowed_dtype_text()}") from None
    if not is_device_dtype(dtype):
        raise ArgumentError(f"{name} is {dtype_name(dtype)}; a device array holds one of {allowed_dtype_text()}")
    return dtype


def check_nbytes(nbytes: object) -> int:
    """A device allocation's size in bytes: at least 1, and what a device can address."""
    nbytes = whole_number(nbytes, "nbytes", 1, INT64_MAX * 2 + 1)
    if nbytes > MAX_ALLOCATION:
        raise ArgumentError(f"nbytes {nbytes} is more than any device can address")
    return nbytes


def plain_array(value: np.ndarray, name: str) -> np.ndarray:
    """The plain ndarray an array argument stands for, in native byte order: a subclass's memory
    as a plain array, a proxy's through its own view() (one that gives no array is refused by
    `name`), and an array in the other byte order converted."""
    kind = type(value).__name__
    plain: Any = None
    try:
        plain = np.ndarray.view(value, np.ndarray)   # (a subclass: the plain array over its memory)
    except TypeError:   # a proxy, which only claims to be an ndarray: the array it forwards to
        try:
            plain = value.view(np.ndarray)
        except Exception:
            pass
    if type(plain) is not np.ndarray:
        raise TypeError(f"{name} is a {kind} that claims to be a numpy.ndarray but gives no array of its own "
                        "(its view(numpy.ndarray) does not); pass the array itself")
    array: np.ndarray = plain if plain.dtype.isnative else plain.astype(plain.dtype.newbyteorder("="))
    return array


def synchronize_flag(value: object) -> bool:
    """synchronize= as a bool: True, False, a NumPy bool, or the int 0 or 1."""
    if isinstance(value, (bool, np.bool_)) or (type(value) is int and value in (0, 1)):
        return bool(value)
    raise TypeError(f"synchronize must be True or False, got {value!r}")
