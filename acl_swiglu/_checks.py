"""Checks for integers that cross into C: ctypes silently truncates an out-of-range value (2**64
becomes 0, 2**32 + 3 becomes 3) and a float to an int, so every such value is checked first."""

from __future__ import annotations

from typing import Type

import numpy as np

from .errors import ArgumentError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
ADDRESS_MAX = 2**64 - 1   # a pointer on the 64-bit hosts CANN supports


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
