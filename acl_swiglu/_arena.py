"""A one-shot call's device side: where every array goes in its single device allocation (an
arena, each array 64-byte aligned, then the workspace), computed once per layout of the
arguments, and the one call into the package's helper (binding/one_shot.c) that makes all of it,
phase 1 and phase 2 included, and releases everything before it returns.
"""

from __future__ import annotations

import ctypes
import math
import struct
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from . import _ffi
from ._device import contiguous_strides, element_span, host_element_strides
from ._dtypes import acl_dtype
from ._operator import HOST_INTS, OUTPUT, Operator, Signature
from .tensor import TensorView, tensor_geometry

ALIGNMENT = 64   # CANN wants 32-byte aligned tensor addresses


class ArenaLayout(NamedTuple):
    """One layout of a one-shot call's arguments (and scalar values), ready for the helper."""

    problem: Any            # the validation's result
    reference: Any          # a byref of the helper's one_shot_layout, made once
    keep: Tuple[Any, ...]   # what that layout points into
    converted: Tuple[int, ...]   # the argument positions of arrays in non-native byte order (converted each call)
    inputs: Tuple[int, ...]      # the argument position of each input array placed
    restage: Optional[Tuple[bool, ...]]   # per array placed: copied to C order first? (None: none is)
    as_bytes: Tuple[int, ...]    # the arrays placed whose dtype the buffer protocol cannot name: exported as bytes
    names: Tuple[str, ...]   # of each output the call computes
    shapes: Tuple[Tuple[int, ...], ...]
    dtypes: Tuple[np.dtype, ...]
    slots: Optional[Tuple[int, ...]]   # per output parameter: its index among the results or -1; None: all, in order
    host_lists: Tuple[int, ...]   # the argument position of each host-ints argument given
    pack: Any                # packs the helper's words: the workspace, an address per array, (address, count) per list
    workspace: List[int]     # the workspace the arena reserves: the most phase 1 asked for


def _int64s(values: Sequence[int]) -> "ctypes.Array[ctypes.c_int64]":
    return (ctypes.c_int64 * max(len(values), 1))(*values)


def arena_layout(operator: Operator, signature: Signature, values: Sequence[Any], problem: Any, scalars: bytes,
                 converted: Tuple[int, ...], outputs: Dict[str, Tuple[Tuple[int, ...], np.dtype]],
                 views: Mapping[str, TensorView], preset: Sequence[str] = ()) -> ArenaLayout:
    """Places the given input arrays, then the outputs the call computes (each seen through its
    view, if it has one); the helper zeroes the `preset` outputs on the device first, since the
    operator may leave parts of them unwritten."""
    names = operator.argument_names
    arrays: List[_ffi.OneShotArray] = []
    keep: List[Any] = []
    index_of: Dict[str, int] = {}
    inputs: List[int] = []
    restage: List[bool] = []
    as_bytes: List[bool] = []
    size = 0

    def place(name: str, shape: Tuple[int, ...], dtype: np.dtype, strides: Tuple[int, ...], is_output: int) -> None:
        nonlocal size
        count = math.prod(shape)
        span = element_span(shape, strides) if count else 0
        nbytes = span * dtype.itemsize
        offset = -1
        if count:
            offset = size
            size += (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        view = views.get(name)
        tensor_dims, tensor_strides, _, per_item = tensor_geometry(shape, strides, 0, view)
        dims, steps = _int64s(tensor_dims), _int64s(tensor_strides)
        keep.extend((dims, steps))
        arrays.append(_ffi.OneShotArray(ctypes.addressof(dims), ctypes.addressof(steps), len(shape), span * per_item, offset,
                             nbytes, acl_dtype(dtype) if view is None else view.dtype, is_output))
        index_of[name] = len(arrays) - 1
        as_bytes.append(dtype.isbuiltin != 1)

    for param in signature.handles:
        if param.kind == OUTPUT or param.kind == HOST_INTS:
            continue
        position = names.index(param.name)
        array = values[position]
        if array is None:
            continue
        strides = host_element_strides(array) if array.size else contiguous_strides(array.shape)
        restage.append(strides is None)
        place(param.name, array.shape, array.dtype, contiguous_strides(array.shape) if strides is None else strides,
              _ffi.ONE_SHOT_INPUT)
        inputs.append(position)
    placed_outputs: List[Tuple[Tuple[int, ...], np.dtype]] = []
    slots: List[int] = []
    for name in signature.output_names:
        slots.append(len(placed_outputs) if name in outputs else -1)
        if name in outputs:
            shape, dtype = tuple(outputs[name][0]), np.dtype(outputs[name][1])
            kind = _ffi.ONE_SHOT_OUTPUT_PRESET if name in preset else _ffi.ONE_SHOT_OUTPUT
            place(name, shape, dtype, contiguous_strides(shape), kind)
            placed_outputs.append((shape, dtype))
    host_positions: List[int] = []
    handles: List[int] = []
    for param in signature.handles:
        if param.kind == HOST_INTS:
            if values[names.index(param.name)] is None:
                handles.append(_ffi.ONE_SHOT_ABSENT)
            else:
                handles.append(_ffi.ONE_SHOT_FIRST_HOST_LIST - len(host_positions))
                host_positions.append(names.index(param.name))
        else:
            handles.append(index_of.get(param.name, _ffi.ONE_SHOT_ABSENT))
    table = (_ffi.OneShotArray * max(len(arrays), 1))(*arrays)
    handle_table = (ctypes.c_int32 * max(len(handles), 1))(*handles)
    layout = _ffi.OneShotLayout(ctypes.addressof(table), len(arrays), len(handles), ctypes.addressof(handle_table),
                     len(host_positions), size, scalars)
    return ArenaLayout(problem, ctypes.byref(layout), (layout, table, handle_table, scalars, *keep), converted,
                       tuple(inputs), tuple(restage + [False] * len(placed_outputs)) if any(restage) else None,
                       tuple(index for index, flag in enumerate(as_bytes) if flag),
                       tuple(name for name, slot in zip(signature.output_names, slots) if slot >= 0),
                       tuple(shape for shape, _ in placed_outputs), tuple(dtype for _, dtype in placed_outputs),
                       None if slots == list(range(len(slots))) else tuple(slots), tuple(host_positions),
                       struct.Struct(f"<{1 + len(arrays) + 2 * len(host_positions)}Q").pack, [0])
