"""Argument rules of aclnnSwigluGroupQuant (docs/forward.md), checked in Python before anything is
allocated, with errors that name the argument and the rule it broke.

The rules of quant modes 0 and 1 are those of the newest release's tiling (9.2.0 on: ranks,
shapes, empty inputs), which every release accepts: older releases check fewer (no shapes at
all), and a call they accept that these refuse would have the device write past an output or
read past an input. Modes 2 and 3 (HiFloat8) are checked as their tiling checks them and handed
to the installed CANN (the emulator refuses them: it does not emulate HiFloat8).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple

import numpy as np

from . import formats
from ._checks import whole_number
from ._dtypes import dtype_name, is_bfloat16
from ._validate import FLOAT32_MAX, MAX_RANK, check_clamp_limit
from ._releases import ReleaseLimitationError
from .errors import ArgumentError
from .tensor import TensorView

BLOCK, GROUP = 128, 32   # elements per scale: mode 0's blocks, mode 1's MX groups
CLAMP_OFF = -1.0
DST_TYPE_MAX_DEFAULT = 15.0   # the operator's default; only quant mode 3 reads it
_F16, _F32, _I64, _U8 = (np.dtype(t) for t in (np.float16, np.float32, np.int64, np.uint8))
_ACL_E8M0 = 37
_MODES = {0: "block FP8", 1: "MX FP8/FP4", 2: "HiFloat8, static scale", 3: "HiFloat8, dynamic scale"}


class ForwardProblem(NamedTuple):
    """A validated call: the scalars phase 1 gets, and each output's (shape, dtype) and view."""

    x_shape: Tuple[int, ...]
    dst: formats.DstType
    quant_mode: int
    block_size: int
    round_scale: bool
    clamp_limit: float        # CLAMP_OFF when off
    dst_type_max: float
    output_origin: bool
    outputs: Dict[str, Tuple[Tuple[int, ...], np.dtype]]
    views: Dict[str, TensorView]   # how the operator sees y (FP4 packed, HiFloat8) and byte scales
    preset: Tuple[str, ...]        # outputs it may leave partly unwritten (rows past the truncation)


def _e8m0() -> np.dtype:
    import ml_dtypes
    dtype: np.dtype = np.dtype(ml_dtypes.float8_e8m0fnu)
    return dtype


def _array(value: Any, name: str, array_types: Tuple[type, ...], text: str, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, array_types):
        raise TypeError(f"{name} must be {text}{' or None' if optional else ''}, got {type(value).__name__}")


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)


def _dst_type(value: object, mode: int) -> formats.DstType:
    try:
        dst = formats.as_dst_type(value)
    except ValueError as error:
        raise ArgumentError(str(error)) from None
    if mode not in dst.quant_modes:
        modes = " or ".join(f"{m} ({_MODES[m]})" for m in dst.quant_modes)
        raise ArgumentError(f"dst_type {dst.name!r} is produced by quant_mode {modes}, not by quant_mode {mode}")
    return dst


def _quant_mode(value: object) -> int:
    mode = whole_number(value, "quant_mode", low=-2**63)
    if mode == 5:
        raise ArgumentError("quant_mode 5 belongs to aclnnSwigluGroupQuantV2, which this package does not call; "
                            "quant_mode must be 0 (block FP8), 1 (MX FP8/FP4), 2 or 3 (HiFloat8)")
    if mode not in _MODES:
        raise ArgumentError(f"quant_mode must be 0 (block FP8), 1 (MX FP8/FP4), 2 or 3 (HiFloat8), got {mode}")
    return mode


def _dst_type_max(value: object) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"dst_type_max must be a real number > 0, got {type(value).__name__}")
    number = float(value)
    if not 0 < number <= FLOAT32_MAX:   # (NaN fails too)
        raise ArgumentError(f"dst_type_max must be a finite number > 0 (the operator uses it as fp32), got {number}")
    return number


def _rows_of(x_shape: Tuple[int, ...]) -> int:
    return math.prod(x_shape[:-1])


def _check_weight(weight: Any, rows: int) -> None:
    if weight is None:
        return
    if weight.dtype != _F32:
        raise ArgumentError(f"weight has dtype {dtype_name(weight.dtype)}; it must be float32 "
                            "(convert with .astype(numpy.float32))")
    shape = tuple(weight.shape)
    if not 1 <= len(shape) <= MAX_RANK or math.prod(shape) != rows:
        raise ArgumentError(f"weight has shape {shape}; it must hold one value per row, T = {rows} elements, "
                            f"in 1 to {MAX_RANK} dims (e.g. ({rows},))")


def _check_group_index(group_index: Any) -> Optional[int]:
    """G, the number of counts (None without group_index)."""
    if group_index is None:
        return None
    if group_index.dtype != _I64:
        raise ArgumentError(f"group_index has dtype {dtype_name(group_index.dtype)}; it must be int64")
    shape = tuple(group_index.shape)
    if len(shape) != 1 or shape[0] == 0:
        raise ArgumentError(f"group_index must be 1-D [G] with G > 0 counts, got shape {shape}")
    return int(shape[0])


def _output(arguments: Mapping[str, Any], name: str, shape: Tuple[int, ...], dtypes: Tuple[np.dtype, ...],
            array_types: Tuple[type, ...], text: str, any_shape: bool = False) -> None:
    """A given output must be of the shape and one of the dtypes the operator writes."""
    value = arguments.get(name)
    if value is None:
        return
    _array(value, name, array_types, text, True)
    if value.dtype not in dtypes or (not any_shape and tuple(value.shape) != shape):
        wanted = " or ".join(dtype_name(d) for d in dtypes)
        raise ArgumentError(f"{name} is {tuple(value.shape)} {dtype_name(value.dtype)}; the operator writes "
                            f"{'any shape of ' if any_shape else ''}{'' if any_shape else str(shape) + ' '}{wanted} "
                            "here")


def validate_forward(arguments: Mapping[str, Any], *, array_types: Tuple[type, ...], array_text: str,
                     check_outputs: bool, counts_overread: Optional[str]) -> ForwardProblem:
    """Checks one call. `array_types` are the accepted array argument types; `check_outputs` checks
    the outputs the caller gave; `counts_overread`: the installed release sums G counts past their
    end when G mod 128 is 97-127 (its truncation would be unpredictable): its name, else None."""
    get = arguments.get
    x: Any = get("x")
    _array(x, "x", array_types, array_text, False)
    for name in ("weight", "group_index", "scale"):
        _array(get(name), name, array_types, array_text, True)
    mode = _quant_mode(get("quant_mode", 0))
    dst = _dst_type(get("dst_type"), mode)
    output_origin = _flag(get("output_origin", False), "output_origin")
    x_shape = tuple(x.shape)
    if mode in (0, 1):
        problem = _block_or_mx(arguments, x, x_shape, mode, dst, output_origin, counts_overread)
    else:
        problem = _hifloat8(arguments, x, x_shape, mode, dst, output_origin)
    if check_outputs:
        for name, (shape, dtype) in problem.outputs.items():
            as_bytes = name == "y_scale" and mode == 1   # (E8M0 scales may be given as their bytes)
            _output(arguments, name, shape, (dtype, _U8) if as_bytes else (dtype,), array_types, array_text,
                    any_shape=name == "y_scale" and mode == 2)   # (mode 2 neither reads nor writes y_scale)
        scales = get("y_scale")
        if mode == 1 and scales is not None and scales.dtype == _U8:
            problem.views["y_scale"] = TensorView(_ACL_E8M0)
    return problem


def _block_or_mx(arguments: Mapping[str, Any], x: Any, x_shape: Tuple[int, ...], mode: int,
                 dst: formats.DstType, output_origin: bool, counts_overread: Optional[str]) -> ForwardProblem:
    get = arguments.get
    if x.dtype != _F16 and not is_bfloat16(x.dtype):
        raise ArgumentError(f"x has dtype {dtype_name(x.dtype)}; quant_mode {mode} takes float16 or bfloat16")
    max_rank = MAX_RANK if mode == 0 else MAX_RANK - 1   # (mode 1's y_scale has one more dim)
    if not 2 <= len(x_shape) <= max_rank:
        raise ArgumentError(f"x has {len(x_shape)} dims {x_shape}; quant_mode {mode} takes 2 to {max_rank} dims")
    rows = _rows_of(x_shape)
    if rows == 0:
        raise ArgumentError(f"x {x_shape} is empty (T = 0 rows); the operator takes no empty input")
    width = x_shape[-1]
    if width < 256 or width % 256:
        raise ArgumentError(f"x's last dim is {width}; it must be a multiple of 256 (2H, with H a multiple of 128)")
    hidden = width // 2
    _check_weight(get("weight"), rows)
    groups = _check_group_index(get("group_index"))
    if groups is not None and counts_overread and groups % 128 >= 97:
        raise ReleaseLimitationError(
            f"group_index has G = {groups} counts (G mod 128 = {groups % 128}): CANN {counts_overread} sums "
            "the counts in whole vectors past their end when G mod 128 is 97 to 127, so the rows it computes "
            "would be unpredictable. Pad group_index with zero counts to another G, or upgrade CANN to "
            "9.2.0-beta.1 or later.")
    if get("scale") is not None:
        raise ArgumentError(f"scale is given but quant_mode {mode} does not read it (only quant_mode 2 does)")
    if get("dst_type_max") is not None:
        raise ArgumentError(f"dst_type_max is given but quant_mode {mode} does not read it (only quant_mode 3 does)")
    per_scale = BLOCK if mode == 0 else GROUP
    block_size = whole_number(get("block_size", 0), "block_size")
    if block_size not in (0, per_scale):
        raise ArgumentError(f"block_size must be 0 or {per_scale} in quant_mode {mode} (a scale per {per_scale} "
                            f"elements), got {block_size}")
    round_scale_given = get("round_scale")
    round_scale = mode == 1 if round_scale_given is None else _flag(round_scale_given, "round_scale")
    if mode == 1 and not round_scale:
        raise ArgumentError("round_scale must be True (or None) in quant_mode 1: MX scales are powers of two")
    if output_origin:
        raise ArgumentError(f"output_origin must be False in quant_mode {mode}: the operator cannot output the "
                            "unquantised y in modes 0 and 1 (acl_swiglu.reference.swiglu(x) computes it)")
    clamp = check_clamp_limit(get("clamp_limit"))
    lead = x_shape[:-1]
    scale_shape = lead + (hidden // BLOCK,) if mode == 0 else lead + ((hidden // GROUP + 1) // 2, 2)
    scale_dtype = _F32 if mode == 0 else _e8m0()
    outputs = {"y": (dst.storage_shape(lead + (hidden,)), dst.storage_dtype), "y_scale": (scale_shape, scale_dtype),
               "y_origin": ((0,), x.dtype)}
    views = {"y": TensorView(dst.acl_code, 2)} if dst.packed else {}
    preset = ("y", "y_scale") if groups is not None else ()
    return ForwardProblem(x_shape, dst, mode, block_size, round_scale, CLAMP_OFF if clamp is None else clamp,
                          DST_TYPE_MAX_DEFAULT, False, outputs, views, preset)


def _hifloat8(arguments: Mapping[str, Any], x: Any, x_shape: Tuple[int, ...], mode: int, dst: formats.DstType,
              output_origin: bool) -> ForwardProblem:
    get = arguments.get
    if x.dtype not in (_F32, _F16) and not is_bfloat16(x.dtype):
        raise ArgumentError(f"x has dtype {dtype_name(x.dtype)}; quant_mode {mode} takes float32, float16 or "
                            "bfloat16")
    if not 1 <= len(x_shape) <= MAX_RANK:
        raise ArgumentError(f"x has {len(x_shape)} dims {x_shape}; quant_mode {mode} takes 1 to {MAX_RANK} dims")
    if x_shape[-1] % 2:
        raise ArgumentError(f"x's last dim is {x_shape[-1]}; it must be even (2H)")
    rows, hidden = _rows_of(x_shape), x_shape[-1] // 2
    _check_weight(get("weight"), rows)
    groups = _check_group_index(get("group_index"))
    if groups is None and rows == 0:
        raise ArgumentError(f"x {x_shape} is empty (T = 0 rows); without group_index the operator takes none")
    scale_count = 1 if groups is None else groups
    scale = get("scale")
    if mode == 2:
        if scale is None:
            raise ArgumentError("quant_mode 2 needs scale: float32 [G] with group_index, else [1]")
        if scale.dtype != _F32 or tuple(scale.shape) != (scale_count,):
            raise ArgumentError(f"scale is {tuple(scale.shape)} {dtype_name(scale.dtype)}; quant_mode 2 takes "
                                f"float32 ({scale_count},) (one per group, or one without group_index)")
    elif scale is not None:
        raise ArgumentError("scale is given but quant_mode 3 does not read it (only quant_mode 2 does)")
    clamp = check_clamp_limit(get("clamp_limit"))
    given_max = get("dst_type_max")
    dst_type_max = DST_TYPE_MAX_DEFAULT if given_max is None else _dst_type_max(given_max)
    lead = x_shape[:-1]
    outputs = {"y": (lead + (hidden,), _U8),
               "y_scale": ((scale_count,) if mode == 3 else (0,), _F32),
               "y_origin": (lead + (hidden,) if output_origin else (0,), x.dtype)}
    views = {"y": TensorView(dst.acl_code)}
    return ForwardProblem(x_shape, dst, mode, whole_number(get("block_size", 0), "block_size"),
                          False if get("round_scale") is None else _flag(get("round_scale"), "round_scale"), CLAMP_OFF if clamp is None else clamp,
                          dst_type_max, output_origin, outputs, views, ("y", "y_scale", "y_origin"))
