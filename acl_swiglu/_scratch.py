"""Native resources that live for one call only (device memory, tensor and int-array handles),
released in reverse order when the call ends, success or not.

The one-shot call uses these instead of the owned Python objects of runtime.py: it frees
everything before it returns, so per-object finalizers would only add cost. All of a call's
device memory is one allocation (an arena), each array at a 64-byte aligned offset in it, then
its workspace. The package's C helper (binding/arena.c) makes the whole device side in two calls
around phase 1; ``CallScratch`` does it one ctypes call per step when the helper is not there or
the ACL functions are wrapped.
"""

from __future__ import annotations

import ctypes
import math
import operator
import os
import platform
from typing import Any, Callable, Dict, List, NamedTuple, NoReturn, Optional, Sequence, Tuple

import numpy as np

from . import _ffi
from ._device import (ACL_MEM_MALLOC_HUGE_FIRST, MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE, contiguous_strides,
                      element_span, host_element_strides)
from ._dtypes import ACL_FORMAT_ND, acl_dtype
from ._ffi import check

ALIGNMENT = 64   # CANN wants 32-byte aligned tensor addresses

_dims_cache: Dict[Tuple[int, ...], "ctypes.Array[ctypes.c_int64]"] = {}


def _int64s(values: Tuple[int, ...]) -> "ctypes.Array[ctypes.c_int64]":
    """A C int64 array of `values`, shared between calls (CANN copies dims, never writes them)."""
    array = _dims_cache.get(values)
    if array is None:
        if len(_dims_cache) > 4096:
            _dims_cache.clear()
        array = _dims_cache[values] = (ctypes.c_int64 * max(len(values), 1))(*values)
    return array


_char_from_buffer = ctypes.c_char.from_buffer
_address_of = ctypes.addressof
_BYTES = np.dtype(np.uint8)


def _probe_data_offset() -> int:
    """Where an ndarray object holds its data pointer (NumPy's array struct: right after the
    object header), checked on two probe arrays; -1 when it cannot be relied on. The C helper
    then reads each host array's address itself: one id() per array instead of a buffer export."""
    if platform.python_implementation() != "CPython":
        return -1   # (id() is an address only there)
    offset = object.__basicsize__
    probe = np.zeros(16, np.uint8)
    for array in (probe, probe[5:]):
        if ctypes.c_void_p.from_address(id(array) + offset).value != array.ctypes.data:
            return -1
    return offset


HOST_DATA_OFFSET = _probe_data_offset()


def host_address(array: np.ndarray) -> int:
    """The address of a host array's first byte: through the buffer protocol (a fraction of
    ``array.ctypes.data``'s cost; a dtype the protocol cannot name, such as bfloat16, as bytes),
    or ``array.ctypes.data`` for a read-only, strided or empty array."""
    try:
        exported: Any = array if array.dtype.isbuiltin == 1 else array.view(_BYTES)
        return _address_of(_char_from_buffer(exported))
    except (TypeError, ValueError, BufferError):
        return int(array.ctypes.data)


class Placement(NamedTuple):
    """One array's place in a call's arena and the aclCreateTensor arguments that describe it."""

    offset: int              # byte offset in the arena; -1 for an empty array (no memory)
    nbytes: int              # bytes copied in or out
    dims: "ctypes.Array[ctypes.c_int64]"   # the C arguments, made once per layout
    ndim: int
    dtype: int
    strides: "ctypes.Array[ctypes.c_int64]"
    span: "ctypes.Array[ctypes.c_int64]"
    make_contiguous: bool    # the host strides cannot go to the device: copy in C order first


class _ArenaApi(ctypes.Structure):
    """The C helper's arena_api struct: the ACL functions it calls (binding/arena.c)."""

    _fields_ = [("malloc", ctypes.c_void_p), ("free", ctypes.c_void_p), ("copy", ctypes.c_void_p),
                ("create_tensor", ctypes.c_void_p), ("destroy_tensor", ctypes.c_void_p), ("launch", ctypes.c_void_p),
                ("synchronize", ctypes.c_void_p), ("malloc_policy", ctypes.c_int32)]


class _ArenaArray(ctypes.Structure):
    """The C helper's arena_array struct: one array of a call."""

    _fields_ = [("dims", ctypes.c_void_p), ("strides", ctypes.c_void_p), ("storage_dims", ctypes.c_void_p),
                ("ndim", ctypes.c_uint64), ("offset", ctypes.c_int64), ("nbytes", ctypes.c_uint64),
                ("dtype", ctypes.c_int32), ("format", ctypes.c_int32)]


class ArenaCall(ctypes.Structure):
    """The C helper's arena_call struct: one call's arena, where it failed, and its slots (the
    host address of each array, then the tensor made for each)."""

    _fields_ = [("base", ctypes.c_void_p), ("size", ctypes.c_uint64), ("workspace_offset", ctypes.c_uint64),
                ("workspace_capacity", ctypes.c_uint64), ("step", ctypes.c_int32), ("index", ctypes.c_uint32),
                ("slots", ctypes.c_void_p), ("executor", ctypes.c_void_p), ("workspace_size", ctypes.c_uint64),
                ("host_data_offset", ctypes.c_int64)]


# The helper's arena_step values, as the call each one names (STEP_PHASE1 and STEP_LAUNCH: the
# operator's phases, which the caller names).
_STEP_APIS = {1: "aclrtMalloc", 2: "aclrtMemcpy", 3: "aclCreateTensor", 6: "aclrtSynchronizeStream",
              7: "aclrtMemcpy", 8: "aclDestroyTensor", 9: "aclrtFree"}
_STEP_CREATE_TENSOR = 3   # (aclCreateTensor returned NULL: its message holds the code)
STEP_PHASE1, STEP_LAUNCH = 4, 5
_HELPER_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native", "libaclswiglu_hotpath.so")
_helper: List[Optional[ctypes.CDLL]] = []


def helper_library() -> Optional[ctypes.CDLL]:
    """The package's small C helper (libaclswiglu_hotpath.so), or None when it is not installed
    (then every step is its own ctypes call)."""
    if not _helper:
        library = None
        if os.path.isfile(_HELPER_LIBRARY):
            try:
                library = ctypes.CDLL(_HELPER_LIBRARY)
            except OSError:
                library = None
        _helper.append(library)
    return _helper[0]


class ArenaHelper(NamedTuple):
    """The C helper's one-shot entry points, bound to one set of ACL functions."""

    open: Any
    finish: Any
    close: Any
    run: Any   # open, phase 1 and finish in one (binding/arena.c)
    api: "ctypes._Pointer[_ArenaApi]"

    def raise_failure(self, api: Any, call: ArenaCall, status: int) -> NoReturn:
        """Raises for a failed open/finish/close, naming the call that failed first (phase 2's
        failures are the caller's to raise)."""
        step = call.step
        if step == _STEP_CREATE_TENSOR:
            _ffi.raise_null("aclCreateTensor", api.get_message)
        _ffi.raise_status(status, _STEP_APIS[step], api.get_message)


# ctypes has no public name for the base class of foreign functions, and only its instances are
# known to be plain C calls (anything else put in their place, such as a wrapper, must see each call).
_C_FUNCTION: type = getattr(ctypes, "_CFuncPtr")


def is_c_function(function: Any) -> bool:
    """Whether `function` is a plain ctypes foreign function (not a wrapper in its place)."""
    return isinstance(function, _C_FUNCTION)


_arena_helpers: Dict[Tuple[int, str], Tuple[Any, Callable[[Any], Tuple[Any, ...]], Tuple[Any, ...],
                                             Optional[ArenaHelper]]] = {}


def arena_helper(api: Any, launch: str) -> Optional[ArenaHelper]:
    """The C helper's arena functions bound to `api`'s ACL functions and the operator's phase 2
    (`launch`, its symbol), or None without the helper or when one of those functions is not a
    plain C function (a Python wrapper must see its calls)."""
    entry = _arena_helpers.get((id(api), launch))
    if entry is not None and entry[0] is api:
        functions = entry[1](api.raw)
        if functions == entry[2]:   # (the same function objects: equal only as themselves)
            return entry[3]
    functions = _helper_functions(launch)(api.raw)
    library = helper_library()
    helper = None
    if library is not None and all(is_c_function(f) for f in functions):
        try:
            entries = [getattr(library, name) for name in ("acl_swiglu_arena_open", "acl_swiglu_arena_finish",
                                                           "acl_swiglu_arena_close", "acl_swiglu_arena_run")]
        except AttributeError:
            entries = []
        if entries:
            pointer, count = ctypes.c_void_p, ctypes.c_uint32
            argtypes = ((pointer, pointer, count, count, pointer),
                        (pointer, pointer, count, count, pointer, pointer, ctypes.c_uint64, pointer, pointer),
                        (pointer, count, pointer, pointer),
                        (pointer, pointer, count, count, pointer, pointer, pointer))
            for entry_point, types in zip(entries, argtypes):
                entry_point.restype = ctypes.c_int32
                entry_point.argtypes = types
            table = _ArenaApi(*(ctypes.cast(f, ctypes.c_void_p).value for f in functions), ACL_MEM_MALLOC_HUGE_FIRST)
            helper = ArenaHelper(entries[0], entries[1], entries[2], entries[3], ctypes.pointer(table))
    _arena_helpers[(id(api), launch)] = (api, _helper_functions(launch), functions, helper)
    return helper


def _helper_functions(launch: str) -> Callable[[Any], Tuple[Any, ...]]:
    """Gets, from a raw namespace, the functions the arena helper calls, in _ArenaApi's order."""
    return operator.attrgetter("aclrtMalloc", "aclrtFree", "aclrtMemcpy", "aclCreateTensor", "aclDestroyTensor",
                               launch, "aclrtSynchronizeStream")


class ArenaLayout(NamedTuple):
    """Where every array of one call goes in its single device allocation: computed once per
    layout of the arguments (shapes, dtypes, strides) and reused by every call with it.
    ``native`` is the same, inputs then outputs, as the C helper's array of arena_array."""

    size: int
    inputs: Tuple[Tuple[str, Placement], ...]
    outputs: Tuple[Tuple[str, Placement], ...]
    native: "ctypes.Array[_ArenaArray]"
    arrays: int               # how many
    slots: Any                # the C array type of an ArenaCall's slots (two per array)
    workspace: List[int]      # the workspace the arena holds after the arrays: the most phase 1 asked for


def arena_layout(inputs: Sequence[Tuple[str, np.ndarray]],
                 outputs: Sequence[Tuple[str, Tuple[int, ...], np.dtype]]) -> ArenaLayout:
    size = [0]

    def place(shape: Tuple[int, ...], dtype: np.dtype, strides: Optional[Tuple[int, ...]], count: int,
              make_contiguous: bool = False) -> Placement:
        if strides is None:
            strides = contiguous_strides(shape)
        span = element_span(shape, strides) if count else 0
        nbytes = span * dtype.itemsize
        offset = -1
        if count:
            offset = size[0]
            size[0] = offset + (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        return Placement(offset, nbytes, _int64s(tuple(shape)), len(shape), acl_dtype(dtype), _int64s(strides),
                         _int64s((span,)), make_contiguous)

    placed_inputs = []
    for name, array in inputs:
        strides = None
        if array.size and not array.flags.c_contiguous:
            strides = host_element_strides(array)
        placed_inputs.append((name, place(array.shape, array.dtype, strides, array.size,
                                          bool(array.size) and not array.flags.c_contiguous and strides is None)))
    placed_outputs = tuple((name, place(shape, dtype, None, math.prod(shape))) for name, shape, dtype in outputs)
    every = [p for _, p in placed_inputs] + [p for _, p in placed_outputs]
    native = (_ArenaArray * max(len(every), 1))(*[
        _ArenaArray(ctypes.addressof(p.dims), ctypes.addressof(p.strides), ctypes.addressof(p.span), p.ndim,
                    p.offset, p.nbytes, p.dtype, ACL_FORMAT_ND) for p in every])
    return ArenaLayout(size[0], tuple(placed_inputs), placed_outputs, native, len(every),
                       ctypes.c_void_p * max(2 * len(every), 1), [0])


class CallScratch:
    """Use as ``with CallScratch(api) as scratch:``; everything it made is released on exit.

    ``allocate_layout()`` makes the arena once, then ``place`` makes each array's tensor
    (copying inputs in) and ``fetch`` copies outputs back. When ``drain`` is set to a stream handle, that
    stream is synchronised before anything is freed if the call fails after queuing work.
    """

    __slots__ = ("api", "raw", "size", "base", "tensors", "int_arrays", "drain")

    def __init__(self, api: Any) -> None:
        self.api = api
        self.raw = api.raw
        self.size = 0
        self.base: Optional[int] = None
        self.tensors: List[Any] = []
        self.int_arrays: List[Any] = []
        self.drain: Any = None

    def __enter__(self) -> "CallScratch":
        return self

    def allocate(self) -> None:
        if self.size:
            ptr = ctypes.c_void_p()
            check(self.api, self.raw.aclrtMalloc(ctypes.byref(ptr), self.size, ACL_MEM_MALLOC_HUGE_FIRST),
                  "aclrtMalloc")
            self.base = ptr.value

    def allocate_layout(self, layout: ArenaLayout) -> None:
        """The arena of a precomputed layout (instead of staging and ``allocate()``)."""
        self.size = layout.size
        self.allocate()

    def place(self, placement: Placement, host: Optional[np.ndarray] = None) -> Any:
        """The tensor of a placed array; with `host`, its bytes are first copied to the device."""
        address = None if placement.offset < 0 or self.base is None else self.base + placement.offset
        if host is not None and address is not None:
            if placement.make_contiguous:
                host = np.ascontiguousarray(host)
            check(self.api, self.raw.aclrtMemcpy(address, placement.nbytes, host_address(host), placement.nbytes,
                                                 MEMCPY_HOST_TO_DEVICE), "aclrtMemcpy")
        handle = self.raw.aclCreateTensor(placement.dims, placement.ndim, placement.dtype, placement.strides, 0,
                                          ACL_FORMAT_ND, placement.span, 1, address)
        if not handle:
            _ffi.raise_null("aclCreateTensor", self.api.get_message)
        self.tensors.append(handle)
        return handle

    def fetch(self, placement: Placement, host: np.ndarray) -> None:
        """Copies a placed output back into `host` (C-contiguous, writable)."""
        if placement.offset >= 0 and self.base is not None:
            check(self.api, self.raw.aclrtMemcpy(host_address(host), placement.nbytes, self.base + placement.offset,
                                                 placement.nbytes, MEMCPY_DEVICE_TO_HOST), "aclrtMemcpy")

    def int_array(self, values: Any) -> Any:
        values = np.ascontiguousarray(values, dtype=np.int64)
        pointer = values.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)) if values.size else None
        handle = self.raw.aclCreateIntArray(pointer, values.size)
        if not handle:
            _ffi.raise_null("aclCreateIntArray", self.api.get_message)
        self.int_arrays.append(handle)
        return handle

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        raw = self.raw
        if exc_type is not None and self.drain is not None:
            if self.api.hot.aclrtSynchronizeStream(self.drain):
                _ffi.drop_message(self.api.get_message)   # the call's own error is the one to report
        failed: List[Tuple[int, str]] = []
        for handle in reversed(self.tensors):
            status = raw.aclDestroyTensor(handle)
            if status:
                failed.append((status, "aclDestroyTensor"))
        for handle in self.int_arrays:
            status = raw.aclDestroyIntArray(handle)
            if status:
                failed.append((status, "aclDestroyIntArray"))
        if self.base is not None:
            status = raw.aclrtFree(self.base)
            if status:
                failed.append((status, "aclrtFree"))
        if failed:
            if exc_type is None:
                _ffi.raise_status(failed[0][0], failed[0][1], self.api.get_message)
            _ffi.drop_message(self.api.get_message)   # the error being raised is the one to report
