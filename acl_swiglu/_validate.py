"""Argument rules of aclnnSwigluGroupQuantGrad (SPEC section 1), checked in Python before
anything is allocated, with errors that name the argument and the rule it broke."""

from __future__ import annotations

import math
import numbers
from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np

from ._checks import INT64_MAX
from ._dtypes import dtype_name, is_io_dtype
from .errors import ArgumentError

MAX_RANK = 8
_F32 = np.dtype(np.float32)
_I64 = np.dtype(np.int64)
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_ROUNDS_TO_ZERO = 2.0 ** -150


class Rules(NamedTuple):
    """The shape rules of one ABI revision."""

    text: str                  # how messages name the revision
    min_rank: int
    max_rank: int
    weight_trailing_one: bool  # weight must be grad_y's leading dims then 1 (else: T elements, 1-8 dims)


class Problem(NamedTuple):
    """A validated call: what the marshaller and the output allocation need."""

    dtype: np.dtype
    x_shape: Tuple[int, ...]
    weight_shape: Optional[Tuple[int, ...]]
    clamp_limit: Optional[float]
    outputs: Dict[str, Tuple[Tuple[int, ...], np.dtype]]   # (shape, dtype) of each output the call computes


def _describe(value: object) -> str:
    return type(value).__name__


def check_clamp_limit(clamp_limit: object) -> Optional[float]:
    """clamp_limit as the float the operator gets, or None for off; raises naming the rule broken."""
    if clamp_limit is None:
        return None
    if type(clamp_limit) is float and 1.1754943508222875e-38 <= clamp_limit <= FLOAT32_MAX:
        return clamp_limit   # the common case: a normal fp32-range positive float
    if isinstance(clamp_limit, (bool, np.bool_)) or not isinstance(clamp_limit, numbers.Real):
        raise TypeError(f"clamp_limit must be None (off) or a real number > 0, got {_describe(clamp_limit)}")
    try:
        value = float(clamp_limit)
    except OverflowError:
        raise ArgumentError(f"clamp_limit {clamp_limit} is beyond float32 range; the operator uses it as fp32") from None
    except (TypeError, ValueError) as exc:   # (a number only in name: a proxy, a broken __float__)
        raise TypeError(f"clamp_limit must be None (off) or a real number > 0, got {_describe(clamp_limit)} "
                        f"that float() refuses ({exc})") from None
    if value != value or value == math.inf or value == -math.inf:   # (comparisons: traceable by torch.compile)
        raise ArgumentError(f"clamp_limit must be a finite number > 0 (or None for off), got {value}")
    if value <= 0:
        raise ArgumentError(f"clamp_limit must be > 0 (use None to turn the clamp off), got {value}")
    if value > FLOAT32_MAX:
        raise ArgumentError(f"clamp_limit {value} is beyond float32 range; the operator uses it as fp32")
    # Limits at or below 2**-150 (half the smallest fp32 subnormal) round to 0 in fp32. Decided
    # in float64 on normal numbers, so a caller's flush-to-zero or denormals-are-zero mode
    # cannot move the answer.
    if value <= FLOAT32_ROUNDS_TO_ZERO:
        raise ArgumentError(f"clamp_limit {value} rounds to 0 in float32; the operator uses it as fp32")
    return value


def host_counts(group_index: object) -> Tuple[int, ...]:
    """group_index given as host values: one int64 count per group."""
    values = np.asarray(group_index)
    if values.ndim != 1:
        raise ArgumentError(f"group_index must be 1-D (one count per group), got shape {values.shape}")
    if values.size and not np.issubdtype(values.dtype, np.integer):
        raise ArgumentError(f"group_index must hold integers, got dtype {values.dtype}")
    if values.size and values.dtype == np.uint64 and int(values.max()) > INT64_MAX:
        raise ArgumentError(f"group_index holds {int(values.max())}, beyond int64")
    return tuple(int(v) for v in values.astype(np.int64))


def _require(value: object, name: str, kinds: Tuple[type, ...], kind_text: str) -> None:
    if not isinstance(value, kinds):
        raise TypeError(f"{name} must be {kind_text}, got {_describe(value)}")


def validate(grad_y: Any, x: Any, weight: Any, y_origin: Any, group_index: Any, clamp_limit: object, *,
             rules: Rules, array_types: Tuple[type, ...], array_text: str, group_host: bool, grad_x: Any = None,
             grad_weight: Any = None, check_outputs: bool = False) -> Problem:
    """Checks one call under a revision's `rules`. `array_types` are the accepted tensor
    argument types (the arguments are checked to be one of them: hence Any here); `group_host`
    says group_index is host values rather than an array."""
    _require(grad_y, "grad_y", array_types, array_text)
    _require(x, "x", array_types, array_text)
    for name, value in (("weight", weight), ("y_origin", y_origin)):
        if value is not None:
            _require(value, name, array_types, array_text + " or None")
    if group_index is not None:
        if group_host:
            _require(group_index, "group_index", (np.ndarray, list, tuple),
                     "a 1-D int64 numpy array or a sequence of ints, or None")
        else:
            _require(group_index, "group_index", array_types, array_text + " (int64, 1-D) or None")

    dtype = grad_y.dtype
    if not is_io_dtype(dtype):
        raise ArgumentError(f"grad_y has dtype {dtype_name(dtype)}; it must be float32, float16 or bfloat16")
    for name, value in (("x", x), ("y_origin", y_origin)):
        if value is not None and value.dtype != dtype:
            raise ArgumentError(f"{name} has dtype {dtype_name(value.dtype)} but grad_y has {dtype_name(dtype)}; "
                                "they must match")
    if weight is not None and weight.dtype != _F32:
        raise ArgumentError(f"weight has dtype {dtype_name(weight.dtype)}; it must be float32 "
                            "(convert with .astype(numpy.float32))")

    gy_shape, x_shape = tuple(grad_y.shape), tuple(x.shape)
    min_rank, max_rank = rules.min_rank, rules.max_rank
    if len(gy_shape) == 0:
        raise ArgumentError("grad_y is 0-d; it must have shape [..., H]")
    if not min_rank <= len(gy_shape) <= max_rank:
        raise ArgumentError(f"grad_y has {len(gy_shape)} dims {gy_shape}; {rules.text} supports "
                            f"{min_rank} to {max_rank} dims")
    if len(x_shape) != len(gy_shape):
        raise ArgumentError(f"x has {len(x_shape)} dims {x_shape} but grad_y has {len(gy_shape)} {gy_shape}; "
                            "they must have the same rank")
    if x_shape[:-1] != gy_shape[:-1]:
        raise ArgumentError(f"x {x_shape} and grad_y {gy_shape} must have the same leading dims")
    if x_shape[-1] % 2:
        raise ArgumentError(f"x's last dim is {x_shape[-1]}; it must be even (2H)")
    if gy_shape[-1] * 2 != x_shape[-1]:
        raise ArgumentError(f"grad_y's last dim {gy_shape[-1]} must be half of x's last dim {x_shape[-1]}")
    rows = math.prod(gy_shape[:-1])

    if y_origin is not None and tuple(y_origin.shape) != gy_shape:
        raise ArgumentError(f"y_origin has shape {tuple(y_origin.shape)} but grad_y has {gy_shape}; they must match")
    if weight is not None and y_origin is None:
        raise ArgumentError("weight is given without y_origin; grad_weight needs both (y_origin is the forward "
                            "output, e.g. acl_swiglu.reference.swiglu(x))")
    if y_origin is not None and weight is None:
        raise ArgumentError("y_origin is given without weight; it is only used to compute grad_weight")
    weight_shape = None
    if weight is not None:
        weight_shape = tuple(weight.shape)
        if rules.weight_trailing_one:
            if weight_shape != gy_shape[:-1] + (1,):
                raise ArgumentError(f"weight has shape {weight_shape}; {rules.text} needs grad_y's leading dims "
                                    f"followed by 1: {gy_shape[:-1] + (1,)}")
        else:
            count = math.prod(weight_shape)
            if not 1 <= len(weight_shape) <= MAX_RANK or count != rows:
                raise ArgumentError(f"weight has shape {weight_shape} ({count} elements); it must hold one value per "
                                    f"row, T = {rows} elements, in 1 to {MAX_RANK} dims (e.g. {gy_shape[:-1] + (1,)})")

    if group_index is not None:
        if group_host:
            host_counts(group_index)
        else:
            if group_index.dtype != _I64:
                raise ArgumentError(f"group_index has dtype {dtype_name(group_index.dtype)}; it must be int64")
            if len(group_index.shape) != 1:
                raise ArgumentError(f"group_index must be 1-D [G], got shape {tuple(group_index.shape)}")

    clamp = check_clamp_limit(clamp_limit)

    if check_outputs:
        if grad_x is not None:
            _require(grad_x, "grad_x", array_types, array_text + " or None")
            if tuple(grad_x.shape) != x_shape or grad_x.dtype != dtype:
                raise ArgumentError(f"grad_x is {tuple(grad_x.shape)} {dtype_name(grad_x.dtype)}; it must be "
                                    f"{x_shape} {dtype_name(dtype)} like x")
        if grad_weight is not None:
            if weight is None:
                raise ArgumentError("grad_weight is given without weight")
            _require(grad_weight, "grad_weight", array_types, array_text + " or None")
            if tuple(grad_weight.shape) != weight_shape or grad_weight.dtype != _F32:
                raise ArgumentError(f"grad_weight is {tuple(grad_weight.shape)} {dtype_name(grad_weight.dtype)}; it "
                                    f"must be {weight_shape} float32 like weight")

    outputs = {"grad_x": (x_shape, dtype)}
    if weight_shape is not None:
        outputs["grad_weight"] = (weight_shape, _F32)
    return Problem(dtype, x_shape, weight_shape, clamp, outputs)
